//! The HTTP API's wire contract (docs/protocol.md, "Owner calls"
//! and "Deliveries"): every
//! request and answer body as a type, and the statuses, outcomes and
//! causes as enums whose serde names are the ones on the wire. The relay
//! answers with these types and the agent sends and reads them, so neither
//! writes a body by hand.

use nostr::prelude::Event;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Where a delivery is in its state machine (docs/protocol.md, "The state machine").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeliveryStatus {
    Pending,
    Claimed,
    Delivered,
    Failed,
    Expired,
    Cancelled,
}

/// What made a delivery: a workflow's step, or a person's mention of the
/// agent in a channel (docs/protocol.md, "Mentions").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeliverySource {
    #[default]
    Workflow,
    Mention,
}

/// What a mention's sender is told while it waits (kind 24621): its row
/// was made (`queued`: the agent has not taken it yet), or claimed
/// (`working`). The answer itself is the agent's reply; a failure, the
/// relay's notice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MentionStatus {
    Queued,
    Working,
}

/// A mention's row has no workflow: its `step_id` is this, and its
/// `run_id` and `definition_event_id` are the message's id.
pub const MENTION_STEP: &str = "mention";

/// Most deliveries one claim takes as a turn: the first due rows of the
/// claimed row's conversation, oldest message first.
pub const MAX_TURN_DELIVERIES: usize = 16;

/// What an agent says of an attempt when it finishes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    Delivered,
    Retry,
    Failed,
}

/// Whether a recorded operation only read or also changed something.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Effect {
    Read,
    Write,
}

/// Where a workflow run is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunStatus {
    Running,
    /// Its current step waits: for deliveries' replies, or a timer.
    Waiting,
    Completed,
    Failed,
    Cancelled,
}

/// Where a run's step is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StepStatus {
    /// Not reached yet.
    Pending,
    /// The run is at it and it has not begun waiting.
    Running,
    /// It waits for replies or a timer.
    Waiting,
    Done,
    /// Its condition was false (output `{"skipped": true}`).
    Skipped,
    Failed,
}

/// What started a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CauseKind {
    /// A kind 9 in the channel (`message_posted`).
    Event,
    Webhook,
    Schedule,
    Manual,
    /// A rerun of an ended run from the step it ended at (`rerunrun`;
    /// the cause id is the origin run's id, so a rerun is made once).
    Rerun,
}

/// The wire names, as SQL stores them too.
macro_rules! names {
    ($ty:ident { $($variant:ident => $name:literal),* $(,)? }) => {
        impl $ty {
            /// Every value, in declaration order.
            pub const ALL: &'static [$ty] = &[$($ty::$variant),*];

            /// The name on the wire (and in the database).
            pub fn as_str(self) -> &'static str {
                match self {
                    $($ty::$variant => $name),*
                }
            }

            /// The value named `s`, if any.
            pub fn parse(s: &str) -> Option<$ty> {
                match s {
                    $($name => Some($ty::$variant),)*
                    _ => None,
                }
            }
        }

        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

names!(DeliveryStatus {
    Pending => "pending",
    Claimed => "claimed",
    Delivered => "delivered",
    Failed => "failed",
    Expired => "expired",
    Cancelled => "cancelled",
});
names!(DeliverySource { Workflow => "workflow", Mention => "mention" });
names!(MentionStatus { Queued => "queued", Working => "working" });
names!(Outcome { Delivered => "delivered", Retry => "retry", Failed => "failed" });
names!(Effect { Read => "read", Write => "write" });
names!(RunStatus {
    Running => "running",
    Waiting => "waiting",
    Completed => "completed",
    Failed => "failed",
    Cancelled => "cancelled",
});
names!(StepStatus {
    Pending => "pending",
    Running => "running",
    Waiting => "waiting",
    Done => "done",
    Skipped => "skipped",
    Failed => "failed",
});
names!(CauseKind {
    Event => "event",
    Webhook => "webhook",
    Schedule => "schedule",
    Manual => "manual",
    Rerun => "rerun",
});

impl DeliveryStatus {
    /// Whether nothing more happens to a delivery in this status.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            DeliveryStatus::Delivered
                | DeliveryStatus::Failed
                | DeliveryStatus::Expired
                | DeliveryStatus::Cancelled
        )
    }
}

/// A refusal's body: `{"error": <code>, "message": <text>}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: String,
    pub message: String,
}

