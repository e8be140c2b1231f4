//! What a definition says about its share of the agents' time: a cap on
//! its deliveries claimed at once (`concurrency`, the whole workflow, all
//! agents together) and a step's `priority` (an agent with a backlog
//! claims higher priorities first). docs/workflows.md, "Fair shares".

use std::ops::RangeInclusive;

/// The priorities a step may carry; higher is claimed first.
pub const PRIORITIES: RangeInclusive<i8> = -10..=10;
/// A step's priority when it names none.
pub const DEFAULT_PRIORITY: i8 = 0;
/// The largest `concurrency` a workflow may name.
pub const MAX_CONCURRENCY: u32 = 1_000;

/// Why a priority is refused, if it is.
pub fn priority_problem(p: Option<i8>) -> Option<String> {
    let p = p?;
    (!PRIORITIES.contains(&p)).then(|| {
        let (lo, hi) = PRIORITIES.into_inner();
        format!("{p} is not from {lo} to {hi}")
    })
}

/// Whether a workflow's `concurrency` is in bounds.
pub fn concurrency_fits(c: Option<u32>) -> bool {
    c.is_none_or(|c| (1..=MAX_CONCURRENCY).contains(&c))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_of_priority_and_concurrency() {
        assert_eq!(priority_problem(None), None);
        assert_eq!(priority_problem(Some(-10)), None);
        assert_eq!(priority_problem(Some(10)), None);
        assert_eq!(
            priority_problem(Some(11)).as_deref(),
            Some("11 is not from -10 to 10")
        );
        assert!(priority_problem(Some(-11)).is_some());
        assert!(concurrency_fits(None));
        assert!(concurrency_fits(Some(1)));
        assert!(concurrency_fits(Some(MAX_CONCURRENCY)));
        assert!(!concurrency_fits(Some(0)));
        assert!(!concurrency_fits(Some(MAX_CONCURRENCY + 1)));
    }
}
