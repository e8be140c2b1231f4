//! Test-only fault injection at named points of the dangerous transactions.
//!
//! Compiled only with the `faults` cargo feature (the test harness builds the
//! relay with it; `cargo run -p relay` and release builds have no hook at
//! all), and inert unless `RELAY_FAULTS` names a point:
//!
//! `RELAY_FAULTS=step:after_event=error*1,finish:after_status=kill`
//!
//! `error` makes the transaction fail there (it rolls back); `kill` sends
//! SIGKILL to this process there; `*N` limits the fault to the first N hits.

use crate::store::StoreError;

#[cfg(feature = "faults")]
mod imp {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};

    use super::StoreError;

    fn hits() -> &'static Mutex<HashMap<String, u32>> {
        static HITS: OnceLock<Mutex<HashMap<String, u32>>> = OnceLock::new();
        HITS.get_or_init(|| Mutex::new(HashMap::new()))
    }

    pub fn check(point: &str) -> Result<(), StoreError> {
        let Ok(spec) = std::env::var("RELAY_FAULTS") else {
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
            match action {
                "kill" => {
                    // SAFETY: signalling our own process.
                    unsafe {
                        libc::kill(libc::getpid(), libc::SIGKILL);
                    }
                }
                _ => return Err(StoreError::Injected(point.to_string())),
            }
        }
        Ok(())
    }
}

/// Fails (or kills the process) when the fault `point` is armed.
#[cfg(feature = "faults")]
pub fn check(point: &str) -> Result<(), StoreError> {
    imp::check(point)
}

/// Without the `faults` feature there is no hook.
#[cfg(not(feature = "faults"))]
#[inline(always)]
pub fn check(_point: &str) -> Result<(), StoreError> {
    Ok(())
}

/// Fails the storing of an event whose content is `poison` while the
/// point `event:poison` is armed: a storage failure of one event, to show
/// that it never fails the other events of its batch.
pub fn check_event(content: &str) -> Result<(), StoreError> {
    if content == "poison" {
        check("event:poison")
    } else {
        Ok(())
    }
}
