//! Workflow definitions: stored revisions (a replaced one kept,
//! superseded), the reaction to a deletion, pause and cancellation, owners'
//! webhook secrets, each change inside one transaction. What starts a run
//! is `triggers.rs`; executing its steps is `runs.rs`.

use nostr::prelude::{Event, Keys, PublicKey, Tag};
use protocol::workflow::{self, Definition, Trigger, Validated};

use crate::delivery::cancel::{cancel_open, Open};
use crate::events::rules as events;
use crate::events::rules::Deleted;
use crate::events::InsertOutcome;
use crate::persistence::db::{Row, Tx, Q};
use crate::persistence::StoreError;
use crate::refusal::{Answer, Refusal};

/// A new id of a run or a delivery row: 32 hex characters, the first 12
/// the creation time in unix milliseconds (big-endian, as UUIDv7), the
/// other 20 random (80 bits). Ids made together sort together, so a
/// step's 50 new rows, and the attempts and finishes that follow them,
/// land at the end of the trees keyed by id instead of at 50 random places
/// of each (docs/performance.md: WAL frames a delivery). Nothing reads the
/// time back: the rows keep their own `created_at`.
pub fn new_id() -> String {
    let mut id = [0_u8; ID_BYTES];
    id[..TIME_BYTES].copy_from_slice(&crate::clock::unix_now_ms().to_be_bytes()[8 - TIME_BYTES..]);
    id[TIME_BYTES..].copy_from_slice(&rand::random::<[u8; ID_BYTES - TIME_BYTES]>());
    hex::encode(id)
}

/// Bytes of an id ([`new_id`]), and of its leading time (48 bits of
/// milliseconds: until the year 10889).
const ID_BYTES: usize = 16;
const TIME_BYTES: usize = 6;

pub(crate) struct WorkflowRow {
    pub(crate) id: String,
    pub(crate) channel: String,
    pub(crate) owner: [u8; 32],
    pub(crate) definition_event_id: [u8; 32],
    pub(crate) enabled: bool,
    pub(crate) deleted: bool,
    /// `pauseworkflow`: no new runs; open work held (`resumeworkflow`).
    pub(crate) paused: bool,
}

pub(crate) fn workflow_row(r: &Row) -> Result<WorkflowRow, StoreError> {
    Ok(WorkflowRow {
        id: r.text("id")?,
        channel: r.text("channel")?,
        owner: r.id32("owner")?,
        definition_event_id: r.id32("definition_event_id")?,
        enabled: r.bool("enabled")?,
        deleted: r.bool("deleted")?,
        paused: r.bool("paused")?,
    })
}

pub(crate) const WORKFLOW_COLS: &str = "id, channel, owner, definition_event_id, enabled, deleted, paused";

pub(crate) async fn load_workflow(
    tx: &mut Tx<'_>,
    community: &str,
    id: &str,
) -> Result<Option<WorkflowRow>, StoreError> {
    let q = Q::new(format!(
        "SELECT {WORKFLOW_COLS} FROM workflows WHERE community_id = $1 AND id = $2"
    ))
    .bind(community)
    .bind(id);
    tx.one(q).await?.as_ref().map(workflow_row).transpose()
}

/// Loads the definition a revision id names (superseded revisions included).
pub(crate) async fn load_definition(
    tx: &mut Tx<'_>,
    community: &str,
    event_id: &[u8; 32],
) -> Result<Option<Definition>, StoreError> {
    let row = tx
        .one(
            Q::new("SELECT raw FROM events WHERE community_id = $1 AND id = $2")
                .bind(community)
                .bind(*event_id),
        )
        .await?;
    let Some(row) = row else { return Ok(None) };
    let event: Event = serde_json::from_str(&row.text(0)?)
        .map_err(|e| StoreError::Corrupt(format!("stored definition: {e}")))?;
    Ok(workflow::parse(&event.content).ok())
}

/// What recording a definition revision came to.
#[derive(Debug, PartialEq, Eq)]
pub enum Upsert {
    Recorded,
    /// The revision must be refused (the caller rolls back): the client's
    /// answer.
    Refused(String),
}

