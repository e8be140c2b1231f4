//! The agent's fault points (test-only; see the `faults` crate): armed by
//! `AGENT_FAULTS`, e.g. `AGENT_FAULTS=claim:after=kill*1`, compiled in only
//! with the `faults` cargo feature.

/// Fails (or kills the process) when the fault `point` is armed.
#[inline(always)]
pub fn check(point: &str) -> Result<(), String> {
    faults::check("AGENT_FAULTS", point).map_err(|e| e.to_string())
}
