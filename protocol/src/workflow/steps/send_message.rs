//! `send_message`: posts the rendered text; managed-agent recipients get
//! deliveries (the run does not wait for them).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{Checking, StepKind};
use crate::workflow::DefinitionError;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SendMessage {
    pub id: String,
    pub text: String,
    #[serde(default)]
    pub reply_in_thread: bool,
    #[serde(rename = "if", default, skip_serializing_if = "Option::is_none")]
    pub condition: Option<String>,
    /// Its deliveries' place in an agent's backlog (-10 to 10, default 0;
    /// higher is claimed first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i8>,
}

/// A `send_message` step's output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SendMessageOutput {
    /// The posted message's event id (hex).
    pub event_id: String,
    /// The rendered text as posted.
    pub text: String,
}

impl StepKind for SendMessage {
    type Output = SendMessageOutput;

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
    fn check(&self, at: &Checking<'_>) -> Result<(), DefinitionError> {
        match crate::workflow::priority_problem(self.priority) {
            Some(why) => Err(at.field("priority", why)),
            None => Ok(()),
        }
    }
    fn priority(&self) -> i8 {
        self.priority.unwrap_or(crate::workflow::DEFAULT_PRIORITY)
    }
}
