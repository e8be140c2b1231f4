//! The delivery API client (NIP-98 signed HTTP calls).

use nostr::prelude::Keys;
use serde::Deserialize;
use serde_json::{json, Value};

/// A claimed delivery, as the relay answers a claim.
#[derive(Debug, Clone, Deserialize)]
pub struct Delivery {
    pub id: String,
    pub workflow_id: String,
    pub run_id: String,
    pub step_id: String,
    pub definition_event_id: String,
    pub message_event_id: String,
    pub channel: String,
    pub target_pubkey: String,
    pub attempt: u32,
    pub claim_token: String,
    pub claim_expires_at: i64,
    pub expires_at: i64,
    pub trigger_context: Value,
    pub execution_trace: Value,
}

/// Why a call did not succeed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ApiError {
    /// The request may not have reached the relay, or its answer was lost.
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
    /// Whether trying again (same request) can help.
    pub fn is_transient(&self) -> bool {
        match self {
            ApiError::Transport(_) => true,
            ApiError::Refused { status, .. } => *status == 429 || *status >= 500,
        }
    }
}

/// The HTTP side of the relay.
#[derive(Clone)]
pub struct Api {
    http: reqwest::Client,
    base: String,
    keys: Keys,
}

impl Api {
    pub fn new(base: String, keys: Keys) -> Self {
        let http = reqwest::Client::builder()
            .timeout(std::time::Duration::from_secs(30))
            .build()
            .expect("building an HTTP client without TLS cannot fail");
        Self { http, base, keys }
    }

    /// One signed call.
    pub async fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value, ApiError> {
        let url = format!("{}{path}", self.base);
        let bytes = body.map(|b| b.to_string().into_bytes()).unwrap_or_default();
        let auth = protocol::nip98::header(&self.keys, method, &url, &bytes);
        let method =
            reqwest::Method::from_bytes(method.as_bytes()).map_err(|e| ApiError::Transport(e.to_string()))?;
        let mut req = self.http.request(method, &url).header("Authorization", auth);
        if !bytes.is_empty() {
            req = req.header("Content-Type", "application/json").body(bytes);
        }
        let resp = req.send().await.map_err(|e| ApiError::Transport(e.to_string()))?;
        let status = resp.status().as_u16();
        let v: Value = resp
            .json()
            .await
            .map_err(|e| ApiError::Transport(e.to_string()))?;
        if status == 200 {
            Ok(v)
        } else {
            Err(ApiError::Refused {
                status,
                code: v["error"].as_str().unwrap_or("unknown").to_string(),
                message: v["message"].as_str().unwrap_or_default().to_string(),
            })
        }
    }

    /// Claims a delivery (by id with expected bindings, or the oldest due).
    pub async fn claim(&self, body: Value) -> Result<Option<Delivery>, ApiError> {
        let v = self.call("POST", "/deliveries/claim", Some(&body)).await?;
        if v["delivery"].is_null() {
            return Ok(None);
        }
        serde_json::from_value(v["delivery"].clone())
            .map(Some)
            .map_err(|e| ApiError::Transport(format!("claim answer: {e}")))
    }

    pub async fn renew(&self, d: &Delivery, lease_secs: u64) -> Result<i64, ApiError> {
        let body = json!({"claim_token": d.claim_token, "lease_seconds": lease_secs});
        let v = self
            .call("POST", &format!("/deliveries/{}/renew", d.id), Some(&body))
            .await?;
        v["claim_expires_at"]
            .as_i64()
            .ok_or_else(|| ApiError::Transport("renew answer".into()))
    }

    pub async fn operation(&self, id: &str, token: &str, name: &str, effect: &str) -> Result<(), ApiError> {
        let body = json!({"claim_token": token, "name": name, "effect": effect});
        self.call("POST", &format!("/deliveries/{id}/operations"), Some(&body))
            .await
            .map(|_| ())
    }

    pub async fn finish(&self, id: &str, body: &Value) -> Result<String, ApiError> {
        let v = self
            .call("POST", &format!("/deliveries/{id}/finish"), Some(body))
            .await?;
        Ok(v["status"].as_str().unwrap_or_default().to_string())
    }
}
