//! Mentions as durable work (docs/protocol.md, "Mentions"): where an
//! agent's owner turned its mentions on (the whole community or one
//! channel), and the delivery row a kind 9 that p-tags such an agent makes
//! in the transaction that stores the message, with its wake to send once
//! that commits.
//!
//! A mention's row has no workflow (`source` `mention`): its `run_id` and
//! `definition_event_id` are the message's id (the request key: the
//! unique key on run, step and target makes a message stored again create
//! nothing), its `step_id` is `mention`.

use nostr::prelude::{Event, EventBuilder, Keys, Kind, PublicKey, Tag, Timestamp};
use protocol::api::{DeliverySource, MentionStatus, MENTION_STEP};
use protocol::nip86::{MentionScope, MentionSetting, MAX_LIST_MENTIONS};
use serde_json::json;

use super::state::Published;
use crate::config::DeliveryConfig;
use crate::delivery::cancel::{cancel_open, Open};
use crate::delivery::rows::{insert_pending, NewRows};
use crate::events::notices;
use crate::events::rules::created_at_of;
use crate::persistence::db::{Tx, Q};
use crate::persistence::StoreError;
use crate::refusal::{Answer, Refusal};
use crate::workflow::definitions::{is_member, new_id};
use crate::workflow::message::eligible_agents;
use crate::workflow::triggers::is_agent;

/// Most agents one message may mention into work: the first this many
/// distinct `p` tags are looked at, the rest make nothing.
pub const MAX_MENTIONED_AGENTS: usize = 16;

/// A kind 9 stored in `channel`: one pending delivery per agent it
/// p-tags that takes mentions there, is a member, and is not its author.
/// Nothing for a message by the relay or by a managed agent (no chains of
/// agents: an agent's message never makes work for another), nor from an
/// author who is not a member. An agent over one of its caps
/// (`deliveries.mentions_*`) gets no row: the sender is told by a notice.
/// Returns the wakes and notices to announce after commit.
pub async fn on_message(
    tx: &mut Tx<'_>,
    community: &str,
    keys: &Keys,
    event: &Event,
    channel: &str,
    cfg: &DeliveryConfig,
) -> Result<Published, StoreError> {
    let mentioned = mentioned(event);
    if mentioned.is_empty() || event.pubkey == keys.public_key() {
        return Ok(Vec::new());
    }
    let targets = eligible_agents(tx, community, channel, mentioned, true).await?;
    if targets.is_empty()
        || is_agent(tx, community, &event.pubkey).await?
        || !is_member(tx, community, channel, &event.pubkey.to_bytes()).await?
    {
        return Ok(Vec::new());
    }
    let now = tx.now().await?;
    let mut published = Vec::new();
    let mut within = Vec::with_capacity(targets.len());
    for target in targets {
        match cap_reached(tx, community, &target, &event.pubkey, cfg, now).await? {
            None => within.push(target),
            Some((cap, limit)) => {
                metrics::counter!(crate::telemetry::MENTIONS_REFUSED, "cap" => cap.name()).increment(1);
                published.push(refusal(tx, community, keys, event, channel, &target, cap, limit, now).await?);
            }
        }
    }
    let rows: Vec<([u8; 32], String)> = within.into_iter().map(|t| (t, new_id())).collect();
    let made = insert_rows(tx, community, event, channel, &rows, cfg, now).await?;
    let message = event.id.to_hex();
    let sender = event.pubkey.to_hex();
    for (target, id) in rows.iter().filter(|(t, _)| made.contains(t)) {
        let Ok(target) = PublicKey::from_slice(target) else {
            continue;
        };
        let place = Place {
            channel,
            message: &message,
            sender: &sender,
        };
        published.push(wake(keys, &target, &place, id, cfg, now));
        published.push(status(
            keys,
            &place,
            &target.to_hex(),
            id,
            MentionStatus::Queued,
            now,
        ));
    }
    Ok(published)
}

/// Where a mention is: its channel, its message's id, its sender (hex).
pub struct Place<'a> {
    pub channel: &'a str,
    pub message: &'a str,
    pub sender: &'a str,
}

/// A mention's status for its sender (kind 24621, p-gated): relay-signed,
/// ephemeral, announced like any event.
pub fn status(
    keys: &Keys,
    place: &Place<'_>,
    agent: &str,
    delivery: &str,
    status: MentionStatus,
    now: i64,
) -> (Event, String) {
    let tags = protocol::workflow::mention_status_tags(
        place.sender,
        place.channel,
        place.message,
        agent,
        status,
        delivery,
    );
    ephemeral(keys, protocol::kinds::MENTION_STATUS, tags, now)
}

