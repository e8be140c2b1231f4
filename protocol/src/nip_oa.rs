//! NIP-OA owner attestation for managed agents (docs/protocol.md, "Managed agents").
//!
//! A managed agent's kind 0 carries one tag
//! `["auth", <owner pubkey hex>, <conditions>, <sig>]`, where `sig` is the
//! owner's BIP-340 signature over SHA-256 of the UTF-8 string
//! `nostr:agent-auth:<agent pubkey hex>:<conditions>`.
//!
//! `conditions` is empty or `&`-joined clauses `kind=N`, `created_at<T`,
//! `created_at>T`. As in NIP-26, several `kind=` clauses name the set of
//! allowed kinds; time clauses all apply.

use nostr::prelude::{Event, Keys, PublicKey, Tag};
use sha2::{Digest, Sha256};

/// Tag name of the attestation.
pub const TAG: &str = "auth";

/// Why an attestation is invalid. `code()` is the stable machine form.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OaError {
    #[error("more than one auth tag")]
    MultipleTags,
    #[error("auth tag must be [\"auth\", owner, conditions, sig]")]
    MalformedTag,
    #[error("owner is not a valid public key")]
    BadOwner,
    #[error("owner must not be the agent itself")]
    SelfOwned,
    #[error("malformed conditions: {0}")]
    MalformedConditions(String),
    #[error("signature is not valid")]
    BadSignature,
    #[error("the conditions do not allow this event (kind {kind}, created_at {created_at})")]
    ConditionsUnmet { kind: u16, created_at: u64 },
}

impl OaError {
    /// Stable machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            OaError::MultipleTags => "multiple_auth_tags",
            OaError::MalformedTag => "malformed_auth_tag",
            OaError::BadOwner => "bad_owner",
            OaError::SelfOwned => "self_owned",
            OaError::MalformedConditions(_) => "malformed_conditions",
            OaError::BadSignature => "bad_signature",
            OaError::ConditionsUnmet { .. } => "conditions_unmet",
        }
    }
}

/// One clause of the conditions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Clause {
    Kind(u16),
    CreatedBefore(u64),
    CreatedAfter(u64),
}

/// Parsed conditions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Conditions(pub Vec<Clause>);

fn number<T: std::str::FromStr>(s: &str, what: &str) -> Result<T, OaError> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) || (s.len() > 1 && s.starts_with('0')) {
        return Err(OaError::MalformedConditions(format!(
            "{what} must be a decimal number: {s:?}"
        )));
    }
    s.parse()
        .map_err(|_| OaError::MalformedConditions(format!("{what} out of range: {s:?}")))
}

impl Conditions {
    /// Parses the conditions string (empty means no conditions).
    pub fn parse(s: &str) -> Result<Self, OaError> {
        if s.is_empty() {
            return Ok(Self::default());
        }
        let mut out = Vec::new();
        for clause in s.split('&') {
            let c = if let Some(n) = clause.strip_prefix("kind=") {
                Clause::Kind(number(n, "kind")?)
            } else if let Some(t) = clause.strip_prefix("created_at<") {
                Clause::CreatedBefore(number(t, "created_at")?)
            } else if let Some(t) = clause.strip_prefix("created_at>") {
                Clause::CreatedAfter(number(t, "created_at")?)
            } else {
                return Err(OaError::MalformedConditions(format!("unknown clause {clause:?}")));
            };
            out.push(c);
        }
        Ok(Self(out))
    }

    /// Whether an event of `kind` made at `created_at` is within the conditions.
    pub fn allows(&self, kind: u16, created_at: u64) -> bool {
        let kinds: Vec<u16> = self
            .0
            .iter()
            .filter_map(|c| if let Clause::Kind(k) = c { Some(*k) } else { None })
            .collect();
        (kinds.is_empty() || kinds.contains(&kind))
            && self.0.iter().all(|c| match c {
                Clause::Kind(_) => true,
                Clause::CreatedBefore(t) => created_at < *t,
                Clause::CreatedAfter(t) => created_at > *t,
            })
    }
}

/// The 32-byte digest the owner signs.
pub fn digest(agent: &PublicKey, conditions: &str) -> [u8; 32] {
    let text = format!("nostr:agent-auth:{}:{conditions}", agent.to_hex());
    Sha256::digest(text.as_bytes()).into()
}

