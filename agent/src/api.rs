//! The delivery API client (NIP-98 signed HTTP calls), speaking the
//! contract's types (`protocol::api`).

use nostr::prelude::Keys;
use protocol::api::{
    ClaimAnswer, ClaimRequest, DeliveryStatus, Effect, ErrorBody, FinishAnswer, FinishRequest,
    OperationAnswer, OperationRequest, RenewAnswer, RenewRequest,
};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// A claimed delivery, as the relay answers a claim.
pub use protocol::api::ClaimedDelivery as Delivery;

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

    /// One signed `POST` of `body`, its answer read as `A`.
    async fn call<B: Serialize, A: DeserializeOwned>(&self, path: &str, body: &B) -> Result<A, ApiError> {
        let url = format!("{}{path}", self.base);
        let bytes = serde_json::to_vec(body).map_err(|e| ApiError::Transport(e.to_string()))?;
        let auth = protocol::nip98::header(&self.keys, "POST", &url, &bytes);
        let resp = self
            .http
            .post(&url)
            .header("Authorization", auth)
            .header("Content-Type", "application/json")
            .body(bytes)
            .send()
            .await
            .map_err(|e| ApiError::Transport(e.to_string()))?;
        let status = resp.status().as_u16();
        let text = resp
            .text()
            .await
            .map_err(|e| ApiError::Transport(e.to_string()))?;
        if status == 200 {
            return serde_json::from_str(&text)
                .map_err(|e| ApiError::Transport(format!("{path} answer: {e}")));
        }
        let refusal: Option<ErrorBody> = serde_json::from_str(&text).ok();
        Err(ApiError::Refused {
            status,
            code: refusal
                .as_ref()
                .map_or("unknown", |r| r.error.as_str())
                .to_string(),
            message: refusal.map(|r| r.message).unwrap_or_default(),
        })
    }

    /// Claims a delivery (by id with expected bindings, or the oldest due).
    pub async fn claim(&self, req: &ClaimRequest) -> Result<Option<Delivery>, ApiError> {
        let answer: ClaimAnswer = self.call("/deliveries/claim", req).await?;
        Ok(answer.delivery)
    }

    pub async fn renew(&self, d: &Delivery, lease_secs: u64) -> Result<i64, ApiError> {
        let req = RenewRequest {
            claim_token: d.claim_token.clone(),
            lease_seconds: Some(lease_secs),
        };
        let answer: RenewAnswer = self.call(&format!("/deliveries/{}/renew", d.id), &req).await?;
        Ok(answer.claim_expires_at)
    }

    pub async fn operation(&self, id: &str, token: &str, name: &str, effect: Effect) -> Result<(), ApiError> {
        let req = OperationRequest {
            claim_token: token.to_string(),
            name: name.to_string(),
            effect,
        };
        let _: OperationAnswer = self.call(&format!("/deliveries/{id}/operations"), &req).await?;
        Ok(())
    }

    pub async fn finish(&self, id: &str, req: &FinishRequest) -> Result<DeliveryStatus, ApiError> {
        let answer: FinishAnswer = self.call(&format!("/deliveries/{id}/finish"), req).await?;
        Ok(answer.status)
    }
}
