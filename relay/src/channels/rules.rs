//! NIP-29 channel rules, applied inside the transaction that stores the
//! event, and the relay-signed metadata (39000-39003) kept current in that
//! same transaction.
//!
//! Every change to one channel is serialised by a lock on the channel, so
//! membership decisions and metadata never interleave across processes.

use nostr::prelude::{Event, Keys, PublicKey};

use crate::config::{ChannelPolicy, DeliveryConfig};
use crate::events::InsertOutcome;
use crate::persistence::db::{Tx, Q};
use crate::persistence::StoreError;
use crate::workflow::definitions::Upsert;

use super::metadata::{republish, republishes};
use super::state::{load, lock_key, put_member, remove_member, ChannelView, Published, Role};
pub use protocol::nip29::{
    changes_channel, h_tag, CREATE_GROUP, CREATE_INVITE, DELETE_EVENT, DELETE_GROUP, EDIT_METADATA,
    GROUP_ADMINS, GROUP_MEMBERS, GROUP_METADATA, GROUP_ROLES, JOIN_REQUEST, LEAVE_REQUEST,
    MAX_CHANNEL_ID_BYTES, MAX_INVITE_CODE_BYTES, PREVIOUS_WINDOW, PUT_USER, REMOVE_USER,
};

fn tag_value<'e>(event: &'e Event, name: &str) -> Option<&'e str> {
    event
        .tags
        .iter()
        .find(|t| t.kind() == name)
        .and_then(|t| t.content())
}

fn has_flag(event: &Event, name: &str) -> bool {
    event.tags.iter().any(|t| t.kind() == name)
}

/// `p` tags of a moderation event: (pubkey, optional role).
fn targets(event: &Event) -> Vec<(PublicKey, Option<String>)> {
    event
        .tags
        .iter()
        .filter(|t| t.kind() == "p")
        .filter_map(|t| {
            let s = t.as_slice();
            let pk = PublicKey::from_hex(s.get(1)?).ok()?;
            Some((pk, s.get(2).cloned()))
        })
        .collect()
}

/// What a channel event asks for, decided before anything is written.
#[derive(Debug, PartialEq, Eq)]
enum Plan {
    /// Refused, with the client's `OK false` text.
    Reject(String),
    /// Nothing to do (a join by a member): answered as a duplicate.
    Duplicate,
    Apply,
}

fn rejected(msg: impl Into<String>) -> Result<Applied, StoreError> {
    Ok(Applied::not_stored(InsertOutcome::Rejected(msg.into())))
}

/// What applying a channel event did: its outcome, the events to announce
/// after the commit (when stored), and whether it started a workflow run
/// or woke one (then the engine has work now; most messages start none).
#[derive(Debug)]
pub struct Applied {
    pub outcome: InsertOutcome,
    pub published: Published,
    pub runs_moved: bool,
}

impl Applied {
    fn not_stored(outcome: InsertOutcome) -> Self {
        Applied {
            outcome,
            published: Vec::new(),
            runs_moved: false,
        }
    }
}

/// The event's channel id, or why it has none that may be used.
fn channel_id_of(event: &Event) -> Result<&str, String> {
    match h_tag(event) {
        None => Err("invalid: missing h tag".into()),
        Some(c) if c.is_empty() || c.len() > MAX_CHANNEL_ID_BYTES => Err(format!(
            "invalid: channel id must be 1 to {MAX_CHANNEL_ID_BYTES} bytes"
        )),
        Some(c) => Ok(c),
    }
}

