//! `agent run`: claims deliveries (from wakes and by polling), verifies each,
//! runs turns per channel (one at a time per channel, several channels at
//! once), keeps leases alive, and finishes with the reply and the outcome
//! committed together.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nostr::prelude::{Event, EventBuilder, FinalizeEvent, Keys, Kind, PublicKey, Tag};
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
    }
}

/// Wakes remembered per delivery id (to check a later claim against), at most.
const MAX_REMEMBERED_WAKES: usize = 4_096;
/// Most deliveries claimed by one poll pass.
const MAX_CLAIMS_PER_POLL: usize = 256;
/// Deliveries queued per channel, at most (claims beyond wait for the next poll).
const MAX_CHANNEL_QUEUE: usize = 256;

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
    channels: Mutex<HashMap<String, mpsc::Sender<Claimed>>>,
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

    /// Verifies a claimed delivery and queues it for its channel, or
    /// finishes it `failed` with the verification code.
    async fn accept(self: &Arc<Self>, d: Delivery, wake: Option<Wake>) {
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
                return;
            }
        };
        match verdict {
            Err(f) => {
                tracing::warn!(delivery = %d.id, code = f.code, reason = %f.message, "delivery failed verification");
                metrics::counter!(crate::telemetry::VERIFICATION_FAILURES, "code" => f.code).increment(1);
                let body = finish_body(&d, WireOutcome::Failed, Some(f.code.to_string()), Some(f.message));
                self.finish(&d, &lease, body).await;
            }
            Ok(v) => {
                let channel = d.channel.clone();
                let item = TurnItem {
                    delivery: d,
                    message: v.message,
                };
                self.enqueue(channel, Claimed { item, lease });
            }
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

    fn enqueue(self: &Arc<Self>, channel: String, c: Claimed) {
        let mut map = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        let tx = map
            .entry(channel.clone())
            .or_insert_with(|| {
                let (tx, rx) = mpsc::channel(MAX_CHANNEL_QUEUE);
                let rt = self.clone();
                self.tracker
                    .spawn(async move { rt.channel_worker(channel, rx).await });
                tx
            })
            .clone();
        drop(map);
        if let Err(e) = tx.try_send(c) {
            // Full: give the claim back for later.
            let c = match e {
                mpsc::error::TrySendError::Full(c) | mpsc::error::TrySendError::Closed(c) => c,
            };
            let rt = self.clone();
            self.tracker.spawn(async move {
                let d = &c.item.delivery;
                let body = finish_body(d, WireOutcome::Retry, None, Some("channel queue full".into()));
                rt.finish(d, &c.lease, body).await;
            });
        }
    }

    /// Runs the turns of one channel, one at a time, in order.
    async fn channel_worker(self: Arc<Self>, channel: String, mut rx: mpsc::Receiver<Claimed>) {
        let debounce = Duration::from_millis(self.cfg.debounce_ms);
        loop {
            let first = tokio::select! {
                _ = self.shutdown.cancelled() => return,
                c = rx.recv() => match c { Some(c) => c, None => return },
            };
            let mut batch = vec![first];
            // Deliveries arriving within the debounce window join this turn.
            let deadline = tokio::time::Instant::now() + debounce;
            while batch.len() < self.cfg.max_turn_deliveries {
                match tokio::time::timeout_at(deadline, rx.recv()).await {
                    Ok(Some(c)) => batch.push(c),
                    _ => break,
                }
            }
            while batch.len() < self.cfg.max_turn_deliveries {
                match rx.try_recv() {
                    Ok(c) => batch.push(c),
                    Err(_) => break,
                }
            }
            let Ok(_permit) = self.permits.clone().acquire_owned().await else {
                return;
            };
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
        // Each delivery is finished on its own, with its own reply.
        for (c, outcome) in batch.iter().zip(outcomes) {
            let d = &c.item.delivery;
            let body = match after_interruption(outcome, ops.wrote()) {
                Outcome::Delivered(text) => FinishRequest {
                    reply: text.and_then(|t| self.reply_event(channel, &c.item.message, &t)),
                    ..finish_body(d, WireOutcome::Delivered, None, None)
                },
                Outcome::Retry(why) | Outcome::Interrupted(why) => {
                    finish_body(d, WireOutcome::Retry, None, Some(why))
                }
                Outcome::Failed { code, message } => {
                    finish_body(d, WireOutcome::Failed, Some(code), Some(message))
                }
            };
            metrics::counter!(crate::telemetry::TURNS, "outcome" => body.outcome.as_str()).increment(1);
            self.finish(d, &c.lease, body).await;
        }
    }

    /// The reply to one delivery: a kind 9 by the agent in the channel,
    /// threaded (NIP-10) under that delivery's workflow message.
    fn reply_event(&self, channel: &str, last: &Event, text: &str) -> Option<Event> {
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
        EventBuilder::new(Kind::from_u16(protocol::workflow::MESSAGE_KIND), text)
            .tags(tags)
            .finalize(&self.keys)
            .ok()
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
