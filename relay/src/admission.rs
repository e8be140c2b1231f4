//! The one admission rule for events: every event that enters the store
//! or the live stream passes [`check`] first, whichever way it came (a
//! client's EVENT, an agent's finish reply, a message the relay signs
//! itself). Before, each way had its own subset of the checks, and a
//! finish reply could store what EVENT refused (ten years ahead, 2,500
//! tags, 300 KB of content, already expired).
//!
//! The checks are pure and cheap (no signature, no storage), so a client's
//! event meets them before it is verified. What needs the connection
//! (NIP-42, NIP-70) or the store (duplicates, deletions, channel
//! membership) is decided where that state lives.

use nostr::prelude::{Event, PublicKey, Timestamp};
use protocol::kinds;

use crate::config::Limits;

/// Channel metadata kinds that only the relay signs (NIP-29 39000-39009).
pub const RELAY_SIGNED_KINDS: std::ops::RangeInclusive<u16> = 39_000..=39_009;

/// What a community's admins banned (NIP-86 `banpubkey`, `banevent`).
#[derive(Debug, Default, Clone)]
pub struct Bans {
    pub pubkeys: std::collections::HashSet<[u8; 32]>,
    pub events: std::collections::HashSet<[u8; 32]>,
}

/// What an event is checked against.
#[derive(Debug, Clone, Copy)]
pub struct Rules<'a> {
    pub limits: &'a Limits,
    /// The community's signing key: the only author of relay-signed kinds.
    pub community_key: &'a PublicKey,
    /// Unix seconds, for `created_at` bounds and NIP-40 expiry.
    pub now: u64,
    /// The community's bans (`None` for the relay's own events).
    pub bans: Option<&'a Bans>,
}

/// Why an event is refused. `Display` is the machine-readable answer
/// (`invalid: …` or `restricted: …`) that OK messages carry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("invalid: event of {bytes} bytes exceeds max_event_bytes {max}")]
    TooLarge { bytes: usize, max: usize },
    #[error("invalid: {tags} tags exceed max_tags_per_event {max}")]
    TooManyTags { tags: usize, max: usize },
    #[error("invalid: a tag value of {bytes} bytes exceeds max_tag_value_bytes {max}")]
    TagValueTooLong { bytes: usize, max: usize },
    #[error("invalid: tag values must not contain U+0000")]
    NulInTag,
    #[error("invalid: created_at is more than {max_secs} seconds in the future")]
    TooFarAhead { max_secs: u64 },
    #[error("invalid: created_at out of range")]
    CreatedAtOutOfRange,
    #[error("invalid: event has expired (NIP-40)")]
    Expired,
    #[error("invalid: kind 22242 is sent with AUTH, not EVENT")]
    AuthKind,
    #[error("invalid: an event belongs to at most one channel (several h tags)")]
    SeveralChannels,
    #[error("restricted: kind {kind} is channel metadata that only the relay signs")]
    RelaySigned { kind: u16 },
    #[error("blocked: this pubkey is banned in this community")]
    BannedAuthor,
    #[error("blocked: this event is banned in this community")]
    BannedEvent,
}

impl Refusal {
    /// Stable machine code (HTTP answers and run failures carry it).
    pub fn code(&self) -> &'static str {
        match self {
            Refusal::TooLarge { .. } => "too_large",
            Refusal::TooManyTags { .. } => "too_many_tags",
            Refusal::TagValueTooLong { .. } => "tag_value_too_long",
            Refusal::NulInTag => "nul_in_tag",
            Refusal::TooFarAhead { .. } => "created_at_too_far_ahead",
            Refusal::CreatedAtOutOfRange => "created_at_out_of_range",
            Refusal::Expired => "expired",
            Refusal::AuthKind => "auth_kind",
            Refusal::SeveralChannels => "several_channels",
            Refusal::RelaySigned { .. } => "relay_signed_kind",
            Refusal::BannedAuthor => "banned_pubkey",
            Refusal::BannedEvent => "banned_event",
        }
    }
}

/// Checks `event` (whose JSON is `raw_len` bytes) against every rule that
/// needs neither its signature nor any stored state.
pub fn check(event: &Event, raw_len: usize, rules: &Rules<'_>) -> Result<(), Refusal> {
    if let Some(bans) = rules.bans {
        if bans.pubkeys.contains(&event.pubkey.to_bytes()) {
            return Err(Refusal::BannedAuthor);
        }
        if bans.events.contains(event.id.as_bytes()) {
            return Err(Refusal::BannedEvent);
        }
    }
    let l = rules.limits;
    if raw_len > l.max_event_bytes {
        return Err(Refusal::TooLarge {
            bytes: raw_len,
            max: l.max_event_bytes,
        });
    }
    check_tags(event, l)?;
    let created = event.created_at.as_secs();
    if created > rules.now.saturating_add(l.max_future_secs) {
        return Err(Refusal::TooFarAhead {
            max_secs: l.max_future_secs,
        });
    }
    if i64::try_from(created).is_err() {
        return Err(Refusal::CreatedAtOutOfRange);
    }
    if event.is_expired_at(Timestamp::from_secs(rules.now)) {
        return Err(Refusal::Expired);
    }
    let kind = event.kind.as_u16();
    if kind == kinds::CLIENT_AUTH {
        return Err(Refusal::AuthKind);
    }
    if RELAY_SIGNED_KINDS.contains(&kind) && event.pubkey != *rules.community_key {
        return Err(Refusal::RelaySigned { kind });
    }
    Ok(())
}

