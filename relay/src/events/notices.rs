//! Relay-signed notices in a channel: the visible record of what the relay
//! did to a member's work (a delivery that failed for good, a workflow
//! paused). Each is a kind 9 by the community key, stored in the
//! transaction that made the change, and announced after its commit.

use nostr::prelude::{Event, EventBuilder, Keys, Kind, Tag, Timestamp};

use crate::events::rules as events;
use crate::persistence::db::Tx;
use crate::persistence::StoreError;

/// Signs and stores a notice `text` in `channel`, with `tags` after its
/// `h` tag. Returns the event and its JSON, to announce after commit.
pub async fn post(
    tx: &mut Tx<'_>,
    community: &str,
    keys: &Keys,
    channel: &str,
    text: String,
    tags: Vec<Tag>,
    now: i64,
) -> Result<(Event, String), StoreError> {
    let mut all = Vec::with_capacity(tags.len() + 1);
    all.push(Tag::custom("h", [channel]));
    all.extend(tags);
    let ev = protocol::sign::sign(
        EventBuilder::new(Kind::from_u16(protocol::workflow::MESSAGE_KIND), text)
            .tags(all)
            .custom_created_at(Timestamp::from_secs(u64::try_from(now).unwrap_or(0))),
        keys,
    );
    let raw = serde_json::to_string(&ev).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    let _stored = events::insert(tx, community, &ev, &raw, Some(channel))
        .await?
        .of_no_deletion();
    Ok((ev, raw))
}

/// The NIP-32 namespace of the relay's management notices.
pub const MANAGEMENT_NAMESPACE: &str = "nip86";

/// Signs and stores a community-wide management notice: a NIP-32 label
/// (kind 1985) by the community key, `["L", "nip86"]`, `["l", <method>,
/// "nip86"]`, the target's tag (`p` or `e`) and `["by", <actor>]`; `text`
/// says it for people. Relay processes forget their cached lists when one
/// reaches them (`AppState::publish`).
#[allow(clippy::too_many_arguments)]
pub async fn label(
    tx: &mut Tx<'_>,
    community: &str,
    keys: &Keys,
    method: &str,
    target: Option<Tag>,
    actor: &nostr::prelude::PublicKey,
    text: String,
    now: i64,
) -> Result<(Event, String), StoreError> {
    let mut tags = vec![
        Tag::custom("L", [MANAGEMENT_NAMESPACE]),
        Tag::custom("l", [method, MANAGEMENT_NAMESPACE]),
    ];
    tags.extend(target);
    tags.push(Tag::custom("by", [actor.to_hex()]));
    let ev = protocol::sign::sign(
        EventBuilder::new(Kind::from_u16(protocol::kinds::LABEL), text)
            .tags(tags)
            .custom_created_at(Timestamp::from_secs(u64::try_from(now).unwrap_or(0))),
        keys,
    );
    let raw = serde_json::to_string(&ev).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    let _stored = events::insert(tx, community, &ev, &raw, None)
        .await?
        .of_no_deletion();
    Ok((ev, raw))
}
