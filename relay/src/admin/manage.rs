//! Management (NIP-86 and this relay's methods, docs/protocol.md "Management"):
//! the community's lists and NIP-11 text, and what an admin or a
//! workflow's owner does to deliveries, runs and workflows. Each change
//! and its relay-signed notice commit in one transaction: nothing changes
//! unseen, and nothing is deleted without a notice saying who did it.

use nostr::prelude::{Event, Keys, PublicKey, Tag};
use protocol::api::DeliveryStatus;
use protocol::nip86::{List, RerunDefinition, RunRerun};

use crate::admission::Bans;
use crate::config::DeliveryConfig;
use crate::delivery::machine::Event as On;
use crate::delivery::operator;
use crate::delivery::rows::Delivery;
use crate::events::notices;
use crate::persistence::db::{Tx, Q};
use crate::persistence::StoreError;
use crate::refusal::{Answer, Refusal};
use crate::workflow::definitions as workflows;

/// Most entries a community's list holds (what each relay process keeps
/// in memory is bounded by it).
pub const MAX_LIST_ENTRIES: usize = 100_000;

/// Who acts: an admin of the community, or anyone else (who may act only
/// on the workflows it owns).
#[derive(Debug, Clone, Copy)]
pub struct Actor<'a> {
    pub pubkey: &'a PublicKey,
    pub admin: bool,
}

/// A stored notice, to announce after commit.
pub type Notice = (Event, String);

/// What a community's admins set: its bans, its allow list and its NIP-11 text.
#[derive(Debug, Default, Clone)]
pub struct Moderation {
    pub bans: Bans,
    /// Pubkeys on the allow list (NIP-86 `allowpubkey`): the only authors
    /// who may publish where `access.writers_allowlist` is set.
    pub allowed: std::collections::HashSet<[u8; 32]>,
    pub name: Option<String>,
    pub description: Option<String>,
}

/// The community's bans and NIP-11 text, as stored.
pub async fn load(tx: &mut Tx<'_>, community: &str) -> Result<Moderation, StoreError> {
    let mut m = Moderation::default();
    let q = Q::new("SELECT list, value FROM moderation WHERE community_id = $1").bind(community);
    for row in tx.all(q).await? {
        let value = row.id32("value")?;
        let list = row.text("list")?;
        if list == List::BannedEvents.as_str() {
            m.bans.events.insert(value);
        } else if list == List::AllowedPubkeys.as_str() {
            m.allowed.insert(value);
        } else {
            m.bans.pubkeys.insert(value);
        }
    }
    let q = Q::new("SELECT name, description FROM community_info WHERE community_id = $1").bind(community);
    if let Some(row) = tx.one(q).await? {
        m.name = row.opt_text("name")?;
        m.description = row.opt_text("description")?;
    }
    Ok(m)
}

/// The entries of one list, oldest first: (value, reason).
pub async fn entries(
    tx: &mut Tx<'_>,
    community: &str,
    list: List,
) -> Result<Vec<([u8; 32], String)>, StoreError> {
    let q = Q::new(
        "SELECT value, reason FROM moderation WHERE community_id = $1 AND list = $2 \
         ORDER BY created_at, value LIMIT $3",
    )
    .bind(community)
    .bind(list.as_str())
    .bind(MAX_LIST_ENTRIES as i64);
    let rows = tx.all(q).await?;
    rows.iter()
        .map(|r| Ok((r.id32("value")?, r.text("reason")?)))
        .collect()
}