/// Tag count, value sizes, NUL bytes and the one-channel rule.
///
/// U+0000: PostgreSQL text cannot hold it, and an indexed tag value, `d`
/// or `h` with one made the whole group commit fail, every client's event
/// with it; SQLite would store it. One rule for both backends: refused.
/// Several `h` tags: the channel rules look at the first, while `#h`
/// queries match any, so a second `h` wrote into a private channel.
fn check_tags(event: &Event, l: &Limits) -> Result<(), Refusal> {
    if event.tags.len() > l.max_tags_per_event {
        return Err(Refusal::TooManyTags {
            tags: event.tags.len(),
            max: l.max_tags_per_event,
        });
    }
    let mut channels = 0usize;
    for tag in event.tags.iter() {
        let values = tag.as_slice();
        if values.first().is_some_and(|name| name == "h") {
            channels += 1;
            if channels > 1 {
                return Err(Refusal::SeveralChannels);
            }
        }
        for v in values {
            if v.len() > l.max_tag_value_bytes {
                return Err(Refusal::TagValueTooLong {
                    bytes: v.len(),
                    max: l.max_tag_value_bytes,
                });
            }
            if v.as_bytes().contains(&0) {
                return Err(Refusal::NulInTag);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use nostr::prelude::{EventBuilder, FinalizeEvent, Keys, Kind, Tag};

    fn signed(keys: &Keys, kind: u16, tags: Vec<Vec<&str>>, created_at: u64) -> Event {
        let tags: Vec<Tag> = tags.into_iter().map(|t| Tag::parse(t).unwrap()).collect();
        EventBuilder::new(Kind::from_u16(kind), "x")
            .tags(tags)
            .custom_created_at(Timestamp::from_secs(created_at))
            .finalize(keys)
            .unwrap()
    }

    fn checked(event: &Event, community: &PublicKey, limits: &Limits) -> Result<(), Refusal> {
        let rules = Rules {
            limits,
            community_key: community,
            now: 1_000_000,
            bans: None,
        };
        check(event, event.as_json().len(), &rules)
    }

    #[test]
    fn each_rule_refuses_with_its_code() {
        let (me, relay) = (Keys::generate(), Keys::generate());
        let rk = relay.public_key();
        let l = Limits::default();
        let now = 1_000_000;
        let ok = signed(&me, 1, vec![vec!["h", "a"]], now);
        assert_eq!(checked(&ok, &rk, &l), Ok(()));
        // 15 minutes ahead by default, to the second; a larger bound lifts it.
        let edge = signed(&me, 1, vec![], now + 900);
        assert_eq!(checked(&edge, &rk, &l), Ok(()));
        let ahead = signed(&me, 1, vec![], now + 10 * 365 * 86_400);
        let lifted = Limits {
            max_future_secs: u64::MAX,
            ..Limits::default()
        };
        assert_eq!(checked(&ahead, &rk, &lifted), Ok(()));
        let cases: Vec<(Event, &str)> = vec![
            (
                signed(&me, 9, vec![vec!["h", "a"], vec!["h", "b"]], now),
                "several_channels",
            ),
            (signed(&me, 1, vec![vec!["t", "a\0b"]], now), "nul_in_tag"),
            (signed(&me, 1, vec![vec!["d", "\0"]], now), "nul_in_tag"),
            (
                signed(&me, 39_000, vec![vec!["d", "x"]], now),
                "relay_signed_kind",
            ),
            (
                signed(&me, 39_009, vec![vec!["d", "x"]], now),
                "relay_signed_kind",
            ),
            (signed(&me, 22_242, vec![], now), "auth_kind"),
            (
                signed(&me, 1, vec![], now + 10 * 365 * 86_400),
                "created_at_too_far_ahead",
            ),
            (signed(&me, 1, vec![vec!["expiration", "10"]], now), "expired"),
            (signed(&me, 1, vec![vec!["t"]; 2_001], now), "too_many_tags"),
        ];
        for (event, code) in cases {
            assert_eq!(
                checked(&event, &rk, &l).map_err(|r| r.code()),
                Err(code),
                "{event:?}"
            );
        }
        // The relay's own metadata passes.
        assert_eq!(
            checked(&signed(&relay, 39_000, vec![vec!["d", "x"]], now), &rk, &l),
            Ok(())
        );
        let long = "v".repeat(l.max_tag_value_bytes + 1);
        let e = signed(&me, 1, vec![vec!["t", &long]], now);
        assert_eq!(
            checked(&e, &rk, &l).map_err(|r| r.code()),
            Err("tag_value_too_long")
        );
        let small = Limits {
            max_event_bytes: 100,
            ..Limits::default()
        };
        assert_eq!(checked(&ok, &rk, &small).map_err(|r| r.code()), Err("too_large"));
    }

    #[test]
    fn answers_carry_the_nip01_prefix() {
        assert!(Refusal::NulInTag.to_string().starts_with("invalid: "));
        assert!(Refusal::RelaySigned { kind: 39_000 }
            .to_string()
            .starts_with("restricted: "));
    }
}
