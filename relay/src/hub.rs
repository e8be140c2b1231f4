//! In-process live fan-out: one bounded broadcast channel per community.
//!
//! Every accepted event (stored or ephemeral) is published here after its
//! commit; each connection task receives from its community's channel and
//! matches the event against its subscriptions. A receiver that falls
//! `fanout_buffer_events` behind is disconnected rather than served out of
//! order or with gaps.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

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

/// The fan-out hub.
pub struct Hub {
    channels: Mutex<HashMap<String, broadcast::Sender<Arc<Published>>>>,
    seq: AtomicU64,
    capacity: usize,
    budget: Arc<Budget>,
}

impl Hub {
    pub fn new(capacity: usize, budget: Arc<Budget>) -> Self {
        assert!(capacity > 0, "fan-out capacity must be positive");
        Self {
            channels: Mutex::new(HashMap::new()),
            seq: AtomicU64::new(0),
            capacity,
            budget,
        }
    }

    fn channels(&self) -> std::sync::MutexGuard<'_, HashMap<String, broadcast::Sender<Arc<Published>>>> {
        self.channels.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A receiver for a community's live events.
    pub fn subscribe(&self, community: &str) -> broadcast::Receiver<Arc<Published>> {
        let mut map = self.channels();
        map.entry(community.to_string())
            .or_insert_with(|| broadcast::channel(self.capacity).0)
            .subscribe()
    }

    /// The sequence number of the last published event.
    pub fn current_seq(&self) -> u64 {
        self.seq.load(Ordering::SeqCst)
    }

    /// Publishes an accepted event to the community's live subscribers.
    pub fn publish(&self, community: &str, event: Arc<Event>, raw: Arc<str>) {
        // The sequence number is taken under the lock so that sequence order
        // is send order on every channel.
        let mut map = self.channels();
        let sender = map
            .entry(community.to_string())
            .or_insert_with(|| broadcast::channel(self.capacity).0);
        let seq = self.seq.fetch_add(1, Ordering::SeqCst) + 1;
        self.budget.charge(raw.len());
        let budget = self.budget.clone();
        // No receivers is not an error: nobody is listening.
        let _ = sender.send(Arc::new(Published {
            seq,
            event,
            raw,
            budget,
            words: OnceLock::new(),
        }));
    }
}