/// Adds `value` to `list` (again: its reason replaced). Banning a pubkey
/// takes it off the allow list and allowing one lifts its ban; a banned
/// event is removed from the store (a banned definition's workflow is
/// deleted, as by NIP-09). Returns the notice.
pub async fn add(
    tx: &mut Tx<'_>,
    community: &str,
    keys: &Keys,
    list: List,
    value: &[u8; 32],
    reason: &str,
    actor: &PublicKey,
) -> Answer<Notice> {
    let now = tx.now().await?;
    let q = Q::new("SELECT COUNT(*) FROM moderation WHERE community_id = $1 AND list = $2")
        .bind(community)
        .bind(list.as_str());
    let count = tx.one(q).await?.map(|r| r.int(0)).transpose()?.unwrap_or(0);
    if usize::try_from(count).unwrap_or(usize::MAX) >= MAX_LIST_ENTRIES {
        return Err(Refusal::ListFull(MAX_LIST_ENTRIES).into());
    }
    tx.exec(
        Q::new(
            "INSERT INTO moderation (community_id, list, value, reason, actor, created_at) \
             VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (community_id, list, value) \
             DO UPDATE SET reason = excluded.reason, actor = excluded.actor",
        )
        .bind(community)
        .bind(list.as_str())
        .bind(*value)
        .bind(reason)
        .bind(actor.to_bytes())
        .bind(now),
    )
    .await?;
    let opposite = match list {
        List::BannedPubkeys => Some(List::AllowedPubkeys),
        List::AllowedPubkeys => Some(List::BannedPubkeys),
        List::BannedEvents => None,
    };
    if let Some(other) = opposite {
        let q = Q::new("DELETE FROM moderation WHERE community_id = $1 AND list = $2 AND value = $3")
            .bind(community)
            .bind(other.as_str())
            .bind(*value);
        tx.exec(q).await?;
    }
    let hex = hex::encode(value);
    let (method, target, text) = match list {
        List::BannedPubkeys => (
            "banpubkey",
            Tag::custom("p", [hex.as_str()]),
            format!("Pubkey {hex} banned"),
        ),
        List::AllowedPubkeys => (
            "allowpubkey",
            Tag::custom("p", [hex.as_str()]),
            format!("Pubkey {hex} allowed"),
        ),
        List::BannedEvents => {
            let q = Q::new("DELETE FROM events WHERE community_id = $1 AND id = $2")
                .bind(community)
                .bind(*value);
            tx.exec(q).await?;
            workflows::on_definition_banned(tx, community, value).await?;
            (
                "banevent",
                Tag::custom("e", [hex.as_str()]),
                format!("Event {hex} banned and removed"),
            )
        }
    };
    let text = with_reason(format!("{text} by {}", actor.to_hex()), reason);
    Ok(notices::label(tx, community, keys, method, Some(target), actor, text, now).await?)
}

fn with_reason(text: String, reason: &str) -> String {
    if reason.is_empty() {
        text
    } else {
        format!("{text}: {reason}")
    }
}

/// Which NIP-11 text `set_info` changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InfoField {
    Name,
    Description,
}

/// Sets the community's NIP-11 name or description; returns the notice.
pub async fn set_info(
    tx: &mut Tx<'_>,
    community: &str,
    keys: &Keys,
    field: InfoField,
    text: &str,
    actor: &PublicKey,
) -> Result<Notice, StoreError> {
    let now = tx.now().await?;
    tx.exec(
        Q::new(
            "INSERT INTO community_info (community_id, updated_at) VALUES ($1, $2) \
             ON CONFLICT (community_id) DO NOTHING",
        )
        .bind(community)
        .bind(now),
    )
    .await?;
    let (column, method) = match field {
        InfoField::Name => ("name", "changerelayname"),
        InfoField::Description => ("description", "changerelaydescription"),
    };
    tx.exec(
        Q::new(format!(
            "UPDATE community_info SET {column} = $2, updated_at = $3 WHERE community_id = $1"
        ))
        .bind(community)
        .bind(text)
        .bind(now),
    )
    .await?;
    let said = format!("Relay {column} set to {text:?} by {}", actor.to_hex());
    notices::label(tx, community, keys, method, None, actor, said, now).await
}

/// The tags of a channel notice of a management action: `["nip86",
/// <method>]`, `[<what>, <id>]` (`delivery`, `run` or `workflow`) and
/// `["by", <actor>]`.
fn action_tags(method: &str, what: &str, id: &str, by: &str) -> Vec<Tag> {
    vec![
        Tag::custom("nip86", [method]),
        Tag::custom(what, [id]),
        Tag::custom("by", [by]),
    ]
}

/// What a delivery action did.
pub struct DeliveryActed {
    pub status: DeliveryStatus,
    /// The row as it was before (its wake is sent after a retry).
    pub delivery: Delivery,
    /// Whether a run that had failed at the row's step waits there again.
    pub run_reopened: bool,
    pub notice: Notice,
}

/// `retrydelivery` (`retry`) or `canceldelivery`: the row as the machine
/// decides, then its run: a retried row reopens the run that failed at its
/// step; a cancelled one wakes the run waiting on it.
pub async fn act_on_delivery(
    tx: &mut Tx<'_>,
    community: &str,
    keys: &Keys,
    actor: Actor<'_>,
    id: &str,
    retry: bool,
    cfg: &DeliveryConfig,
) -> Answer<DeliveryActed> {
    let d = crate::delivery::rows::load(tx, community, id)
        .await?
        .ok_or(Refusal::NoDelivery)?;
    if !actor.admin {
        workflows::owned(tx, community, &d.workflow_id, actor.pubkey, true).await?;
    }
    let now = tx.now().await?;
    let by = actor.pubkey.to_hex();
    let (event, verb) = if retry {
        let redrive = On::Redrive {
            max_attempts: i64::from(cfg.max_attempts),
            lifetime_secs: i64::try_from(cfg.lifetime_secs).unwrap_or(i64::MAX),
        };
        (redrive, "retried")
    } else {
        (On::OperatorCancel, "cancelled")
    };
    let why = format!("cancelled by {by}");
    let status = operator::operate(tx, community, &d, event, now, &why).await?;
    let run_reopened = if retry {
        crate::workflow::views::reopen_at(tx, community, &d.run_id, &d.step_id).await?
    } else {
        if d.awaited {
            crate::delivery::deliveries::poke(tx, community, &d.run_id, &d.id).await?;
        }
        false
    };
    let text = format!(
        "Delivery {id} (workflow {}, run {}, step {}) {verb} by {by}",
        d.workflow_id, d.run_id, d.step_id
    );
    let method = if retry { "retrydelivery" } else { "canceldelivery" };
    let tags = action_tags(method, "delivery", id, &by);
    let notice = notices::post(tx, community, keys, &d.channel, text, tags, now).await?;
    Ok(DeliveryActed {
        status,
        delivery: d,
        run_reopened,
        notice,
    })
}

