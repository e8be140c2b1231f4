//! `ask_agent`: as `send_message`, then the run waits for the deliveries'
//! replies (`wait`: all or any), until its timeout.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{seconds_or, Checking, OnFailure, StepKind, Wait};
use crate::api::DeliveryStatus;
use crate::workflow::{DefinitionError, OutputSchema, DEFAULT_REVISE, MAX_REVISE};

/// Shortest and longest wait of an `ask_agent` step, and its default.
pub const ASK_TIMEOUT_SECS: std::ops::RangeInclusive<u64> = 60..=604_800;
pub const DEFAULT_ASK_TIMEOUT_SECS: u64 = 3600;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AskAgent {
    pub id: String,
    pub text: String,
    #[serde(default)]
    pub reply_in_thread: bool,
    #[serde(default)]
    pub wait: Wait,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_secs: Option<u64>,
    #[serde(default)]
    pub on_failure: OnFailure,
    #[serde(rename = "if", default, skip_serializing_if = "Option::is_none")]
    pub condition: Option<String>,
    /// The answer's shape (a JSON Schema subset, `output.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<OutputSchema>,
    /// How many times an answer that does not fit `output` is sent back
    /// to the agent with the errors (0 to 5, default 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revise: Option<u8>,
    /// Its deliveries' place in an agent's backlog (-10 to 10, default 0;
    /// higher is claimed first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i8>,
}

impl AskAgent {
    /// How long the step waits, in seconds (its default when unset).
    pub fn timeout(&self) -> i64 {
        seconds_or(self.timeout_secs, DEFAULT_ASK_TIMEOUT_SECS)
    }

    /// How many revisions an answer that does not fit may get.
    pub fn revisions(&self) -> u8 {
        self.revise.unwrap_or(DEFAULT_REVISE)
    }
}

/// How an `ask_agent` step ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum AskStatus {
    Delivered,
    Failed,
    TimedOut,
}

/// An `ask_agent` step's output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct AskOutput {
    /// The step's message (hex event id).
    pub event_id: String,
    pub status: AskStatus,
    /// The first delivered reply's text (empty when none).
    pub reply: String,
    /// Every delivery's end, in the order they ended.
    pub replies: Vec<AskReply>,
    /// With an `output`: the properties of the first delivered answer
    /// (`steps.<id>.output.<property>`).
    #[serde(flatten)]
    pub fields: serde_json::Map<String, serde_json::Value>,
}

/// One delivery of an `ask_agent` step, as its output lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct AskReply {
    /// The agent (hex pubkey).
    pub agent: String,
    pub delivery_id: String,
    #[schemars(with = "String")]
    pub status: DeliveryStatus,
    /// The reply's event id (hex), when there is one.
    pub event_id: Option<String>,
    /// The reply's text (empty when none).
    pub text: String,
}

impl StepKind for AskAgent {
    type Output = AskOutput;

    fn id(&self) -> &str {
        &self.id
    }
    fn condition(&self) -> Option<&str> {
        self.condition.as_deref()
    }
    fn text(&self) -> Option<&str> {
        Some(&self.text)
    }
    fn message(&self) -> Option<(&str, bool)> {
        Some((&self.text, self.reply_in_thread))
    }
    fn output(&self) -> Option<&OutputSchema> {
        self.output.as_ref()
    }
    fn priority(&self) -> i8 {
        self.priority.unwrap_or(crate::workflow::DEFAULT_PRIORITY)
    }
    fn check(&self, at: &Checking<'_>) -> Result<(), DefinitionError> {
        at.seconds("timeout_secs", self.timeout_secs, ASK_TIMEOUT_SECS)?;
        if let Some(why) = crate::workflow::priority_problem(self.priority) {
            return Err(at.field("priority", why));
        }
        if let Some(output) = &self.output {
            output.check().map_err(|why| at.field("output", why))?;
        }
        match self.revise {
            Some(n) if n > MAX_REVISE => return Err(at.field("revise", format!("{n} is over {MAX_REVISE}"))),
            Some(_) if self.output.is_none() => return Err(at.field("revise", "needs an output to check answers")),
            _ => {}
        }
        if at.template.is_some_and(|t| crate::template::mentions(t).is_empty()) {
            let why = "must mention at least one agent (nostr:npub1… or nostr:nprofile1…)";
            return Err(at.field("text", why));
        }
        Ok(())
    }
}
