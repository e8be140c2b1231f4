//! Workflow definitions (kind 30620) and the tags of the messages and wake
//! hints a workflow produces (docs/protocol.md, "Workflows"). Shared by the
//! relay (which validates and executes) and the agent (which verifies).

use nostr::prelude::PublicKey;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::condition::{StepShape, Ty};

mod tags;
mod validate;

pub use tags::{message_tags, recipients, tag_slice, tag_values, wake_tags, Cause, MessageBinding};
pub use validate::{check, is_hex_pubkey, parse, valid_id, validate, DefinitionError, Validated};

/// Kind of a workflow definition.
pub const DEFINITION_KIND: u16 = 30620;
/// Kind of a workflow message (NIP-29 chat message).
pub const MESSAGE_KIND: u16 = 9;
/// Value of the `workflow` tag of workflow messages.
pub const MESSAGE_VERSION: &str = "message-v1";
/// Shortest schedule interval.
pub const MIN_INTERVAL_SECS: u64 = 60;
/// Longest schedule interval (a year).
pub const MAX_INTERVAL_SECS: u64 = 366 * 24 * 3600;
/// Most steps in one workflow.
pub const MAX_STEPS: usize = 32;

/// A definition's JSON content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Definition {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default = "yes")]
    pub enabled: bool,
    pub trigger: Trigger,
    pub steps: Vec<Step>,
}

fn yes() -> bool {
    true
}

/// What starts a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "on", rename_all = "snake_case", deny_unknown_fields)]
pub enum Trigger {
    MessagePosted {
        #[serde(default)]
        filter: MessageFilter,
    },
    Webhook,
    /// Every `interval_secs`, or at each slot of `cron` (five fields) in
    /// `timezone` (IANA, default UTC): exactly one of the two.
    Schedule {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        interval_secs: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cron: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timezone: Option<String>,
    },
    Manual,
    /// A NIP-25 reaction (kind 7) in the channel on a message of the channel.
    ReactionAdded {
        #[serde(default)]
        filter: ReactionFilter,
    },
}

impl Trigger {
    /// The stored name of the trigger type.
    pub fn name(&self) -> &'static str {
        match self {
            Trigger::MessagePosted { .. } => "message_posted",
            Trigger::Webhook => "webhook",
            Trigger::Schedule { .. } => "schedule",
            Trigger::Manual => "manual",
            Trigger::ReactionAdded { .. } => "reaction_added",
        }
    }

    /// Whether a channel event (a message, a reaction) fires this trigger:
    /// its filter matches (the caller knows whether the author is an agent).
    /// Triggers that no event fires never match.
    pub fn matches_event(&self, content: &str, author: &PublicKey, author_is_agent: bool) -> bool {
        match self {
            Trigger::MessagePosted { filter } => filter.matches(content, author, author_is_agent),
            Trigger::ReactionAdded { filter } => filter.matches(content, author, author_is_agent),
            _ => false,
        }
    }
}

/// Which posted messages fire a `message_posted` workflow.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MessageFilter {
    /// Case-insensitive substring of the message text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text_contains: Option<String>,
    /// Hex pubkeys whose messages count (all when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authors: Option<Vec<String>>,
    /// Whether messages by managed agents count (they do not by default, so
    /// that an agent's reply cannot loop).
    #[serde(default)]
    pub include_agents: bool,
}

impl MessageFilter {
    /// Whether a message matches (the caller knows whether its author is an agent).
    pub fn matches(&self, text: &str, author: &PublicKey, author_is_agent: bool) -> bool {
        let text_counts = self
            .text_contains
            .as_ref()
            .is_none_or(|needle| text.to_lowercase().contains(&needle.to_lowercase()));
        text_counts
            && author_counts(
                self.authors.as_deref(),
                self.include_agents,
                author,
                author_is_agent,
            )
    }
}

/// Which reactions fire a `reaction_added` workflow.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReactionFilter {
    /// Reaction contents that count, compared exactly (all when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<Vec<String>>,
    /// Hex pubkeys whose reactions count (all when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authors: Option<Vec<String>>,
    /// Whether reactions by managed agents count (they do not by default,
    /// so that an agent reacting to a workflow's message cannot loop).
    #[serde(default)]
    pub include_agents: bool,
}