/// Bindings a claim by id expects (from the wake hint).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expected {
    pub run_id: String,
    pub step_id: String,
    pub definition_event_id: String,
    pub message_event_id: String,
    pub channel: String,
}

/// `POST /deliveries/claim`
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClaimRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivery_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected: Option<Expected>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_seconds: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub records_operations: Option<bool>,
}

/// A claimed delivery: what the agent needs to verify and do the work.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClaimedDelivery {
    pub id: String,
    pub workflow_id: String,
    pub run_id: String,
    pub step_id: String,
    pub definition_event_id: String,
    pub message_event_id: String,
    pub channel: String,
    pub target_pubkey: String,
    pub attempt: u32,
    pub claim_token: String,
    pub claim_expires_at: i64,
    pub expires_at: i64,
    /// The private trigger context (names the cause).
    pub trigger_context: Value,
    /// The run's trace as of the step.
    pub execution_trace: Value,
    /// The shape the answer must have (the step's `output`), if any: a
    /// delivered finish whose reply does not fit it is refused
    /// `output_invalid` and the step asks again (a revision).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<crate::workflow::OutputSchema>,
    /// Which revision this is: 0 for the step's message, n for its n-th
    /// revision message (tagged `["workflow-revision", "n"]`).
    #[serde(default)]
    pub revision: u32,
    /// The delivery's span in its run's trace (W3C `traceparent`): the
    /// agent's work continues the run's trace from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    /// What made it (absent: a workflow's step).
    #[serde(default)]
    pub source: DeliverySource,
    /// The conversation a mention belongs to (its channel, or
    /// `<channel>/<root event id>` in a thread); absent for a workflow's.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub conversation: String,
    /// The other deliveries this claim took with it: the due mentions of
    /// the same conversation, oldest message first, under the same token
    /// and lease. The agent answers them as one turn and finishes them
    /// together (`FinishRequest::turn`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub turn: Vec<TurnPart>,
}

/// A delivery claimed with another as one turn: what differs from the
/// claimed row (its token, lease, channel, target and source are the same).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnPart {
    pub id: String,
    pub run_id: String,
    pub definition_event_id: String,
    pub message_event_id: String,
    pub attempt: u32,
    pub expires_at: i64,
    pub trigger_context: Value,
}

/// The answer to a claim: the delivery, or `null` when none was due.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClaimAnswer {
    pub delivery: Option<ClaimedDelivery>,
}

/// `POST /deliveries/<id>/renew`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RenewRequest {
    pub claim_token: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_seconds: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RenewAnswer {
    pub claim_expires_at: i64,
}

/// `POST /deliveries/<id>/operations` (record a write before doing it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OperationRequest {
    pub claim_token: String,
    pub name: String,
    pub effect: Effect,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperationAnswer {
    pub recorded: bool,
}

/// `POST /deliveries/<id>/finish`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FinishRequest {
    pub claim_token: String,
    pub outcome: Outcome,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_code: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_message: Option<String>,
    /// A kind 9 by the agent in the delivery's channel, stored with the status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply: Option<Event>,
    /// The other deliveries of the turn (claimed with this one, same
    /// token), finished with the same outcome and reply in the same
    /// transaction; at most [`MAX_TURN_DELIVERIES`]. One that is no longer
    /// the caller's to finish (deleted, cancelled, its lease over) is left
    /// as it is.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub turn: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FinishAnswer {
    pub status: DeliveryStatus,
}

/// A delivery as listed (no token, no private snapshot).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeliveryView {
    pub id: String,
    /// What made it (absent: a workflow's step).
    #[serde(default)]
    pub source: DeliverySource,
    pub workflow_id: String,
    pub run_id: String,
    pub step_id: String,
    pub channel: String,
    pub target_pubkey: String,
    pub definition_event_id: String,
    pub message_event_id: String,
    pub status: DeliveryStatus,
    pub attempt: i64,
    pub max_attempts: i64,
    pub next_attempt_at: i64,
    pub claim_expires_at: Option<i64>,
    pub expires_at: i64,
    pub failure_code: Option<String>,
    pub failure_message: Option<String>,
    pub reply_event_id: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
}

/// One attempt of a delivery: claimed, and (once over) how it ended:
/// `delivered`, `failed`, `expired`, `cancelled`, `retry` (the agent asked
/// for another attempt) or `lease_expired` (the lease ran out first).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptView {
    pub attempt: i64,
    pub claimed_at: i64,
    pub finished_at: Option<i64>,
    pub outcome: Option<String>,
    pub failure_code: Option<String>,
    /// At most 1 KiB.
    pub failure_message: Option<String>,
}

