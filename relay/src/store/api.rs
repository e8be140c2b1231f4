//! [`WorkflowStore`]: the workflow and delivery half of the storage
//! interface, one transaction per call (PostgreSQL announcements of what a
//! call stored are sent inside it). The delivery API's writes (claim, renew,
//! operation, finish) go through the call writer, which commits what is
//! queued together, each call in its own savepoint (`group.rs`).

use async_trait::async_trait;
use nostr::prelude::{Event, Keys, PublicKey};
use protocol::workflow::Cause;
use serde_json::Value;

use super::deliveries::{self, Answer, ClaimRequest, Delivery, FinishRequest, Finished, Refusal};
use super::group::{mismatch, Call, Done};
use super::sqlstore::SqlStore;
use super::workflows::{self, StepOutcome};
use super::StoreError;
use crate::config::{DeliveryConfig, Limits};

/// A NIP-98 auth event that a delivery call spends: recorded as used in the
/// call's own transaction, before the call and outside its savepoint, so the
/// record stands even when the call is refused. An event already recorded
/// makes the call answer 401 `auth_replayed` without running it.
#[derive(Debug, Clone, Copy)]
pub struct HttpAuthUse {
    pub event_id: [u8; 32],
    /// Unix seconds until which the record is kept (then swept).
    pub keep_until: i64,
}

/// The refusal of a replayed auth event (the same as the HTTP layer's).
fn replayed() -> Refusal {
    Refusal::Replayed(protocol::nip98::Nip98Error::Replayed.to_string())
}

/// Workflows, runs and deliveries.
#[async_trait]
pub trait WorkflowStore: Send + Sync {
    /// Executes the current step of a run (see `workflows::execute_step`).
    async fn execute_run_step(
        &self,
        community: &str,
        keys: &Keys,
        run_id: &str,
        cfg: &DeliveryConfig,
        limits: &Limits,
    ) -> Result<StepOutcome, StoreError>;

    /// Runs still running in a community, oldest first.
    async fn running_runs(&self, community: &str, limit: u32) -> Result<Vec<String>, StoreError>;

    /// Fires due schedule slots; returns new runs.
    async fn fire_schedules(&self, community: &str) -> Result<Vec<String>, StoreError>;

    /// Starts a run of a workflow whose trigger is `trigger` (manual runs
    /// also need `caller` to be the owner). Returns (run id, newly created).
    async fn start_run(
        &self,
        community: &str,
        workflow_id: &str,
        caller: Option<&PublicKey>,
        trigger: &str,
        cause: Cause,
        context: Value,
    ) -> Result<Answer<(String, bool)>, StoreError>;

    /// Stores the hash of a new webhook secret for the owner.
    async fn set_webhook_secret(
        &self,
        community: &str,
        workflow_id: &str,
        caller: &PublicKey,
        hash_hex: &str,
    ) -> Result<Answer<()>, StoreError>;

    /// (secret hash, trigger, live) of a workflow.
    async fn webhook_target(
        &self,
        community: &str,
        workflow_id: &str,
    ) -> Result<Option<(Option<String>, String, bool)>, StoreError>;

    /// A page of runs (for the owner when `caller` is given; all for operators).
    async fn list_runs(
        &self,
        community: &str,
        workflow_id: Option<&str>,
        caller: Option<&PublicKey>,
        before: Option<i64>,
        limit: u32,
    ) -> Result<Answer<workflows::RunList>, StoreError>;

    /// One run.
    async fn show_run(
        &self,
        community: &str,
        run_id: &str,
    ) -> Result<Option<protocol::api::RunView>, StoreError>;

    async fn claim(
        &self,
        community: &str,
        auth: &HttpAuthUse,
        caller: &PublicKey,
        req: &ClaimRequest,
        cfg: &DeliveryConfig,
    ) -> Result<Answer<Option<Delivery>>, StoreError>;

    #[allow(clippy::too_many_arguments)]
    async fn renew(
        &self,
        community: &str,
        auth: &HttpAuthUse,
        caller: &PublicKey,
        id: &str,
        token: &str,
        lease_seconds: Option<u64>,
        cfg: &DeliveryConfig,
    ) -> Result<Answer<i64>, StoreError>;

    #[allow(clippy::too_many_arguments)]
    async fn record_operation(
        &self,
        community: &str,
        auth: &HttpAuthUse,
        caller: &PublicKey,
        id: &str,
        token: &str,
        name: &str,
        effect: protocol::api::Effect,
        cfg: &DeliveryConfig,
    ) -> Result<Answer<()>, StoreError>;