/// Records a definition revision that was just stored in `tx`.
pub async fn upsert_definition(
    tx: &mut Tx<'_>,
    community: &str,
    event: &Event,
    v: &Validated,
) -> Result<Upsert, StoreError> {
    let now = tx.now().await?;
    let existing = load_workflow(tx, community, &v.workflow_id).await?;
    let trigger = v.definition.trigger.name();
    let (interval, cron, timezone) = match &v.definition.trigger {
        Trigger::Schedule {
            interval_secs,
            cron,
            timezone,
        } => (
            interval_secs.map(|s| i64::try_from(s).unwrap_or(i64::MAX)),
            cron.clone(),
            timezone.clone(),
        ),
        _ => (None, None, None),
    };
    match existing {
        Some(w) if w.owner != event.pubkey.to_bytes() => {
            return Ok(Upsert::Refused(format!(
                "restricted: workflow id {} belongs to another owner",
                v.workflow_id
            )))
        }
        Some(w) if w.channel != v.channel => {
            return Ok(Upsert::Refused(format!(
                "invalid: workflow {} belongs to channel {}",
                v.workflow_id, w.channel
            )))
        }
        Some(w) => {
            let was_live = w.enabled && !w.deleted;
            tx.exec(
                Q::new(
                    "UPDATE workflows SET definition_event_id = $3, trigger = $4, interval_secs = $5, enabled = $6, \
                     cron = $9, timezone = $10, \
                     deleted = FALSE, updated_at = $7, enabled_at = CASE WHEN $8 THEN enabled_at ELSE $7 END \
                     WHERE community_id = $1 AND id = $2",
                )
                .bind(community)
                .bind(v.workflow_id.as_str())
                .bind(event.id.to_bytes())
                .bind(trigger)
                .bind(interval)
                .bind(v.definition.enabled)
                .bind(now)
                .bind(was_live)
                .bind(cron.clone())
                .bind(timezone.clone()),
            )
            .await?;
            if !v.definition.enabled {
                cancel_workflow(tx, community, &v.workflow_id).await?;
            }
        }
        None => {
            tx.exec(
                Q::new(
                    "INSERT INTO workflows (community_id, id, channel, owner, definition_event_id, trigger, \
                     interval_secs, enabled, enabled_at, updated_at, cron, timezone) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $9, $10, $11)",
                )
                .bind(community)
                .bind(v.workflow_id.as_str())
                .bind(v.channel.as_str())
                .bind(event.pubkey.to_bytes())
                .bind(event.id.to_bytes())
                .bind(trigger)
                .bind(interval)
                .bind(v.definition.enabled)
                .bind(now)
                .bind(cron)
                .bind(timezone),
            )
            .await?;
        }
    }
    Ok(Upsert::Recorded)
}

/// Stores an event under the event rules (`events::insert`) and, for a
/// stored deletion, runs the workflows' reaction: a deleted definition
/// (by id or by address) deletes its workflow and cancels its runs and
/// open deliveries, in the same transaction.
pub async fn insert_event(
    tx: &mut Tx<'_>,
    community: &str,
    event: &Event,
    raw: &str,
    channel: Option<&str>,
) -> Result<InsertOutcome, StoreError> {
    let inserted = events::insert(tx, community, event, raw, channel).await?;
    on_deleted(tx, community, &event.pubkey, &inserted.deleted).await?;
    Ok(inserted.outcome)
}

/// The workflows' reaction to what a deletion by `author` named.
async fn on_deleted(
    tx: &mut Tx<'_>,
    community: &str,
    author: &PublicKey,
    deleted: &Deleted,
) -> Result<(), StoreError> {
    for id in &deleted.ids {
        on_definition_deleted(tx, community, author, Some(*id), None).await?;
    }
    for (kind, d) in &deleted.addresses {
        if *kind == workflow::DEFINITION_KIND {
            on_definition_deleted(tx, community, author, None, Some(d)).await?;
        }
    }
    Ok(())
}

/// A NIP-09 deletion by `author` of a definition (by id or by address):
/// the workflow stops firing and its pending work is cancelled.
async fn on_definition_deleted(
    tx: &mut Tx<'_>,
    community: &str,
    author: &PublicKey,
    by_id: Option<[u8; 32]>,
    by_workflow_id: Option<&str>,
) -> Result<(), StoreError> {
    let q = match (by_id, by_workflow_id) {
        (Some(id), _) => Q::new(
            "SELECT id FROM workflows WHERE community_id = $1 AND owner = $2 AND definition_event_id = $3",
        )
        .bind(community)
        .bind(author.to_bytes())
        .bind(id),
        (None, Some(w)) => {
            Q::new("SELECT id FROM workflows WHERE community_id = $1 AND owner = $2 AND id = $3")
                .bind(community)
                .bind(author.to_bytes())
                .bind(w)
        }
        (None, None) => return Ok(()),
    };
    for row in tx.all(q).await? {
        let id = row.text(0)?;
        tx.exec(
            Q::new("UPDATE workflows SET deleted = TRUE WHERE community_id = $1 AND id = $2")
                .bind(community)
                .bind(id.as_str()),
        )
        .await?;
        cancel_workflow(tx, community, &id).await?;
    }
    Ok(())
}

