//! Talking to a running relay as one key: NIP-98 signed HTTP calls, NIP-86
//! management calls, and publishing an event over WebSocket after NIP-42.
//! Every failure says what failed and what to try.

use ::client::http::{ApiError, Http, CALL_TIMEOUT};
use ::client::ws::{self, WsError};
use anyhow::{anyhow, bail, Context};
use nostr::prelude::{Event, Keys};
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

/// A relay (one community's host) and the key that signs.
pub struct Relay {
    /// `http(s)://host[:port]`, no trailing slash.
    http: Http,
    /// `ws(s)://host[:port]`.
    ws: String,
    keys: Keys,
}

impl Relay {
    /// `url` as `http(s)://…` or `ws(s)://…` (a path is ignored).
    pub fn new(url: &str, keys: Keys) -> anyhow::Result<Relay> {
        let parsed = url::Url::parse(url).with_context(|| format!("--relay {url:?} is not a URL"))?;
        let secure = match parsed.scheme() {
            "http" | "ws" => false,
            "https" | "wss" => true,
            other => bail!("--relay must be http(s):// or ws(s)://, not {other}://"),
        };
        let host = parsed
            .host_str()
            .ok_or_else(|| anyhow!("--relay {url:?} has no host"))?;
        let authority = match parsed.port() {
            Some(p) => format!("{host}:{p}"),
            None => host.to_string(),
        };
        let (h, w) = if secure { ("https", "wss") } else { ("http", "ws") };
        Ok(Relay {
            http: Http::new(format!("{h}://{authority}"), keys.clone())?,
            ws: format!("{w}://{authority}"),
            keys,
        })
    }

    /// A NIP-98 signed call; the answer of a 2xx read as `T` (a type of
    /// `protocol::api`), else an error with the relay's code and message
    /// and a hint.
    pub async fn call<T: DeserializeOwned>(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> anyhow::Result<T> {
        self.http
            .call(method, path, body)
            .await
            .map_err(|e| said(&format!("{method} {path}"), self.http.base(), e))
    }

    /// A management call (NIP-86): its `result` read as `T`, or the
    /// relay's `error`.
    pub async fn rpc<T: DeserializeOwned>(&self, method: &str, params: Value) -> anyhow::Result<T> {
        self.http
            .rpc(method, params)
            .await
            .map_err(|e| said(method, self.http.base(), e))
    }

    /// Publishes `event` over WebSocket, authenticated (NIP-42) as the key;
    /// returns the relay's `OK` message when accepted.
    pub async fn publish(&self, event: &Event) -> anyhow::Result<String> {
        let mut ws = self.connect().await?;
        let (ok, msg) =
            ws::send_and_wait_ok(&mut ws, json!(["EVENT", event]), &event.id.to_hex(), CALL_TIMEOUT).await?;
        let _ = ws.close(None).await;
        if !ok {
            bail!("the relay refused the event: {msg}");
        }
        Ok(msg)
    }
}

impl Relay {
    /// A WebSocket session authenticated (NIP-42) as the key.
    async fn connect(&self) -> anyhow::Result<ws::Socket> {
        ws::connect_authed(&self.ws, &self.keys, CALL_TIMEOUT)
            .await
            .map_err(|e| match e {
                WsError::Connect { .. } => anyhow!("{e} (is the relay running there?)"),
                e => anyhow!(e),
            })
    }

    /// One stored event by id, as this key may read it (NIP-42), if any.
    pub async fn event(&self, id: &str) -> anyhow::Result<Option<Event>> {
        let mut ws = self.connect().await?;
        let found = ws::query(&mut ws, &json!({"ids": [id]}), 1, CALL_TIMEOUT).await?;
        let _ = ws.close(None).await;
        Ok(found
            .into_iter()
            .next()
            .and_then(|v| serde_json::from_value(v).ok()))
    }
}

/// A failed call in words: what was called, the relay's status, code and
/// message, and what to try.
fn said(what: &str, base: &str, e: ApiError) -> anyhow::Error {
    match e {
        ApiError::Unreachable(why) => {
            anyhow!("{why} (is it running at {base}, and is --relay its public address?)")
        }
        ApiError::Transport(why) => anyhow!("{what}: {why}"),
        ApiError::Refused {
            status,
            code,
            message,
        } if message.starts_with(&code) => {
            anyhow!("{what}: HTTP {status} {message}{}", hint(status, &code))
        }
        ApiError::Refused {
            status,
            code,
            message,
        } => {
            anyhow!("{what}: HTTP {status} {code}: {message}{}", hint(status, &code))
        }
    }
}

/// What to try after a refusal.
fn hint(status: u16, code: &str) -> &'static str {
    match (status, code) {
        (401, _) => "\nhint: the signature was refused; check this machine's clock and that --relay names the host the relay serves",
        (403, "banned") => "\nhint: this key is banned in this community",
        (403, "not_owner") => "\nhint: sign with the workflow owner's key (--key-file or RELAYCTL_KEY)",
        (403, _) => "\nhint: this needs a community admin's key (the relay's `admins` setting) or the workflow owner's",
        (404, _) => "\nhint: check the id; `relayctl runs list` and `relayctl deliveries list` show them",
        (429, _) => "\nhint: too many calls; wait a moment",
        (503, _) => "\nhint: the relay cannot reach its database now; try again",
        _ => "",
    }
}
