//! The workflow and delivery half of [`Store`]'s storage
//! interface, one transaction per call (PostgreSQL announcements of what a
//! call stored are sent inside it). The delivery API's writes (claim, renew,
//! operation, finish) go through the call writer, which commits what is
//! queued together, each call in its own savepoint (`group.rs`).

use nostr::prelude::{Event, Keys, PublicKey};
use protocol::api::{OperationRequest, RenewRequest};
use protocol::workflow::Cause;
use serde_json::Value;

use crate::delivery::deliveries::{Answer, ClaimRequest, FinishRequest, Finished, Refusal};
use crate::delivery::rows::Delivery;
use crate::delivery::sweep;
use crate::store::calls::{Claim, Finish, Operation, Renew};
pub use crate::store::group::HttpAuthUse;

use crate::admin::manage;
use crate::admin::overview;
use crate::channels::mentions;
use crate::config::DeliveryConfig;
use crate::persistence::StoreError;
use crate::store::sqlstore::Store;
use crate::workflow::definitions as workflows;
use crate::workflow::outcalls;
use crate::workflow::outcalls::CallAnswer;
use crate::workflow::runs;
use crate::workflow::step::StepOutcome;
use crate::workflow::views;
use protocol::nip86::List;

/// Workflows, runs and deliveries.
impl Store {
    /// Executes the current step of a run (see `runs::execute_step`).
    pub async fn execute_run_step(
        &self,
        community: &str,
        keys: &Keys,
        run_id: &str,
        env: &crate::workflow::step::Env<'_>,
    ) -> Result<StepOutcome, StoreError> {
        let mut tx = self.pool.begin().await?;
        let out = runs::execute_step(&mut tx, community, keys, run_id, env).await?;
        let raws: Vec<&str> = out.published.iter().map(|(_, raw)| raw.as_str()).collect();
        self.announce(&mut tx, community, &raws).await?;
        tx.commit().await?;
        Ok(out)
    }

    /// Records the answer to a webhook call's attempt and wakes its run, if
    /// that attempt is still the one in flight (`outcalls::answer`);
    /// returns whether it was.
    pub async fn record_call_answer(
        &self,
        community: &str,
        run_id: &str,
        answer: &CallAnswer,
    ) -> Result<bool, StoreError> {
        let mut tx = self.pool.begin().await?;
        let now = tx.now().await?;
        let taken = outcalls::answer(&mut tx, community, run_id, answer, now).await?;
        if taken {
            let wake = format!("call:{}:{}", answer.step_id, answer.attempt);
            crate::delivery::deliveries::poke(&mut tx, community, run_id, &wake).await?;
        }
        tx.commit().await?;
        Ok(taken)
    }

    /// Runs with a step to execute now, oldest first (`views::due_runs`).
    pub async fn due_runs(&self, community: &str, limit: u32) -> Result<Vec<String>, StoreError> {
        views::due_runs(&self.pool, community, limit).await
    }