/// The `working` status of a mention row just claimed (`None` for a
/// workflow's row, or one whose snapshot names no sender).
pub fn working(keys: &Keys, d: &crate::delivery::rows::Delivery, now: i64) -> Option<(Event, String)> {
    if d.source != DeliverySource::Mention {
        return None;
    }
    let context: serde_json::Value = serde_json::from_str(&d.trigger_context).ok()?;
    let sender = context["author"].as_str()?;
    let message = hex::encode(d.message_event_id);
    let place = Place {
        channel: &d.channel,
        message: &message,
        sender,
    };
    Some(status(
        keys,
        &place,
        &hex::encode(d.target),
        &d.id,
        MentionStatus::Working,
        now,
    ))
}

/// A cap on the mentions one agent takes (`deliveries.mentions_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cap {
    Hour,
    Day,
    SenderHour,
}

impl Cap {
    fn name(self) -> &'static str {
        match self {
            Cap::Hour => "per_hour",
            Cap::Day => "per_day",
            Cap::SenderHour => "per_sender_per_hour",
        }
    }

    fn said(self) -> &'static str {
        match self {
            Cap::Hour => "an hour",
            Cap::Day => "a day",
            Cap::SenderHour => "an hour from one sender",
        }
    }
}

/// The first cap `target` has reached in `community` for one more
/// mention from `sender`, with its limit; `None` when it is within all.
/// Counts its mention rows of the last hour and day (rows of deleted
/// mentions are gone and do not count).
async fn cap_reached(
    tx: &mut Tx<'_>,
    community: &str,
    target: &[u8; 32],
    sender: &PublicKey,
    cfg: &DeliveryConfig,
    now: i64,
) -> Result<Option<(Cap, u32)>, StoreError> {
    let mine = "FROM workflow_agent_deliveries d WHERE d.community_id = $1 AND d.target_pubkey = $2 \
                AND d.source = 'mention' AND d.created_at >";
    let q = Q::new(format!(
        "SELECT (SELECT COUNT(*) {mine} $3) AS hour, (SELECT COUNT(*) {mine} $4) AS day, \
         (SELECT COUNT(*) {mine} $3 AND EXISTS (SELECT 1 FROM events e WHERE e.community_id = $1 \
         AND e.created_at = d.message_created_at AND e.id = d.message_event_id AND e.pubkey = $5)) AS sender"
    ));
    let q = q
        .bind(community)
        .bind(*target)
        .bind(now - 3_600)
        .bind(now - 86_400)
        .bind(sender.to_bytes());
    let Some(row) = tx.one(q).await? else {
        return Ok(None);
    };
    let reached = |n: i64, limit: u32| limit > 0 && n >= i64::from(limit);
    Ok(if reached(row.int("hour")?, cfg.mentions_per_hour) {
        Some((Cap::Hour, cfg.mentions_per_hour))
    } else if reached(row.int("day")?, cfg.mentions_per_day) {
        Some((Cap::Day, cfg.mentions_per_day))
    } else if reached(row.int("sender")?, cfg.mentions_per_sender_per_hour) {
        Some((Cap::SenderHour, cfg.mentions_per_sender_per_hour))
    } else {
        None
    })
}

/// The relay-signed notice that a mention was not passed on to `target`
/// (over `cap`): a kind 9 in the channel threaded under the message
/// (NIP-10), p-tagging its sender, with `["mention-refused", <agent>,
/// <cap>]`.
#[allow(clippy::too_many_arguments)]
async fn refusal(
    tx: &mut Tx<'_>,
    community: &str,
    keys: &Keys,
    event: &Event,
    channel: &str,
    target: &[u8; 32],
    cap: Cap,
    limit: u32,
    now: i64,
) -> Result<(Event, String), StoreError> {
    let agent = hex::encode(target);
    let text = format!(
        "Agent {agent} takes at most {limit} mentions {}: this message was not passed on to it",
        cap.said()
    );
    let id = event.id.to_hex();
    let root = event
        .tags
        .iter()
        .map(|t| t.as_slice())
        .find(|t| t.len() >= 4 && t[0] == "e" && t[3] == "root");
    let mut tags = match root {
        Some(r) => vec![
            Tag::custom("e", [r[1].as_str(), "", "root"]),
            Tag::custom("e", [id.as_str(), "", "reply"]),
        ],
        None => vec![Tag::custom("e", [id.as_str(), "", "root"])],
    };
    tags.push(Tag::custom("p", [event.pubkey.to_hex()]));
    tags.push(Tag::custom("mention-refused", [agent.as_str(), cap.name()]));
    notices::post(tx, community, keys, channel, text, tags, now).await
}

