//! One WebSocket connection: NIP-01 messages in, answers and live events out.
//!
//! The connection task owns all per-connection state (auth, subscriptions,
//! rate bucket) and handles one client message at a time, so answers go out
//! in the order requests came in. Live events that may match its filters
//! arrive from the community's hub (see [`crate::hub::Listener`]) and are
//! matched exactly here; the socket is written by a separate task (see
//! [`crate::outbound`]).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::{Message, WebSocket};
use futures_util::future::BoxFuture;
use futures_util::stream::FuturesOrdered;
use futures_util::StreamExt;
use nostr::prelude::{Event, Filter, MatchEventOptions, PublicKey};
use protocol::kinds::{self};
use protocol::message::{ClientMessage, ParseError};
use serde_json::json;

use crate::clock::unix_now;
use crate::community::Community;
use crate::hub::{Lagged, Listener, Published};
use crate::outbound::{self, Outbound, Overflow};
use crate::ratelimit::TokenBucket;
use crate::state::AppState;
use crate::store::InsertOutcome;
use crate::verify;

mod event;
mod gate;
mod read;

/// WebSocket close code for a message above the hard size cap.
const CLOSE_TOO_BIG: u16 = 1009;
/// WebSocket close code sent on shutdown.
const CLOSE_GOING_AWAY: u16 = 1001;
/// WebSocket close code for a policy violation (slow reader, lagging).
const CLOSE_POLICY: u16 = 1008;
/// How long a closing connection waits, at most, for its last frames to
/// be written and for the client's close.
const CLOSE_WAIT: Duration = Duration::from_secs(2);

struct Subscription {
    filters: Vec<Filter>,
    /// Each filter's NIP-50 query, parsed once (`None`: no words).
    searches: Vec<Option<protocol::search::Query>>,
    /// Hub sequence when the stored query began; live events at or below it
    /// were committed before the query and are not sent again.
    seq_floor: u64,
    /// Its share of the relay's live search work (`None`: no search).
    searching: Option<crate::livesearch::Hold>,
}

/// A connection's subscriptions by id, in the order they were made: a
/// list, not a map. Most connections hold one or two (at most
/// `limits.max_subscriptions`), and a `HashMap`'s first insert allocates
/// four entries (about 450 bytes here) where this allocates one.
#[derive(Default)]
struct Subs(Vec<(String, Subscription)>);

impl Subs {
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn len(&self) -> usize {
        self.0.len()
    }

    fn contains_key(&self, id: &str) -> bool {
        self.0.iter().any(|(k, _)| k == id)
    }

    fn remove(&mut self, id: &str) -> Option<Subscription> {
        let at = self.0.iter().position(|(k, _)| k == id)?;
        Some(self.0.remove(at).1)
    }

    /// Adds `sub` as `id`, replacing a subscription of the same id.
    fn insert(&mut self, id: String, sub: Subscription) {
        self.remove(&id);
        self.0.reserve_exact(1);
        self.0.push((id, sub));
    }

    fn iter(&self) -> impl Iterator<Item = (&String, &Subscription)> {
        self.0.iter().map(|(k, v)| (k, v))
    }

    fn values(&self) -> impl Iterator<Item = &Subscription> {
        self.0.iter().map(|(_, v)| v)
    }
}

/// Live matching: every field of a filter but `search`, which is matched
/// as the stores read it ([`protocol::search::Query`]), not as a substring.
const LIVE_MATCH: MatchEventOptions = MatchEventOptions {
    nip50: false,
    ..MatchEventOptions::new()
};

/// Whether a REQ is complete at EOSE: every filter asks for events by id
/// and every id it asks for was `sent` (an event's id fixes its content,
/// so nothing published later can match). A REQ by ids whose event is not
/// stored yet stays live: clients subscribe to an id and then publish it.
fn is_complete(filters: &[Filter], sent: &HashSet<[u8; 32]>) -> bool {
    crate::req::names_ids(filters)
        && filters
            .iter()
            .flat_map(|f| f.ids.iter().flatten())
            .all(|id| sent.contains(id.as_bytes()))
}

