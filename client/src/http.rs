//! NIP-98 signed HTTP calls to one relay as one key: each answer read into
//! its type of `protocol::api` or `protocol::nip86`, each refusal kept as
//! the relay said it (status, code, message).

use std::time::Duration;

use nostr::prelude::Keys;
use protocol::api::ErrorBody;
use protocol::nip86::Response;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};

/// How long one call may take.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a call did not succeed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ApiError {
    /// The call failed before the relay answered (connecting to it, or
    /// sending the request).
    #[error("transport: {0}")]
    Unreachable(String),
    /// Anything else between the call and a readable answer: the client
    /// could not be built, the answer was cut off, or it is not what the
    /// contract says.
    #[error("transport: {0}")]
    Transport(String),
    /// The relay answered with a refusal.
    #[error("{status} {code}: {message}")]
    Refused {
        status: u16,
        code: String,
        message: String,
    },
}

impl ApiError {
    /// Whether trying again (the same request) can help.
    pub fn is_transient(&self) -> bool {
        match self {
            ApiError::Unreachable(_) | ApiError::Transport(_) => true,
            ApiError::Refused { status, .. } => *status == 429 || *status >= 500,
        }
    }
}

/// One relay's HTTP side (`http(s)://host[:port]`) and the key that signs.
#[derive(Clone)]
pub struct Http {
    client: reqwest::Client,
    base: String,
    keys: Keys,
}

impl Http {
    pub fn new(base: String, keys: Keys) -> Result<Self, ApiError> {
        let client = reqwest::Client::builder()
            .timeout(CALL_TIMEOUT)
            .build()
            .map_err(|e| ApiError::Transport(format!("building the HTTP client: {e}")))?;
        Ok(Self { client, base, keys })
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    /// A signed call of `method` on `path` with an optional JSON body; the
    /// answer of a 2xx read as `A`.
    pub async fn call<A: DeserializeOwned>(
        &self,
        method: &str,
        path: &str,
        body: Option<&impl Serialize>,
    ) -> Result<A, ApiError> {
        let bytes = match body {
            Some(b) => serde_json::to_vec(b).map_err(|e| ApiError::Transport(e.to_string()))?,
            None => Vec::new(),
        };
        let (status, text) = self
            .send(method, path, "application/json", body.is_some(), bytes)
            .await?;
        if (200..300).contains(&status) {
            return serde_json::from_str(&text).map_err(|e| {
                ApiError::Transport(format!(
                    "{method} {path}: an answer not in the contract ({e}): {text}"
                ))
            });
        }
        let refusal: Option<ErrorBody> = serde_json::from_str(&text).ok();
        Err(ApiError::Refused {
            status,
            code: refusal.as_ref().map_or("error", |r| r.error.as_str()).to_string(),
            message: refusal.map_or(text, |r| r.message),
        })
    }

    /// A management call (NIP-86, `POST /`): its `result` read as `A`; a
    /// refusal's code is the `error`'s prefix (`prefix: text`).
    pub async fn rpc<A: DeserializeOwned>(&self, method: &str, params: Value) -> Result<A, ApiError> {
        let body = json!({"method": method, "params": params})
            .to_string()
            .into_bytes();
        let (status, text) = self
            .send("POST", "/", protocol::nip86::CONTENT_TYPE, true, body)
            .await?;
        match serde_json::from_str::<Response>(&text).ok() {
            Some(Response { result, error: None }) if (200..300).contains(&status) => {
                serde_json::from_value(result).map_err(|e| {
                    ApiError::Transport(format!("{method}: an answer not in the contract ({e}): {text}"))
                })
            }
            answer => {
                let error = answer.and_then(|a| a.error).unwrap_or(text);
                let error = if error.is_empty() {
                    "no answer".to_string()
                } else {
                    error
                };
                Err(ApiError::Refused {
                    status,
                    code: error.split(':').next().unwrap_or_default().to_string(),
                    message: error,
                })
            }
        }
    }

    /// Sends a signed request; its status and body text.
    async fn send(
        &self,
        method: &str,
        path: &str,
        content_type: &str,
        has_body: bool,
        bytes: Vec<u8>,
    ) -> Result<(u16, String), ApiError> {
        let url = format!("{}{path}", self.base);
        let auth = protocol::nip98::header(&self.keys, method, &url, &bytes);
        let m =
            reqwest::Method::from_bytes(method.as_bytes()).map_err(|e| ApiError::Transport(e.to_string()))?;
        let mut req = self.client.request(m, &url).header("Authorization", auth);
        if has_body {
            req = req.header("Content-Type", content_type).body(bytes);
        }
        let resp = req
            .send()
            .await
            .map_err(|e| ApiError::Unreachable(format!("cannot reach the relay at {}: {e}", self.base)))?;
        let status = resp.status().as_u16();
        let text = resp
            .text()
            .await
            .map_err(|e| ApiError::Transport(e.to_string()))?;
        Ok((status, text))
    }
}