/// Most values in a filter's `content` or `authors` list.
pub const MAX_FILTER_VALUES: usize = 64;

impl ReactionFilter {
    /// Whether a reaction matches (the caller knows whether its author is an agent).
    pub fn matches(&self, content: &str, author: &PublicKey, author_is_agent: bool) -> bool {
        let content_counts = self
            .content
            .as_ref()
            .is_none_or(|list| list.iter().any(|c| c == content));
        content_counts
            && author_counts(
                self.authors.as_deref(),
                self.include_agents,
                author,
                author_is_agent,
            )
    }
}

/// Whether a filter's author rules let `author` through: agents only with
/// `include_agents`, and only listed `authors` when there is a list.
fn author_counts(
    authors: Option<&[String]>,
    include_agents: bool,
    author: &PublicKey,
    is_agent: bool,
) -> bool {
    if is_agent && !include_agents {
        return false;
    }
    let hex = author.to_hex();
    authors.is_none_or(|list| list.iter().any(|a| a.eq_ignore_ascii_case(&hex)))
}

/// Shortest and longest wait of an `ask_agent` step, and its default.
pub const ASK_TIMEOUT_SECS: std::ops::RangeInclusive<u64> = 60..=604_800;
pub const DEFAULT_ASK_TIMEOUT_SECS: u64 = 3600;
/// Shortest and longest `delay`.
pub const DELAY_SECS: std::ops::RangeInclusive<u64> = 1..=2_592_000;
/// Shortest and longest wait for an approval, and its default.
pub const APPROVAL_TIMEOUT_SECS: std::ops::RangeInclusive<u64> = 60..=2_592_000;
pub const DEFAULT_APPROVAL_TIMEOUT_SECS: u64 = 86_400;
/// Most approvers named by one step (the owner is always one more).
pub const MAX_APPROVERS: usize = 32;
/// Shortest and longest webhook call, and its default.
pub const WEBHOOK_TIMEOUT_SECS: std::ops::RangeInclusive<u64> = 1..=60;
pub const DEFAULT_WEBHOOK_TIMEOUT_SECS: u64 = 10;
/// Longest webhook URL.
pub const MAX_URL_BYTES: usize = 2048;

/// One step. Every step may carry `"if"`, a condition (CEL) that skips it
/// when false.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case", deny_unknown_fields)]
pub enum Step {
    /// Posts the rendered text; managed-agent recipients get deliveries.
    SendMessage {
        id: String,
        text: String,
        #[serde(default)]
        reply_in_thread: bool,
        #[serde(rename = "if", default, skip_serializing_if = "Option::is_none")]
        condition: Option<String>,
    },
    /// As `send_message`, then the run waits for the deliveries' replies.
    AskAgent {
        id: String,
        text: String,
        #[serde(default)]
        reply_in_thread: bool,
        #[serde(default)]
        wait: Wait,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timeout_secs: Option<u64>,
        #[serde(default)]
        on_failure: OnFailure,
        #[serde(rename = "if", default, skip_serializing_if = "Option::is_none")]
        condition: Option<String>,
    },
    /// The run waits `secs`, durably.
    Delay {
        id: String,
        secs: u64,
        #[serde(rename = "if", default, skip_serializing_if = "Option::is_none")]
        condition: Option<String>,
    },
    /// Posts the rendered text as an approval request; the run waits for
    /// the first decision (a NIP-25 reaction) by an approver.
    RequestApproval {
        id: String,
        text: String,
        /// Hex pubkeys that may decide, besides the owner.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        approvers: Vec<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timeout_secs: Option<u64>,
        #[serde(default)]
        on_deny: OnFailure,
        #[serde(rename = "if", default, skip_serializing_if = "Option::is_none")]
        condition: Option<String>,
    },
    /// An outbound HTTP call to a fixed URL.
    CallWebhook {
        id: String,
        url: String,
        #[serde(default)]
        method: HttpMethod,
        /// A JSON value whose strings are templates (a string that is one
        /// placeholder alone becomes the value it names), or one template
        /// string whose rendering must be JSON.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        body: Option<Value>,
        /// Name of an owner secret: the body's HMAC-SHA256 is sent with it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        secret: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timeout_secs: Option<u64>,
        /// Whether a call interrupted by a crash is sent again.
        #[serde(default)]
        retry: bool,
        #[serde(rename = "if", default, skip_serializing_if = "Option::is_none")]
        condition: Option<String>,
    },
}

