//! Prometheus metrics (docs/operations.md, "Metrics"): the recorder (`metrics` with
//! `metrics-exporter-prometheus`), the names, and the bounded label values
//! they take. Recording is a handful of atomic operations, so the hot
//! paths record directly with the `metrics` macros; without
//! `metrics_listen` no recorder is installed and every record is a no-op.
//!
//! Labels never carry pubkeys or ids: `community` (configured by the
//! operator), statuses and outcomes (closed sets), and failure codes only
//! from the relay's own set (an agent's free-text code counts as `agent`).

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

pub const CONNECTIONS: &str = "relay_connections";
pub const TRACE_SPANS_DROPPED: &str = "relay_trace_spans_dropped_total";
pub const EVENTS_RECEIVED: &str = "relay_events_received_total";
pub const REQ_DURATION: &str = "relay_req_duration_seconds";
pub const READS: &str = "relay_reads_total";
pub const DELIVERIES: &str = "relay_deliveries";
pub const OLDEST_PENDING: &str = "relay_delivery_oldest_pending_seconds";
pub const DELIVERY_WAIT: &str = "relay_delivery_wait_seconds";
pub const TRANSITIONS: &str = "relay_delivery_transitions_total";
pub const RUNS: &str = "relay_runs";
pub const SCHEDULE_PASSES: &str = "relay_schedule_passes_total";
pub const ENGINE_LAST_TICK: &str = "relay_engine_last_tick_seconds";
pub const TRIGGER_REFUSALS: &str = "relay_trigger_refusals_total";
pub const MENTIONS_REFUSED: &str = "relay_mentions_refused_total";
pub const WRITE_BATCH: &str = "relay_write_batch_events";
pub const BUILD_INFO: &str = "relay_build_info";

/// Installs the process-wide recorder; returns the handle that renders
/// the text format.
pub fn install() -> anyhow::Result<PrometheusHandle> {
    let seconds = [
        0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    ];
    let batch = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0];
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Full(REQ_DURATION.into()), &seconds)?
        .set_buckets_for_metric(Matcher::Full(DELIVERY_WAIT.into()), &seconds)?
        .set_buckets_for_metric(Matcher::Full(WRITE_BATCH.into()), &batch)?
        .install_recorder()?;
    describe();
    metrics::gauge!(BUILD_INFO, "version" => env!("CARGO_PKG_VERSION"), "commit" => env!("RELAY_COMMIT"))
        .set(1.0);
    Ok(handle)
}

fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_gauge!(CONNECTIONS, "open WebSocket connections");
    describe_counter!(EVENTS_RECEIVED, "EVENT messages answered, by outcome");
    describe_counter!(
        TRACE_SPANS_DROPPED,
        "run trace spans not exported (queue full or export failed)"
    );
    describe_histogram!(REQ_DURATION, Unit::Seconds, "REQ to EOSE");
    describe_counter!(
        READS,
        "REQ, COUNT and NIP-77 reads by where they went (from: primary, standby)"
    );
    describe_gauge!(DELIVERIES, "deliveries by community and status");
    describe_gauge!(
        OLDEST_PENDING,
        Unit::Seconds,
        "age of the oldest pending delivery"
    );
    describe_histogram!(
        DELIVERY_WAIT,
        Unit::Seconds,
        "a delivery's creation to its first claim"
    );
    describe_counter!(TRANSITIONS, "delivery status changes, by new status and code");
    describe_gauge!(RUNS, "workflow runs by status");
    describe_counter!(
        SCHEDULE_PASSES,
        "passes of this process's engine over a community's schedules that completed"
    );
    describe_gauge!(
        ENGINE_LAST_TICK,
        Unit::Seconds,
        "unix time at which this process's workflow engine last completed a pass"
    );
    describe_counter!(
        TRIGGER_REFUSALS,
        "events that matched a workflow's trigger and started no run, by trigger and refusal code"
    );
    describe_counter!(
        MENTIONS_REFUSED,
        "mentions not passed on to an agent over one of its caps, by cap"
    );
    describe_histogram!(WRITE_BATCH, "events per group commit of the event writer");
    describe_gauge!(BUILD_INFO, "1, labelled with the relay's version");
}

/// The outcome label of an `OK`: `stored`, `duplicate`, or the refusal's
/// machine-readable prefix (NIP-01), `other` for anything else.
pub fn outcome(accepted: bool, message: &str) -> &'static str {
    let prefix = message.split(':').next().unwrap_or_default();
    match (accepted, prefix) {
        (_, "duplicate") => "duplicate",
        (true, _) => "stored",
        (false, "invalid") => "invalid",
        (false, "restricted") => "restricted",
        (false, "blocked") => "blocked",
        (false, "rate-limited") => "rate-limited",
        (false, "auth-required") => "auth-required",
        (false, "pow") => "pow",
        (false, "error") => "error",
        (false, _) => "other",
    }
}

/// Counts an event that matched a workflow's `trigger` and started no
/// run, refused with `code` (a relay code: a bounded label).
pub fn count_trigger_refusal(trigger: &str, code: &'static str) {
    let trigger = match trigger {
        "message_posted" => "message_posted",
        "reaction_added" => "reaction_added",
        _ => "other",
    };
    metrics::counter!(TRIGGER_REFUSALS, "trigger" => trigger, "code" => code).increment(1);
}

/// Counts `n` delivery transitions to status `to` with `code` (bounded by
/// [`code_label`]): one call per single transition, one per bulk
/// cancellation with the rows it changed.
pub fn count_transitions(to: &'static str, code: &str, n: u64) {
    if n > 0 {
        metrics::counter!(TRANSITIONS, "to" => to, "code" => code_label(code)).increment(n);
    }
}

/// The code label of a delivery transition: the relay's own codes as
/// they are, any other (an agent's free text) as `agent`.
pub fn code_label(code: &str) -> &'static str {
    const OWN: [&str; 16] = [
        "lease_expired",
        "cancelled_by_operator",
        "retried_by_operator",
        "run_cancelled",
        "expired",
        "attempts_exhausted",
        "interrupted_after_write",
        "workflow_disabled",
        "channel_deleted",
        "member_removed",
        "step_done",
        "step_timeout",
        "owner_not_member",
        "agent_failed",
        "cancelled",
        "",
    ];
    OWN.iter().find(|c| **c == code).copied().unwrap_or("agent")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_bounded() {
        assert_eq!(outcome(true, ""), "stored");
        assert_eq!(outcome(true, "duplicate: already have it"), "duplicate");
        assert_eq!(outcome(false, "invalid: bad sig"), "invalid");
        assert_eq!(outcome(false, "rate-limited: slow down"), "rate-limited");
        assert_eq!(outcome(false, "something new"), "other");
        assert_eq!(code_label("lease_expired"), "lease_expired");
        assert_eq!(code_label("my tool broke at 3am"), "agent");
    }
}
