//! `agent run`: claims deliveries (from wakes and by polling), verifies each,
//! runs turns per channel (one at a time per channel, several channels at
//! once), keeps leases alive, and finishes with the reply and the outcome
//! committed together.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nostr::prelude::{Event, EventBuilder, Keys, Kind, PublicKey, Tag};
use protocol::api::{ClaimRequest, DeliverySource, FinishRequest, Outcome as WireOutcome};
use serde_json::{json, Value};
use tokio::sync::{mpsc, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::api::{Api, Delivery};
use crate::config::AgentConfig;
use crate::handler::{Handler, Ops, Outcome, Turn, TurnItem};
use crate::relay::{self, Backoff, RelayLink};
use crate::verify::{self, Failure, Trust, Verified, Wake};

/// What a worker's conversation is: a mention's own, else its channel.
fn conversation_key(d: &Delivery) -> String {
    if d.conversation.is_empty() {
        d.channel.clone()
    } else {
        d.conversation.clone()
    }
}

/// The deliveries of a claim: those of its turn (the same token, lease,
/// channel and source; their own ids, messages and snapshots), then the
/// claimed one.
fn turn_of(mut d: Delivery) -> Vec<Delivery> {
    let parts = std::mem::take(&mut d.turn);
    let mut out = Vec::with_capacity(1 + parts.len());
    for p in parts {
        out.push(Delivery {
            id: p.id,
            run_id: p.run_id,
            definition_event_id: p.definition_event_id,
            message_event_id: p.message_event_id,
            attempt: p.attempt,
            expires_at: p.expires_at,
            trigger_context: p.trigger_context,
            traceparent: None,
            ..d.clone()
        });
    }
    out.push(d);
    out
}

/// A finish of `d` with `outcome` (no reply).
fn finish_body(
    d: &Delivery,
    outcome: WireOutcome,
    code: Option<String>,
    message: Option<String>,
) -> FinishRequest {
    FinishRequest {
        claim_token: d.claim_token.clone(),
        outcome,
        failure_code: code,
        failure_message: message,
        reply: None,
        turn: Vec::new(),
    }
}

/// Wakes remembered per delivery id (to check a later claim against), at most.
const MAX_REMEMBERED_WAKES: usize = 4_096;
/// Most deliveries claimed by one poll pass.
const MAX_CLAIMS_PER_POLL: usize = 256;
/// Claims queued per conversation, at most (claims beyond are given back).
const MAX_CHANNEL_QUEUE: usize = 256;
/// How long after a wake's `due-in` its claim is made.
const DUE_SLACK: Duration = Duration::from_millis(200);

/// A claimed, verified delivery and the lease that keeps it.
struct Claimed {
    item: TurnItem,
    lease: Lease,
}

/// The keeper of one claim's lease: renews it, and cancels the turn when
/// it can no longer be kept.
#[derive(Clone)]
struct Lease {
    lost: CancellationToken,
    done: CancellationToken,
    expires_at: Arc<Mutex<i64>>,
}

impl Lease {
    fn expires_at(&self) -> i64 {
        *self.expires_at.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

struct Runtime {
    cfg: AgentConfig,
    keys: Keys,
    api: Api,
    link: RelayLink,
    trust: Trust,
    handler: Handler,
    wakes: Mutex<(HashMap<String, Wake>, VecDeque<String>)>,
    channels: Mutex<HashMap<String, mpsc::Sender<Vec<Claimed>>>>,
    permits: Arc<Semaphore>,
    tracker: TaskTracker,
    shutdown: CancellationToken,
}

/// Fetches the community's relay key (NIP-11 `self`), retrying until shutdown.
/// What an interrupted handler means for a delivery: a recorded write
/// may have happened before the handler was stopped, and a retry would
/// run it a second time, so it fails visibly instead; with no write, a
/// retry is safe.
fn after_interruption(outcome: Outcome, wrote: bool) -> Outcome {
    match outcome {
        Outcome::Interrupted(why) if wrote => Outcome::Failed {
            code: "interrupted_after_write".into(),
            message: format!("stopped after recording a write, not retried: {why}"),
        },
        Outcome::Interrupted(why) => Outcome::Retry(why),
        other => other,
    }
}

async fn relay_self(base: &str, shutdown: &CancellationToken, backoff: Backoff) -> Option<PublicKey> {
    let http = reqwest::Client::builder()
        .timeout(RELAY_INFO_TIMEOUT)
        .build()
        .unwrap_or_default();
    for n in 0u32.. {
        let why = match relay_info(&http, base).await {
            Ok(pk) => return Some(pk),
            Err(why) => why,
        };
        let delay = backoff.delay(n);
        // Said at every try, as the link does: an agent that cannot reach
        // its relay at start is visible without debug logs.
        tracing::warn!(relay = %base, error = %why, retry_in_ms = delay.as_millis() as u64,
            "cannot reach the relay; retrying");
        tokio::select! {
            _ = shutdown.cancelled() => return None,
            _ = tokio::time::sleep(delay) => {}
        }
    }
    None
}

/// How long reading the relay's NIP-11 document may take.
const RELAY_INFO_TIMEOUT: Duration = Duration::from_secs(10);

/// The relay's own pubkey (`self`) from its NIP-11 document.
async fn relay_info(http: &reqwest::Client, base: &str) -> Result<PublicKey, String> {
    let resp = http
        .get(base)
        .header("Accept", "application/nostr+json")
        .send()
        .await
        .map_err(|e| format!("NIP-11 document: {e}"))?;
    let doc: Value = resp.json().await.map_err(|e| format!("NIP-11 document: {e}"))?;
    doc["self"]
        .as_str()
        .and_then(|s| PublicKey::from_hex(s).ok())
        .ok_or_else(|| "the NIP-11 document names no relay pubkey (self)".to_string())
}

/// Runs the agent until `shutdown`.
pub async fn run(cfg: AgentConfig, keys: Keys, shutdown: CancellationToken) -> anyhow::Result<()> {
    let base = cfg.http_base().map_err(anyhow::Error::msg)?;
    let backoff = Backoff {
        min: Duration::from_millis(cfg.reconnect_min_ms),
        max: Duration::from_millis(cfg.reconnect_max_ms),
    };
    let Some(relay_pk) = relay_self(&base, &shutdown, backoff).await else {
        return Ok(());
    };
    let owner = PublicKey::from_hex(&cfg.owner)?;
    let allowed = cfg
        .allowed_authors
        .iter()
        .filter_map(|a| PublicKey::from_hex(a).ok())
        .collect();
    let trust = Trust {
        me: keys.public_key(),
        relay: relay_pk,
        owner,
        allowed,
    };
    let (wake_tx, mut wake_rx) = mpsc::channel(256);
    let (conn_tx, mut conn_rx) = mpsc::channel(4);
    let link = relay::spawn(
        cfg.relay_url.clone(),
        keys.clone(),
        wake_tx,
        conn_tx,
        backoff,
        shutdown.clone(),
    );
    let rt = Arc::new(Runtime {
        api: Api::new(base, keys.clone()),
        handler: Handler::new(&cfg.handler),
        permits: Arc::new(Semaphore::new(cfg.max_concurrent_channels)),
        keys,
        link,
        trust,
        wakes: Mutex::new((HashMap::new(), VecDeque::new())),
        channels: Mutex::new(HashMap::new()),
        tracker: TaskTracker::new(),
        shutdown: shutdown.clone(),
        cfg,
    });
    if let Some(addr) = rt.cfg.metrics_listen {
        crate::telemetry::install(addr)?;
    }
    tracing::info!(agent = %rt.trust.me.to_hex(), relay = %rt.trust.relay.to_hex(), "agent running");
    println!("agent running pubkey={}", rt.trust.me.to_hex());
    let mut tick = tokio::time::interval(Duration::from_secs(rt.cfg.poll_interval_secs));
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            Some(ev) = wake_rx.recv() => {
                let rt = rt.clone();
                rt.tracker.clone().spawn(async move { rt.on_wake(ev).await });
            }
            Some(()) = conn_rx.recv() => rt.poll().await,
            _ = tick.tick() => rt.poll().await,
        }
    }
    rt.tracker.close();
    let _ = tokio::time::timeout(Duration::from_secs(10), rt.tracker.wait()).await;
    Ok(())
}

impl Runtime {
    fn claim_body(&self) -> ClaimRequest {
        ClaimRequest {
            lease_seconds: Some(self.cfg.lease_secs),
            records_operations: Some(true),
            ..ClaimRequest::default()
        }
    }

    async fn poll(self: &Arc<Self>) {
        for _ in 0..MAX_CLAIMS_PER_POLL {
            if self.shutdown.is_cancelled() {
                return;
            }
            if crate::faults::check("claim:before").is_err() {
                return;
            }
            match self.api.claim(&self.claim_body()).await {
                Ok(Some(d)) => {
                    let _ = crate::faults::check("claim:after");
                    self.accept(d, None).await
                }
                Ok(None) => return,
                Err(e) => {
                    tracing::warn!(error = %e, "poll claim failed");
                    return;
                }
            }
        }
    }

    fn remember(&self, w: &Wake) {
        let mut guard = self.wakes.lock().unwrap_or_else(|p| p.into_inner());
        let (map, order) = &mut *guard;
        if map.insert(w.delivery_id.clone(), w.clone()).is_none() {
            order.push_back(w.delivery_id.clone());
        }
        while order.len() > MAX_REMEMBERED_WAKES {
            if let Some(old) = order.pop_front() {
                map.remove(&old);
            }
        }
    }

    fn remembered(&self, id: &str) -> Option<Wake> {
        self.wakes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .0
            .get(id)
            .cloned()
    }

    async fn on_wake(self: Arc<Self>, ev: Event) {
        let wake = match verify::check_wake(&ev, &self.trust) {
            Ok(w) => w,
            Err(f) => {
                tracing::warn!(code = f.code, reason = %f.message, "ignoring a wake hint");
                return;
            }
        };
        self.remember(&wake);
        if wake.due_in_secs > 0 {
            // Its row is due once its conversation has been quiet this
            // long (the relay's debounce); a little after, by our clock.
            let wait = Duration::from_secs(wake.due_in_secs) + DUE_SLACK;
            tokio::select! {
                _ = self.shutdown.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
        }
        let body = ClaimRequest {
            delivery_id: Some(wake.delivery_id.clone()),
            expected: Some(wake.expected()),
            ..self.claim_body()
        };
        if crate::faults::check("claim:before").is_err() {
            return;
        }
        match self.api.claim(&body).await {
            Ok(Some(d)) => {
                let _ = crate::faults::check("claim:after");
                self.accept(d, Some(wake)).await
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %e, "claim by wake failed; polling will catch up"),
        }
    }

    /// Starts keeping the lease of a claim.
    fn keep_lease(self: &Arc<Self>, d: &Delivery) -> Lease {
        let lease = Lease {
            lost: CancellationToken::new(),
            done: CancellationToken::new(),
            expires_at: Arc::new(Mutex::new(d.claim_expires_at)),
        };
        let (rt, l, d) = (self.clone(), lease.clone(), d.clone());
        self.tracker.spawn(async move {
            let every = Duration::from_secs((rt.cfg.lease_secs / 3).max(1));
            loop {
                tokio::select! {
                    _ = l.done.cancelled() => return,
                    _ = tokio::time::sleep(every) => {}
                }
                match rt.api.renew(&d, rt.cfg.lease_secs).await {
                    Ok(t) => *l.expires_at.lock().unwrap_or_else(|p| p.into_inner()) = t,
                    Err(e) if e.is_transient() && unix_now() + 2 < l.expires_at() => {
                        tracing::warn!(error = %e, delivery = %d.id, "lease renewal failed; will try again");
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, delivery = %d.id, "lease lost; cancelling the turn");
                        l.lost.cancel();
                        return;
                    }
                }
            }
        });
        lease
    }

    /// Verifies a claim's deliveries (the claimed one and those of its
    /// turn) and queues the verified ones for their conversation, as one
    /// group; one that fails verification is finished `failed` with its code.
    async fn accept(self: &Arc<Self>, d: Delivery, wake: Option<Wake>) {
        let key = conversation_key(&d);
        let mut group = Vec::with_capacity(1 + d.turn.len());
        for part in turn_of(d) {
            let wake = wake.clone().filter(|w| w.delivery_id == part.id);
            if let Some(c) = self.accept_one(part, wake).await {
                group.push(c);
            }
        }
        // In the order they were said (as clients show them: by time,
        // then id).
        group.sort_by_key(|c| (c.item.message.created_at, c.item.message.id));
        if !group.is_empty() {
            self.enqueue(key, group);
        }
    }

    /// Verifies one claimed delivery and keeps its lease: `None` when it
    /// was finished at once (failed verification, or the relay could not
    /// be asked: a retry).
    async fn accept_one(self: &Arc<Self>, d: Delivery, wake: Option<Wake>) -> Option<Claimed> {
        let lease = self.keep_lease(&d);
        // A wake remembered from before a revision names the row's older
        // message: out of date, not a mismatch (the revision's own wake
        // may have been lost).
        let wake = wake.or_else(|| {
            self.remembered(&d.id)
                .filter(|w| d.revision == 0 || w.message_event_id.eq_ignore_ascii_case(&d.message_event_id))
        });
        let verdict = match self.check(&d, wake.as_ref()).await {
            Ok(verdict) => verdict,
            Err(e) => {
                // Could not ask: not a verdict on the delivery. Let it be redelivered.
                tracing::warn!(error = %e, delivery = %d.id, "fetching events failed; retrying later");
                let body = finish_body(
                    &d,
                    WireOutcome::Retry,
                    None,
                    Some(format!("fetching events: {e}")),
                );
                self.finish(&d, &lease, body).await;
                return None;
            }
        };
        match verdict {
            Err(f) => {
                tracing::warn!(delivery = %d.id, code = f.code, reason = %f.message, "delivery failed verification");
                metrics::counter!(crate::telemetry::VERIFICATION_FAILURES, "code" => f.code).increment(1);
                let body = finish_body(&d, WireOutcome::Failed, Some(f.code.to_string()), Some(f.message));
                self.finish(&d, &lease, body).await;
                None
            }
            Ok(v) => Some(Claimed {
                item: TurnItem {
                    delivery: d,
                    message: v.message,
                },
                lease,
            }),
        }
    }

    /// Fetches what a delivery is checked against and checks it: the
    /// definition and the message of a workflow's, the message and the
    /// channel's member list of a mention. `Err` when the relay could not
    /// be asked.
    async fn check(&self, d: &Delivery, wake: Option<&Wake>) -> Result<Result<Verified, Failure>, String> {
        let msg = self.link.event_by_id(&d.message_event_id).await?;
        if d.source == DeliverySource::Mention {
            let filter = json!({
                "kinds": [protocol::nip29::GROUP_MEMBERS],
                "authors": [self.trust.relay.to_hex()],
                "#d": [d.channel],
                "limit": 1,
            });
            let members = self.link.query(filter).await?.into_iter().next();
            let accept = self.cfg.mentions;
            return Ok(verify::verify_mention(
                d,
                wake,
                msg.as_ref(),
                members.as_ref(),
                &self.trust,
                accept,
            ));
        }
        let def = self.link.event_by_id(&d.definition_event_id).await?;
        Ok(verify::verify(d, wake, def.as_ref(), msg.as_ref(), &self.trust))
    }

    /// Queues one claim's verified deliveries for their conversation's
    /// worker (started on first use).
    fn enqueue(self: &Arc<Self>, key: String, group: Vec<Claimed>) {
        let mut map = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        let tx = map
            .entry(key.clone())
            .or_insert_with(|| {
                let (tx, rx) = mpsc::channel(MAX_CHANNEL_QUEUE);
                let rt = self.clone();
                self.tracker.spawn(async move { rt.channel_worker(rx).await });
                tx
            })
            .clone();
        drop(map);
        if let Err(e) = tx.try_send(group) {
            // Full: give the claim back for later.
            let group = match e {
                mpsc::error::TrySendError::Full(g) | mpsc::error::TrySendError::Closed(g) => g,
            };
            let rt = self.clone();
            self.tracker.spawn(async move {
                for c in &group {
                    let d = &c.item.delivery;
                    let body = finish_body(d, WireOutcome::Retry, None, Some("channel queue full".into()));
                    rt.finish(d, &c.lease, body).await;
                }
            });
        }
    }

    /// Runs the turns of one conversation (a channel, or a thread of
    /// mentions), one at a time, in order.
    async fn channel_worker(self: Arc<Self>, mut rx: mpsc::Receiver<Vec<Claimed>>) {
        let debounce = Duration::from_millis(self.cfg.debounce_ms);
        loop {
            let mut batch = tokio::select! {
                _ = self.shutdown.cancelled() => return,
                c = rx.recv() => match c { Some(c) => c, None => return },
            };
            // Claims arriving within the debounce window join this turn.
            let deadline = tokio::time::Instant::now() + debounce;
            while batch.len() < self.cfg.max_turn_deliveries {
                match tokio::time::timeout_at(deadline, rx.recv()).await {
                    Ok(Some(g)) => batch.extend(g),
                    _ => break,
                }
            }
            while batch.len() < self.cfg.max_turn_deliveries {
                match rx.try_recv() {
                    Ok(g) => batch.extend(g),
                    Err(_) => break,
                }
            }
            let Ok(_permit) = self.permits.clone().acquire_owned().await else {
                return;
            };
            let channel = batch[0].item.delivery.channel.clone();
            self.turn(&channel, batch).await;
        }
    }

    async fn turn(self: &Arc<Self>, channel: &str, batch: Vec<Claimed>) {
        let turn = Turn {
            channel: channel.to_string(),
            items: batch.iter().map(|c| c.item.clone()).collect(),
        };
        let cancel = CancellationToken::new();
        for c in &batch {
            let (lost, cancel) = (c.lease.lost.clone(), cancel.clone());
            tokio::spawn(async move {
                tokio::select! {
                    _ = lost.cancelled() => cancel.cancel(),
                    _ = cancel.cancelled() => {}
                }
            });
        }
        let ops = Ops::new(self.api.clone(), &turn);
        tracing::info!(channel, deliveries = turn.items.len(), "running a turn");
        let started = std::time::Instant::now();
        let outcomes = self.handler.run(&turn, &ops, &cancel).await;
        metrics::histogram!(crate::telemetry::HANDLER_SECONDS).record(started.elapsed().as_secs_f64());
        debug_assert_eq!(outcomes.len(), batch.len(), "one outcome per delivery");
        cancel.cancel();
        let outcomes: Vec<Outcome> = outcomes
            .into_iter()
            .map(|o| after_interruption(o, ops.wrote()))
            .collect();
        // The deliveries of one claim (a turn of mentions, one token) with
        // one outcome are finished together, with one reply under the
        // last message; any other delivery on its own, with its own reply.
        let mut start = 0;
        while start < batch.len() {
            let token = &batch[start].item.delivery.claim_token;
            let end = start
                + batch[start..]
                    .iter()
                    .take_while(|c| &c.item.delivery.claim_token == token)
                    .count();
            let same = outcomes[start..end].iter().all(|o| o == &outcomes[end - 1]);
            if same {
                self.finish_turn(channel, &batch[start..end], &outcomes[end - 1])
                    .await;
            } else {
                for (c, outcome) in batch[start..end].iter().zip(&outcomes[start..end]) {
                    self.finish_turn(channel, std::slice::from_ref(c), outcome).await;
                }
            }
            start = end;
        }
        // Mentions of a conversation that arrived during the turn waited
        // for it to end: claim them now rather than at the next poll.
        if batch.iter().any(|c| !c.item.delivery.conversation.is_empty()) {
            self.poll().await;
        }
    }

    /// Finishes the deliveries of one claim (`group`, one token) with
    /// `outcome`: the last with the reply, the rest as its turn.
    async fn finish_turn(&self, channel: &str, group: &[Claimed], outcome: &Outcome) {
        let Some((last, rest)) = group.split_last() else {
            return;
        };
        let d = &last.item.delivery;
        let mut body = match outcome.clone() {
            Outcome::Delivered(text) => FinishRequest {
                reply: text.map(|t| self.reply_event(channel, &last.item.message, &t)),
                ..finish_body(d, WireOutcome::Delivered, None, None)
            },
            Outcome::Retry(why) | Outcome::Interrupted(why) => {
                finish_body(d, WireOutcome::Retry, None, Some(why))
            }
            Outcome::Failed { code, message } => {
                finish_body(d, WireOutcome::Failed, Some(code), Some(message))
            }
        };
        body.turn = rest.iter().map(|c| c.item.delivery.id.clone()).collect();
        metrics::counter!(crate::telemetry::TURNS, "outcome" => body.outcome.as_str()).increment(1);
        self.finish(d, &last.lease, body).await;
        for c in rest {
            c.lease.done.cancel();
        }
    }

    /// The reply to one delivery: a kind 9 by the agent in the channel,
    /// threaded (NIP-10) under that delivery's workflow message.
    fn reply_event(&self, channel: &str, last: &Event, text: &str) -> Event {
        let root = last.tags.iter().find(|t| {
            let s = t.as_slice();
            s.len() >= 4 && s[0] == "e" && s[3] == "root"
        });
        let mut tags = vec![Tag::custom("h", [channel])];
        match root {
            Some(r) => {
                tags.push(Tag::custom("e", [r.as_slice()[1].as_str(), "", "root"]));
                tags.push(Tag::custom(
                    "e",
                    [last.id.to_hex(), String::new(), "reply".into()],
                ));
            }
            None => tags.push(Tag::custom("e", [last.id.to_hex(), String::new(), "root".into()])),
        }
        let reply = EventBuilder::new(Kind::from_u16(protocol::workflow::MESSAGE_KIND), text);
        protocol::sign::sign(reply.tags(tags), &self.keys)
    }

    /// Finishes a claim, retrying the same request (same token) until the
    /// relay acknowledges it or the lease is over.
    async fn finish(&self, d: &Delivery, lease: &Lease, body: FinishRequest) {
        let mut delay = Duration::from_millis(200);
        loop {
            match self.api.finish(&d.id, &body).await {
                Ok(status) => {
                    let _ = crate::faults::check("finish:after_ack");

                    tracing::info!(delivery = %d.id, status = %status, "finished");
                    break;
                }
                Err(e) if e.is_transient() && unix_now() < lease.expires_at() => {
                    tracing::warn!(error = %e, delivery = %d.id, "finish not acknowledged; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(3));
                }
                Err(e) => {
                    tracing::warn!(error = %e, delivery = %d.id, "finish refused");
                    break;
                }
            }
        }
        lease.done.cancel();
    }
}
