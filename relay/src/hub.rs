//! In-process live fan-out, partitioned by community.
//!
//! Every accepted event (stored or ephemeral) is published here after its
//! commit. A connection with live subscriptions is a [`Listener`]: the
//! hub indexes the keys of its filters ([`interest`]) and hands an event
//! only to the listeners holding one of the event's keys, each on its own
//! queue of at most `fanout_buffer_events`; the connection then matches it
//! exactly. An event goes to none of the connections it cannot match, so
//! a community's idle or unrelated subscribers cost a publish nothing. A
//! listener that falls `fanout_buffer_events` behind is told it lagged
//! and is disconnected rather than served out of order or with gaps.
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

use nostr::prelude::{Event, Filter};

use crate::budget::Budget;

pub mod interest;

use interest::{Index, Key, TagHasher};

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

/// One listener's queue, and the keys it is indexed under.
struct Listening {
    tx: flume::Sender<Arc<Published>>,
    keys: Vec<Key>,
}

/// One community's listeners, and its recent events.
#[derive(Default)]
struct Channel {
    listeners: HashMap<u64, Listening>,
    index: Index,
    /// Events published within the hub's `recent_for`, oldest first
    /// (empty when it keeps none), and their JSON's bytes.
    recent: VecDeque<Arc<Published>>,
    recent_bytes: usize,
    /// When the newest event dropped from `recent` was published: events
    /// since an instant before it are not all known.
    forgot: Option<Instant>,
}

impl Channel {
    /// Hands `p` to every listener holding one of `keys`; one whose
    /// queue is full lagged and is dropped (its queue closes).
    fn send(&mut self, keys: &[Key], p: &Arc<Published>) {
        for id in self.index.holders(keys) {
            let Some(l) = self.listeners.get(&id) else {
                continue;
            };
            // Full: it lagged; closed: it is being dropped. Either way
            // its sender goes, which closes its queue.
            if l.tx.try_send(p.clone()).is_err() {
                self.forget(id);
            }
        }
    }

