//! The agent's Prometheus metrics (docs/operations.md, "Metrics"), served by
//! `metrics-exporter-prometheus`'s own listener on `metrics_listen`.
//! Labels are closed sets: a finish's outcome, a verification code.

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};

/// Deliveries a turn finished, by outcome (`delivered`, `retry`, `failed`).
pub const TURNS: &str = "agent_turns_total";
/// How long a handler ran for a turn.
pub const HANDLER_SECONDS: &str = "agent_handler_seconds";
/// Deliveries refused before dispatch, by verification code.
pub const VERIFICATION_FAILURES: &str = "agent_verification_failures_total";

/// Installs the recorder and starts serving `/metrics` on `addr` (within
/// the current tokio runtime).
pub fn install(addr: std::net::SocketAddr) -> anyhow::Result<()> {
    let seconds = [0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0];
    PrometheusBuilder::new()
        .with_http_listener(addr)
        .set_buckets_for_metric(Matcher::Full(HANDLER_SECONDS.into()), &seconds)?
        .install()?;
    metrics::describe_counter!(TURNS, "deliveries a turn finished, by outcome");
    metrics::describe_histogram!(HANDLER_SECONDS, metrics::Unit::Seconds, "a turn's handler run");
    metrics::describe_counter!(
        VERIFICATION_FAILURES,
        "deliveries refused before dispatch, by code"
    );
    Ok(())
}
