//! Why the store refuses a call: domain facts, each with the stable code
//! the contract names and a message for people. How a refusal is said over
//! HTTP (its status) is decided at the edge (`crate::http::status_of`), not here.

use protocol::api::DeliveryStatus;

use crate::persistence::StoreError;

/// A refused call: nothing it asked for happened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("no such delivery in this community")]
    NoDelivery,
    #[error("this delivery is for another agent")]
    NotTarget,
    #[error("this delivery was cancelled")]
    Cancelled,
    #[error("the claim token is not the current one")]
    StaleToken,
    #[error("the delivery is {0}")]
    NotClaimed(DeliveryStatus),
    #[error("the lease has expired")]
    LeaseExpired,
    #[error("lease_seconds must be between 1 and {max_secs}")]
    BadLease { max_secs: u64 },
    #[error("the lease must end by the delivery's expiry ({expires_at})")]
    LeaseExceedsLifetime { expires_at: i64 },
    #[error("name must be 1 to 256 bytes")]
    BadName,
    #[error("operation limit of this attempt reached")]
    TooManyOperations,
    #[error("a turn finishes at most 16 deliveries")]
    TurnTooLong,
    #[error("{0}")]
    BadReply(String),
    #[error("the agent is no longer a member of the channel")]
    AgentNotMember,
    #[error("{0}")]
    Replayed(String),
    #[error("no such workflow")]
    UnknownWorkflow,
    #[error("no such run in this community")]
    UnknownRun,
    #[error("only the workflow's owner may do this")]
    NotOwner,
    #[error("only the workflow's owner, while a member of its channel, may do this")]
    OwnerLeft,
    #[error("the workflow's owner is not a member of its channel")]
    OwnerNotMember,
    #[error("the workflow is disabled")]
    WorkflowDisabled,
    #[error("this workflow is triggered by {0}")]
    WrongTrigger(String),
    #[error("the workflow is paused")]
    WorkflowPaused,
    #[error("the delivery is {0}; only a failed, expired or cancelled one is retried")]
    NotRetryable(DeliveryStatus),
    #[error("the delivery has already ended ({0})")]
    AlreadyEnded(DeliveryStatus),
    #[error("the run has already ended ({0})")]
    RunEnded(protocol::api::RunStatus),
    #[error("the list holds its maximum of {0} entries")]
    ListFull(usize),
    #[error("the run is {0}; only a failed or cancelled run is rerun")]
    NotRerunnable(protocol::api::RunStatus),
    #[error("{0}")]
    DefinitionChanged(String),
    #[error("the definition revision the run ran with is no longer stored")]
    DefinitionMissing,
    #[error("no managed agent with that pubkey is registered here")]
    UnknownAgent,
    #[error("only the agent's owner (or an admin) may do this")]
    NotAgentOwner,
    #[error("no channel with that id here")]
    UnknownChannel,
}

impl Refusal {
    /// The stable machine code (`{"error": <code>}`).
    pub fn code(&self) -> &'static str {
        match self {
            Refusal::NoDelivery => "not_found",
            Refusal::NotTarget => "not_target",
            Refusal::Cancelled => "cancelled",
            Refusal::StaleToken => "stale_token",
            Refusal::NotClaimed(_) => "not_claimed",
            Refusal::LeaseExpired => "lease_expired",
            Refusal::BadLease { .. } => "bad_lease",
            Refusal::LeaseExceedsLifetime { .. } => "lease_exceeds_lifetime",
            Refusal::BadName => "bad_name",
            Refusal::TooManyOperations => "too_many_operations",
            Refusal::TurnTooLong => "turn_too_long",
            Refusal::BadReply(_) => "bad_reply",
            Refusal::AgentNotMember | Refusal::OwnerLeft => "not_member",
            Refusal::Replayed(_) => "auth_replayed",
            Refusal::UnknownWorkflow => "unknown_workflow",
            Refusal::WorkflowPaused => "workflow_paused",
            Refusal::NotRetryable(_) => "not_retryable",
            Refusal::AlreadyEnded(_) => "already_ended",
            Refusal::RunEnded(_) => "run_ended",
            Refusal::ListFull(_) => "list_full",
            Refusal::UnknownRun => "unknown_run",
            Refusal::NotOwner => "not_owner",
            Refusal::OwnerNotMember => "owner_not_member",
            Refusal::WorkflowDisabled => "workflow_disabled",
            Refusal::WrongTrigger(_) => "wrong_trigger",
            Refusal::NotRerunnable(_) => "not_rerunnable",
            Refusal::DefinitionChanged(_) => "definition_changed",
            Refusal::DefinitionMissing => "definition_missing",
            Refusal::UnknownAgent => "unknown_agent",
            Refusal::NotAgentOwner => "not_owner",
            Refusal::UnknownChannel => "unknown_channel",
        }
    }
}

/// Why a store call did not give its answer: it was refused (nothing it
/// asked for happened; the caller is told why), or the store failed. One
/// type for both, so that `?` carries either out of a call.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error(transparent)]
    Refused(#[from] Refusal),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<sqlx::Error> for CallError {
    fn from(e: sqlx::Error) -> Self {
        CallError::Store(e.into())
    }
}

impl From<faults::Injected> for CallError {
    fn from(e: faults::Injected) -> Self {
        CallError::Store(e.into())
    }
}

impl CallError {
    /// The refusal, if the call was refused.
    pub fn refusal(&self) -> Option<&Refusal> {
        match self {
            CallError::Refused(r) => Some(r),
            CallError::Store(_) => None,
        }
    }
}

/// What a store call answers: its value, or why not.
pub type Answer<T> = Result<T, CallError>;

/// A call's value, or `None` when it was refused (the store's errors
/// pass): for a caller to whom a refusal is an ordinary outcome.
pub fn unless_refused<T>(a: Answer<T>) -> Result<Option<T>, StoreError> {
    match a {
        Ok(v) => Ok(Some(v)),
        Err(CallError::Refused(_)) => Ok(None),
        Err(CallError::Store(e)) => Err(e),
    }
}