    fn forget(&mut self, id: u64) {
        if let Some(l) = self.listeners.remove(&id) {
            self.index.remove(id, &l.keys);
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
    inner: Arc<Inner>,
}

struct Inner {
    channels: Mutex<HashMap<String, Channel>>,
    seq: AtomicU64,
    /// Each listener's queue bound, in events.
    capacity: usize,
    budget: Arc<Budget>,
    /// How long recent events are kept ([`Hub::since`]); zero: none.
    recent_for: Duration,
    next_listener: AtomicU64,
    tags: TagHasher,
}

impl Inner {
    fn channels(&self) -> std::sync::MutexGuard<'_, HashMap<String, Channel>> {
        self.channels.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A connection's place in its community's fan-out, while it has live
/// subscriptions: dropping it leaves.
pub struct Listener {
    inner: Arc<Inner>,
    community: String,
    id: u64,
    /// flume's, not tokio's: a bounded channel of tokio's takes about
    /// 800 bytes at once (cache-padded fields and a first block of 32
    /// slots) for every subscribed connection, flume's about 170. flume's
    /// queue grows with what is queued and keeps that room: at most
    /// `fanout_buffer_events` pointers (8 bytes each) for a listener that
    /// once fell that far behind, where tokio's gives its blocks back.
    rx: flume::Receiver<Arc<Published>>,
}

/// The listener fell `fanout_buffer_events` behind and was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lagged;

impl Listener {
    /// The next event holding one of this listener's keys, in publication
    /// order.
    pub async fn recv(&mut self) -> Result<Arc<Published>, Lagged> {
        // The hub closes a live listener's queue only when it drops it for
        // lagging: then it says so at once, not after what is queued
        // (events followed by a gap).
        if self.rx.is_disconnected() {
            return Err(Lagged);
        }
        self.rx.recv_async().await.map_err(|_| Lagged)
    }

    /// From now on, events are handed over when they hold one of `keys`
    /// (the keys of every live filter of the connection: [`Hub::keys_of`]).
    pub fn set_keys(&self, keys: Vec<Key>) {
        let mut map = self.inner.channels();
        let Some(ch) = map.get_mut(&self.community) else {
            return;
        };
        let Some(me) = ch.listeners.get_mut(&self.id) else {
            return; // dropped for lagging: recv says so
        };
        let old = std::mem::replace(&mut me.keys, keys);
        ch.index.remove(self.id, &old);
        ch.index.add(self.id, &me.keys);
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Some(ch) = self.inner.channels().get_mut(&self.community) {
            ch.forget(self.id);
        }
    }
}

impl Hub {
    /// A hub whose channels buffer `capacity` events, keeping each
    /// community's events of the last `recent_for` (zero: none).
    pub fn new(capacity: usize, budget: Arc<Budget>, recent_for: Duration) -> Self {
        assert!(capacity > 0, "fan-out capacity must be positive");
        let inner = Inner {
            channels: Mutex::new(HashMap::new()),
            seq: AtomicU64::new(0),
            capacity,
            budget,
            recent_for,
            next_listener: AtomicU64::new(1),
            tags: TagHasher::default(),
        };
        Self {
            inner: Arc::new(inner),
        }
    }

    /// The keys `filters` are indexed under, each once.
    pub fn keys_of<'a>(&self, filters: impl IntoIterator<Item = &'a Filter>) -> Vec<Key> {
        let mut keys: Vec<Key> = filters
            .into_iter()
            .flat_map(|f| self.inner.tags.keys_of(f))
            .collect();
        keys.sort_unstable();
        keys.dedup();
        keys
    }

    /// Joins a community's fan-out, handed the events holding one of
    /// `keys` from now on.
    pub fn listen(&self, community: &str, keys: Vec<Key>) -> Listener {
        let id = self.inner.next_listener.fetch_add(1, Ordering::SeqCst);
        let (tx, rx) = flume::bounded(self.inner.capacity);
        let mut map = self.inner.channels();
        let ch = map.entry(community.to_string()).or_default();
        ch.index.add(id, &keys);
        let listening = Listening { tx, keys };
        ch.listeners.insert(id, listening);
        Listener {
            inner: self.inner.clone(),
            community: community.to_string(),
            id,
            rx,
        }
    }

    /// The sequence number of the last published event.
    pub fn current_seq(&self) -> u64 {
        self.inner.seq.load(Ordering::SeqCst)
    }

    /// The community's events published at or after `at`, oldest first;
    /// `None` when the hub cannot tell (it keeps no recent events, or
    /// some since `at` were dropped by its bounds).
    pub fn since(&self, community: &str, at: Instant) -> Option<Vec<Arc<Published>>> {
        let recent_for = self.inner.recent_for;
        if recent_for.is_zero() {
            return None;
        }
        let mut map = self.inner.channels();
        let Some(ch) = map.get_mut(community) else {
            return Some(Vec::new()); // nothing ever published here
        };
        ch.trim(Instant::now().checked_sub(recent_for));
        if ch.forgot.is_some_and(|f| f >= at) {
            return None;
        }
        Some(ch.recent.iter().filter(|p| p.at >= at).cloned().collect())
    }

    /// Publishes an accepted event to the community's live subscribers.
    pub fn publish(&self, community: &str, event: Arc<Event>, raw: Arc<str>) {
        // The sequence number is taken under the lock so that sequence order
        // is send order on every channel.
        let inner = &self.inner;
        let mut map = inner.channels();
        let ch = map.entry(community.to_string()).or_default();
        let seq = inner.seq.fetch_add(1, Ordering::SeqCst) + 1;
        inner.budget.charge(raw.len());
        let budget = inner.budget.clone();
        let at = Instant::now();
        let published = Arc::new(Published {
            seq,
            at,
            event,
            raw,
            budget,
            words: OnceLock::new(),
        });
        if !inner.recent_for.is_zero() {
            ch.recent_bytes += published.raw.len();
            ch.recent.push_back(published.clone());
            ch.trim(at.checked_sub(inner.recent_for));
        }
        if !ch.listeners.is_empty() {
            let keys = inner.tags.event_keys(&published.event);
            ch.send(&keys, &published);
        }
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

    fn keys(hub: &Hub, filter: &str) -> Vec<Key> {
        hub.keys_of([&Filter::from_json(filter).expect("filter")])
    }

    /// A listener is handed the events its keys name, in order, and none
    /// other; new keys take effect at once; one that falls a queue's
    /// length behind lagged, while the others keep theirs.
    #[tokio::test]
    async fn a_listener_gets_what_its_keys_name_and_lags_past_its_queue() {
        let hub = Hub::new(2, Budget::new(1 << 30), Duration::ZERO);
        let (a, b) = (Keys::generate(), Keys::generate());
        let of = |keys: &Keys, text: &str| {
            let ev = protocol::sign::sign(EventBuilder::new(Kind::TextNote, text), keys);
            let raw: Arc<str> = Arc::from(serde_json::to_string(&ev).expect("json"));
            (Arc::new(ev), raw)
        };
        let by_a = keys(&hub, &format!(r#"{{"authors":["{}"]}}"#, a.public_key().to_hex()));
        let mut l = hub.listen("c", by_a);
        let mut everything = hub.listen("c", keys(&hub, "{}"));
        let mut elsewhere = hub.listen("other", keys(&hub, "{}"));
        let (e1, r1) = of(&b, "b1");
        hub.publish("c", e1.clone(), r1);
        let (e2, r2) = of(&a, "a1");
        hub.publish("c", e2.clone(), r2);
        assert_eq!(l.recv().await.expect("a1").event.id, e2.id, "b's event skipped");
        assert_eq!(everything.recv().await.expect("b1").event.id, e1.id);
        assert_eq!(everything.recv().await.expect("a1").event.id, e2.id);
        l.set_keys(keys(&hub, r#"{"kinds":[1]}"#));
        everything.set_keys(keys(
            &hub,
            &format!(r#"{{"authors":["{}"]}}"#, a.public_key().to_hex()),
        ));
        let (e3, r3) = of(&b, "b2");
        hub.publish("c", e3.clone(), r3);
        assert_eq!(l.recv().await.expect("b2").event.id, e3.id);
        // Two queued and a third: `l` lagged and is dropped from the hub.
        for text in ["x", "y", "z"] {
            let (e, r) = of(&b, text);
            hub.publish("c", e, r);
        }
        assert_eq!(l.recv().await.map(|_| ()), Err(Lagged));
        assert_eq!(hub.inner.channels()["c"].listeners.len(), 1);
        let (e5, r5) = of(&a, "a2");
        hub.publish("c", e5.clone(), r5);
        let got = everything
            .recv()
            .await
            .expect("the other listener was not dropped");
        assert_eq!(got.event.id, e5.id);
        drop(everything);
        assert!(hub.inner.channels()["c"].listeners.is_empty());
        let (e, r) = of(&a, "for c only");
        hub.publish("c", e, r);
        let (e4, r4) = of(&a, "for other");
        hub.publish("other", e4.clone(), r4);
        assert_eq!(elsewhere.recv().await.expect("other's").event.id, e4.id);
    }

    #[test]
    fn without_standbys_nothing_is_kept() {
        let hub = Hub::new(8, Budget::new(1 << 30), Duration::ZERO);
        let (e, raw) = event("one");
        hub.publish("c", e, raw);
        assert!(hub.since("c", Instant::now()).is_none());
    }
}
