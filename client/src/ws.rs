//! The relay's WebSocket side for a client that authenticates (NIP-42):
//! connect, answer the relay's challenge, wait for its `OK`; then send
//! messages, wait for the `OK` of one event, or read what one filter
//! matches. Every wait is bounded by the caller's timeout.

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use nostr::prelude::Keys;
use serde_json::{json, Value};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// A connection to the relay.
pub type Socket = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// Why a WebSocket exchange with the relay did not complete.
#[derive(Debug, thiserror::Error)]
pub enum WsError {
    /// No connection (nothing listens, a refused handshake).
    #[error("connecting to {url}: {why}")]
    Connect { url: String, why: String },
    /// The relay said nothing in time.
    #[error("the relay said nothing within {0:?}")]
    Silent(Duration),
    /// The connection closed or failed mid-exchange.
    #[error("the connection ended: {0}")]
    Closed(String),
    /// The relay refused the authentication event (its `OK` message).
    #[error("the relay refused authentication: {0}")]
    AuthRefused(String),
    /// The relay closed a query (its `CLOSED` message).
    #[error("the relay refused the query: {0}")]
    Refused(String),
}

/// Connects to `url` and authenticates as `keys`: answers the relay's
/// `AUTH` challenge and waits for the `OK` of that answer, all within
/// `timeout`. Messages before the challenge are skipped.
pub async fn connect_authed(url: &str, keys: &Keys, timeout: Duration) -> Result<Socket, WsError> {
    let deadline = Instant::now() + timeout;
    let connect = tokio_tungstenite::connect_async_with_config(url, None, true);
    let (mut ws, _) = tokio::time::timeout_at(deadline, connect)
        .await
        .map_err(|_| WsError::Silent(timeout))?
        .map_err(|e| WsError::Connect {
            url: url.to_string(),
            why: e.to_string(),
        })?;
    let challenge = loop {
        let msg = next_json(&mut ws, deadline, timeout).await?;
        if msg[0] == "AUTH" {
            break msg[1].as_str().unwrap_or_default().to_string();
        }
    };
    let auth = protocol::nip42::auth_event(keys, url, &challenge);
    let id = auth.id.to_hex();
    let (accepted, message) =
        send_and_wait_ok_until(&mut ws, json!(["AUTH", auth]), &id, deadline, timeout).await?;
    if !accepted {
        return Err(WsError::AuthRefused(message));
    }
    Ok(ws)
}

/// Sends `msg` and waits (within `timeout`) for the relay's `OK` of event
/// `id`: whether it was accepted, and its message.
pub async fn send_and_wait_ok(
    ws: &mut Socket,
    msg: Value,
    id: &str,
    timeout: Duration,
) -> Result<(bool, String), WsError> {
    send_and_wait_ok_until(ws, msg, id, Instant::now() + timeout, timeout).await
}

async fn send_and_wait_ok_until(
    ws: &mut Socket,
    msg: Value,
    id: &str,
    deadline: Instant,
    timeout: Duration,
) -> Result<(bool, String), WsError> {
    send(ws, &msg).await?;
    loop {
        let v = next_json(ws, deadline, timeout).await?;
        if v[0] == "OK" && v[1] == id {
            let message = v[3].as_str().unwrap_or_default().to_string();
            return Ok((v[2].as_bool().unwrap_or(false), message));
        }
    }
}

/// Stored events matching one filter (`REQ` until `EOSE`, at most
/// `max_events` kept), within `timeout`; a `CLOSED` is the relay's
/// refusal.
pub async fn query(
    ws: &mut Socket,
    filter: &Value,
    max_events: usize,
    timeout: Duration,
) -> Result<Vec<Value>, WsError> {
    let deadline = Instant::now() + timeout;
    send(ws, &json!(["REQ", "q", filter])).await?;
    let mut events = Vec::new();
    loop {
        let v = next_json(ws, deadline, timeout).await?;
        match v[0].as_str() {
            Some("EVENT") if v[1] == "q" && events.len() < max_events => events.push(v[2].clone()),
            Some("EOSE") if v[1] == "q" => break,
            Some("CLOSED") if v[1] == "q" => {
                return Err(WsError::Refused(v[2].as_str().unwrap_or_default().to_string()))
            }
            _ => {}
        }
    }
    send(ws, &json!(["CLOSE", "q"])).await?;
    Ok(events)
}

/// Sends one message.
pub async fn send(ws: &mut Socket, msg: &Value) -> Result<(), WsError> {
    ws.send(Message::text(msg.to_string()))
        .await
        .map_err(|e| WsError::Closed(e.to_string()))
}

/// The next JSON text message, before `deadline` (`timeout` names it in
/// the error). Frames that are not text, or not JSON, are skipped.
async fn next_json(ws: &mut Socket, deadline: Instant, timeout: Duration) -> Result<Value, WsError> {
    loop {
        let frame = tokio::time::timeout_at(deadline, ws.next())
            .await
            .map_err(|_| WsError::Silent(timeout))?
            .ok_or_else(|| WsError::Closed("closed by the relay".into()))?
            .map_err(|e| WsError::Closed(e.to_string()))?;
        if let Message::Text(t) = frame {
            if let Ok(v) = serde_json::from_str(t.as_str()) {
                return Ok(v);
            }
        }
    }
}