    /// Fires due schedule slots; returns new runs.
    pub async fn fire_schedules(&self, community: &str) -> Result<Vec<String>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let runs = crate::workflow::triggers::fire_schedules(&mut tx, community).await?;
        tx.commit().await?;
        Ok(runs)
    }

    /// Starts a run of a workflow whose trigger is `trigger` (manual runs
    /// also need `caller` to be the owner). Returns (run id, newly created).
    pub async fn start_run(
        &self,
        community: &str,
        workflow_id: &str,
        caller: Option<&PublicKey>,
        trigger: &str,
        cause: Cause,
        context: Value,
    ) -> Answer<(String, bool)> {
        let mut tx = self.pool.begin().await?;
        if let Some(caller) = caller {
            workflows::owned(&mut tx, community, workflow_id, caller, false).await?;
        }
        match workflows::trigger_of(&mut tx, community, workflow_id).await? {
            None => return Err(Refusal::UnknownWorkflow.into()),
            Some(t) if t != trigger => return Err(Refusal::WrongTrigger(t).into()),
            Some(_) => {}
        }
        let run =
            crate::workflow::triggers::create_run(&mut tx, community, workflow_id, &cause, context).await?;
        tx.commit().await?;
        Ok(run)
    }

    /// Stores the hash of a new webhook secret for the owner.
    pub async fn set_webhook_secret(
        &self,
        community: &str,
        workflow_id: &str,
        caller: &PublicKey,
        hash_hex: &str,
    ) -> Answer<()> {
        let mut tx = self.pool.begin().await?;
        workflows::owned(&mut tx, community, workflow_id, caller, false).await?;
        workflows::set_webhook_secret(&mut tx, community, workflow_id, hash_hex).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Sets (or rotates) a named secret of the owner's workflow, sealed by
    /// the caller; returns when it was stored.
    pub async fn set_secret(
        &self,
        community: &str,
        workflow_id: &str,
        caller: &PublicKey,
        name: &str,
        sealed: &[u8],
    ) -> Answer<i64> {
        let mut tx = self.pool.begin().await?;
        workflows::owned(&mut tx, community, workflow_id, caller, false).await?;
        let at = outcalls::set_secret(&mut tx, community, workflow_id, name, sealed).await?;
        tx.commit().await?;
        Ok(at)
    }

    /// (secret hash, trigger, live) of a workflow.
    pub async fn webhook_target(
        &self,
        community: &str,
        workflow_id: &str,
    ) -> Result<Option<(Option<String>, String, bool)>, StoreError> {
        let mut tx = self.pool.read().await?;
        workflows::webhook_target(&mut tx, community, workflow_id).await
    }

    /// A page of runs (for the owner when `caller` is given; all for operators).
    pub async fn list_runs(
        &self,
        community: &str,
        workflow_id: Option<&str>,
        caller: Option<&PublicKey>,
        before: Option<views::Before<'_>>,
        limit: u32,
    ) -> Answer<views::RunList> {
        let mut tx = self.pool.read().await?;
        if let (Some(caller), Some(w)) = (caller, workflow_id) {
            workflows::owned(&mut tx, community, w, caller, true).await?;
        }
        Ok(views::list_runs(&mut tx, community, workflow_id, before, limit).await?)
    }

    /// One run; with `caller`, only its workflow's owner (still a member
    /// of the channel) sees it.
    pub async fn show_run(
        &self,
        community: &str,
        run_id: &str,
        caller: Option<&PublicKey>,
    ) -> Answer<protocol::api::RunView> {
        let mut tx = self.pool.read().await?;
        let run = views::show_run(&mut tx, community, run_id)
            .await?
            .ok_or(Refusal::UnknownRun)?;
        if let Some(caller) = caller {
            workflows::owned(&mut tx, community, &run.workflow_id, caller, true).await?;
        }
        Ok(run)
    }

    /// Each delivery call below spends `auth` (see [`HttpAuthUse`]) and
    /// goes through the call writer.
    /// A claim, and for a mention the status its sender is sent (already
    /// announced to other processes; this one publishes it).
    pub async fn claim(
        &self,
        community: &str,
        keys: &Keys,
        auth: HttpAuthUse,
        caller: PublicKey,
        req: ClaimRequest,
    ) -> Answer<crate::store::calls::Claimed> {
        let claim = Claim {
            community: community.to_string(),
            caller,
            req,
            keys: keys.clone(),
        };
        self.calls.run_spending(auth, claim).await
    }

    pub async fn renew(
        &self,
        community: &str,
        auth: HttpAuthUse,
        caller: PublicKey,
        id: String,
        req: RenewRequest,
    ) -> Answer<i64> {
        let community = community.to_string();
        let call = Renew {
            community,
            caller,
            id,
            req,
        };
        self.calls.run_spending(auth, call).await
    }

    pub async fn record_operation(
        &self,
        community: &str,
        auth: HttpAuthUse,
        caller: PublicKey,
        id: String,
        req: OperationRequest,
    ) -> Answer<()> {
        let community = community.to_string();
        let call = Operation {
            community,
            caller,
            id,
            req,
        };
        self.calls.run_spending(auth, call).await
    }

    #[allow(clippy::too_many_arguments)]
    pub async fn finish(
        &self,
        community: &str,
        auth: HttpAuthUse,
        keys: &Keys,
        caller: PublicKey,
        id: String,
        req: FinishRequest,
    ) -> Answer<Finished> {
        let call = Finish {
            community: community.to_string(),
            keys: keys.clone(),
            caller,
            id,
            req,
        };
        self.calls.run_spending(auth, call).await
    }

    /// The row `agent` would claim next (see `claim::next_claimable`).
    pub async fn next_claimable(
        &self,
        community: &str,
        agent: &PublicKey,
        cfg: &crate::config::DeliveryConfig,
    ) -> Result<Option<Delivery>, StoreError> {
        let mut tx = self.pool.read().await?;
        crate::delivery::claim::next_claimable(&mut tx, community, &agent.to_bytes(), cfg).await
    }

    /// Deliveries, newest first, as `filter` narrows them.
    pub async fn list_deliveries(
        &self,
        community: &str,
        filter: &crate::delivery::rows::ListFilter,
        limit: u32,
    ) -> Result<Vec<Delivery>, StoreError> {
        let mut tx = self.pool.read().await?;
        crate::delivery::rows::list(&mut tx, community, filter, limit).await
    }

    /// One delivery with its attempts and recorded operations; with
    /// `caller`, only for the delivery's target or its workflow's owner.
    pub async fn show_delivery(
        &self,
        community: &str,
        id: &str,
        caller: Option<&PublicKey>,
    ) -> Answer<protocol::api::DeliveryDetail> {
        let mut tx = self.pool.read().await?;
        let (d, detail) = crate::delivery::rows::show(&mut tx, community, id)
            .await?
            .ok_or(Refusal::NoDelivery)?;
        if let Some(caller) = caller.filter(|c| !d.for_caller(c)) {
            workflows::owned(&mut tx, community, &d.workflow_id, caller, false).await?;
        }
        Ok(detail)
    }

    /// Expires and lapses what is due; returns the notices to announce.
    pub async fn sweep_deliveries(
        &self,
        community: &str,
        keys: &Keys,
        cfg: &DeliveryConfig,
    ) -> Result<Vec<(Event, String)>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let published = sweep::sweep(&mut tx, community, keys, cfg).await?;
        let raws: Vec<&str> = published.iter().map(|(_, raw)| raw.as_str()).collect();
        self.announce(&mut tx, community, &raws).await?;
        tx.commit().await?;
        Ok(published)
    }
}