/// The method of a `call_webhook` step.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum HttpMethod {
    #[default]
    Post,
    Put,
}

impl HttpMethod {
    pub fn as_str(self) -> &'static str {
        match self {
            HttpMethod::Post => "POST",
            HttpMethod::Put => "PUT",
        }
    }
}

/// Which replies an `ask_agent` step waits for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Wait {
    /// Every delivery ends.
    #[default]
    All,
    /// One delivery is delivered (the others are then cancelled).
    Any,
}

/// What a step that did not succeed does to its run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnFailure {
    /// The run fails.
    #[default]
    Fail,
    /// The run goes on; the step's output says what happened.
    Continue,
}

/// The wire name of a step's action.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    SendMessage,
    AskAgent,
    Delay,
    RequestApproval,
    CallWebhook,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::SendMessage => "send_message",
            Action::AskAgent => "ask_agent",
            Action::Delay => "delay",
            Action::RequestApproval => "request_approval",
            Action::CallWebhook => "call_webhook",
        }
    }

    /// The fields of this action's output, for conditions.
    pub fn output_fields(self) -> &'static [(&'static str, Ty)] {
        match self {
            Action::SendMessage => &[("event_id", Ty::String), ("text", Ty::String)],
            Action::AskAgent => &[
                ("event_id", Ty::String),
                ("status", Ty::String),
                ("reply", Ty::String),
                ("replies", Ty::List),
            ],
            Action::Delay => &[("until", Ty::Int)],
            Action::RequestApproval => &[
                ("decision", Ty::String),
                ("by", Ty::String),
                ("event_id", Ty::String),
            ],
            Action::CallWebhook => &[("status", Ty::Int), ("body", Ty::Dyn)],
        }
    }
}

impl Step {
    pub fn id(&self) -> &str {
        match self {
            Step::SendMessage { id, .. }
            | Step::AskAgent { id, .. }
            | Step::Delay { id, .. }
            | Step::RequestApproval { id, .. }
            | Step::CallWebhook { id, .. } => id,
        }
    }

    pub fn action(&self) -> Action {
        match self {
            Step::SendMessage { .. } => Action::SendMessage,
            Step::AskAgent { .. } => Action::AskAgent,
            Step::Delay { .. } => Action::Delay,
            Step::RequestApproval { .. } => Action::RequestApproval,
            Step::CallWebhook { .. } => Action::CallWebhook,
        }
    }

    /// What later steps' conditions may read of this one.
    pub fn shape(&self) -> StepShape<'_> {
        StepShape {
            id: self.id(),
            fields: self.action().output_fields(),
        }
    }

    /// The step's condition, if it has one.
    pub fn condition(&self) -> Option<&str> {
        match self {
            Step::SendMessage { condition, .. }
            | Step::AskAgent { condition, .. }
            | Step::Delay { condition, .. }
            | Step::RequestApproval { condition, .. }
            | Step::CallWebhook { condition, .. } => condition.as_deref(),
        }
    }

    /// The message template of a step that posts one (`send_message`,
    /// `ask_agent`), with whether it replies in thread.
    pub fn message(&self) -> Option<(&str, bool)> {
        match self {
            Step::SendMessage {
                text,
                reply_in_thread,
                ..
            }
            | Step::AskAgent {
                text,
                reply_in_thread,
                ..
            } => Some((text, *reply_in_thread)),
            _ => None,
        }
    }

    /// The text template of a step that posts a kind 9 (`send_message`,
    /// `ask_agent`, `request_approval`).
    pub fn text(&self) -> Option<&str> {
        match self {
            Step::SendMessage { text, .. }
            | Step::AskAgent { text, .. }
            | Step::RequestApproval { text, .. } => Some(text),
            _ => None,
        }
    }
}