/// The channel rules (NIP-29 subset): whether `author` may have an event
/// of `kind` applied to `channel` as it is now (`current`, `None` when it
/// does not exist).
fn plan(
    current: Option<&ChannelView>,
    channel: &str,
    kind: u16,
    author: &PublicKey,
    policy: &ChannelPolicy,
) -> Plan {
    match (current, kind) {
        (Some(c), CREATE_GROUP) if c.deleted => Plan::Reject("blocked: this channel was deleted".into()),
        (Some(_), CREATE_GROUP) => Plan::Reject(format!("duplicate: channel {channel} already exists")),
        (None, CREATE_GROUP) => Plan::Apply,
        (None, _) => Plan::Reject(format!("invalid: unknown channel {channel}")),
        (Some(c), _) if c.deleted => Plan::Reject("blocked: this channel was deleted".into()),
        (Some(c), JOIN_REQUEST) if c.is_member(author) => Plan::Duplicate,
        (Some(_), JOIN_REQUEST) => Plan::Apply,
        (Some(c), LEAVE_REQUEST) if !c.is_member(author) => {
            Plan::Reject(format!("invalid: not a member of channel {channel}"))
        }
        (Some(c), PUT_USER | REMOVE_USER | EDIT_METADATA | DELETE_EVENT | DELETE_GROUP | CREATE_INVITE)
            if c.role_of(author) != Some(Role::Admin) =>
        {
            Plan::Reject(format!(
                "restricted: only admins of channel {channel} may do this"
            ))
        }
        (Some(c), k)
            if (policy.requires_membership(k) || k == protocol::workflow::DEFINITION_KIND)
                && !c.is_member(author) =>
        {
            Plan::Reject(format!(
                "restricted: only members of channel {channel} may post in it"
            ))
        }
        _ => Plan::Apply,
    }
}

/// What applying an event changed: which metadata kinds to re-publish
/// (39000 / 39001 / 39002), and who left the channel.
#[derive(Default)]
struct Changed {
    meta: bool,
    admins: bool,
    members: bool,
    departed: Vec<PublicKey>,
}

/// Applies and stores an `h`-tagged event (including 9007, which creates the
/// channel). The caller has verified the signature and, for 9007, the
/// creation policy. Returns the outcome and, when stored, the events to
/// announce (the event itself first, then any new relay-signed metadata).
pub async fn apply(
    tx: &mut Tx<'_>,
    community: &str,
    keys: &Keys,
    policy: &ChannelPolicy,
    event: &Event,
    raw: &str,
    deliveries: &DeliveryConfig,
) -> Result<Applied, StoreError> {
    let channel = match channel_id_of(event) {
        Ok(c) => c.to_string(),
        Err(msg) => return rejected(msg),
    };
    tx.lock(&lock_key(community, &channel)).await?;
    let now = tx.now().await?;
    let kind = event.kind.as_u16();
    let current = load(tx, community, &channel).await?;
    match plan(current.as_ref(), &channel, kind, &event.pubkey, policy) {
        Plan::Reject(msg) => return rejected(msg),
        Plan::Duplicate => return Ok(Applied::not_stored(InsertOutcome::Duplicate)),
        Plan::Apply => {}
    }
    if kind == CREATE_INVITE && invite_code(event).is_none() {
        return rejected(format!(
            "invalid: an invite (9009) needs a code tag of 1 to {MAX_INVITE_CODE_BYTES} bytes"
        ));
    }
    if let Some(msg) = check_previous(tx, community, &channel, event).await? {
        return rejected(msg);
    }
    let outcome =
        crate::workflow::definitions::insert_event(tx, community, event, raw, Some(&channel)).await?;
    if outcome != InsertOutcome::Stored {
        return Ok(Applied::not_stored(outcome));
    }
    let runs_moved = match workflow_effects(tx, community, keys, event, &channel).await? {
        Effects::Refused(msg) => return rejected(msg),
        Effects::Done { runs_moved } => runs_moved,
    };
    let changed = change_state(
        tx,
        community,
        &keys.public_key(),
        &channel,
        event,
        current.as_ref(),
        now,
    )
    .await?;
    let mut published: Published = vec![(event.clone(), raw.to_string())];
    if changed.meta || changed.admins || changed.members {
        debug_assert!(
            republishes(kind),
            "kind {kind} re-publishes: lock_keys must say so"
        );
        let which = (changed.meta, changed.admins, changed.members);
        published.extend(republish(tx, community, keys, &channel, now, which).await?);
    }
    for pk in &changed.departed {
        published.extend(
            crate::workflow::definitions::pause_for_departed(tx, community, keys, &channel, pk, now).await?,
        );
        super::mentions::cancel_for_departed(tx, community, &channel, pk, now).await?;
    }
    if kind == protocol::workflow::MESSAGE_KIND {
        published
            .extend(super::mentions::on_message(tx, community, keys, event, &channel, deliveries).await?);
    }
    Ok(Applied {
        outcome: InsertOutcome::Stored,
        published,
        runs_moved,
    })
}

