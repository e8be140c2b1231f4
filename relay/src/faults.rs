//! The relay's fault points (test-only; see the `faults` crate): armed by
//! `RELAY_FAULTS`, compiled in only with the `faults` cargo feature.

pub use faults::Injected;

/// Fails (or kills the process) when the fault `point` is armed.
#[inline(always)]
pub fn check(point: &str) -> Result<(), Injected> {
    faults::check("RELAY_FAULTS", point)
}

/// Fails the storing of an event whose content is `poison` while the
/// point `event:poison` is armed: a storage failure of one event, to show
/// that it never fails the other events of its batch.
#[inline(always)]
pub fn check_event(content: &str) -> Result<(), Injected> {
    if content == "poison" {
        check("event:poison")
    } else {
        Ok(())
    }
}
