//! `request_approval`: posts the rendered text as an approval request; the
//! run waits for the first decision (a NIP-25 reaction) by an approver.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{seconds_or, Checking, OnFailure, StepKind};
use crate::approval::Decision;
use crate::workflow::{is_hex_pubkey, DefinitionError};

/// Shortest and longest wait for an approval, and its default.
pub const APPROVAL_TIMEOUT_SECS: std::ops::RangeInclusive<u64> = 60..=2_592_000;
pub const DEFAULT_APPROVAL_TIMEOUT_SECS: u64 = 86_400;
/// Most approvers named by one step (the owner is always one more).
pub const MAX_APPROVERS: usize = 32;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestApproval {
    pub id: String,
    pub text: String,
    /// Hex pubkeys that may decide, besides the owner.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub approvers: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_secs: Option<u64>,
    #[serde(default)]
    pub on_deny: OnFailure,
    #[serde(rename = "if", default, skip_serializing_if = "Option::is_none")]
    pub condition: Option<String>,
}

impl RequestApproval {
    /// How long the step waits for a decision, in seconds (its default
    /// when unset).
    pub fn timeout(&self) -> i64 {
        seconds_or(self.timeout_secs, DEFAULT_APPROVAL_TIMEOUT_SECS)
    }
}

/// A `request_approval` step's output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ApprovalOutput {
    pub decision: Decision,
    /// Who decided (hex pubkey; empty when the request timed out).
    pub by: String,
    /// The deciding reaction (hex event id; empty when the request timed
    /// out).
    pub event_id: String,
}

impl StepKind for RequestApproval {
    type Output = ApprovalOutput;

    fn id(&self) -> &str {
        &self.id
    }
    fn condition(&self) -> Option<&str> {
        self.condition.as_deref()
    }
    fn text(&self) -> Option<&str> {
        Some(&self.text)
    }
    /// An approval request is for people: no deliveries.
    fn message(&self) -> Option<(&str, bool)> {
        None
    }
    fn check(&self, at: &Checking<'_>) -> Result<(), DefinitionError> {
        at.seconds("timeout_secs", self.timeout_secs, APPROVAL_TIMEOUT_SECS)?;
        let listed = self.approvers.len() <= MAX_APPROVERS;
        if !listed || !self.approvers.iter().all(|a| is_hex_pubkey(a)) {
            let why = format!("must be at most {MAX_APPROVERS} 64-character hex pubkeys");
            return Err(at.field("approvers", why));
        }
        Ok(())
    }
}
