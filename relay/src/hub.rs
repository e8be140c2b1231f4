//! In-process live fan-out: one bounded broadcast channel per community.
//!
//! Every accepted event (stored or ephemeral) is published here after its
//! commit; each connection task receives from its community's channel and
//! matches the event against its subscriptions. A receiver that falls
//! `fanout_buffer_events` behind is disconnected rather than served out of
//! order or with gaps.
//!
//! With standbys serving reads, the hub also keeps each community's
//! recent events (bounded by age, count and bytes): a REQ read from a
//! standby that has replayed everything committed before an instant adds
//! the events published since ([`Hub::since`]), which the standby may not
//! have yet and which arrived before the subscription's floor.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use nostr::prelude::Event;
use tokio::sync::broadcast;

use crate::budget::Budget;

/// One event on its way to live subscribers.
#[derive(Debug)]
pub struct Published {
    /// Process-local publication order; a subscription registered when the
    /// sequence was `s` skips events with `seq <= s` (its stored query
    /// already saw them).
    pub seq: u64,
    /// When it was published (after its commit).
    pub at: Instant,
    pub event: Arc<Event>,
    /// The event's JSON, serialised once for every subscriber, and queued
    /// by reference to each subscriber's socket.
    pub raw: Arc<str>,
    /// The relay-wide output budget, charged `raw.len()` for as long as
    /// this lives (in the hub or any connection's queue): once, however
    /// many subscribers it goes to.
    budget: Arc<Budget>,
    /// The words of its content, read by the first live search that looks
    /// and shared by every other one.
    words: OnceLock<protocol::search::Words>,
}

impl Published {
    /// The words of the event's content (NIP-50), read once.
    pub fn words(&self) -> &protocol::search::Words {
        self.words
            .get_or_init(|| protocol::search::Words::of(&self.event.content))
    }
}

impl Drop for Published {
    fn drop(&mut self) {
        self.budget.release(self.raw.len());
    }
}

/// Most recent events kept per community, and their bytes (JSON).
const RECENT_EVENTS_MAX: usize = 2_048;
const RECENT_BYTES_MAX: usize = 4 * 1024 * 1024;

/// One community's channel.
struct Channel {
    sender: broadcast::Sender<Arc<Published>>,
    /// Events published within the hub's `recent_for`, oldest first
    /// (empty when it keeps none), and their JSON's bytes.
    recent: VecDeque<Arc<Published>>,
    recent_bytes: usize,
    /// When the newest event dropped from `recent` was published: events
    /// since an instant before it are not all known.
    forgot: Option<Instant>,
}

impl Channel {
    fn new(capacity: usize) -> Self {
        Self {
            sender: broadcast::channel(capacity).0,
            recent: VecDeque::new(),
            recent_bytes: 0,
            forgot: None,
        }
    }

    /// Drops recent events published before `oldest` (none by age when
    /// `None`), and the oldest while there are more than the bounds allow.
    fn trim(&mut self, oldest: Option<Instant>) {
        while let Some(front) = self.recent.front() {
            let over = self.recent.len() > RECENT_EVENTS_MAX || self.recent_bytes > RECENT_BYTES_MAX;
            let old = oldest.is_some_and(|o| front.at < o);
            if !old && !over {
                break;
            }
            self.forgot = Some(front.at);
            self.recent_bytes -= front.raw.len();
            self.recent.pop_front();
        }
    }
}

/// The fan-out hub.
pub struct Hub {
    channels: Mutex<HashMap<String, Channel>>,
    seq: AtomicU64,
    capacity: usize,
    budget: Arc<Budget>,
    /// How long recent events are kept ([`Hub::since`]); zero: none.
    recent_for: Duration,
}

impl Hub {
    /// A hub whose channels buffer `capacity` events, keeping each
    /// community's events of the last `recent_for` (zero: none).
    pub fn new(capacity: usize, budget: Arc<Budget>, recent_for: Duration) -> Self {
        assert!(capacity > 0, "fan-out capacity must be positive");
        Self {
            channels: Mutex::new(HashMap::new()),
            seq: AtomicU64::new(0),
            capacity,
            budget,
            recent_for,
        }
    }