/// What [`workflow_effects`] did.
enum Effects {
    /// A definition that must not be stored, and why.
    Refused(String),
    /// Recorded; whether a run started or was woken.
    Done { runs_moved: bool },
}

/// What a stored workflow definition (recorded), channel message or
/// reaction (which may start runs, or decide an approval a run waits for)
/// does; [`Effects::Refused`] when the definition must be refused after
/// all (the caller rolls back).
async fn workflow_effects(
    tx: &mut Tx<'_>,
    community: &str,
    keys: &Keys,
    event: &Event,
    channel: &str,
) -> Result<Effects, StoreError> {
    let kind = event.kind.as_u16();
    let mut runs_moved = false;
    if kind == protocol::workflow::DEFINITION_KIND {
        let v = match protocol::workflow::validate(event) {
            Ok(v) => v,
            Err(e) => return Ok(Effects::Refused(format!("invalid: {e}"))),
        };
        if let Upsert::Refused(msg) =
            crate::workflow::definitions::upsert_definition(tx, community, event, &v).await?
        {
            return Ok(Effects::Refused(msg));
        }
    }
    if kind == protocol::workflow::MESSAGE_KIND {
        let started =
            crate::workflow::triggers::on_message(tx, community, &keys.public_key(), event, channel).await?;
        runs_moved |= !started.is_empty();
    }
    if kind == protocol::approval::REACTION_KIND {
        if let Some(run) = crate::workflow::approvals::on_reaction(tx, community, event, channel).await? {
            let wake = format!("approval:{}", event.id.to_hex());
            crate::delivery::deliveries::poke(tx, community, &run, &wake).await?;
            runs_moved = true;
        }
        let started =
            crate::workflow::triggers::on_reaction(tx, community, &keys.public_key(), event, channel).await?;
        runs_moved |= !started.is_empty();
    }
    Ok(Effects::Done { runs_moved })
}

/// The channel's state after an applied event of a NIP-29 kind (other
/// kinds change nothing).
async fn change_state(
    tx: &mut Tx<'_>,
    community: &str,
    relay_key: &PublicKey,
    channel: &str,
    event: &Event,
    current: Option<&ChannelView>,
    now: i64,
) -> Result<Changed, StoreError> {
    let author = event.pubkey;
    // A join to a closed channel waits for an admin, unless it has an invite.
    let waits = event.kind.as_u16() == JOIN_REQUEST
        && current.is_some_and(|c| c.closed)
        && !invited(tx, community, channel, event).await?;
    let both = Changed {
        admins: true,
        members: true,
        ..Changed::default()
    };
    Ok(match event.kind.as_u16() {
        CREATE_GROUP => {
            create(tx, community, channel, event, now).await?;
            Changed { meta: true, ..both }
        }
        JOIN_REQUEST if waits => {
            request_to_join(tx, community, channel, &author, now).await?;
            Changed::default()
        }
        JOIN_REQUEST => {
            put_member(tx, community, channel, &author, Role::Member, now).await?;
            Changed {
                members: true,
                ..Changed::default()
            }
        }
        LEAVE_REQUEST => {
            remove_member(tx, community, channel, &author).await?;
            Changed {
                departed: vec![author],
                ..both
            }
        }
        PUT_USER => {
            for (pk, role) in targets(event) {
                let role = if role.as_deref() == Some("admin") {
                    Role::Admin
                } else {
                    Role::Member
                };
                put_member(tx, community, channel, &pk, role, now).await?;
            }
            both
        }
        REMOVE_USER => {
            let mut departed = Vec::new();
            for (pk, _) in targets(event) {
                if current.is_some_and(|c| c.is_member(&pk)) {
                    departed.push(pk);
                }
                remove_member(tx, community, channel, &pk).await?;
            }
            Changed { departed, ..both }
        }
        EDIT_METADATA => {
            let c = current.expect("channel exists for an applied edit");
            edit(tx, community, channel, event, c).await?;
            Changed {
                meta: true,
                ..Changed::default()
            }
        }
        DELETE_EVENT => {
            delete_events(tx, community, relay_key, channel, event).await?;
            Changed::default()
        }
        CREATE_INVITE => {
            let code = invite_code(event).expect("checked before applying");
            tx.exec(
                Q::new(
                    "INSERT INTO channel_invites (community_id, channel_id, code, created_by, created_at) \
                     VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
                )
                .bind(community)
                .bind(channel)
                .bind(code)
                .bind(author.to_bytes())
                .bind(now),
            )
            .await?;
            Changed::default()
        }
        DELETE_GROUP => {
            tx.exec(
                Q::new("UPDATE channels SET deleted = TRUE WHERE community_id = $1 AND id = $2")
                    .bind(community)
                    .bind(channel),
            )
            .await?;
            crate::workflow::definitions::cancel_channel(tx, community, channel).await?;
            Changed::default()
        }
        _ => Changed::default(),
    })
}