/// A verified attestation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attestation {
    pub owner: PublicKey,
    pub conditions: Conditions,
    /// The conditions exactly as signed.
    pub conditions_raw: String,
    /// Hex signature.
    pub sig: String,
}

/// Signs an attestation tag for `agent` with the owner's keys (random aux).
pub fn sign(owner: &Keys, agent: &PublicKey, conditions: &str) -> Result<Tag, OaError> {
    sign_with_aux(owner, agent, conditions, &rand::random())
}

/// Signs with explicit auxiliary randomness (deterministic: used for test vectors).
pub fn sign_with_aux(
    owner: &Keys,
    agent: &PublicKey,
    conditions: &str,
    aux: &[u8; 32],
) -> Result<Tag, OaError> {
    Conditions::parse(conditions)?;
    if owner.public_key() == *agent {
        return Err(OaError::SelfOwned);
    }
    let sig = owner.sign_schnorr_with_aux_rand(secp256k1::SECP256K1, digest(agent, conditions), aux);
    Ok(Tag::custom(
        TAG,
        [owner.public_key().to_hex(), conditions.to_string(), sig.to_hex()],
    ))
}

/// Verifies one attestation given its parts.
pub fn verify(
    agent: &PublicKey,
    owner_hex: &str,
    conditions: &str,
    sig_hex: &str,
) -> Result<Attestation, OaError> {
    if owner_hex.len() != 64
        || !owner_hex
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    {
        return Err(OaError::BadOwner);
    }
    let owner = PublicKey::from_hex(owner_hex).map_err(|_| OaError::BadOwner)?;
    if owner == *agent {
        return Err(OaError::SelfOwned);
    }
    let parsed = Conditions::parse(conditions)?;
    let sig_bytes: [u8; 64] = hex::decode(sig_hex)
        .ok()
        .and_then(|b| b.try_into().ok())
        .ok_or(OaError::BadSignature)?;
    let sig = secp256k1::schnorr::Signature::from_byte_array(sig_bytes);
    let xonly = owner.xonly().map_err(|_| OaError::BadOwner)?;
    secp256k1::SECP256K1
        .verify_schnorr(&sig, &digest(agent, conditions), &xonly)
        .map_err(|_| OaError::BadSignature)?;
    Ok(Attestation {
        owner,
        conditions: parsed,
        conditions_raw: conditions.to_string(),
        sig: sig_hex.to_string(),
    })
}

/// The attestation of an event, if it carries one: `Ok(None)` without an
/// `auth` tag, `Err` when it carries an invalid one (or several), including
/// one whose conditions the carrying event itself does not meet (its kind
/// or `created_at`): an attestation for kind 1 does not register an agent
/// with a kind 0.
pub fn from_event(event: &Event) -> Result<Option<Attestation>, OaError> {
    let mut tags = event.tags.iter().filter(|t| t.kind() == TAG);
    let Some(tag) = tags.next() else { return Ok(None) };
    if tags.next().is_some() {
        return Err(OaError::MultipleTags);
    }
    let s = tag.as_slice();
    if s.len() != 4 {
        return Err(OaError::MalformedTag);
    }
    let att = verify(&event.pubkey, &s[1], &s[2], &s[3])?;
    let (kind, created_at) = (event.kind.as_u16(), event.created_at.as_secs());
    if !att.conditions.allows(kind, created_at) {
        return Err(OaError::ConditionsUnmet { kind, created_at });
    }
    Ok(Some(att))
}

#[cfg(test)]
mod tests {
    use super::*;
    use nostr::prelude::{EventBuilder, FinalizeEvent, Kind};

    fn kind0(agent: &Keys, tags: Vec<Tag>) -> Event {
        EventBuilder::new(Kind::Metadata, "{}")
            .tags(tags)
            .finalize(agent)
            .unwrap()
    }

    #[test]
    fn round_trip() {
        let owner = Keys::generate();
        let agent = Keys::generate();
        for cond in [
            "",
            "kind=0",
            "kind=9&kind=0&created_at<4000000000&created_at>1700000000",
        ] {
            let tag = sign(&owner, &agent.public_key(), cond).unwrap();
            let att = from_event(&kind0(&agent, vec![tag])).unwrap().unwrap();
            assert_eq!(att.owner, owner.public_key());
            assert_eq!(att.conditions_raw, cond);
        }
        assert_eq!(from_event(&kind0(&agent, vec![])).unwrap(), None);
    }

