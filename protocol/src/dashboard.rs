//! What the dashboard (`/ui`) reads, as types: the answers of the
//! read-only calls it makes with NIP-98 (`GET /overview`, `/workflows`,
//! `/workflows/<id>`, `/agents`, `/channels`). An admin of the community
//! sees all of it; a workflow's owner only what its workflows (and its
//! agents, and the channels it is a member of) touch.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Who the caller is to the dashboard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Admin,
    Owner,
}

/// One minute of the last hour: attempts that ended in it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Minute {
    /// Unix seconds of the minute's start.
    pub at: i64,
    pub delivered: u64,
    pub failed: u64,
}

/// `GET /overview`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Overview {
    pub role: Role,
    pub pubkey: String,
    pub community: String,
    /// Deliveries by status (every status present, zero included).
    pub deliveries: Vec<(String, u64)>,
    pub oldest_pending_secs: Option<i64>,
    /// Runs by status.
    pub runs: Vec<(String, u64)>,
    /// Sixty minutes, oldest first, ending with the current one.
    pub last_hour: Vec<Minute>,
}

/// A workflow as listed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkflowSummary {
    pub id: String,
    pub name: String,
    pub channel: String,
    pub owner: String,
    pub trigger: String,
    pub enabled: bool,
    pub paused: bool,
    pub updated_at: i64,
    pub last_run_status: Option<String>,
    pub last_run_at: Option<i64>,
    pub runs: u64,
}

/// `GET /workflows/<id>`: the summary and its definition.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkflowDetail {
    #[serde(flatten)]
    pub summary: WorkflowSummary,
    pub definition_event_id: String,
    /// The definition's JSON content.
    pub definition: Value,
}

/// `GET /agents`: a registered agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentView {
    pub pubkey: String,
    pub owner: String,
    pub registered_at: i64,
    pub last_claimed_at: Option<i64>,
    /// Deliveries it holds now (claimed).
    pub in_flight: u64,
}

/// `GET /channels`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChannelSummary {
    pub id: String,
    pub name: String,
    pub private: bool,
    pub closed: bool,
    pub members: u64,
    pub workflows: u64,
}