struct Conn {
    state: Arc<AppState>,
    community: Arc<Community>,
    /// Normalised host this connection was made to.
    host: String,
    challenge: String,
    authed: Option<PublicKey>,
    subs: Subs,
    /// Open NIP-77 syncs, at most `limits.max_sync_sessions`.
    syncs: HashMap<String, Box<crate::neg::Session>>,
    /// The community's live events that may match a subscription's
    /// filters, only while there is a subscription: a connection that only
    /// publishes (or idles), or whose filters an event cannot match, is
    /// not woken by it.
    live: Option<Listener>,
    bucket: TokenBucket,
    out: Outbound,
    /// EVENTs being verified (concurrently), answered in arrival order.
    verifying: FuturesOrdered<BoxFuture<'static, Verified>>,
    /// Verified EVENTs queued for the store's batch writer, in arrival order.
    storing: FuturesOrdered<BoxFuture<'static, Stored>>,
    /// When this connection was last answered `OK true`: its reads from a
    /// standby must come from one that replayed past it (`read.rs`).
    wrote_at: Option<std::time::Instant>,
}

type Verified = (Arc<Event>, Arc<str>, Result<(), verify::VerifyError>);
type Stored = (
    Arc<Event>,
    Arc<str>,
    Result<InsertOutcome, crate::store::StoreError>,
);

/// Why the connection loop stops.
enum Stop {
    Overflow,
}

impl From<Overflow> for Stop {
    fn from(_: Overflow) -> Self {
        Stop::Overflow
    }
}

/// Counts an open connection in `relay_connections` while it lives.
struct OpenConnection;

impl OpenConnection {
    fn new() -> OpenConnection {
        metrics::gauge!(crate::telemetry::CONNECTIONS).increment(1.0);
        OpenConnection
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        metrics::gauge!(crate::telemetry::CONNECTIONS).decrement(1.0);
    }
}

/// The most a connection's task may take: its future is allocated whole
/// when the socket opens, as large as the largest state any await inside
/// it can be in, so a large await on a rare path (a cache miss, a channel
/// event, a REQ) is boxed. It was 10,896 bytes before they were, 1,760
/// after; checked in debug builds (every test's relay) as each opens.
pub const TASK_MAX_BYTES: usize = 4 * 1024;