    #[test]
    fn the_carrying_event_must_meet_the_conditions() {
        let owner = Keys::generate();
        let agent = Keys::generate();
        for cond in [
            "kind=1",
            "kind=9&kind=1",
            "created_at<1000",
            "created_at>4000000000",
        ] {
            let tag = sign(&owner, &agent.public_key(), cond).unwrap();
            let err = from_event(&kind0(&agent, vec![tag])).unwrap_err();
            assert!(
                matches!(err, OaError::ConditionsUnmet { kind: 0, .. }),
                "{cond}: {err:?}"
            );
            assert_eq!(err.code(), "conditions_unmet");
        }
    }

    #[test]
    fn conditions_grammar() {
        let c = Conditions::parse("kind=9&kind=1&created_at<200&created_at>100").unwrap();
        assert!(c.allows(9, 150));
        assert!(c.allows(1, 101));
        assert!(!c.allows(7, 150));
        assert!(!c.allows(9, 200));
        assert!(!c.allows(9, 100));
        assert!(Conditions::parse("").unwrap().allows(12345, 0));
        for bad in [
            "kind=",
            "kind=x",
            "kind=-1",
            "kind=65536",
            "kind=01",
            "created_at<",
            "created_at<1.5",
            "created_at=5",
            "&",
            "kind=1&",
            "&kind=1",
            "kind=1&&kind=2",
            "KIND=1",
            " kind=1",
            "kind=1 ",
            "foo",
            "created_at>+5",
        ] {
            assert!(
                matches!(Conditions::parse(bad), Err(OaError::MalformedConditions(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn invalid_cases() {
        let owner = Keys::generate();
        let agent = Keys::generate();
        let good = sign(&owner, &agent.public_key(), "kind=0").unwrap();
        // Two auth tags.
        let err = from_event(&kind0(&agent, vec![good.clone(), good.clone()])).unwrap_err();
        assert_eq!(err, OaError::MultipleTags);
        // Wrong arity.
        let short = Tag::custom(TAG, [owner.public_key().to_hex(), String::new()]);
        assert_eq!(
            from_event(&kind0(&agent, vec![short])).unwrap_err(),
            OaError::MalformedTag
        );
        // Owner equal to the agent.
        let selfsig =
            agent.sign_schnorr_with_aux_rand(secp256k1::SECP256K1, digest(&agent.public_key(), ""), &[0; 32]);
        let tag = Tag::custom(
            TAG,
            [agent.public_key().to_hex(), String::new(), selfsig.to_hex()],
        );
        assert_eq!(
            from_event(&kind0(&agent, vec![tag])).unwrap_err(),
            OaError::SelfOwned
        );
        assert_eq!(
            sign(&agent, &agent.public_key(), "").unwrap_err(),
            OaError::SelfOwned
        );
        // Signature over other conditions, other agent, garbage.
        let s = good.as_slice();
        let other_cond = Tag::custom(TAG, [s[1].clone(), "kind=1".into(), s[3].clone()]);
        assert_eq!(
            from_event(&kind0(&agent, vec![other_cond])).unwrap_err(),
            OaError::BadSignature
        );
        let other_agent = Keys::generate();
        assert_eq!(
            from_event(&kind0(&other_agent, vec![good.clone()])).unwrap_err(),
            OaError::BadSignature
        );
        for sig in ["", "zz", &"00".repeat(64), &"ab".repeat(63)] {
            let t = Tag::custom(TAG, [s[1].clone(), s[2].clone(), sig.to_string()]);
            assert_eq!(
                from_event(&kind0(&agent, vec![t])).unwrap_err(),
                OaError::BadSignature,
                "{sig}"
            );
        }
        // Malformed owner and conditions.
        for owner_hex in ["", "xyz", &"A".repeat(64), &"0".repeat(63)] {
            let t = Tag::custom(TAG, [owner_hex.to_string(), String::new(), s[3].clone()]);
            assert_eq!(
                from_event(&kind0(&agent, vec![t])).unwrap_err(),
                OaError::BadOwner,
                "{owner_hex}"
            );
        }
        let t = Tag::custom(TAG, [s[1].clone(), "kind=zero".into(), s[3].clone()]);
        assert!(matches!(
            from_event(&kind0(&agent, vec![t])),
            Err(OaError::MalformedConditions(_))
        ));
    }
}