impl Store {
    /// Commits `tx` with `notices` announced to other processes inside it.
    async fn commit_noticed(
        &self,
        mut tx: crate::persistence::db::Tx<'_>,
        community: &str,
        notices: &[&manage::Notice],
    ) -> Result<(), StoreError> {
        let raws: Vec<&str> = notices.iter().map(|(_, raw)| raw.as_str()).collect();
        self.announce(&mut tx, community, &raws).await?;
        tx.commit().await?;
        Ok(())
    }
}

/// Management (NIP-86 and ours): each change with its notice in one
/// transaction (`manage.rs`), announced to other processes inside it.
impl Store {
    /// The community's bans and NIP-11 text.
    pub async fn moderation(&self, community: &str) -> Result<manage::Moderation, StoreError> {
        let mut tx = self.pool.read().await?;
        manage::load(&mut tx, community).await
    }

    pub async fn list_entries(
        &self,
        community: &str,
        list: List,
    ) -> Result<Vec<([u8; 32], String)>, StoreError> {
        let mut tx = self.pool.read().await?;
        manage::entries(&mut tx, community, list).await
    }

    pub async fn add_to_list(
        &self,
        community: &str,
        keys: &Keys,
        list: List,
        value: &[u8; 32],
        reason: &str,
        actor: &PublicKey,
    ) -> Answer<manage::Notice> {
        let mut tx = self.pool.begin().await?;
        let notice = manage::add(&mut tx, community, keys, list, value, reason, actor).await?;
        self.commit_noticed(tx, community, &[&notice]).await?;
        Ok(notice)
    }

    pub async fn set_info(
        &self,
        community: &str,
        keys: &Keys,
        field: manage::InfoField,
        text: &str,
        actor: &PublicKey,
    ) -> Result<manage::Notice, StoreError> {
        let mut tx = self.pool.begin().await?;
        let notice = manage::set_info(&mut tx, community, keys, field, text, actor).await?;
        self.commit_noticed(tx, community, &[&notice]).await?;
        Ok(notice)
    }

    /// `retrydelivery` (`retry`) or `canceldelivery`.
    pub async fn act_on_delivery(
        &self,
        community: &str,
        keys: &Keys,
        actor: manage::Actor<'_>,
        id: &str,
        retry: bool,
        cfg: &DeliveryConfig,
    ) -> Answer<manage::DeliveryActed> {
        let mut tx = self.pool.begin().await?;
        let acted = manage::act_on_delivery(&mut tx, community, keys, actor, id, retry, cfg).await?;
        self.commit_noticed(tx, community, &[&acted.notice]).await?;
        Ok(acted)
    }

    pub async fn cancel_run(
        &self,
        community: &str,
        keys: &Keys,
        actor: manage::Actor<'_>,
        run_id: &str,
    ) -> Answer<manage::Notice> {
        let mut tx = self.pool.begin().await?;
        let notice = manage::cancel_run(&mut tx, community, keys, actor, run_id).await?;
        self.commit_noticed(tx, community, &[&notice]).await?;
        Ok(notice)
    }

