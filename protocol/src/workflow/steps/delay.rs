//! `delay`: the run waits `secs`, durably.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{Checking, StepKind};
use crate::workflow::DefinitionError;

/// Shortest and longest `delay`.
pub const DELAY_SECS: std::ops::RangeInclusive<u64> = 1..=2_592_000;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Delay {
    pub id: String,
    pub secs: u64,
    #[serde(rename = "if", default, skip_serializing_if = "Option::is_none")]
    pub condition: Option<String>,
}

impl Delay {
    /// When a delay that started at `started` (unix seconds) ends.
    pub fn until(&self, started: i64) -> i64 {
        started.saturating_add(i64::try_from(self.secs).unwrap_or(i64::MAX))
    }
}

/// A `delay` step's output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct DelayOutput {
    /// When the delay ended (unix seconds).
    pub until: i64,
}

impl StepKind for Delay {
    type Output = DelayOutput;

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
        at.seconds("secs", Some(self.secs), DELAY_SECS)
    }
}
