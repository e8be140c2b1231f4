//! `call_webhook`: an outbound HTTP call to a fixed URL; the run waits for
//! its answer.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{Checking, HttpMethod, StepKind};
use crate::workflow::{valid_id, DefinitionError};

/// Shortest and longest webhook call, and its default.
pub const WEBHOOK_TIMEOUT_SECS: std::ops::RangeInclusive<u64> = 1..=60;
pub const DEFAULT_WEBHOOK_TIMEOUT_SECS: u64 = 10;
/// Longest webhook URL.
pub const MAX_URL_BYTES: usize = 2048;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallWebhook {
    pub id: String,
    pub url: String,
    #[serde(default)]
    pub method: HttpMethod,
    /// A JSON value whose strings are templates (a string that is one
    /// placeholder alone becomes the value it names), or one template
    /// string whose rendering must be JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<Value>,
    /// Name of an owner secret: the body's HMAC-SHA256 is sent with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_secs: Option<u64>,
    /// Whether a call interrupted by a crash is sent again.
    #[serde(default)]
    pub retry: bool,
    #[serde(rename = "if", default, skip_serializing_if = "Option::is_none")]
    pub condition: Option<String>,
}

impl CallWebhook {
    /// How long one attempt may take, in seconds (its default when unset).
    pub fn timeout(&self) -> u64 {
        self.timeout_secs.unwrap_or(DEFAULT_WEBHOOK_TIMEOUT_SECS)
    }
}

/// A `call_webhook` step's output: the server's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct WebhookOutput {
    /// The HTTP status.
    pub status: u16,
    /// The answer's JSON, or its text when it was not JSON.
    pub body: Value,
}

impl StepKind for CallWebhook {
    type Output = WebhookOutput;

    fn id(&self) -> &str {
        &self.id
    }
    fn condition(&self) -> Option<&str> {
        self.condition.as_deref()
    }
    fn text(&self) -> Option<&str> {
        None
    }
    fn message(&self) -> Option<(&str, bool)> {
        None
    }
    fn check(&self, at: &Checking<'_>) -> Result<(), DefinitionError> {
        at.seconds("timeout_secs", self.timeout_secs, WEBHOOK_TIMEOUT_SECS)?;
        crate::webhook::check_url(&self.url).map_err(|w| at.field("url", w))?;
        if self.secret.as_deref().is_some_and(|s| !valid_id(s)) {
            return Err(at.field("secret", "must be a name [a-z0-9_-]{1,64}"));
        }
        if let Some(body) = &self.body {
            crate::webhook::check_body(body, at.earlier).map_err(|w| at.field("body", w))?;
        }
        Ok(())
    }
}