/// The message's distinct `p` values that are pubkeys, at most
/// [`MAX_MENTIONED_AGENTS`], the author's own excepted.
fn mentioned(event: &Event) -> Vec<[u8; 32]> {
    let mut out: Vec<[u8; 32]> = Vec::new();
    for p in protocol::workflow::tag_values(event, "p") {
        let Ok(pk) = PublicKey::from_hex(p) else {
            continue;
        };
        if pk != event.pubkey && !out.contains(&pk.to_bytes()) {
            out.push(pk.to_bytes());
            if out.len() == MAX_MENTIONED_AGENTS {
                break;
            }
        }
    }
    out
}

/// Inserts one pending mention row per (target, new id); returns the
/// targets whose row is new (a message stored again makes none).
async fn insert_rows(
    tx: &mut Tx<'_>,
    community: &str,
    event: &Event,
    channel: &str,
    rows: &[([u8; 32], String)],
    cfg: &DeliveryConfig,
    now: i64,
) -> Result<Vec<[u8; 32]>, StoreError> {
    let id = event.id.to_hex();
    let context = json!({
        "text": event.content,
        "author": event.pubkey.to_hex(),
        "event_id": id,
        "channel": channel,
        "cause": {"type": "event", "id": id},
    })
    .to_string();
    let conversation = conversation_of(event, channel);
    let shared = NewRows {
        workflow_id: "",
        run_id: &id,
        step_id: MENTION_STEP,
        channel,
        definition_event_id: event.id.to_bytes(),
        message_event_id: event.id.to_bytes(),
        message_created_at: created_at_of(event),
        max_attempts: i64::from(cfg.max_attempts),
        next_attempt_at: now.saturating_add(i64::from(cfg.mention_debounce_secs)),
        expires_at: now.saturating_add(i64::try_from(cfg.lifetime_secs).unwrap_or(i64::MAX)),
        trigger_context: &context,
        execution_trace: "[]",
        awaited: false,
        output_schema: None,
        priority: 0,
        concurrency: None,
        source: DeliverySource::Mention,
        conversation: &conversation,
    };
    insert_pending(tx, community, &shared, rows, now).await
}

/// The conversation a message in `channel` belongs to: its thread
/// (`<channel>/<root id>`) when it replies (NIP-10: the `e` tag marked
/// `root`, else its first `e` tag), else the channel.
fn conversation_of(event: &Event, channel: &str) -> String {
    let e_tags = || {
        event
            .tags
            .iter()
            .map(|t| t.as_slice())
            .filter(|t| t.len() >= 2 && t[0] == "e" && t[1].len() == 64)
    };
    let root = e_tags()
        .find(|t| t.get(3).is_some_and(|m| m == "root"))
        .or_else(|| e_tags().next());
    match root {
        Some(t) => format!("{channel}/{}", t[1].to_ascii_lowercase()),
        None => channel.to_string(),
    }
}

/// The wake hint of a new mention row (docs/protocol.md, "Wake hints"):
/// its row is due after the debounce, which the wake says (`due-in`).
fn wake(
    keys: &Keys,
    target: &PublicKey,
    place: &Place<'_>,
    id: &str,
    cfg: &DeliveryConfig,
    now: i64,
) -> (Event, String) {
    let message = place.message;
    let mut tags =
        protocol::workflow::wake_tags(target, place.channel, id, message, message, MENTION_STEP, message);
    if cfg.mention_debounce_secs > 0 {
        tags.push(Tag::custom("due-in", [cfg.mention_debounce_secs.to_string()]));
    }
    ephemeral(keys, protocol::kinds::WAKE_HINT, tags, now)
}

/// A relay-signed ephemeral event of `kind` with `tags`, empty content.
fn ephemeral(keys: &Keys, kind: u16, tags: Vec<Tag>, now: i64) -> (Event, String) {
    let ev = protocol::sign::sign(
        EventBuilder::new(Kind::from_u16(kind), "")
            .tags(tags)
            .custom_created_at(Timestamp::from_secs(u64::try_from(now).unwrap_or(0))),
        keys,
    );
    let raw = serde_json::to_string(&ev).expect("an event serialises");
    (ev, raw)
}

/// A member left `channel` or was removed: the open mention rows there
/// that it wrote, or that are addressed to it (an agent), are cancelled
/// (`member_removed`); a finish of one is answered 410.
pub async fn cancel_for_departed(
    tx: &mut Tx<'_>,
    community: &str,
    channel: &str,
    departed: &PublicKey,
    now: i64,
) -> Result<(), StoreError> {
    let theirs = Open::MentionsOf { channel, departed };
    cancel_open(tx, community, theirs, "member_removed", now).await?;
    Ok(())
}