    #[allow(clippy::too_many_arguments)]
    async fn finish(
        &self,
        community: &str,
        auth: &HttpAuthUse,
        keys: &Keys,
        caller: &PublicKey,
        id: &str,
        req: &FinishRequest,
        cfg: &DeliveryConfig,
    ) -> Result<Answer<Finished>, StoreError>;

    /// Deliveries, newest first (one target's when given).
    async fn list_deliveries(
        &self,
        community: &str,
        target: Option<&PublicKey>,
        status: Option<protocol::api::DeliveryStatus>,
        before: Option<i64>,
        limit: u32,
    ) -> Result<Vec<Delivery>, StoreError>;

    /// One delivery with its recorded operations (attempt, name, effect).
    async fn show_delivery(
        &self,
        community: &str,
        id: &str,
    ) -> Result<Option<(Delivery, Vec<(i64, String, String)>)>, StoreError>;

    /// Expires and lapses what is due; returns the notices to announce.
    async fn sweep_deliveries(
        &self,
        community: &str,
        keys: &Keys,
        cfg: &DeliveryConfig,
    ) -> Result<Vec<(Event, String)>, StoreError>;
}

#[async_trait]
impl WorkflowStore for SqlStore {
    async fn execute_run_step(
        &self,
        community: &str,
        keys: &Keys,
        run_id: &str,
        cfg: &DeliveryConfig,
        limits: &Limits,
    ) -> Result<StepOutcome, StoreError> {
        let mut tx = self.pool.begin().await?;
        let out = workflows::execute_step(&mut tx, community, keys, run_id, cfg, limits).await?;
        let raws: Vec<&str> = out.published.iter().map(|(_, raw)| raw.as_str()).collect();
        self.announce(&mut tx, community, &raws).await?;
        tx.commit().await?;
        Ok(out)
    }

    async fn running_runs(&self, community: &str, limit: u32) -> Result<Vec<String>, StoreError> {
        workflows::running_runs(&self.pool, community, limit).await
    }