/// Cancels a workflow's running runs and open deliveries.
pub async fn cancel_workflow(tx: &mut Tx<'_>, community: &str, workflow_id: &str) -> Result<(), StoreError> {
    let now = tx.now().await?;
    tx.exec(
        Q::new(
            "UPDATE workflow_runs SET status = 'cancelled', error = 'workflow disabled or deleted', \
             error_code = 'workflow_disabled', updated_at = $3 \
             WHERE community_id = $1 AND workflow_id = $2 AND status IN ('running', 'waiting')",
        )
        .bind(community)
        .bind(workflow_id)
        .bind(now),
    )
    .await?;
    cancel_open(
        tx,
        community,
        Open::Workflow(workflow_id),
        "workflow_disabled",
        now,
    )
    .await?;
    Ok(())
}

/// Pauses the workflows `departed` owns in `channel` (removed by an admin,
/// or left): they stop firing, their running runs and open deliveries are
/// cancelled, and the channel sees one relay-signed notice per workflow
/// (tag `["workflow-paused", <workflow id>, "owner_not_member"]`). The
/// owner resumes one by publishing its definition again once a member.
/// Returns the notices, to announce after commit.
pub async fn pause_for_departed(
    tx: &mut Tx<'_>,
    community: &str,
    keys: &Keys,
    channel: &str,
    departed: &PublicKey,
    now: i64,
) -> Result<Vec<(Event, String)>, StoreError> {
    let rows = tx
        .all(
            Q::new(
                "SELECT id FROM workflows WHERE community_id = $1 AND channel = $2 AND owner = $3 \
                 AND enabled AND NOT deleted ORDER BY id",
            )
            .bind(community)
            .bind(channel)
            .bind(departed.to_bytes()),
        )
        .await?;
    let mut notices = Vec::with_capacity(rows.len());
    for row in rows {
        let id = row.text(0)?;
        tx.exec(
            Q::new(
                "UPDATE workflows SET enabled = FALSE, updated_at = $3 WHERE community_id = $1 AND id = $2",
            )
            .bind(community)
            .bind(id.as_str())
            .bind(now),
        )
        .await?;
        cancel_workflow(tx, community, &id).await?;
        let text = format!(
            "Workflow {id} is paused: its owner {} is no longer a member of this channel",
            departed.to_hex()
        );
        let tags = vec![
            Tag::custom("workflow-paused", [id.as_str(), Refusal::OwnerNotMember.code()]),
            Tag::custom("workflow-owner", [departed.to_hex()]),
        ];
        notices.push(crate::events::notices::post(tx, community, keys, channel, text, tags, now).await?);
    }
    Ok(notices)
}

/// Cancels everything of a deleted channel.
pub async fn cancel_channel(tx: &mut Tx<'_>, community: &str, channel: &str) -> Result<(), StoreError> {
    let now = tx.now().await?;
    tx.exec(
        Q::new(
            "UPDATE workflows SET deleted = TRUE, updated_at = $3 WHERE community_id = $1 AND channel = $2",
        )
        .bind(community)
        .bind(channel)
        .bind(now),
    )
    .await?;
    tx.exec(
        Q::new(
            "UPDATE workflow_runs SET status = 'cancelled', error = 'channel deleted', \
             error_code = 'channel_deleted', updated_at = $3 \
             WHERE community_id = $1 AND channel = $2 AND status IN ('running', 'waiting')",
        )
        .bind(community)
        .bind(channel)
        .bind(now),
    )
    .await?;
    cancel_open(tx, community, Open::Channel(channel), "channel_deleted", now).await?;
    Ok(())
}

/// Pauses or resumes a live workflow (`pauseworkflow`, `resumeworkflow`):
/// paused, it starts no run and its runs' steps wait; open deliveries stay
/// open. Resumed, it fires from now on (a schedule's slots that passed
/// while it was paused do not fire). Returns its channel, or `None` when
/// it already was in that state.
pub async fn set_paused(
    tx: &mut Tx<'_>,
    community: &str,
    id: &str,
    paused: bool,
    now: i64,
) -> Answer<Option<String>> {
    let w = load_workflow(tx, community, id)
        .await?
        .ok_or(Refusal::UnknownWorkflow)?;
    if !w.enabled || w.deleted {
        return Err(Refusal::WorkflowDisabled.into());
    }
    if w.paused == paused {
        return Ok(None);
    }
    let q = Q::new(
        "UPDATE workflows SET paused = $3, updated_at = $4, \
         enabled_at = CASE WHEN $3 THEN enabled_at ELSE $4 END WHERE community_id = $1 AND id = $2",
    )
    .bind(community)
    .bind(id)
    .bind(paused)
    .bind(now);
    tx.exec(q).await?;
    Ok(Some(w.channel))
}