/// `setmentions`: turns `scope`'s agent's mentions on or off there, for
/// its owner (or an admin); returns the setting and the notice (`None`
/// when nothing changed). The notice is a kind 9 in the channel, or a
/// label for the whole community.
pub async fn set(
    tx: &mut Tx<'_>,
    community: &str,
    keys: &Keys,
    actor: (&PublicKey, bool),
    scope: &MentionScope,
    on: bool,
) -> Answer<(MentionSetting, Option<(Event, String)>)> {
    let owner = super::agents::owner_of(tx, community, &scope.agent)
        .await?
        .ok_or(Refusal::UnknownAgent)?;
    let (by, admin) = actor;
    if !admin && owner != by.to_bytes() {
        return Err(Refusal::NotAgentOwner.into());
    }
    let channel = scope.channel.as_deref().unwrap_or("");
    if !channel.is_empty() && !live_channel(tx, community, channel).await? {
        return Err(Refusal::UnknownChannel.into());
    }
    let now = tx.now().await?;
    let changed = if on {
        let q = Q::new(
            "INSERT INTO agent_mentions (community_id, agent_pubkey, channel, by_pubkey, created_at) \
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (community_id, agent_pubkey, channel) DO NOTHING",
        );
        tx.exec(
            q.bind(community)
                .bind(scope.agent)
                .bind(channel)
                .bind(by.to_bytes())
                .bind(now),
        )
        .await?
    } else {
        let q = Q::new(
            "DELETE FROM agent_mentions WHERE community_id = $1 AND agent_pubkey = $2 AND channel = $3",
        );
        tx.exec(q.bind(community).bind(scope.agent).bind(channel)).await?
    };
    let setting = MentionSetting {
        agent: hex::encode(scope.agent),
        channel: scope.channel.clone(),
        on,
        by: Some(by.to_hex()),
        created_at: Some(now),
    };
    if changed == 0 {
        return Ok((setting, None));
    }
    let notice = notice(tx, community, keys, &setting, now).await?;
    Ok((setting, Some(notice)))
}

/// The relay-signed notice of a change of mentions.
async fn notice(
    tx: &mut Tx<'_>,
    community: &str,
    keys: &Keys,
    s: &MentionSetting,
    now: i64,
) -> Result<(Event, String), StoreError> {
    let by = s.by.clone().unwrap_or_default();
    let state = if s.on { "on" } else { "off" };
    match &s.channel {
        Some(channel) => {
            let text = format!(
                "Mentions of agent {} turned {state} in this channel by {by}",
                s.agent
            );
            let tags = vec![
                Tag::custom("nip86", ["setmentions"]),
                Tag::custom("agent", [s.agent.as_str(), state]),
                Tag::custom("by", [by.as_str()]),
            ];
            notices::post(tx, community, keys, channel, text, tags, now).await
        }
        None => {
            let text = format!(
                "Mentions of agent {} turned {state} in every channel by {by}",
                s.agent
            );
            let target = Some(Tag::custom("p", [s.agent.as_str()]));
            let actor = PublicKey::from_hex(&by).map_err(|e| StoreError::Corrupt(e.to_string()))?;
            notices::label(tx, community, keys, "setmentions", target, &actor, text, now).await
        }
    }
}

/// Whether `channel` exists here and is not deleted.
async fn live_channel(tx: &mut Tx<'_>, community: &str, channel: &str) -> Result<bool, StoreError> {
    let q = Q::new("SELECT 1 FROM channels WHERE community_id = $1 AND id = $2 AND NOT deleted");
    tx.exists(q.bind(community).bind(channel)).await
}

/// `listmentions`: where agents take mentions, oldest first (at most
/// [`MAX_LIST_MENTIONS`]); `owner` narrows to its own agents.
pub async fn list(
    tx: &mut Tx<'_>,
    community: &str,
    owner: Option<&PublicKey>,
) -> Result<Vec<MentionSetting>, StoreError> {
    let d = tx.dialect();
    let mut q = Q::new(
        "SELECT o.agent_pubkey, o.channel, o.by_pubkey, o.created_at FROM agent_mentions o \
         WHERE o.community_id = ",
    )
    .arg(d, community);
    if let Some(owner) = owner {
        q.sql.push_str(
            " AND EXISTS (SELECT 1 FROM agents a WHERE a.community_id = o.community_id \
             AND a.pubkey = o.agent_pubkey AND a.owner = ",
        );
        q = q.arg(d, owner.to_bytes());
        q.sql.push(')');
    }
    q.sql.push_str(&format!(
        " ORDER BY o.created_at, o.agent_pubkey, o.channel LIMIT {MAX_LIST_MENTIONS}"
    ));
    let rows = tx.all(q).await?;
    rows.iter()
        .map(|r| {
            let channel = r.text("channel")?;
            Ok(MentionSetting {
                agent: hex::encode(r.id32("agent_pubkey")?),
                channel: (!channel.is_empty()).then_some(channel),
                on: true,
                by: Some(hex::encode(r.id32("by_pubkey")?)),
                created_at: Some(r.int("created_at")?),
            })
        })
        .collect()
}