/// Runs a connection to completion.
pub async fn run(socket: WebSocket, state: Arc<AppState>, community: Arc<Community>, host: String) {
    let limits = &state.cfg.limits;
    // Events of this connection verified or stored at once, at most.
    let max_inflight = limits.max_inflight_events;
    assert!(max_inflight > 0, "validated at load");
    let (sink, stream) = socket.split();
    // Polled only when the socket woke it (`gate`): not after every live event.
    let mut stream = gate::Gated::new(stream);
    let (out, writer) = outbound::spawn(sink, limits.max_outbound_bytes, state.output.clone());
    let mut conn = Conn {
        bucket: TokenBucket::new(limits.events_per_second, limits.events_burst),
        challenge: hex::encode(rand::random::<[u8; 16]>()),
        state: state.clone(),
        community,
        host,
        authed: None,
        subs: Subs::default(),
        syncs: HashMap::new(),
        live: None,
        out,
        verifying: FuturesOrdered::new(),
        storing: FuturesOrdered::new(),
        wrote_at: None,
    };
    let shutdown = state.shutdown.clone();
    let _ = conn.out.text(json!(["AUTH", conn.challenge]).to_string());
    let _open = OpenConnection::new();
    // On shutdown the connection reads nothing more, answers every EVENT
    // it already read (verified or being stored: an event stored without
    // its OK would be sent again by a client), then closes. The server
    // waits `shutdown_grace_ms` for that at most.
    let mut draining = false;

    loop {
        if draining && conn.verifying.is_empty() && conn.storing.is_empty() {
            conn.out.close(CLOSE_GOING_AWAY, "relay shutting down");
            break;
        }
        let step: Result<bool, Stop> = tokio::select! {
            biased;
            _ = shutdown.cancelled(), if !draining => {
                draining = true;
                Ok(true)
            }
            _ = conn.out.failed() => break,
            Some(done) = conn.storing.next(), if !conn.storing.is_empty() => conn.after_store(done).map(|_| true),
            Some(checked) = conn.verifying.next(), if !conn.verifying.is_empty() => {
                conn.after_verify(checked).await.map(|_| true)
            }
            // Live events before the socket: a live event is the usual
            // reason this task woke. The socket still gets its turn
            // whenever no live event waits (the live backlog is bounded by
            // `fanout_buffer_events`), and is read only once it woke the
            // task (`gate`).
            item = next_live(&mut conn.live), if !draining => match item {
                Ok(p) => conn.on_live(&p).await.map(|_| true),
                Err(Lagged) => {
                    tracing::warn!(community = %conn.community.id, "subscriber fell behind live fan-out");
                    let _ = conn.notice("error: connection fell behind the live event stream and is closed");
                    conn.out.close(CLOSE_POLICY, "too slow");
                    break;
                }
            },
            msg = stream.next(), if !draining && conn.verifying.len() + conn.storing.len() < max_inflight => match msg {
                None | Some(Ok(Message::Close(_))) => Ok(false),
                Some(Err(e)) => {
                    if is_capacity_error(&e) {
                        conn.out.close(CLOSE_TOO_BIG, "invalid: message exceeds the hard size limit");
                    }
                    Ok(false)
                }
                Some(Ok(Message::Text(text))) => conn.on_text(text.as_str()).await.map(|_| true),
                Some(Ok(Message::Binary(_))) => conn
                    .notice("invalid: binary messages are not supported")
                    .map(|_| true)
                    .map_err(Stop::from),
                Some(Ok(_)) => Ok(true), // ping/pong are answered by the library
            },
        };
        if conn.subs.is_empty() {
            conn.live = None;
        }
        match step {
            Ok(true) => {}
            Ok(false) => {
                conn.out.close(1000, "");
                break;
            }
            Err(Stop::Overflow) => {
                tracing::info!(community = %conn.community.id, "slow reader disconnected");
                writer.abort();
                return;
            }
        }
    }
    drop(conn);
    // Let the writer flush what is queued (ending with the close frame),
    // reading and dropping what the client sends meanwhile, until its
    // close: a socket closed with input unread is reset, and a reset
    // drops what is still unsent (the last answers of a client that
    // pipelined more than the relay read before shutdown).
    let drain = async { while let Some(Ok(_)) = stream.next().await {} };
    let closing = futures_util::future::join(writer, drain);
    let _ = tokio::time::timeout(CLOSE_WAIT, closing).await;
}

fn is_capacity_error(e: &axum::Error) -> bool {
    let text = e.to_string().to_ascii_lowercase();
    text.contains("capacity") || text.contains("too long") || text.contains("too big")
}

impl Conn {
    fn send(&self, v: serde_json::Value) -> Result<(), Overflow> {
        self.out.text(v.to_string())
    }

    fn notice(&self, msg: &str) -> Result<(), Overflow> {
        self.send(json!(["NOTICE", msg]))
    }

    /// The `OK` of an EVENT (counted in `relay_events_received_total`).
    fn ok(&mut self, id: &str, accepted: bool, msg: &str) -> Result<(), Overflow> {
        if accepted {
            self.wrote_at = Some(std::time::Instant::now());
        }
        let outcome = crate::telemetry::outcome(accepted, msg);
        metrics::counter!(crate::telemetry::EVENTS_RECEIVED, "outcome" => outcome).increment(1);
        self.send(json!(["OK", id, accepted, msg]))
    }

