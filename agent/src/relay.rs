//! The agent's WebSocket link to the relay: authenticates (NIP-42,
//! `client::ws`), subscribes to
//! its wake hints, serves `REQ`-by-id queries, and reconnects with backoff
//! and jitter. One task owns the socket; others talk to it by message.

use std::collections::HashMap;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use nostr::prelude::{Event, Keys};
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};
use tokio_tungstenite::tungstenite::Message;
use tokio_util::sync::CancellationToken;

/// How long a query may take.
const QUERY_TIMEOUT: Duration = Duration::from_secs(10);
/// How long connecting and authenticating (NIP-42) may take.
const AUTH_TIMEOUT: Duration = Duration::from_secs(10);
/// Queries waiting for the socket, at most.
const MAX_PENDING_QUERIES: usize = 256;

enum Cmd {
    Query {
        filter: Value,
        reply: oneshot::Sender<Result<Vec<Event>, String>>,
    },
}

/// Handle to the link task.
#[derive(Clone)]
pub struct RelayLink {
    cmds: mpsc::Sender<Cmd>,
}

impl RelayLink {
    /// Stored events matching one filter (authenticated as the agent).
    pub async fn query(&self, filter: Value) -> Result<Vec<Event>, String> {
        let (tx, rx) = oneshot::channel();
        self.cmds
            .send(Cmd::Query { filter, reply: tx })
            .await
            .map_err(|_| "relay link stopped".to_string())?;
        match tokio::time::timeout(QUERY_TIMEOUT, rx).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Err("relay link dropped the query".into()),
            Err(_) => Err("query timed out".into()),
        }
    }

    /// One event by id, if the relay serves it to this agent.
    pub async fn event_by_id(&self, id: &str) -> Result<Option<Event>, String> {
        Ok(self.query(json!({"ids": [id]})).await?.into_iter().next())
    }
}

/// Backoff bounds for reconnecting.
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    pub min: Duration,
    pub max: Duration,
}

impl Backoff {
    /// The delay before attempt `n` (0-based): exponential, capped, with
    /// jitter of up to half the delay (so many agents do not reconnect in step).
    pub fn delay(&self, n: u32) -> Duration {
        let base = self.min.saturating_mul(1u32 << n.min(16)).min(self.max);
        let jitter = rand::random::<f64>() * base.as_secs_f64() / 2.0;
        base.mul_f64(0.75) + Duration::from_secs_f64(jitter)
    }
}

/// Starts the link. Wakes (kind 24620 addressed to this agent) go to `wakes`;
/// `connected` is signalled after each successful subscription (the runtime
/// polls then, so nothing sent while disconnected waits for the next poll).
pub fn spawn(
    url: String,
    keys: Keys,
    wakes: mpsc::Sender<Event>,
    connected: mpsc::Sender<()>,
    backoff: Backoff,
    shutdown: CancellationToken,
) -> RelayLink {
    let (tx, rx) = mpsc::channel(MAX_PENDING_QUERIES);
    tokio::spawn(run(url, keys, wakes, connected, backoff, shutdown, rx));
    RelayLink { cmds: tx }
}

async fn run(
    url: String,
    keys: Keys,
    wakes: mpsc::Sender<Event>,
    connected: mpsc::Sender<()>,
    backoff: Backoff,
    shutdown: CancellationToken,
    mut cmds: mpsc::Receiver<Cmd>,
) {
    let mut failures = 0u32;
    let mut last_error;
    loop {
        let mut subscribed = false;
        match session(
            &url,
            &keys,
            &wakes,
            &connected,
            &shutdown,
            &mut cmds,
            &mut subscribed,
        )
        .await
        {
            Ok(()) => return, // shutdown
            Err(e) => last_error = e.to_string(),
        }
        // A session that got as far as subscribing resets the backoff.
        if subscribed {
            failures = 0;
        }
        let delay = backoff.delay(failures);
        // Said at every try, so that an operator sees an agent that cannot
        // reach its relay (and why) without turning on debug logs.
        tracing::warn!(relay = %url, error = %last_error, retry_in_ms = delay.as_millis() as u64,
            "cannot reach the relay; retrying");
        failures = failures.saturating_add(1);
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(delay) => {}
        }
    }
}

type Pending = HashMap<String, (Vec<Event>, oneshot::Sender<Result<Vec<Event>, String>>)>;

async fn session(
    url: &str,
    keys: &Keys,
    wakes: &mpsc::Sender<Event>,
    connected: &mpsc::Sender<()>,
    shutdown: &CancellationToken,
    cmds: &mut mpsc::Receiver<Cmd>,
    subscribed: &mut bool,
) -> Result<(), String> {
    let mut ws = client::ws::connect_authed(url, keys, AUTH_TIMEOUT)
        .await
        .map_err(|e| e.to_string())?;
    let me = keys.public_key().to_hex();
    let req = json!(["REQ", "wakes", {"kinds": [protocol::kinds::WAKE_HINT], "#p": [me], "limit": 0}]);
    ws.send(Message::Text(req.to_string().into()))
        .await
        .map_err(|e| e.to_string())?;
    let mut pending: Pending = HashMap::new();
    let mut next_query = 0u64;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => {
                let _ = ws.close(None).await;
                return Ok(());
            }
            cmd = cmds.recv() => {
                let Some(Cmd::Query { filter, reply }) = cmd else { return Ok(()) };
                next_query += 1;
                let sub = format!("q{next_query}");
                let msg = json!(["REQ", sub, filter]).to_string();
                if let Err(e) = ws.send(Message::Text(msg.into())).await {
                    let _ = reply.send(Err(format!("send: {e}")));
                    return Err(format!("send: {e}"));
                }
                pending.insert(sub, (Vec::new(), reply));
            }
            msg = ws.next() => {
                let text = match msg {
                    Some(Ok(Message::Text(t))) => t,
                    Some(Ok(Message::Close(_))) | None => return Err("closed by relay".into()),
                    Some(Ok(_)) => continue,
                    Some(Err(e)) => return Err(format!("read: {e}")),
                };
                let Ok(v) = serde_json::from_str::<Value>(text.as_str()) else { continue };
                match v[0].as_str() {
                    Some("EOSE") if v[1] == "wakes" => {
                        tracing::info!("subscribed to wake hints");
                        *subscribed = true;
                        let _ = connected.try_send(());
                    }
                    Some("EVENT") => {
                        let Ok(ev) = serde_json::from_value::<Event>(v[2].clone()) else { continue };
                        if v[1] == "wakes" {
                            // Bounded: if the runtime is behind, drop the hint; polling covers it.
                            let _ = wakes.try_send(ev);
                        } else if let Some(sub) = v[1].as_str() {
                            if let Some(p) = pending.get_mut(sub) {
                                p.0.push(ev);
                            }
                        }
                    }
                    Some("EOSE") => {
                        if let Some((events, reply)) = v[1].as_str().and_then(|s| pending.remove(s)) {
                            let _ = reply.send(Ok(events));
                            let close = json!(["CLOSE", v[1]]).to_string();
                            ws.send(Message::Text(close.into())).await.map_err(|e| e.to_string())?;
                        }
                    }
                    Some("CLOSED") => {
                        if let Some((_, reply)) = v[1].as_str().and_then(|s| pending.remove(s)) {
                            let _ = reply.send(Err(format!("query closed: {}", v[2])));
                        }
                    }
                    _ => {}
                }
            }
        }
    }
}