    fn channels(&self) -> std::sync::MutexGuard<'_, HashMap<String, Channel>> {
        self.channels.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A receiver for a community's live events.
    pub fn subscribe(&self, community: &str) -> broadcast::Receiver<Arc<Published>> {
        let mut map = self.channels();
        map.entry(community.to_string())
            .or_insert_with(|| Channel::new(self.capacity))
            .sender
            .subscribe()
    }

    /// The sequence number of the last published event.
    pub fn current_seq(&self) -> u64 {
        self.seq.load(Ordering::SeqCst)
    }

    /// The community's events published at or after `at`, oldest first;
    /// `None` when the hub cannot tell (it keeps no recent events, or
    /// some since `at` were dropped by its bounds).
    pub fn since(&self, community: &str, at: Instant) -> Option<Vec<Arc<Published>>> {
        if self.recent_for.is_zero() {
            return None;
        }
        let mut map = self.channels();
        let Some(ch) = map.get_mut(community) else {
            return Some(Vec::new()); // nothing ever published here
        };
        ch.trim(Instant::now().checked_sub(self.recent_for));
        if ch.forgot.is_some_and(|f| f >= at) {
            return None;
        }
        Some(ch.recent.iter().filter(|p| p.at >= at).cloned().collect())
    }

    /// Publishes an accepted event to the community's live subscribers.
    pub fn publish(&self, community: &str, event: Arc<Event>, raw: Arc<str>) {
        // The sequence number is taken under the lock so that sequence order
        // is send order on every channel.
        let mut map = self.channels();
        let ch = map
            .entry(community.to_string())
            .or_insert_with(|| Channel::new(self.capacity));
        let seq = self.seq.fetch_add(1, Ordering::SeqCst) + 1;
        self.budget.charge(raw.len());
        let budget = self.budget.clone();
        let at = Instant::now();
        let published = Arc::new(Published {
            seq,
            at,
            event,
            raw,
            budget,
            words: OnceLock::new(),
        });
        if !self.recent_for.is_zero() {
            ch.recent_bytes += published.raw.len();
            ch.recent.push_back(published.clone());
            ch.trim(at.checked_sub(self.recent_for));
        }
        // No receivers is not an error: nobody is listening.
        let _ = ch.sender.send(published);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nostr::prelude::{EventBuilder, Keys, Kind};

    fn event(text: &str) -> (Arc<Event>, Arc<str>) {
        let ev = protocol::sign::sign(EventBuilder::new(Kind::TextNote, text), &Keys::generate());
        let raw: Arc<str> = Arc::from(serde_json::to_string(&ev).expect("json"));
        (Arc::new(ev), raw)
    }

    #[test]
    fn recent_events_since_an_instant_or_none_when_some_were_dropped() {
        let hub = Hub::new(8, Budget::new(1 << 30), Duration::from_secs(60));
        let before = Instant::now();
        assert_eq!(hub.since("c", before).map(|v| v.len()), Some(0));
        let (e, raw) = event("one");
        hub.publish("c", e, raw);
        let middle = Instant::now();
        let (e, raw) = event("two");
        hub.publish("c", e.clone(), raw);
        let got = hub.since("c", middle).expect("kept");
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].event.id, e.id);
        assert_eq!(hub.since("c", before).map(|v| v.len()), Some(2));
        assert_eq!(hub.since("other", before).map(|v| v.len()), Some(0));
        // Past the count bound the oldest are dropped: an instant before
        // them cannot be answered; one after them still can.
        for i in 0..RECENT_EVENTS_MAX {
            let (e, raw) = event(&format!("n{i}"));
            hub.publish("c", e, raw);
        }
        assert!(hub.since("c", before).is_none());
        let after = Instant::now();
        assert_eq!(hub.since("c", after).map(|v| v.len()), Some(0));
    }

    #[test]
    fn without_standbys_nothing_is_kept() {
        let hub = Hub::new(8, Budget::new(1 << 30), Duration::ZERO);
        let (e, raw) = event("one");
        hub.publish("c", e, raw);
        assert!(hub.since("c", Instant::now()).is_none());
    }
}
