//! The delivery API client (NIP-98 signed HTTP calls), speaking the
//! contract's types (`protocol::api`).

use client::http::Http;
use nostr::prelude::Keys;
use protocol::api::{
    ClaimAnswer, ClaimRequest, DeliveryStatus, Effect, FinishAnswer, FinishRequest, OperationAnswer,
    OperationRequest, RenewAnswer, RenewRequest,
};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// A claimed delivery, as the relay answers a claim.
pub use protocol::api::ClaimedDelivery as Delivery;

pub use client::http::ApiError;

/// The HTTP side of the relay.
#[derive(Clone)]
pub struct Api {
    http: Http,
}

impl Api {
    pub fn new(base: String, keys: Keys) -> Self {
        let http = Http::new(base, keys).expect("building an HTTP client without TLS cannot fail");
        Self { http }
    }

    /// One signed `POST` of `body`, its answer read as `A`.
    async fn call<B: Serialize, A: DeserializeOwned>(&self, path: &str, body: &B) -> Result<A, ApiError> {
        self.http.call("POST", path, Some(body)).await
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