/// The `code` tag of an invite (9009) or a join request (9021), when usable.
fn invite_code(event: &Event) -> Option<&str> {
    tag_value(event, "code").filter(|c| !c.is_empty() && c.len() <= MAX_INVITE_CODE_BYTES)
}

/// Whether a join request carries a code an admin created for this channel
/// (NIP-29: it lets the requester into a closed channel at once).
async fn invited(tx: &mut Tx<'_>, community: &str, channel: &str, event: &Event) -> Result<bool, StoreError> {
    let Some(code) = invite_code(event) else {
        return Ok(false);
    };
    let q = Q::new(
        "SELECT 1 AS found FROM channel_invites WHERE community_id = $1 AND channel_id = $2 AND code = $3",
    )
    .bind(community)
    .bind(channel)
    .bind(code);
    Ok(tx.one(q).await?.is_some())
}

/// A 9005: the events its `e` tags name leave the channel (only events of
/// this channel; never what the relay signed (its metadata, kept current
/// by itself; workflow messages, which deliveries refer to), nor a
/// workflow definition, which its owner deletes with NIP-09 so that its
/// workflow is retired with it). At most `max_tags_per_event` ids.
async fn delete_events(
    tx: &mut Tx<'_>,
    community: &str,
    relay_key: &PublicKey,
    channel: &str,
    event: &Event,
) -> Result<(), StoreError> {
    for id in event.tags.event_ids() {
        tx.exec(
            Q::new(
                "DELETE FROM events WHERE community_id = $1 AND id = $2 AND channel = $3 \
                 AND pubkey <> $4 AND kind <> $5",
            )
            .bind(community)
            .bind(id.to_bytes())
            .bind(channel)
            .bind(relay_key.to_bytes())
            .bind(i64::from(protocol::workflow::DEFINITION_KIND)),
        )
        .await?;
    }
    Ok(())
}