    /// The `OK` of an AUTH (not an event received).
    fn auth_ok(&self, id: &str, accepted: bool, msg: &str) -> Result<(), Overflow> {
        self.send(json!(["OK", id, accepted, msg]))
    }

    fn closed(&self, sub_id: &str, msg: &str) -> Result<(), Overflow> {
        self.send(json!(["CLOSED", sub_id, msg]))
    }

    fn limits(&self) -> &crate::config::Limits {
        &self.state.cfg.limits
    }

    async fn on_text(&mut self, text: &str) -> Result<(), Stop> {
        let max = self.limits().max_message_bytes;
        let parsed = protocol::message::parse(text);
        if text.len() > max {
            let why = format!(
                "invalid: message of {} bytes exceeds max_message_bytes {max}",
                text.len()
            );
            match parsed {
                Ok(ClientMessage::Event(e)) => self.ok(&e.event.id.to_hex(), false, &why)?,
                Ok(ClientMessage::Auth(e)) => self.ok(&e.id.to_hex(), false, &why)?,
                Err(ParseError::Event { event_id, .. }) => self.ok(&event_id, false, &why)?,
                Ok(ClientMessage::Req { sub_id, .. }) | Ok(ClientMessage::Count { sub_id, .. }) => {
                    self.closed(&sub_id, &why)?
                }
                _ => self.notice(&why)?,
            }
            return Ok(());
        }
        match parsed {
            Err(ParseError::Envelope(reason)) => self.notice(&format!("invalid: {reason}"))?,
            Err(ParseError::Event { event_id, reason }) => {
                self.ok(&event_id, false, &format!("invalid: {reason}"))?
            }
            Err(ParseError::Subscription { sub_id, reason, verb }) if verb.starts_with("NEG-") => {
                self.syncs.remove(&sub_id);
                self.neg_err(&sub_id, &format!("invalid: {reason}"))?
            }
            Err(ParseError::Subscription { sub_id, reason, .. }) => {
                self.closed(&sub_id, &format!("invalid: {reason}"))?
            }
            Ok(ClientMessage::Event(incoming)) => self.on_event(*incoming).await?,
            Ok(ClientMessage::Req { sub_id, filters }) => Box::pin(self.on_req(sub_id, filters)).await?,
            Ok(ClientMessage::Count { sub_id, filters }) => Box::pin(self.on_count(sub_id, filters)).await?,
            Ok(ClientMessage::Close { sub_id }) => {
                if self.subs.remove(&sub_id).is_some() {
                    self.listen(None);
                }
            }
            Ok(ClientMessage::Auth(event)) => Box::pin(self.on_auth(Arc::new(*event))).await?,
            Ok(ClientMessage::NegOpen {
                sub_id,
                filter,
                message,
            }) => Box::pin(self.on_neg_open(sub_id, *filter, message)).await?,
            Ok(ClientMessage::NegMsg { sub_id, message }) => {
                Box::pin(self.on_neg_msg(sub_id, message)).await?
            }
            Ok(ClientMessage::NegClose { sub_id }) => {
                self.syncs.remove(&sub_id);
            }
        }
        Ok(())
    }

