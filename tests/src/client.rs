//! A minimal Nostr client over a real WebSocket, for tests.

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use nostr::prelude::{Event, EventBuilder, FinalizeEvent, Keys, Kind, Tag};
use serde_json::{json, Value};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// How long a test waits for an expected message.
pub const WAIT: Duration = Duration::from_secs(10);

/// A connected test client.
pub struct Client {
    ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
    /// The NIP-42 challenge the relay sent on connect.
    pub challenge: String,
    /// The URL the client connected to.
    pub url: String,
}

/// What a REQ produced.
#[derive(Debug)]
pub enum ReqResult {
    /// Stored events until EOSE.
    Events(Vec<Event>),
    /// The relay closed the subscription with this message.
    Closed(String),
}

impl ReqResult {
    /// The events, panicking on CLOSED.
    pub fn events(self) -> Vec<Event> {
        match self {
            ReqResult::Events(e) => e,
            ReqResult::Closed(m) => panic!("subscription closed: {m}"),
        }
    }

    /// The CLOSED message, panicking on events.
    pub fn closed(self) -> String {
        match self {
            ReqResult::Closed(m) => m,
            ReqResult::Events(e) => panic!("expected CLOSED, got {} events", e.len()),
        }
    }
}

impl Client {
    /// Connects to `url` (Host header from the URL) and reads the AUTH challenge.
    pub async fn connect(url: &str) -> Client {
        Self::connect_host(url, None).await.expect("connect")
    }

    /// Connects with an explicit `Host` header.
    pub async fn connect_host(
        url: &str,
        host: Option<&str>,
    ) -> Result<Client, tokio_tungstenite::tungstenite::Error> {
        let mut req = url.into_client_request()?;
        if let Some(h) = host {
            req.headers_mut()
                .insert("host", HeaderValue::from_str(h).expect("host header"));
        }
        let (ws, _) = tokio_tungstenite::connect_async_with_config(req, None, true).await?;
        let mut c = Client {
            ws,
            challenge: String::new(),
            url: url.to_string(),
        };
        let first = c.recv().await;
        assert_eq!(
            first[0], "AUTH",
            "first message must be the AUTH challenge: {first}"
        );
        c.challenge = first[1].as_str().expect("challenge string").to_string();
        Ok(c)
    }

    /// Connects with a tiny, fixed socket receive buffer (no autotuning), to
    /// play a client that reads slowly or not at all.
    pub async fn connect_small_receive_buffer(url: &str) -> Client {
        let req = url.into_client_request().expect("request");
        let host = req.uri().host().expect("host").to_string();
        let port = req.uri().port_u16().expect("port");
        let addr = tokio::net::lookup_host((host.as_str(), port))
            .await
            .expect("resolve")
            .next()
            .expect("address");
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket.set_recv_buffer_size(4096).expect("SO_RCVBUF");
        let stream = socket.connect(addr).await.expect("connect");
        let (ws, _) = tokio_tungstenite::client_async(req, MaybeTlsStream::Plain(stream))
            .await
            .expect("handshake");
        let mut c = Client {
            ws,
            challenge: String::new(),
            url: url.to_string(),
        };
        let first = c.recv().await;
        c.challenge = first[1].as_str().unwrap_or_default().to_string();
        c
    }

    /// Sends a raw text frame.
    pub async fn send_raw(&mut self, text: impl Into<String>) {
        self.ws
            .send(Message::Text(text.into().into()))
            .await
            .expect("send");
    }

    /// Sends a JSON value; `false` if the connection is gone (a relay
    /// killed under a background task of a test is not a failure).
    pub async fn try_send(&mut self, v: Value) -> bool {
        self.ws.send(Message::Text(v.to_string().into())).await.is_ok()
    }

    /// Sends a JSON value.
    pub async fn send(&mut self, v: Value) {
        self.send_raw(v.to_string()).await;
    }

    /// Next JSON message, panicking after [`WAIT`].
    pub async fn recv(&mut self) -> Value {
        match self.try_recv(WAIT).await {
            Some(v) => v,
            None => panic!("no message within {WAIT:?}"),
        }
    }

    /// Next JSON message within `d`, or `None`.
    pub async fn try_recv(&mut self, d: Duration) -> Option<Value> {
        loop {
            let msg = tokio::time::timeout(d, self.ws.next()).await.ok()??;
            match msg {
                Ok(Message::Text(t)) => {
                    return Some(serde_json::from_str(t.as_str()).expect("relay sent JSON"))
                }
                Ok(Message::Close(_)) | Err(_) => return None,
                Ok(_) => continue,
            }
        }
    }

