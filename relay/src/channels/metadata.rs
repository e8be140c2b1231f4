//! The relay-signed channel metadata (39000-39002): which kinds make the
//! relay sign fresh metadata, and signing and storing it in the
//! transaction that changed the channel.

use nostr::prelude::{Event, EventBuilder, Keys, Kind, Tag, Timestamp};

use crate::events::rules as events;
use crate::events::InsertOutcome;
use crate::persistence::db::{Tx, Q};
use crate::persistence::StoreError;

use super::state::{load, Published, Role};
use protocol::nip29::{
    CREATE_GROUP, EDIT_METADATA, GROUP_ADMINS, GROUP_MEMBERS, GROUP_METADATA, GROUP_ROLES, JOIN_REQUEST,
    LEAVE_REQUEST, PUT_USER, REMOVE_USER,
};

/// Whether storing an event of `kind` may make the relay sign and store
/// fresh channel metadata (39000-39002) with the community key: the kinds
/// whose `apply` arm re-publishes. Batches lock the community key up front
/// for these (`Call::lock_keys`), and only these.
pub fn republishes(kind: u16) -> bool {
    matches!(
        kind,
        PUT_USER | REMOVE_USER | EDIT_METADATA | CREATE_GROUP | JOIN_REQUEST | LEAVE_REQUEST
    )
}

/// Signs and stores fresh 39000/39001/39002 for a channel (those asked for),
/// with `created_at` strictly after the previous ones so that they replace them.
pub(crate) async fn republish(
    tx: &mut Tx<'_>,
    community: &str,
    keys: &Keys,
    channel: &str,
    now: i64,
    (meta, admins, members): (bool, bool, bool),
) -> Result<Published, StoreError> {
    let c = load(tx, community, channel)
        .await?
        .ok_or_else(|| StoreError::Corrupt("channel vanished".into()))?;
    let at = now.max(c.metadata_at + 1);
    tx.exec(
        Q::new("UPDATE channels SET metadata_at = $3 WHERE community_id = $1 AND id = $2")
            .bind(community)
            .bind(channel)
            .bind(at),
    )
    .await?;
    let d = Tag::identifier(channel);
    let mut out = Vec::new();
    let emit = |kind: u16, tags: Vec<Tag>| -> Event {
        protocol::sign::sign(
            EventBuilder::new(Kind::from_u16(kind), "")
                .tags(tags)
                .custom_created_at(Timestamp::from_secs(u64::try_from(at).unwrap_or(0))),
            keys,
        )
    };
    let mut events = Vec::new();
    if meta {
        let mut tags = vec![
            d.clone(),
            Tag::custom("name", [c.name.as_str()]),
            Tag::custom("about", [c.about.as_str()]),
        ];
        if !c.picture.is_empty() {
            tags.push(Tag::custom("picture", [c.picture.as_str()]));
        }
        tags.push(Tag::custom(
            if c.private { "private" } else { "public" },
            Vec::<String>::new(),
        ));
        tags.push(Tag::custom(
            if c.closed { "closed" } else { "open" },
            Vec::<String>::new(),
        ));
        events.push(emit(GROUP_METADATA, tags));
        events.push(emit(
            GROUP_ROLES,
            vec![
                d.clone(),
                Tag::custom(
                    "role",
                    [
                        "admin",
                        "adds and removes members, edits metadata, deletes events, creates invites",
                    ],
                ),
                Tag::custom("role", ["member", "posts in the channel"]),
            ],
        ));
    }
    let member_tags = |only_admins: bool| -> Vec<Tag> {
        let mut tags = vec![d.clone()];
        for (pk, role) in &c.members {
            if only_admins && *role != Role::Admin {
                continue;
            }
            let hexpk = hex::encode(pk);
            tags.push(if only_admins {
                Tag::custom("p", [hexpk, "admin".into()])
            } else {
                Tag::custom("p", [hexpk])
            });
        }
        tags
    };
    if admins {
        events.push(emit(GROUP_ADMINS, member_tags(true)));
    }
    if members {
        events.push(emit(GROUP_MEMBERS, member_tags(false)));
    }
    for e in events {
        let raw = serde_json::to_string(&e).map_err(|err| StoreError::Corrupt(err.to_string()))?;
        let outcome = events::insert(tx, community, &e, &raw, Some(channel))
            .await?
            .of_no_deletion();
        if outcome == InsertOutcome::Stored {
            out.push((e, raw));
        }
    }
    Ok(out)
}