/// A definition an admin banned (`banevent`) is gone: its workflow is
/// deleted and its open work cancelled, as a NIP-09 deletion does.
pub async fn on_definition_banned(
    tx: &mut Tx<'_>,
    community: &str,
    event_id: &[u8; 32],
) -> Result<(), StoreError> {
    let q = Q::new("SELECT owner FROM workflows WHERE community_id = $1 AND definition_event_id = $2")
        .bind(community)
        .bind(*event_id);
    for row in tx.all(q).await? {
        let owner = PublicKey::from_slice(&row.blob(0)?).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        on_definition_deleted(tx, community, &owner, Some(*event_id), None).await?;
    }
    Ok(())
}

/// Whether `owner` owns a workflow in the community (deleted ones aside).
pub async fn owns_any(tx: &mut Tx<'_>, community: &str, owner: &PublicKey) -> Result<bool, StoreError> {
    let q = Q::new("SELECT 1 FROM workflows WHERE community_id = $1 AND owner = $2 AND NOT deleted LIMIT 1")
        .bind(community)
        .bind(owner.to_bytes());
    tx.exists(q).await
}

/// Whether `caller` owns the workflow, and with `member`, is also a member
/// of its channel now (an owner who left, or was removed, no longer sees
/// its runs: they hold the channel's messages).
pub async fn owned(
    tx: &mut Tx<'_>,
    community: &str,
    workflow_id: &str,
    caller: &PublicKey,
    member: bool,
) -> Answer<()> {
    let refused = match load_workflow(tx, community, workflow_id).await? {
        None => Refusal::UnknownWorkflow,
        Some(w) if w.owner != caller.to_bytes() => Refusal::NotOwner,
        Some(w) if member && !is_member(tx, community, &w.channel, &w.owner).await? => Refusal::OwnerLeft,
        Some(_) => return Ok(()),
    };
    Err(refused.into())
}

/// Stores the hash of a new webhook secret (rotating any previous one).
pub async fn set_webhook_secret(
    tx: &mut Tx<'_>,
    community: &str,
    workflow_id: &str,
    hash_hex: &str,
) -> Result<(), StoreError> {
    tx.exec(
        Q::new("UPDATE workflows SET webhook_secret_hash = $3 WHERE community_id = $1 AND id = $2")
            .bind(community)
            .bind(workflow_id)
            .bind(hash_hex),
    )
    .await?;
    Ok(())
}

/// The webhook secret hash and trigger of a workflow.
pub async fn webhook_target(
    tx: &mut Tx<'_>,
    community: &str,
    workflow_id: &str,
) -> Result<Option<(Option<String>, String, bool)>, StoreError> {
    let row = tx
        .one(
            Q::new(
                "SELECT webhook_secret_hash, trigger, enabled AND NOT deleted AS live FROM workflows \
                 WHERE community_id = $1 AND id = $2",
            )
            .bind(community)
            .bind(workflow_id),
        )
        .await?;
    row.map(|r| {
        Ok((
            r.opt_text("webhook_secret_hash")?,
            r.text("trigger")?,
            r.bool("live")?,
        ))
    })
    .transpose()
}

/// The trigger type of a workflow.
pub async fn trigger_of(
    tx: &mut Tx<'_>,
    community: &str,
    workflow_id: &str,
) -> Result<Option<String>, StoreError> {
    let row = tx
        .one(
            Q::new("SELECT trigger FROM workflows WHERE community_id = $1 AND id = $2")
                .bind(community)
                .bind(workflow_id),
        )
        .await?;
    row.map(|r| r.text(0)).transpose()
}

/// Whether `owner` is a member of `channel` now.
pub async fn is_member(
    tx: &mut Tx<'_>,
    community: &str,
    channel: &str,
    owner: &[u8; 32],
) -> Result<bool, StoreError> {
    tx.exists(
        Q::new("SELECT 1 FROM channel_members WHERE community_id = $1 AND channel_id = $2 AND pubkey = $3")
            .bind(community)
            .bind(channel)
            .bind(*owner),
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::new_id;
    use crate::clock::unix_now_ms;

    /// The time an id says it was made at.
    fn made_at_ms(id: &str) -> u64 {
        u64::from_str_radix(&id[..12], 16).unwrap()
    }

    #[test]
    fn ids_lead_with_their_time_and_differ_within_it() {
        let before = unix_now_ms();
        let (a, b) = (new_id(), new_id());
        let after = unix_now_ms();
        for id in [&a, &b] {
            assert_eq!(id.len(), 32, "{id}");
            assert!(
                id.bytes()
                    .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()),
                "{id}"
            );
            assert!(
                (before..=after).contains(&made_at_ms(id)),
                "{id} made in {before}..={after}"
            );
        }
        assert_ne!(a[12..], b[12..], "the random parts differ");
        std::thread::sleep(std::time::Duration::from_millis(2));
        let later = new_id();
        assert!(later > a && later > b, "{later} sorts after {a} and {b}");
    }
}