    async fn fire_schedules(&self, community: &str) -> Result<Vec<String>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let runs = workflows::fire_schedules(&mut tx, community).await?;
        tx.commit().await?;
        Ok(runs)
    }

    async fn start_run(
        &self,
        community: &str,
        workflow_id: &str,
        caller: Option<&PublicKey>,
        trigger: &str,
        cause: Cause,
        context: Value,
    ) -> Result<Answer<(String, bool)>, StoreError> {
        let mut tx = self.pool.begin().await?;
        if let Some(caller) = caller {
            if let Err(r) = workflows::owned(&mut tx, community, workflow_id, caller, false).await? {
                return Ok(Err(r));
            }
        }
        match workflows::trigger_of(&mut tx, community, workflow_id).await? {
            None => return Ok(Err(Refusal::UnknownWorkflow)),
            Some(t) if t != trigger => return Ok(Err(Refusal::WrongTrigger(t))),
            Some(_) => {}
        }
        let run = match workflows::create_run(&mut tx, community, workflow_id, &cause, context).await? {
            Ok(r) => r,
            Err(r) => return Ok(Err(r)),
        };
        tx.commit().await?;
        Ok(Ok(run))
    }

    async fn set_webhook_secret(
        &self,
        community: &str,
        workflow_id: &str,
        caller: &PublicKey,
        hash_hex: &str,
    ) -> Result<Answer<()>, StoreError> {
        let mut tx = self.pool.begin().await?;
        if let Err(r) = workflows::owned(&mut tx, community, workflow_id, caller, false).await? {
            return Ok(Err(r));
        }
        workflows::set_webhook_secret(&mut tx, community, workflow_id, hash_hex).await?;
        tx.commit().await?;
        Ok(Ok(()))
    }

    async fn webhook_target(
        &self,
        community: &str,
        workflow_id: &str,
    ) -> Result<Option<(Option<String>, String, bool)>, StoreError> {
        let mut tx = self.pool.read().await?;
        workflows::webhook_target(&mut tx, community, workflow_id).await
    }

    async fn list_runs(
        &self,
        community: &str,
        workflow_id: Option<&str>,
        caller: Option<&PublicKey>,
        before: Option<i64>,
        limit: u32,
    ) -> Result<Answer<workflows::RunList>, StoreError> {
        let mut tx = self.pool.read().await?;
        if let (Some(caller), Some(w)) = (caller, workflow_id) {
            if let Err(r) = workflows::owned(&mut tx, community, w, caller, true).await? {
                return Ok(Err(r));
            }
        }
        Ok(Ok(workflows::list_runs(
            &mut tx,
            community,
            workflow_id,
            before,
            limit,
        )
        .await?))
    }

    async fn show_run(
        &self,
        community: &str,
        run_id: &str,
    ) -> Result<Option<protocol::api::RunView>, StoreError> {
        let mut tx = self.pool.read().await?;
        workflows::show_run(&mut tx, community, run_id).await
    }

    async fn claim(
        &self,
        community: &str,
        auth: &HttpAuthUse,
        caller: &PublicKey,
        req: &ClaimRequest,
        cfg: &DeliveryConfig,
    ) -> Result<Answer<Option<Delivery>>, StoreError> {
        let call = Call::Claim {
            community: community.to_string(),
            caller: *caller,
            req: req.clone(),
            cfg: cfg.clone(),
        };
        match self.calls.run_spending(*auth, call).await? {
            Done::Claim(a) => Ok(a),
            Done::Replayed => Ok(Err(replayed())),
            _ => Err(mismatch()),
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn renew(
        &self,
        community: &str,
        auth: &HttpAuthUse,
        caller: &PublicKey,
        id: &str,
        token: &str,
        lease_seconds: Option<u64>,
        cfg: &DeliveryConfig,
    ) -> Result<Answer<i64>, StoreError> {
        let call = Call::Renew {
            community: community.to_string(),
            caller: *caller,
            id: id.to_string(),
            token: token.to_string(),
            lease_seconds,
            cfg: cfg.clone(),
        };
        match self.calls.run_spending(*auth, call).await? {
            Done::Renew(a) => Ok(a),
            Done::Replayed => Ok(Err(replayed())),
            _ => Err(mismatch()),
        }
    }

    async fn record_operation(
        &self,
        community: &str,
        auth: &HttpAuthUse,
        caller: &PublicKey,
        id: &str,
        token: &str,
        name: &str,
        effect: protocol::api::Effect,
        cfg: &DeliveryConfig,
    ) -> Result<Answer<()>, StoreError> {
        let call = Call::Operation {
            community: community.to_string(),
            caller: *caller,
            id: id.to_string(),
            token: token.to_string(),
            name: name.to_string(),
            effect,
            cfg: cfg.clone(),
        };
        match self.calls.run_spending(*auth, call).await? {
            Done::Operation(a) => Ok(a),
            Done::Replayed => Ok(Err(replayed())),
            _ => Err(mismatch()),
        }
    }

    async fn finish(
        &self,
        community: &str,
        auth: &HttpAuthUse,
        keys: &Keys,
        caller: &PublicKey,
        id: &str,
        req: &FinishRequest,
        cfg: &DeliveryConfig,
    ) -> Result<Answer<Finished>, StoreError> {
        let call = Call::Finish {
            community: community.to_string(),
            keys: keys.clone(),
            caller: *caller,
            id: id.to_string(),
            req: req.clone(),
            cfg: cfg.clone(),
        };
        match self.calls.run_spending(*auth, call).await? {
            Done::Finish(a) => Ok(a),
            Done::Replayed => Ok(Err(replayed())),
            _ => Err(mismatch()),
        }
    }

    async fn list_deliveries(
        &self,
        community: &str,
        target: Option<&PublicKey>,
        status: Option<protocol::api::DeliveryStatus>,
        before: Option<i64>,
        limit: u32,
    ) -> Result<Vec<Delivery>, StoreError> {
        let mut tx = self.pool.read().await?;
        deliveries::list_own(&mut tx, community, target, status, before, limit).await
    }

    async fn show_delivery(
        &self,
        community: &str,
        id: &str,
    ) -> Result<Option<(Delivery, Vec<(i64, String, String)>)>, StoreError> {
        let mut tx = self.pool.read().await?;
        let Some(d) = deliveries::show(&mut tx, community, id).await? else {
            return Ok(None);
        };
        let ops = deliveries::operations(&mut tx, community, id).await?;
        Ok(Some((d, ops)))
    }

    async fn sweep_deliveries(
        &self,
        community: &str,
        keys: &Keys,
        cfg: &DeliveryConfig,
    ) -> Result<Vec<(Event, String)>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let published = deliveries::sweep(&mut tx, community, keys, cfg).await?;
        let raws: Vec<&str> = published.iter().map(|(_, raw)| raw.as_str()).collect();
        self.announce(&mut tx, community, &raws).await?;
        tx.commit().await?;
        Ok(published)
    }
}