    /// Waits for the connection to be closed and returns the close frame.
    pub async fn closed_by_relay(&mut self, d: Duration) -> Option<Option<CloseFrame>> {
        let deadline = tokio::time::Instant::now() + d;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match tokio::time::timeout(left, self.ws.next()).await {
                Err(_) => return None,
                Ok(None) => return Some(None),
                Ok(Some(Ok(Message::Close(f)))) => return Some(f),
                Ok(Some(Err(_))) => return Some(None),
                Ok(Some(Ok(_))) => continue,
            }
        }
    }

    /// Asserts nothing arrives for `d`.
    pub async fn expect_silence(&mut self, d: Duration) {
        if let Some(v) = self.try_recv(d).await {
            panic!("expected no message, got {v}");
        }
    }

    /// Publishes an event and returns the OK (accepted, message).
    pub async fn publish(&mut self, ev: &Event) -> (bool, String) {
        self.send(json!(["EVENT", ev])).await;
        self.wait_ok(&ev.id.to_hex()).await
    }

    /// Publishes and asserts `OK true`.
    pub async fn publish_ok(&mut self, ev: &Event) {
        let (ok, msg) = self.publish(ev).await;
        assert!(ok, "event rejected: {msg}");
    }

    /// Sends every event without waiting (so that the relay's writer may
    /// store them in batches), then asserts `OK true` for each.
    pub async fn publish_all_ok(&mut self, events: &[Event]) {
        for ev in events {
            self.send(json!(["EVENT", ev])).await;
        }
        for ev in events {
            let (ok, msg) = self.wait_ok(&ev.id.to_hex()).await;
            assert!(ok, "event rejected: {msg}");
        }
    }

    /// Waits for the OK of `id`, skipping other messages.
    pub async fn wait_ok(&mut self, id: &str) -> (bool, String) {
        loop {
            let v = self.recv().await;
            if v[0] == "OK" && v[1] == id {
                return (
                    v[2].as_bool().expect("bool"),
                    v[3].as_str().unwrap_or("").to_string(),
                );
            }
        }
    }

    /// Opens a subscription and collects stored events until EOSE (or CLOSED).
    pub async fn req(&mut self, sub: &str, filters: Vec<Value>) -> ReqResult {
        // Every filter on `ids`, and every id found: the relay ends it after
        // EOSE (CLOSED ""), read here so that a later REQ of the same id
        // does not take it. An id not found keeps it live.
        let ids: Option<Vec<String>> = filters
            .iter()
            .map(|f| {
                f.get("ids")
                    .and_then(Value::as_array)
                    .filter(|a| !a.is_empty())
                    .map(|a| {
                        a.iter()
                            .filter_map(|v| v.as_str().map(str::to_string))
                            .collect::<Vec<_>>()
                    })
            })
            .collect::<Option<Vec<Vec<String>>>>()
            .map(|lists| lists.concat());
        let mut msg = vec![json!("REQ"), json!(sub)];
        msg.extend(filters);
        self.send(Value::Array(msg)).await;
        let mut events: Vec<Event> = Vec::new();
        loop {
            let v = self.recv().await;
            let complete = ids
                .as_ref()
                .is_some_and(|ids| ids.iter().all(|id| events.iter().any(|e| e.id.to_hex() == *id)));
            match v[0].as_str() {
                Some("EVENT") if v[1] == sub => {
                    events.push(serde_json::from_value(v[2].clone()).expect("event"))
                }
                Some("EOSE") if v[1] == sub && complete => loop {
                    let v = self.recv().await;
                    if v[0] == "CLOSED" && v[1] == sub {
                        assert_eq!(v[2], "", "a complete REQ ends without a reason");
                        return ReqResult::Events(events);
                    }
                },
                Some("EOSE") if v[1] == sub => return ReqResult::Events(events),
                Some("CLOSED") if v[1] == sub => {
                    return ReqResult::Closed(v[2].as_str().unwrap_or("").to_string())
                }
                _ => {}
            }
        }
    }

    /// Waits for the next live EVENT on `sub`.
    pub async fn next_event(&mut self, sub: &str) -> Event {
        loop {
            let v = self.recv().await;
            if v[0] == "EVENT" && v[1] == sub {
                return serde_json::from_value(v[2].clone()).expect("event");
            }
        }
    }

    /// Sends COUNT and returns the count (or the CLOSED message as `Err`).
    pub async fn count(&mut self, sub: &str, filters: Vec<Value>) -> Result<u64, String> {
        let mut msg = vec![json!("COUNT"), json!(sub)];
        msg.extend(filters);
        self.send(Value::Array(msg)).await;
        loop {
            let v = self.recv().await;
            match v[0].as_str() {
                Some("COUNT") if v[1] == sub => return Ok(v[2]["count"].as_u64().expect("count")),
                Some("CLOSED") if v[1] == sub => return Err(v[2].as_str().unwrap_or("").to_string()),
                _ => {}
            }
        }
    }

    /// NIP-42 authentication with `relay_url` as the `relay` tag.
    pub async fn auth_as(&mut self, keys: &Keys, relay_url: &str) -> (bool, String) {
        let ev = auth_event(keys, &self.challenge, relay_url);
        self.send(json!(["AUTH", ev])).await;
        self.wait_ok(&ev.id.to_hex()).await
    }

    /// NIP-42 authentication against the URL connected to; asserts success.
    pub async fn auth(&mut self, keys: &Keys) {
        let url = self.url.clone();
        let (ok, msg) = self.auth_as(keys, &url).await;
        assert!(ok, "auth failed: {msg}");
    }

    /// Closes the connection politely.
    pub async fn close(mut self) {
        let _ = self.ws.close(None).await;
    }
}

/// A signed NIP-42 event.
pub fn auth_event(keys: &Keys, challenge: &str, relay_url: &str) -> Event {
    EventBuilder::new(Kind::Authentication, "")
        .tags([
            Tag::custom("relay", [relay_url]),
            Tag::custom("challenge", [challenge]),
        ])
        .finalize(keys)
        .expect("sign")
}

/// Signs an event of `kind` with `content` and `tags` (each tag a list of strings).
pub fn event(keys: &Keys, kind: u16, content: &str, tags: &[&[&str]]) -> Event {
    event_at(keys, kind, content, tags, crate::now())
}

/// Like [`event`] with an explicit `created_at`.
pub fn event_at(keys: &Keys, kind: u16, content: &str, tags: &[&[&str]], created_at: u64) -> Event {
    let tags: Vec<Tag> = tags
        .iter()
        .map(|t| Tag::parse(t.iter().copied()).expect("tag"))
        .collect();
    EventBuilder::new(Kind::from_u16(kind), content)
        .tags(tags)
        .custom_created_at(nostr::prelude::Timestamp::from_secs(created_at))
        .finalize(keys)
        .expect("sign")
}