/// NIP-29 `previous` tags: each names (by its first 8 hex characters) one
/// of the channel's last [`PREVIOUS_WINDOW`] events; an event naming any
/// other is refused, as it was written against a history this channel
/// does not have (a fork, or a copy from another relay).
async fn check_previous(
    tx: &mut Tx<'_>,
    community: &str,
    channel: &str,
    event: &Event,
) -> Result<Option<String>, StoreError> {
    let named: Vec<&str> = event
        .tags
        .iter()
        .filter(|t| t.kind() == "previous")
        .flat_map(|t| t.as_slice().iter().skip(1).map(String::as_str))
        .collect();
    if named.is_empty() {
        return Ok(None);
    }
    let q = Q::new(format!(
        "SELECT id FROM events WHERE community_id = $1 AND channel = $2 \
         ORDER BY created_at DESC LIMIT {PREVIOUS_WINDOW}"
    ))
    .bind(community)
    .bind(channel);
    let recent: Vec<String> = tx
        .all(q)
        .await?
        .iter()
        .map(|r| r.id32("id").map(hex::encode))
        .collect::<Result<_, _>>()?;
    let unknown = named
        .iter()
        .find(|p| p.len() < 8 || !recent.iter().any(|id| id.starts_with(&p.to_ascii_lowercase())));
    Ok(unknown.map(|p| {
        format!(
            "invalid: previous {p:?} is not one of the last {PREVIOUS_WINDOW} events of channel {channel}"
        )
    }))
}