/// An operation an agent recorded in an attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperationView {
    pub attempt: i64,
    pub name: String,
    pub effect: String,
}

/// `GET /deliveries/<id>` (its target or its workflow's owner): the
/// delivery with every attempt and recorded operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeliveryDetail {
    #[serde(flatten)]
    pub delivery: DeliveryView,
    pub attempts: Vec<AttemptView>,
    pub operations: Vec<OperationView>,
}

/// `GET /deliveries`: the caller's own, newest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeliveriesPage {
    pub deliveries: Vec<DeliveryView>,
    /// Ask again with `before=<this>&before_id=<next_before_id>` for the
    /// next page.
    pub next_before: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_before_id: Option<String>,
}

/// `POST /workflows/<id>/webhook-secret`: shown once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WebhookSecret {
    pub secret: String,
}

/// `GET /healthz` and `GET /readyz`: `ok`, or `unready` with the reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Health {
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The relay's version and the commit it was built from (`/healthz`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
}

/// Longest value of a workflow secret.
pub const MAX_SECRET_BYTES: usize = 4096;

/// `PUT /workflows/<id>/secrets/<name>`: the value, never shown again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretRequest {
    pub value: String,
}

/// A secret was stored (its value is not repeated).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretStored {
    pub name: String,
    pub updated_at: i64,
}

/// A started run (`POST /workflows/<id>/runs`, `POST /hooks/<id>`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunStarted {
    pub run_id: String,
}

/// What started a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CauseView {
    #[serde(rename = "type")]
    pub kind: CauseKind,
    pub id: String,
}

/// Why a run or a step did not succeed: a stable code, a text, and (for a
/// run) the step it failed at.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunError {
    pub code: String,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
}

/// One step of a run: where it is, when it ran, what it gave.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepView {
    pub id: String,
    /// `send_message`, `ask_agent`, `delay`.
    pub action: String,
    pub status: StepStatus,
    pub started_at: Option<i64>,
    pub finished_at: Option<i64>,
    pub output: Option<Value>,
    pub error: Option<RunError>,
    /// A `request_approval` step waiting for its decision: the request to
    /// react to (`GET /runs/<id>` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<ApprovalView>,
    /// A step its condition skipped: the condition and what it read
    /// (`GET /runs/<id>` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skipped: Option<SkipView>,
    /// A `call_webhook` step's call as recorded: its latest attempt's
    /// request and answer (`GET /runs/<id>` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call: Option<CallView>,
    /// A step a rerun did not run again: the run whose result it keeps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept_from: Option<String>,
}

/// Where a webhook call's attempt is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallPhase {
    /// Recorded and being sent (or the process died while sending).
    Sending,
    /// The server answered, with any status.
    Answered,
    /// No answer: refused before sending, unreachable, timed out, too large.
    Failed,
    /// Found still sending after its deadline: the process died mid-call.
    Interrupted,
}

/// A `call_webhook` step's latest attempt: the request as sent and what
/// came back. Sizes in bytes; times in unix seconds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallView {
    pub attempt: i64,
    pub phase: CallPhase,
    /// `POST` or `PUT`.
    pub method: String,
    pub url: String,
    /// The request body as sent (JSON text, at most the step's body bound).
    pub request: String,
    pub request_bytes: u64,
    pub sent_at: i64,
    pub answered_at: Option<i64>,
    /// The HTTP status, once answered.
    pub status: Option<u16>,
    pub answer_bytes: Option<u64>,
    /// Why there is no answer (`failed`, `interrupted`).
    pub error: Option<RunError>,
}

/// Why a step was skipped: its `if`, false for this run, and the values
/// of the run's context it read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SkipView {
    pub condition: String,
    /// At most `condition::MAX_INPUTS`, in the order the condition names them.
    pub inputs: Vec<ConditionInput>,
}

/// One path a condition reads (`steps.triage.output.severity`) and its
/// value in the run (`None`: the run has nothing there); a value longer
/// than `condition::MAX_INPUT_BYTES` is cut, as text ending in `…`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConditionInput {
    pub path: String,
    pub value: Option<Value>,
}

