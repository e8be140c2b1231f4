//! The bound on live NIP-50 search: every published event is matched
//! against every live subscription's search filters, so their number and
//! their words are work each event costs. A connection holds at most
//! `limits.max_live_search_filters_per_connection` such filters and
//! `max_live_search_words_per_connection` words; the relay as a whole at
//! most `max_live_search_filters` and `max_live_search_words`. A REQ that
//! would pass either is refused with `CLOSED` before its stored results,
//! and the words of each event are read once, whatever the number of
//! filters (`hub::Published::words`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use nostr::prelude::Filter;

/// The live search filters and words held relay-wide.
#[derive(Debug)]
pub struct SearchLoad {
    filters: AtomicUsize,
    words: AtomicUsize,
    max_filters: usize,
    max_words: usize,
}

/// One subscription's share of the load, given back when it drops.
#[derive(Debug)]
pub struct Hold {
    load: Arc<SearchLoad>,
    pub filters: usize,
    pub words: usize,
}

/// The search filters of a REQ and their words (filters whose search has
/// no words constrain nothing and cost nothing).
pub fn weight(searches: &[Option<protocol::search::Query>]) -> (usize, usize) {
    searches
        .iter()
        .flatten()
        .fold((0, 0), |(f, w), q| (f + 1, w + q.words().len()))
}

/// The parsed search of each filter.
pub fn searches_of(filters: &[Filter]) -> Vec<Option<protocol::search::Query>> {
    filters.iter().map(crate::events::query::search_of).collect()
}

impl SearchLoad {
    pub fn new(max_filters: usize, max_words: usize) -> Arc<SearchLoad> {
        Arc::new(SearchLoad {
            filters: AtomicUsize::new(0),
            words: AtomicUsize::new(0),
            max_filters,
            max_words,
        })
    }

    /// Takes `filters` and `words` if the relay has room for them.
    pub fn hold(self: &Arc<Self>, filters: usize, words: usize) -> Option<Hold> {
        if !take(&self.filters, filters, self.max_filters) {
            return None;
        }
        if !take(&self.words, words, self.max_words) {
            self.filters.fetch_sub(filters, Ordering::AcqRel);
            return None;
        }
        Some(Hold {
            load: self.clone(),
            filters,
            words,
        })
    }

    /// Filters held now, relay-wide.
    pub fn filters(&self) -> usize {
        self.filters.load(Ordering::Acquire)
    }
}

/// Adds `n` to `counter` unless that passes `max`.
fn take(counter: &AtomicUsize, n: usize, max: usize) -> bool {
    counter
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |now| {
            now.checked_add(n).filter(|&after| after <= max)
        })
        .is_ok()
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.load.filters.fetch_sub(self.filters, Ordering::AcqRel);
        self.load.words.fetch_sub(self.words, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_up_to_the_bound_and_gives_back_on_drop() {
        let load = SearchLoad::new(3, 10);
        let a = load.hold(2, 4).expect("room");
        assert!(load.hold(2, 1).is_none(), "filters over");
        assert!(load.hold(1, 7).is_none(), "words over");
        assert_eq!(load.filters(), 2, "a refusal takes nothing");
        let b = load.hold(1, 6).expect("exactly full");
        drop(a);
        assert_eq!(load.filters(), 1);
        drop(b);
        assert!(load.hold(3, 10).is_some());
    }
}
