//! Test-only fault injection at named points of dangerous work, shared by
//! the relay (`RELAY_FAULTS`) and the agent (`AGENT_FAULTS`).
//!
//! Compiled only with the `enabled` feature (the test harness builds both
//! binaries with it; release builds and `cargo run` have no hook at all),
//! and inert unless the process's variable names a point:
//!
//! `RELAY_FAULTS=step:after_event=error*1,finish:after_status=kill`
//!
//! `error` makes the work fail there ([`Injected`]); `kill` sends SIGKILL to
//! this process there; `*N` limits the fault to the first N hits.

/// A fault injected at `point`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Injected {
    pub point: String,
}

impl std::fmt::Display for Injected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "injected fault at {}", self.point)
    }
}

impl std::error::Error for Injected {}

#[cfg(feature = "enabled")]
mod imp {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};

    use super::Injected;

    fn hits() -> &'static Mutex<HashMap<String, u32>> {
        static HITS: OnceLock<Mutex<HashMap<String, u32>>> = OnceLock::new();
        HITS.get_or_init(|| Mutex::new(HashMap::new()))
    }

    pub fn check(variable: &str, point: &str) -> Result<(), Injected> {
        let Ok(spec) = std::env::var(variable) else {
            return Ok(());
        };
        for item in spec.split(',') {
            let (name, action) = item.split_once('=').unwrap_or((item, "error"));
            if name != point {
                continue;
            }
            let (action, limit) = match action.split_once('*') {
                Some((a, n)) => (a, n.parse::<u32>().unwrap_or(u32::MAX)),
                None => (action, u32::MAX),
            };
            let mut map = hits().lock().unwrap_or_else(|p| p.into_inner());
            let n = map.entry(point.to_string()).or_insert(0);
            if *n >= limit {
                return Ok(());
            }
            *n += 1;
            drop(map);
            tracing::warn!(point, action, "injected fault");
            if action == "kill" {
                // SAFETY: signalling our own process.
                unsafe {
                    libc::kill(libc::getpid(), libc::SIGKILL);
                }
            }
            return Err(Injected {
                point: point.to_string(),
            });
        }
        Ok(())
    }
}

/// Fails (or kills the process) when `variable` arms the fault `point`.
#[cfg(feature = "enabled")]
pub fn check(variable: &str, point: &str) -> Result<(), Injected> {
    imp::check(variable, point)
}

/// Without the `enabled` feature there is no hook.
#[cfg(not(feature = "enabled"))]
#[inline(always)]
pub fn check(_variable: &str, _point: &str) -> Result<(), Injected> {
    Ok(())
}