/// An approval request waiting for its decision: a NIP-25 reaction to
/// `request_event_id` by one of `approvers` decides it (docs/workflows.md,
/// `request_approval`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalView {
    /// The request message (hex event id): the event to react to.
    pub request_event_id: String,
    /// Its text as posted.
    pub text: String,
    /// Who may decide (hex pubkeys, the owner first).
    pub approvers: Vec<String>,
    /// When it times out without a decision (unix seconds).
    pub deadline: i64,
}

/// A run as listed (`GET /workflows/<id>/runs`) and shown (`GET /runs/<id>`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunView {
    pub id: String,
    pub workflow_id: String,
    pub status: RunStatus,
    /// Index of the step the run is at (the number of steps when it completed).
    pub current_step: i64,
    pub cause: CauseView,
    pub error: Option<RunError>,
    pub created_at: i64,
    pub updated_at: i64,
    /// When a waiting run is looked at again (its timer or timeout).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wake_at: Option<i64>,
    /// Every step of the definition, in order.
    pub steps: Vec<StepView>,
    pub definition_event_id: String,
    /// Only when one run is shown: its private trigger context.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger_context: Option<Value>,
    /// Only when one run is shown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<String>,
    /// Only when one run is shown: the run that reruns this one, if any
    /// (a run is rerun at most once; rerun the rerun to go again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rerun_by: Option<String>,
    /// Only when one run is shown: its trace (W3C trace id, 32 hex
    /// digits); every webhook call and delivery of the run carries a
    /// `traceparent` in it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
}

/// `GET /workflows/<id>/runs`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunsPage {
    pub runs: Vec<RunView>,
    /// The next page: `?before=<next_before>&before_id=<next_before_id>`.
    pub next_before: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_before_id: Option<String>,
}

/// `GET /me`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Me {
    pub pubkey: String,
    pub community: String,
    pub agent_owner: Option<String>,
    pub channels: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn names_are_the_wire_names_both_ways() {
        for s in DeliveryStatus::ALL {
            assert_eq!(serde_json::to_value(s).unwrap(), json!(s.as_str()));
            assert_eq!(DeliveryStatus::parse(s.as_str()), Some(*s));
        }
        for o in Outcome::ALL {
            assert_eq!(serde_json::to_value(o).unwrap(), json!(o.as_str()));
        }
        for r in RunStatus::ALL {
            assert_eq!(serde_json::to_value(r).unwrap(), json!(r.as_str()));
        }
        for s in StepStatus::ALL {
            assert_eq!(serde_json::to_value(s).unwrap(), json!(s.as_str()));
        }
        for c in CauseKind::ALL {
            assert_eq!(serde_json::to_value(c).unwrap(), json!(c.as_str()));
        }
        assert_eq!(Outcome::parse("retried"), None);
        assert!(serde_json::from_value::<Outcome>(json!("retried")).is_err());
        let terminal: Vec<_> = DeliveryStatus::ALL.iter().filter(|s| s.is_terminal()).collect();
        assert_eq!(terminal.len(), 4);
    }

    #[test]
    fn requests_read_as_the_contract_writes_them() {
        let claim: ClaimRequest =
            serde_json::from_value(json!({"delivery_id": "d", "lease_seconds": 30})).unwrap();
        assert_eq!(claim.delivery_id.as_deref(), Some("d"));
        assert_eq!(serde_json::to_value(ClaimRequest::default()).unwrap(), json!({}));
        assert!(serde_json::from_value::<ClaimRequest>(json!({"delivery": "d"})).is_err());
        let finish: FinishRequest =
            serde_json::from_value(json!({"claim_token": "t", "outcome": "retry"})).unwrap();
        assert_eq!(finish.outcome, Outcome::Retry);
        assert_eq!(
            serde_json::to_value(&finish).unwrap(),
            json!({"claim_token": "t", "outcome": "retry"})
        );
        let run = json!({"id": "r", "workflow_id": "w", "status": "failed", "current_step": 1,
            "cause": {"type": "webhook", "id": "k"},
            "error": {"code": "message_too_large", "message": "x", "step": "a"},
            "created_at": 1, "updated_at": 2, "definition_event_id": "d",
            "steps": [{"id": "a", "action": "send_message", "status": "failed", "started_at": 1,
                       "finished_at": 2, "output": null, "error": {"code": "message_too_large", "message": "x"}}]});
        let parsed: RunView = serde_json::from_value(run.clone()).unwrap();
        assert_eq!(parsed.cause.kind, CauseKind::Webhook);
        assert_eq!(serde_json::to_value(&parsed).unwrap(), run);
    }
}