    async fn on_auth(&mut self, event: Arc<Event>) -> Result<(), Stop> {
        let id = event.id.to_hex();
        if event.kind.as_u16() != kinds::CLIENT_AUTH {
            return Ok(self.auth_ok(&id, false, "invalid: AUTH event must be kind 22242")?);
        }
        if let Err(e) = verify::verify(event.clone(), verify::IdCheck::Recompute).await {
            return Ok(self.auth_ok(&id, false, e.message())?);
        }
        let tag_value = |name: &str| {
            event
                .tags
                .iter()
                .find(|t| t.kind() == name)
                .and_then(|t| t.content())
                .map(str::to_string)
        };
        if tag_value("challenge").as_deref() != Some(self.challenge.as_str()) {
            return Ok(self.auth_ok(&id, false, "invalid: challenge does not match this connection's")?);
        }
        let expected = self.community.websocket_url(&self.host);
        let relay_ok = tag_value("relay").is_some_and(|r| same_relay_url(&r, &expected));
        if !relay_ok {
            return Ok(self.auth_ok(&id, false, &format!("invalid: relay tag must be {expected}"))?);
        }
        let now = unix_now();
        let age = now.abs_diff(event.created_at.as_secs());
        if age > self.limits().auth_max_age_secs {
            return Ok(self.auth_ok(&id, false, "invalid: AUTH event created_at is too far from now")?);
        }
        let moderation = self.state.moderation.get(&self.community).await;
        if moderation.bans.pubkeys.contains(&event.pubkey.to_bytes()) {
            return Ok(self.auth_ok(&id, false, "blocked: this pubkey is banned in this community")?);
        }
        self.authed = Some(event.pubkey);
        Ok(self.auth_ok(&id, true, "")?)
    }
}

/// The next live event, or never when the connection has no listener.
async fn next_live(live: &mut Option<Listener>) -> Result<Arc<Published>, Lagged> {
    match live {
        Some(l) => l.recv().await,
        None => std::future::pending().await,
    }
}

/// Compares relay URLs the way NIP-42 clients write them: scheme and host
/// case-insensitive, a trailing slash ignored, default ports ignored.
fn same_relay_url(given: &str, expected: &str) -> bool {
    let norm = |s: &str| -> Option<(String, String, String)> {
        let u = url::Url::parse(s.trim()).ok()?;
        let host = u.host_str()?.to_ascii_lowercase();
        let hostport = match u.port() {
            Some(p) => format!("{host}:{p}"),
            None => host,
        };
        let path = u.path().trim_end_matches('/').to_string();
        Some((u.scheme().to_string(), hostport, path))
    };
    matches!((norm(given), norm(expected)), (Some(a), Some(b)) if a == b)
}

#[cfg(test)]
mod tests {
    use super::{same_relay_url, Subs, Subscription};

    #[test]
    fn relay_urls() {
        assert!(same_relay_url("ws://127.0.0.1:7777", "ws://127.0.0.1:7777"));
        assert!(same_relay_url("ws://127.0.0.1:7777/", "ws://127.0.0.1:7777"));
        assert!(same_relay_url("WSS://Example.com", "wss://example.com"));
        assert!(same_relay_url("wss://example.com:443", "wss://example.com"));
        assert!(!same_relay_url("ws://example.com", "wss://example.com"));
        assert!(!same_relay_url("wss://other.com", "wss://example.com"));
        assert!(!same_relay_url("not a url", "wss://example.com"));
    }

    fn sub(seq_floor: u64) -> Subscription {
        Subscription {
            filters: Vec::new(),
            searches: Vec::new(),
            seq_floor,
            searching: None,
        }
    }

    #[test]
    fn subs_replace_by_id_and_keep_the_order_they_were_made_in() {
        let mut subs = Subs::default();
        assert!(subs.is_empty());
        subs.insert("a".into(), sub(1));
        subs.insert("b".into(), sub(2));
        subs.insert("a".into(), sub(3));
        assert_eq!(subs.len(), 2, "a REQ of a held id replaces it");
        let order: Vec<(&String, u64)> = subs.iter().map(|(k, s)| (k, s.seq_floor)).collect();
        assert_eq!(order, [(&"b".to_string(), 2), (&"a".to_string(), 3)]);
        assert!(subs.contains_key("a") && !subs.contains_key("c"));
        assert_eq!(subs.remove("b").map(|s| s.seq_floor), Some(2));
        assert!(subs.remove("b").is_none());
        assert_eq!(subs.values().map(|s| s.seq_floor).collect::<Vec<_>>(), [3]);
    }
}
