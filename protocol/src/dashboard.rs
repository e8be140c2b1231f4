//! What the dashboard (`/ui`) reads, as types: the answers of the
//! read-only calls it makes with NIP-98 (`GET /overview`, `/workflows`,
//! `/workflows/<id>`, `/agents`, `/channels`). An admin of the community
//! sees all of it; a workflow's owner only what its workflows (and its
//! agents, and the channels it is a member of) touch.

use serde::{Deserialize, Serialize};

use crate::api::RunStatus;
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
    /// How its latest runs ended, and how long they took.
    pub stats: RunStats,
}

/// A workflow's latest ended runs (at most `RUN_STATS_WINDOW`, newest
/// first): how each ended, and how long the completed ones took, from
/// creation to their last step's end (nearest-rank percentiles, seconds).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunStats {
    /// Ended runs looked at.
    pub ended: u64,
    pub completed: u64,
    pub failed: u64,
    pub cancelled: u64,
    /// `completed / ended` (`None`: none ended).
    pub success_rate: Option<f64>,
    pub p50_secs: Option<i64>,
    pub p95_secs: Option<i64>,
    pub max_secs: Option<i64>,
}

/// Ended runs a workflow's `RunStats` reads, at most.
pub const RUN_STATS_WINDOW: i64 = 500;

impl RunStats {
    /// From each ended run's status and duration (seconds), any order.
    pub fn of(ended: &[(RunStatus, i64)]) -> RunStats {
        let count = |want: RunStatus| ended.iter().filter(|(s, _)| *s == want).count() as u64;
        let mut took: Vec<i64> = ended
            .iter()
            .filter(|(s, _)| *s == RunStatus::Completed)
            .map(|(_, secs)| (*secs).max(0))
            .collect();
        took.sort_unstable();
        // Nearest rank: the smallest value with at least p% at or below it.
        let rank = |p: usize| -> Option<i64> {
            let n = took.len();
            (n > 0).then(|| took[(p * n).div_ceil(100).clamp(1, n) - 1])
        };
        let completed = count(RunStatus::Completed);
        RunStats {
            ended: ended.len() as u64,
            completed,
            failed: count(RunStatus::Failed),
            cancelled: count(RunStatus::Cancelled),
            success_rate: (!ended.is_empty()).then(|| completed as f64 / ended.len() as f64),
            p50_secs: rank(50),
            p95_secs: rank(95),
            max_secs: took.last().copied(),
        }
    }
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
    /// Where it takes mentions (`setmentions`): channel ids, `""` for every
    /// channel; none: its mentions are off.
    #[serde(default)]
    pub mentions: Vec<String>,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_stats_count_each_end_and_rank_completed_durations() {
        assert_eq!(
            RunStats::of(&[]),
            RunStats {
                ended: 0,
                completed: 0,
                failed: 0,
                cancelled: 0,
                success_rate: None,
                p50_secs: None,
                p95_secs: None,
                max_secs: None,
            }
        );
        let mut runs: Vec<(RunStatus, i64)> = (1..=20).map(|s| (RunStatus::Completed, s)).collect();
        runs.push((RunStatus::Failed, 1000));
        runs.push((RunStatus::Cancelled, 5000));
        runs.reverse();
        let s = RunStats::of(&runs);
        assert_eq!((s.ended, s.completed, s.failed, s.cancelled), (22, 20, 1, 1));
        assert_eq!(s.success_rate, Some(20.0 / 22.0));
        // Of 1..=20: the 10th and the 19th value; failures do not count.
        assert_eq!(
            (s.p50_secs, s.p95_secs, s.max_secs),
            (Some(10), Some(19), Some(20))
        );
        let one = RunStats::of(&[(RunStatus::Completed, 7)]);
        assert_eq!((one.p50_secs, one.p95_secs), (Some(7), Some(7)));
    }
}
