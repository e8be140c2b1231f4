//! A REQ's stored results, streamed to the socket a page at a time.
//!
//! Before, a REQ read its whole result set (up to `max_limit` events per
//! filter) into memory and only then queued it: 1,000 stored events of
//! 120 KB cost a subscriber that never read 81-164 MiB. Now each filter is
//! a cursor over its results in REQ order (newest first, ties by lowest
//! id), read in pages that fit the room left in the connection's queue and
//! in the relay-wide budget, and a page is read only when the one before
//! it has been queued. What a REQ holds is bounded by that room plus one
//! event, whatever its `limit`, and a reader that stops reading stops the
//! REQ at its queue's bound (and is dropped after the stored-results
//! deadline). Several filters are merged in REQ order, each event once.
//! A REQ sends at most `max_req_bytes` of events; past that it ends with
//! EOSE, as if its limits had been reached. A REQ with a NIP-50 search is
//! sent filter by filter instead, each in its rank order (NIP-50: best
//! match first, `limit` applied after ranking).

use std::collections::{HashSet, VecDeque};
use std::time::Duration;

use nostr::prelude::Filter;
use serde_json::json;

use crate::events::query::{search_of, After, Position};
use crate::outbound::{Outbound, Overflow};
use crate::state::AppState;
use crate::store::{Page, ReadScope, StoreError, StoredEvent};

/// How long stored results may wait for a slow reader before it is dropped.
pub const STORED_RESULTS_DEADLINE: Duration = Duration::from_secs(10);

/// Why the stored results stopped before their end.
#[derive(Debug)]
pub enum Stopped {
    /// The reader did not make room in time (or the connection is gone).
    Overflow,
    /// A page could not be read.
    Store(StoreError),
}

impl From<Overflow> for Stopped {
    fn from(_: Overflow) -> Self {
        Stopped::Overflow
    }
}

/// One filter's results not sent yet.
struct Cursor<'f> {
    filter: &'f Filter,
    /// The filter's clamped `limit`, and how many of them are still to read.
    limit: usize,
    left: usize,
    /// The last event read (pages continue after it).
    after: Option<After>,
    buf: VecDeque<StoredEvent>,
    /// Nothing more to read.
    done: bool,
}

impl Cursor<'_> {
    fn hungry(&self) -> bool {
        self.buf.is_empty() && !self.done
    }

    /// The REQ-order key of the next event: newest first, then lowest id.
    fn head(&self) -> Option<(std::cmp::Reverse<i64>, [u8; 32])> {
        self.buf.front().map(|e| (std::cmp::Reverse(e.created_at), e.id))
    }
}

/// Whether every filter names its events by id.
pub fn names_ids(filters: &[Filter]) -> bool {
    filters
        .iter()
        .all(|f| f.ids.as_ref().is_some_and(|ids| !ids.is_empty()))
}

/// Queues the stored events of `filters` for subscription `sub_id` (the
/// caller sends EOSE after); the ids of the events it sent, when several
/// filters or ids were asked for ([`names_ids`]), else only those of
/// `watch` it sent.
pub async fn send_stored(
    state: &AppState,
    community: &str,
    out: &Outbound,
    sub_id: &str,
    filters: &[Filter],
    scope: &ReadScope,
    watch: &HashSet<[u8; 32]>,
) -> Result<HashSet<[u8; 32]>, Stopped> {
    let l = &state.cfg.limits;
    let mut cursors: Vec<Cursor<'_>> = filters
        .iter()
        .filter_map(|filter| {
            let limit = filter.limit.unwrap_or(l.max_limit).min(l.max_limit);
            (limit > 0).then(|| Cursor {
                filter,
                limit,
                left: limit,
                after: None,
                buf: VecDeque::new(),
                done: false,
            })
        })
        .collect();
    let ranked = filters.iter().any(|f| search_of(f).is_some());
    let prefix = format!("[\"EVENT\",{},", json!(sub_id));
    let one_event = l.max_event_bytes + prefix.len() + 1;
    // The ids sent, bounded by max_filters x max_limit ids: kept where
    // several filters can return the same event twice, and for a REQ by
    // ids, whose caller tells from them whether it found all it asked for.
    let keep_ids = cursors.len() > 1 || names_ids(filters);
    let mut seen: HashSet<[u8; 32]> = HashSet::new();
    let mut sent_bytes = 0usize;
    loop {
        refill(state, community, out, &mut cursors, scope, one_event).await?;
        // The cursor whose next event comes first in REQ order (a search
        // REQ: each filter's results whole, in filter order, as ranked).
        let mut ready = (0..cursors.len()).filter(|&i| cursors[i].head().is_some());
        let next = if ranked {
            ready.next()
        } else {
            ready.min_by_key(|&i| cursors[i].head())
        };
        let Some(next) = next else {
            return Ok(seen);
        };
        let event = cursors[next].buf.pop_front().expect("head was some");
        if (keep_ids || watch.contains(&event.id)) && !seen.insert(event.id) {
            continue;
        }
        let id = event.id;
        let mut frame = String::with_capacity(prefix.len() + event.raw.len() + 1);
        frame.push_str(&prefix);
        frame.push_str(&event.raw);
        frame.push(']');
        drop(event);
        if sent_bytes > 0 && sent_bytes + frame.len() > l.max_req_bytes {
            seen.remove(&id);
            return Ok(seen);
        }
        sent_bytes += frame.len();
        out.text_wait(frame, STORED_RESULTS_DEADLINE).await?;
    }
}

/// Reads the next page of every cursor whose buffer is empty (its next
/// event may be the one to send first), the room left shared between them.
async fn refill(
    state: &AppState,
    community: &str,
    out: &Outbound,
    cursors: &mut [Cursor<'_>],
    scope: &ReadScope,
    one_event: usize,
) -> Result<(), Stopped> {
    let hungry = cursors.iter().filter(|c| c.hungry()).count();
    if hungry == 0 {
        return Ok(());
    }
    let room = out.wait_room(one_event, STORED_RESULTS_DEADLINE).await?;
    let share = (room / hungry).max(1);
    for c in cursors.iter_mut().filter(|c| c.hungry()) {
        let page = Page {
            limit: c.limit,
            rows: c.left,
            position: Position {
                after: c.after,
                offset: c.limit - c.left,
            },
            max_bytes: share,
        };
        let rows = state
            .store
            .query_page(community, c.filter, &page, scope)
            .await
            .map_err(Stopped::Store)?;
        debug_assert!(rows.events.len() <= c.left, "a page is within the limit");
        c.left -= rows.events.len();
        c.done = rows.end || c.left == 0 || rows.events.is_empty();
        if let Some(last) = rows.events.last() {
            c.after = Some((last.created_at, last.id));
        }
        c.buf.extend(rows.events);
    }
    Ok(())
}
