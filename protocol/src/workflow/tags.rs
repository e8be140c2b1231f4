//! What a run's cause is, and the exact tags of a workflow message and
//! of a wake hint (docs/protocol.md, "The workflow message" and "Wake
//! hints"); shared by the relay (which signs) and the agent (which
//! verifies).

use nostr::prelude::{Event, PublicKey, Tag};
use serde::{Deserialize, Serialize};

use super::MESSAGE_VERSION;
use crate::api::CauseKind;
use crate::template::Template;

/// What caused a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cause {
    /// `event`, `webhook`, `schedule` or `manual`.
    #[serde(rename = "type")]
    pub kind: CauseKind,
    /// Trigger event id, webhook request id, schedule slot, or manual request id.
    pub id: String,
}

/// Everything that identifies one workflow message.
#[derive(Debug, Clone)]
pub struct MessageBinding<'a> {
    pub channel: &'a str,
    pub definition_event_id: &'a str,
    pub step_id: &'a str,
    pub run_id: &'a str,
    pub owner: &'a PublicKey,
    pub cause: &'a Cause,
    pub recipients: &'a [PublicKey],
    /// Trigger event to thread under (NIP-10), when the step replies in thread.
    pub reply_to: Option<&'a str>,
}

/// The exact tags of a workflow message (docs/protocol.md, "The workflow message").
pub fn message_tags(b: &MessageBinding<'_>) -> Vec<Tag> {
    let mut tags = vec![
        Tag::custom("h", [b.channel]),
        Tag::custom("workflow-definition", [b.definition_event_id, b.step_id]),
        Tag::custom("workflow-run", [b.run_id]),
        Tag::custom("workflow-step", [b.step_id]),
        Tag::custom("workflow-owner", [b.owner.to_hex()]),
        Tag::custom("workflow-cause", [b.cause.kind.as_str(), b.cause.id.as_str()]),
    ];
    for p in b.recipients {
        tags.push(Tag::custom("p", [p.to_hex()]));
    }
    if let Some(e) = b.reply_to {
        tags.push(Tag::custom("e", [e, "", "root"]));
    }
    tags.push(Tag::custom("workflow", [MESSAGE_VERSION]));
    tags
}

/// Recipients of a step: the owner, then every literal mention, once each.
pub fn recipients(owner: &PublicKey, template: &Template) -> Vec<PublicKey> {
    let mut out = vec![*owner];
    for pk in crate::template::mentions(template) {
        if !out.contains(&pk) {
            out.push(pk);
        }
    }
    out
}

/// Tag values of an event by name (first value of each).
pub fn tag_values<'e>(event: &'e Event, name: &str) -> Vec<&'e str> {
    event
        .tags
        .iter()
        .filter(|t| t.kind() == name)
        .filter_map(|t| t.content())
        .collect()
}

/// The whole tag by name (first one), as a slice.
pub fn tag_slice<'e>(event: &'e Event, name: &str) -> Option<&'e [String]> {
    event.tags.iter().find(|t| t.kind() == name).map(|t| t.as_slice())
}

/// Tags of a wake hint (kind 24620, docs/protocol.md, "Wake hints").
pub fn wake_tags(
    target: &PublicKey,
    channel: &str,
    delivery_id: &str,
    definition_event_id: &str,
    run_id: &str,
    step_id: &str,
    message_event_id: &str,
) -> Vec<Tag> {
    vec![
        Tag::custom("p", [target.to_hex()]),
        Tag::custom("h", [channel]),
        Tag::custom("delivery", [delivery_id]),
        Tag::custom("workflow-definition", [definition_event_id]),
        Tag::custom("workflow-run", [run_id]),
        Tag::custom("workflow-step", [step_id]),
        Tag::custom("e", [message_event_id]),
    ]
}

/// Tags of a mention's status (kind 24621, docs/protocol.md, "Mentions"):
/// `["p", <sender>]`, `["h", <channel>]`, `["e", <mention>]`, `["agent",
/// <agent>]`, `["status", queued|working]`, `["delivery", <id>]`.
pub fn mention_status_tags(
    sender: &str,
    channel: &str,
    message_event_id: &str,
    agent: &str,
    status: crate::api::MentionStatus,
    delivery_id: &str,
) -> Vec<Tag> {
    vec![
        Tag::custom("p", [sender]),
        Tag::custom("h", [channel]),
        Tag::custom("e", [message_event_id]),
        Tag::custom("agent", [agent]),
        Tag::custom("status", [status.as_str()]),
        Tag::custom("delivery", [delivery_id]),
    ]
}
