//! Workflow definitions (kind 30620) and the tags of the messages and wake
//! hints a workflow produces (docs/protocol.md, "Workflows"). Shared by the
//! relay (which validates and executes) and the agent (which verifies).

use nostr::prelude::PublicKey;
use serde::{Deserialize, Serialize};

mod output;
mod shares;
mod steps;
mod tags;
mod validate;

pub use output::*;
pub use shares::*;
pub use steps::*;

pub use tags::{
    mention_status_tags, message_tags, recipients, tag_slice, tag_values, wake_tags, Cause, MessageBinding,
};
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
    /// Most of its deliveries claimed at once, all agents together
    /// (1 to [`MAX_CONCURRENCY`]; none: no cap of its own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<u32>,
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