/// The workflow and channel of a run `actor` may act on: any run for an
/// admin, else one of a workflow it owns while a member of its channel.
async fn run_of(
    tx: &mut Tx<'_>,
    community: &str,
    actor: Actor<'_>,
    run_id: &str,
) -> Answer<(String, String)> {
    let (workflow_id, channel, _) = crate::workflow::views::place_of(tx, community, run_id)
        .await?
        .ok_or(Refusal::UnknownRun)?;
    if !actor.admin {
        workflows::owned(tx, community, &workflow_id, actor.pubkey, true).await?;
    }
    Ok((workflow_id, channel))
}

/// `cancelrun`: the run and its open deliveries; returns the notice.
pub async fn cancel_run(
    tx: &mut Tx<'_>,
    community: &str,
    keys: &Keys,
    actor: Actor<'_>,
    run_id: &str,
) -> Answer<Notice> {
    let (workflow_id, channel) = run_of(tx, community, actor, run_id).await?;
    let by = actor.pubkey.to_hex();
    crate::workflow::views::cancel_by(tx, community, run_id, &format!("cancelled by {by}")).await?;
    let now = tx.now().await?;
    let text = format!("Run {run_id} of workflow {workflow_id} cancelled by {by}");
    let tags = action_tags("cancelrun", "run", run_id, &by);
    Ok(notices::post(tx, community, keys, &channel, text, tags, now).await?)
}

/// `rerunrun`: a failed or cancelled run rerun from the step it ended at
/// (`workflow::rerun`); the answer, and the notice linking both runs when
/// this call made the rerun (asked again, it makes and posts nothing).
pub async fn rerun_run(
    tx: &mut Tx<'_>,
    community: &str,
    keys: &Keys,
    actor: Actor<'_>,
    run_id: &str,
    which: RerunDefinition,
) -> Answer<(RunRerun, Option<Notice>)> {
    let (workflow_id, _) = run_of(tx, community, actor, run_id).await?;
    let r = crate::workflow::rerun::rerun(tx, community, run_id, which).await?;
    let answer = RunRerun {
        id: run_id.to_string(),
        rerun: r.run_id.clone(),
        from_step: r.from_step.clone(),
        created: r.created,
    };
    if !r.created {
        return Ok((answer, None));
    }
    let by = actor.pubkey.to_hex();
    let now = tx.now().await?;
    let text = format!(
        "Run {} reruns run {run_id} of workflow {workflow_id} from step {}, by {by}",
        r.run_id, r.from_step
    );
    let mut tags = action_tags("rerunrun", "run", run_id, &by);
    tags.push(Tag::custom("rerun", [r.run_id.as_str()]));
    let notice = notices::post(tx, community, keys, &r.channel, text, tags, now).await?;
    crate::faults::check("rerun:before_commit")?;
    Ok((answer, Some(notice)))
}

/// `pauseworkflow` / `resumeworkflow`; the notice, `None` when the
/// workflow already was in that state.
pub async fn set_paused(
    tx: &mut Tx<'_>,
    community: &str,
    keys: &Keys,
    actor: Actor<'_>,
    workflow_id: &str,
    paused: bool,
) -> Answer<Option<Notice>> {
    if !actor.admin {
        workflows::owned(tx, community, workflow_id, actor.pubkey, true).await?;
    }
    let now = tx.now().await?;
    let Some(channel) = workflows::set_paused(tx, community, workflow_id, paused, now).await? else {
        return Ok(None);
    };
    let by = actor.pubkey.to_hex();
    let (verb, method) = if paused {
        ("paused", "pauseworkflow")
    } else {
        ("resumed", "resumeworkflow")
    };
    let text = format!("Workflow {workflow_id} {verb} by {by}");
    let tags = action_tags(method, "workflow", workflow_id, &by);
    Ok(Some(
        notices::post(tx, community, keys, &channel, text, tags, now).await?,
    ))
}
