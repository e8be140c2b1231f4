//! A follow list's read on SQLite: the windows of time, newest first,
//! that a page of a filter naming several authors is read through
//! (`query::by_author_window` says which filters; the rule is here;
//! `store::sqlstore::SqlStore::query_page` runs the windows).

use nostr::prelude::{Filter, Timestamp};

use crate::events::query::After;

/// The windows of time a page of a follow list is read through on SQLite
/// (`query::by_author_window`), narrowest first, back from the newest
/// event the page may hold (`until`, the page's `after`, or `now`). A
/// window that holds the page (full, or stopped for its bounds) holds the
/// page's newest events: every event newer than its floor is read.
/// Otherwise the next is wider, by as much as the rows found say the page
/// needs (twice that, at most [`Windows::MAX_GROWTH`] times), until its
/// floor passes the filter's own `since`: then the plain read, last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Windows {
    /// The newest second the page may hold.
    top: u64,
    /// The filter's `since` (0: none).
    since: u64,
    window_secs: u64,
}

impl Windows {
    /// The first window: a minute, so that a list of very active authors
    /// reads a minute of their events, not an hour.
    const FIRST_SECS: u64 = 60;
    /// Growth of a window after one that did not hold the page. A window
    /// that found most of the page grows by little: eight times as wide
    /// would read eight times the rows the page needs. It grows at least
    /// threefold (twice the rows wanted over fewer than those), so `top`
    /// (at most `now`) is passed within 17 windows.
    const MIN_GROWTH: u64 = 2;
    const MAX_GROWTH: u64 = 64;

    pub fn new(f: &Filter, after: Option<After>, now: u64) -> Self {
        let top = [
            f.until.map(|t| t.as_secs()),
            after.map(|(at, _)| u64::try_from(at).unwrap_or(0)),
            Some(now),
        ]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(now);
        Self {
            top,
            since: f.since.map_or(0, |t| t.as_secs()),
            window_secs: Self::FIRST_SECS,
        }
    }

    /// The floor of the current window, or `None` once it would reach the
    /// filter's `since`: the plain read is next.
    pub fn floor(&self) -> Option<Timestamp> {
        let floor = self.top.checked_sub(self.window_secs)?;
        (floor > self.since).then(|| Timestamp::from_secs(floor))
    }

    /// After a window that held `found` of the `wanted` rows.
    pub fn widen(&mut self, found: usize, wanted: usize) {
        debug_assert!(found < wanted, "a window that holds the page is the last");
        let needed = wanted.saturating_mul(2).div_ceil(found.max(1));
        let growth = u64::try_from(needed)
            .unwrap_or(u64::MAX)
            .clamp(Self::MIN_GROWTH, Self::MAX_GROWTH);
        self.window_secs = self.window_secs.saturating_mul(growth);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_widen_back_from_the_pages_start_to_the_filters_since() {
        let now = 1_000_000;
        let f = Filter::new();
        let floors = |mut w: Windows, found: usize| {
            let mut out = Vec::new();
            while let Some(floor) = w.floor() {
                out.push(floor.as_secs());
                w.widen(found, 50);
            }
            out
        };
        // Nothing found: each window 64 times the last.
        assert_eq!(
            floors(Windows::new(&f, None, now), 0),
            [999_940, 996_160, 754_240]
        );
        // Some found: as much wider as twice the rows wanted over those
        // found say (5 of 50: 20 times; 40 of 50: 3 times).
        assert_eq!(
            floors(Windows::new(&f, None, now), 5),
            [999_940, 998_800, 976_000, 520_000]
        );
        assert_eq!(
            floors(Windows::new(&f, None, now), 40)[..4],
            [999_940, 999_820, 999_460, 998_380]
        );
        // The filter's own `since` ends the windows (the plain read is next).
        let since = f.clone().since(Timestamp::from_secs(999_000));
        assert_eq!(
            floors(Windows::new(&since, None, now), 40),
            [999_940, 999_820, 999_460]
        );
        // Back from `until`, or from the previous page's last event,
        // whichever is older, when older than now.
        let until = f.clone().until(Timestamp::from_secs(500_000));
        assert_eq!(floors(Windows::new(&until, None, now), 0)[0], 499_940);
        let after = Some((400_000, [0u8; 32]));
        assert_eq!(floors(Windows::new(&until, after, now), 0)[0], 399_940);
        assert!(floors(Windows::new(&f, None, 30), 0).is_empty());
        assert_eq!(floors(Windows::new(&f, None, u64::from(u32::MAX)), 49).len(), 17);
        // A page of any size (the configured `max_limit` bounds it) widens
        // by the most, never overflowing.
        let mut w = Windows::new(&f, None, now);
        w.widen(1, usize::MAX);
        assert_eq!(w.floor().map(|t| t.as_secs()), Some(1_000_000 - 60 * 64));
    }
}