/// Creates the channel of a 9007, its author its first admin.
async fn create(
    tx: &mut Tx<'_>,
    community: &str,
    channel: &str,
    event: &Event,
    now: i64,
) -> Result<(), StoreError> {
    tx.exec(
        Q::new(
            "INSERT INTO channels (community_id, id, creator, name, about, picture, private, closed, created_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        )
        .bind(community)
        .bind(channel)
        .bind(event.pubkey.to_bytes())
        .bind(tag_value(event, "name").unwrap_or_default())
        .bind(tag_value(event, "about").unwrap_or_default())
        .bind(tag_value(event, "picture").unwrap_or_default())
        .bind(has_flag(event, "private"))
        .bind(has_flag(event, "closed"))
        .bind(now),
    )
    .await?;
    put_member(tx, community, channel, &event.pubkey, Role::Admin, now).await
}

/// A join request to a closed channel waits for an admin.
async fn request_to_join(
    tx: &mut Tx<'_>,
    community: &str,
    channel: &str,
    author: &PublicKey,
    now: i64,
) -> Result<(), StoreError> {
    tx.exec(
        Q::new(
            "INSERT INTO channel_join_requests (community_id, channel_id, pubkey, requested_at) \
             VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
        )
        .bind(community)
        .bind(channel)
        .bind(author.to_bytes())
        .bind(now),
    )
    .await?;
    Ok(())
}

/// A 9002: the fields it names change, the others stay.
async fn edit(
    tx: &mut Tx<'_>,
    community: &str,
    channel: &str,
    event: &Event,
    c: &ChannelView,
) -> Result<(), StoreError> {
    let flag = |on: &str, off: &str, was: bool| {
        if has_flag(event, on) {
            true
        } else if has_flag(event, off) {
            false
        } else {
            was
        }
    };
    tx.exec(
        Q::new(
            "UPDATE channels SET name = $3, about = $4, picture = $5, private = $6, closed = $7 \
             WHERE community_id = $1 AND id = $2",
        )
        .bind(community)
        .bind(channel)
        .bind(tag_value(event, "name").unwrap_or(&c.name))
        .bind(tag_value(event, "about").unwrap_or(&c.about))
        .bind(tag_value(event, "picture").unwrap_or(&c.picture))
        .bind(flag("private", "public", c.private))
        .bind(flag("closed", "open", c.closed)),
    )
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use nostr::prelude::{Keys, PublicKey};
    use protocol::nip29::{
        CREATE_GROUP, CREATE_INVITE, DELETE_EVENT, DELETE_GROUP, EDIT_METADATA, JOIN_REQUEST, LEAVE_REQUEST,
        PUT_USER, REMOVE_USER,
    };

    use super::{plan, ChannelView, Plan, Role};
    use crate::config::ChannelPolicy;

    fn channel(members: &[(&PublicKey, Role)]) -> ChannelView {
        ChannelView {
            id: "c".into(),
            name: String::new(),
            about: String::new(),
            picture: String::new(),
            private: false,
            closed: false,
            deleted: false,
            members: members
                .iter()
                .map(|(pk, r)| (pk.to_bytes(), *r))
                .collect::<BTreeMap<_, _>>(),
            metadata_at: 0,
        }
    }

    /// Whether the plan is a refusal whose text starts with `prefix`.
    fn refused_with(p: &Plan, prefix: &str) -> bool {
        matches!(p, Plan::Reject(m) if m.starts_with(prefix))
    }

    #[test]
    fn channel_rules() {
        let (admin, member, stranger) = (Keys::generate(), Keys::generate(), Keys::generate());
        let (admin, member, stranger) = (admin.public_key(), member.public_key(), stranger.public_key());
        let open = channel(&[(&admin, Role::Admin), (&member, Role::Member)]);
        let deleted = ChannelView {
            deleted: true,
            ..open.clone()
        };
        let policy = ChannelPolicy::default();
        let chat = protocol::workflow::MESSAGE_KIND;
        let definition = protocol::workflow::DEFINITION_KIND;
        let cases: Vec<(&str, Option<&ChannelView>, u16, &PublicKey, &str)> = vec![
            ("create a new channel", None, CREATE_GROUP, &stranger, "apply"),
            (
                "create an existing one",
                Some(&open),
                CREATE_GROUP,
                &stranger,
                "duplicate:",
            ),
            (
                "create a deleted one",
                Some(&deleted),
                CREATE_GROUP,
                &admin,
                "blocked:",
            ),
            ("post in an unknown channel", None, chat, &member, "invalid:"),
            (
                "post in a deleted channel",
                Some(&deleted),
                chat,
                &admin,
                "blocked:",
            ),
            (
                "join as a stranger",
                Some(&open),
                JOIN_REQUEST,
                &stranger,
                "apply",
            ),
            ("join as a member", Some(&open), JOIN_REQUEST, &member, "same"),
            ("leave as a member", Some(&open), LEAVE_REQUEST, &member, "apply"),
            (
                "leave as a stranger",
                Some(&open),
                LEAVE_REQUEST,
                &stranger,
                "invalid:",
            ),
            ("post as a member", Some(&open), chat, &member, "apply"),
            ("post as a stranger", Some(&open), chat, &stranger, "restricted:"),
            (
                "define a workflow as a stranger",
                Some(&open),
                definition,
                &stranger,
                "restricted:",
            ),
            (
                "define a workflow as a member",
                Some(&open),
                definition,
                &member,
                "apply",
            ),
        ];
        let mut all = cases;
        for k in [
            PUT_USER,
            REMOVE_USER,
            EDIT_METADATA,
            DELETE_EVENT,
            DELETE_GROUP,
            CREATE_INVITE,
        ] {
            all.push(("moderate as an admin", Some(&open), k, &admin, "apply"));
            all.push(("moderate as a member", Some(&open), k, &member, "restricted:"));
            all.push(("moderate as a stranger", Some(&open), k, &stranger, "restricted:"));
        }
        for (what, current, kind, author, want) in all {
            let got = plan(current, "c", kind, author, &policy);
            let ok = match want {
                "apply" => got == Plan::Apply,
                "same" => got == Plan::Duplicate,
                prefix => refused_with(&got, prefix),
            };
            assert!(ok, "{what} (kind {kind}): {got:?}, want {want}");
        }
    }

    #[test]
    fn posting_policy_names_the_kinds_that_need_membership() {
        let stranger = Keys::generate().public_key();
        let open = channel(&[]);
        let policy = ChannelPolicy {
            membership_kinds: vec![9],
            ..ChannelPolicy::default()
        };
        assert!(matches!(
            plan(Some(&open), "c", 9, &stranger, &policy),
            Plan::Reject(_)
        ));
        assert_eq!(plan(Some(&open), "c", 1, &stranger, &policy), Plan::Apply);
        // A workflow definition needs membership whatever the policy says.
        let definition = protocol::workflow::DEFINITION_KIND;
        assert!(matches!(
            plan(Some(&open), "c", definition, &stranger, &policy),
            Plan::Reject(_)
        ));
    }
}