    /// `rerunrun`: the answer, and the notice when the rerun is new.
    pub async fn rerun_run(
        &self,
        community: &str,
        keys: &Keys,
        actor: manage::Actor<'_>,
        run_id: &str,
        which: protocol::nip86::RerunDefinition,
    ) -> Answer<(protocol::nip86::RunRerun, Option<manage::Notice>)> {
        let mut tx = self.pool.begin().await?;
        let (answer, notice) = manage::rerun_run(&mut tx, community, keys, actor, run_id, which).await?;
        let all: Vec<&manage::Notice> = notice.iter().collect();
        self.commit_noticed(tx, community, &all).await?;
        Ok((answer, notice))
    }

    pub async fn set_paused(
        &self,
        community: &str,
        keys: &Keys,
        actor: manage::Actor<'_>,
        workflow_id: &str,
        paused: bool,
    ) -> Answer<Option<manage::Notice>> {
        let mut tx = self.pool.begin().await?;
        let notice = manage::set_paused(&mut tx, community, keys, actor, workflow_id, paused).await?;
        let all: Vec<&manage::Notice> = notice.iter().collect();
        self.commit_noticed(tx, community, &all).await?;
        Ok(notice)
    }

    /// `setmentions`: the setting, and its notice when it changed.
    pub async fn set_mentions(
        &self,
        community: &str,
        keys: &Keys,
        actor: manage::Actor<'_>,
        scope: &protocol::nip86::MentionScope,
        on: bool,
    ) -> Answer<(protocol::nip86::MentionSetting, Option<manage::Notice>)> {
        let mut tx = self.pool.begin().await?;
        let who = (actor.pubkey, actor.admin);
        let (setting, notice) = mentions::set(&mut tx, community, keys, who, scope, on).await?;
        let all: Vec<&manage::Notice> = notice.iter().collect();
        self.commit_noticed(tx, community, &all).await?;
        Ok((setting, notice))
    }

    /// `listmentions`: every agent's for an admin (`owner` `None`), else
    /// `owner`'s agents'.
    pub async fn list_mentions(
        &self,
        community: &str,
        owner: Option<&PublicKey>,
    ) -> Result<Vec<protocol::nip86::MentionSetting>, StoreError> {
        let mut tx = self.pool.read().await?;
        mentions::list(&mut tx, community, owner).await
    }

    /// Whether `owner` owns a managed agent here.
    pub async fn owns_agent(&self, community: &str, owner: &PublicKey) -> Result<bool, StoreError> {
        let mut tx = self.pool.read().await?;
        crate::channels::agents::owns_any(&mut tx, community, owner).await
    }

    /// Whether `owner` owns a workflow here.
    pub async fn owns_workflow(&self, community: &str, owner: &PublicKey) -> Result<bool, StoreError> {
        let mut tx = self.pool.read().await?;
        workflows::owns_any(&mut tx, community, owner).await
    }

    /// The dashboard's reads (`overview.rs`); `owner` narrows each to one
    /// owner's workflows, agents and channels.
    pub async fn dashboard_counts(
        &self,
        community: &str,
        owner: Option<&PublicKey>,
        now: i64,
    ) -> Result<overview::Counts, StoreError> {
        let mut tx = self.pool.read().await?;
        overview::counts(&mut tx, community, owner.map(|o| o.to_bytes()).as_ref(), now).await
    }

    pub async fn dashboard_workflows(
        &self,
        community: &str,
        owner: Option<&PublicKey>,
    ) -> Result<Vec<protocol::dashboard::WorkflowSummary>, StoreError> {
        let mut tx = self.pool.read().await?;
        overview::workflows(&mut tx, community, owner.map(|o| o.to_bytes()).as_ref()).await
    }

    pub async fn dashboard_workflow(
        &self,
        community: &str,
        id: &str,
    ) -> Result<Option<protocol::dashboard::WorkflowDetail>, StoreError> {
        let mut tx = self.pool.read().await?;
        overview::workflow(&mut tx, community, id).await
    }

    pub async fn dashboard_agents(
        &self,
        community: &str,
        owner: Option<&PublicKey>,
    ) -> Result<Vec<protocol::dashboard::AgentView>, StoreError> {
        let mut tx = self.pool.read().await?;
        overview::agents(&mut tx, community, owner.map(|o| o.to_bytes()).as_ref()).await
    }

    pub async fn dashboard_channels(
        &self,
        community: &str,
        member: Option<&PublicKey>,
    ) -> Result<Vec<protocol::dashboard::ChannelSummary>, StoreError> {
        let mut tx = self.pool.read().await?;
        overview::channels(&mut tx, community, member.map(|o| o.to_bytes()).as_ref()).await
    }
}
