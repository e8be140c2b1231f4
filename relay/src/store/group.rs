//! Group commit for the store's small write calls: NIP-98 auth records,
//! delivery claims, renews, operations and finishes, and channel events.
//!
//! Why: each of these is a transaction of a few statements, and on SQLite
//! every one of them waited for the one writer connection. Measured in the
//! delivery benchmark, a claim spent 0.3 ms in its statements and 12 ms
//! waiting for the connection to be handed over from the previous
//! transaction. One task now takes every call that is queued (at most
//! `writer.call_batch`) and runs them in one transaction, back to back.
//!
//! Each call runs in its own savepoint (a call whose one write is its last
//! statement needs none; when such a call fails, the batch is run again
//! with a savepoint for every call), so a call that is refused or fails is
//! rolled back alone, exactly as if it had had its own transaction, and the
//! others still commit: one client's failing call never fails another's. No call is answered before the commit that
//! holds it: an answer is never sent for work that could still be lost.
//! If the commit fails, every call it held gets the error (nothing of
//! theirs was stored); the calls that were rolled back keep their answers.

use std::collections::VecDeque;
use std::sync::Arc;

use nostr::prelude::{Event, Keys, PublicKey};
use tokio::sync::{mpsc, oneshot};

use super::api::HttpAuthUse;
use super::db::{Conn, Dialect, Pool, Tx, Q};
use super::deliveries::{self, Answer, ClaimRequest, Delivery, FinishRequest, Finished};
use super::sqlstore::author_lock_key;
use super::{InsertOutcome, Published, StoreError};
use crate::config::{ChannelPolicy, DeliveryConfig};

/// A write call and its arguments (owned: it outlives the caller's borrow).
/// Each is moved once into the queue and answered once: variant sizes do
/// not matter enough to box them.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Call {
    /// Nothing but the job's auth record (a NIP-98 request that writes
    /// nothing else): submitted with [`Calls::run_spending`].
    HttpAuth { community: String },
    Claim {
        community: String,
        caller: PublicKey,
        req: ClaimRequest,
        cfg: DeliveryConfig,
    },
    Renew {
        community: String,
        caller: PublicKey,
        id: String,
        token: String,
        lease_seconds: Option<u64>,
        cfg: DeliveryConfig,
    },
    Operation {
        community: String,
        caller: PublicKey,
        id: String,
        token: String,
        name: String,
        effect: protocol::api::Effect,
        cfg: DeliveryConfig,
    },
    Finish {
        community: String,
        keys: Keys,
        caller: PublicKey,
        id: String,
        req: FinishRequest,
        cfg: DeliveryConfig,
    },
    ChannelEvent {
        community: String,
        keys: Keys,
        policy: ChannelPolicy,
        event: Arc<Event>,
        raw: Arc<str>,
    },
}

/// What a call answered.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Done {
    /// The auth event was recorded as used (it had not been).
    HttpAuth,
    Claim(Answer<Option<Delivery>>),
    Renew(Answer<i64>),
    Operation(Answer<()>),
    Finish(Answer<Finished>),
    ChannelEvent(InsertOutcome, Published),
    /// The call's auth event was already used: the call did not run.
    Replayed,
}

impl Done {
    /// Whether the call's writes stand. A refusal, or an event not stored,
    /// is rolled back: it must leave no trace (its own transaction would
    /// not have been committed either).
    fn keeps(&self) -> bool {
        match self {
            Done::HttpAuth => true,
            Done::Claim(a) => a.is_ok(),
            Done::Renew(a) => a.is_ok(),
            Done::Operation(a) => a.is_ok(),
            Done::Finish(a) => a.is_ok(),
            Done::ChannelEvent(outcome, _) => *outcome == InsertOutcome::Stored,
            Done::Replayed => true,
        }
    }

    /// Raw events this call stored, to announce to other relay processes.
    fn announced(&self) -> Vec<&str> {
        match self {
            Done::Finish(Ok(f)) => f.published.iter().map(|(_, raw)| raw.as_str()).collect(),
            Done::ChannelEvent(InsertOutcome::Stored, published) => {
                published.iter().map(|(_, raw)| raw.as_str()).collect()
            }
            _ => Vec::new(),
        }
    }
}

impl Call {
    async fn run(&self, tx: &mut Tx<'_>) -> Result<Done, StoreError> {
        Ok(match self {
            // Its record was written before the calls ran (`spend_all`):
            // a replay never gets here.
            Call::HttpAuth { .. } => Done::HttpAuth,
            Call::Claim {
                community,
                caller,
                req,
                cfg,
            } => Done::Claim(deliveries::claim(tx, community, caller, req, cfg).await?),
            Call::Renew {
                community,
                caller,
                id,
                token,
                lease_seconds,
                cfg,
            } => Done::Renew(deliveries::renew(tx, community, caller, id, token, *lease_seconds, cfg).await?),
            Call::Operation {
                community,
                caller,
                id,
                token,
                name,
                effect,
                cfg,
            } => Done::Operation(
                deliveries::record_operation(tx, community, caller, id, token, name, *effect, cfg).await?,
            ),
            Call::Finish {
                community,
                keys,
                caller,
                id,
                req,
                cfg,
            } => Done::Finish(deliveries::finish(tx, community, keys, caller, id, req, cfg).await?),
            Call::ChannelEvent {
                community,
                keys,
                policy,
                event,
                raw,
            } => {
                let (outcome, published) =
                    super::channels::apply(tx, community, keys, policy, event, raw).await?;
                Done::ChannelEvent(outcome, published)
            }
        })
    }

    /// Whether every write of this call is its last statement, and every
    /// refusal comes before it: then the call needs no savepoint (a refusal
    /// has written nothing; an error fails the whole batch, see
    /// `run_batch`). The functions named here keep that shape; see their
    /// doc comments.
    fn one_write(&self) -> bool {
        matches!(
            self,
            Call::HttpAuth { .. } | Call::Claim { .. } | Call::Renew { .. } | Call::Operation { .. }
        )
    }

    /// Who makes the call: its writer is chosen by it, so that one
    /// caller's calls (and the locks they take: its delivery rows, its
    /// author lock) never wait on each other from two writers at once.
    fn caller(&self) -> Option<&PublicKey> {
        match self {
            Call::HttpAuth { .. } => None,
            Call::Claim { caller, .. }
            | Call::Renew { caller, .. }
            | Call::Operation { caller, .. }
            | Call::Finish { caller, .. } => Some(caller),
            Call::ChannelEvent { event, .. } => Some(&event.pubkey),
        }
    }

    /// The [`Tx::lock`] keys this call takes, known before it runs: its
    /// batch takes all of them first, in one order (`Tx::lock_all`), so that
    /// two writers' batches never wait on each other in a cycle. A call may
    /// still lock something not listed here (a workflow run), but not
    /// something a concurrent batch takes up front and then waits behind.
    /// - a channel event: its channel, its author and, for the kinds that
    ///   make the relay re-sign the channel's metadata, the community key
    ///   (as the author of those events);
    /// - a finish: the author of its reply and, unless the outcome is
    ///   `delivered`, the community key (a failure is announced by a
    ///   relay-signed notice);
    /// - the rest lock rows only.
    fn lock_keys(&self) -> Vec<String> {
        match self {
            Call::ChannelEvent {
                community,
                keys,
                event,
                ..
            } => {
                let mut out = vec![author_lock_key(community, &event.pubkey)];
                if let Some(channel) = super::channels::h_tag(event) {
                    out.push(super::channels::lock_key(community, channel));
                }
                if super::channels::republishes(event.kind.as_u16()) {
                    out.push(author_lock_key(community, &keys.public_key()));
                }
                out
            }
            Call::Finish {
                community, keys, req, ..
            } => {
                let mut out: Vec<String> = req
                    .reply
                    .iter()
                    .map(|r| author_lock_key(community, &r.pubkey))
                    .collect();
                if req.outcome != protocol::api::Outcome::Delivered {
                    out.push(author_lock_key(community, &keys.public_key()));
                }
                out
            }
            Call::HttpAuth { .. } | Call::Claim { .. } | Call::Renew { .. } | Call::Operation { .. } => {
                Vec::new()
            }
        }
    }

    fn community(&self) -> &str {
        match self {
            Call::HttpAuth { community, .. }
            | Call::Claim { community, .. }
            | Call::Renew { community, .. }
            | Call::Operation { community, .. }
            | Call::Finish { community, .. }
            | Call::ChannelEvent { community, .. } => community,
        }
    }
}

/// Records the NIP-98 auth events that the jobs of a batch spend, in one
/// statement; returns, per job, whether its event was fresh (`None`: the
/// job spends none). Of two jobs spending the same event, the first gets
/// it: the later one is a replay, as if it had come in a later batch.
async fn spend_all(tx: &mut Tx<'_>, batch: &[Job]) -> Result<Vec<Option<bool>>, StoreError> {
    let keys: Vec<Option<(&str, &HttpAuthUse)>> = batch
        .iter()
        .map(|j| j.spends.as_ref().map(|a| (j.call.community(), a)))
        .collect();
    let mut firsts: Vec<(&str, &HttpAuthUse)> = Vec::with_capacity(batch.len());
    for (community, auth) in keys.iter().flatten() {
        if !firsts
            .iter()
            .any(|(c, a)| c == community && a.event_id == auth.event_id)
        {
            firsts.push((community, auth));
        }
    }
    if firsts.is_empty() {
        return Ok(vec![None; batch.len()]);
    }
    let d = tx.dialect();
    let mut q = Q::new("INSERT INTO http_auth_seen (community_id, event_id, expires_at) VALUES ");
    for (k, (community, auth)) in firsts.iter().enumerate() {
        d.push_values_row(&mut q.sql, k, 3);
        q = q.bind(*community).bind(auth.event_id).bind(auth.keep_until);
    }
    q.sql
        .push_str(" ON CONFLICT DO NOTHING RETURNING community_id, event_id");
    let postgres = d == Dialect::Postgres;
    if postgres {
        // The database clock rides along: the batch's calls read it next
        // (`Tx::now`), and it would be a round trip of its own.
        q.sql.push_str(", ");
        q.sql.push_str(d.now());
    }
    let mut fresh: Vec<(String, [u8; 32])> = Vec::with_capacity(firsts.len());
    for row in tx.all(q).await? {
        fresh.push((row.text(0)?, row.id32(1)?));
        if postgres {
            tx.remember_now(row.int(2)?);
        }
    }
    // Each fresh event goes to its first job only.
    Ok(keys
        .iter()
        .map(|k| {
            k.map(|(community, auth)| {
                match fresh
                    .iter()
                    .position(|(c, e)| c == community && *e == auth.event_id)
                {
                    Some(i) => {
                        fresh.swap_remove(i);
                        true
                    }
                    None => false,
                }
            })
        })
        .collect())
}

/// The error for an answer of the wrong variant (a bug in this module).
pub(crate) fn mismatch() -> StoreError {
    StoreError::Corrupt("the call writer answered another call".into())
}

/// A queued call and where its answer goes.
struct Job {
    call: Call,
    /// The auth event the call spends (recorded before the batch's calls
    /// run: `spend_all`).
    spends: Option<HttpAuthUse>,
    reply: oneshot::Sender<Result<Done, StoreError>>,
}

/// The sending side: what the store's methods submit calls to.
#[derive(Clone)]
pub(crate) struct Calls {
    /// One queue per writer.
    txs: Vec<mpsc::Sender<Job>>,
}

impl Calls {
    /// Starts `writers` writer tasks on `pool` (SQLite: always one, its one
    /// write connection), each with a queue of `queue` calls; `origin`
    /// names this process in cross-process announcements.
    ///
    /// Why several on PostgreSQL: a writer waits for the server once per
    /// statement, and one writer was measured busy all the time while the
    /// machine was a third idle. Several writers' transactions run side by
    /// side; each caller's calls go to one writer (`Call::caller`), so one
    /// caller's delivery rows are only ever locked by one writer. Locks
    /// that several writers (and the event writer) do share, on channels,
    /// authors and the community key, every batch takes first, in one
    /// order (`Call::lock_keys`), so they queue instead of deadlocking.
    pub(crate) fn start(
        pool: Pool,
        origin: String,
        queue: usize,
        batch: usize,
        writers: usize,
    ) -> Result<Self, StoreError> {
        assert!(queue > 0 && (1..=64).contains(&batch), "call writer bounds");
        let writers = match pool {
            Pool::Sqlite { .. } => 1,
            Pool::Postgres { .. } => writers.clamp(1, 64),
        };
        let mut txs = Vec::with_capacity(writers);
        for i in 0..writers {
            let (tx, rx) = mpsc::channel(queue);
            let name = if writers == 1 {
                "call-writer".to_string()
            } else {
                format!("call-writer-{i}")
            };
            crate::dedicated::spawn(&name, writer(pool.clone(), origin.clone(), rx, batch))
                .map_err(|e| StoreError::Start(format!("{name}: {e}")))?;
            txs.push(tx);
        }
        Ok(Self { txs })
    }

    /// Runs `call` in the next group transaction; answers after its commit.
    pub(crate) async fn run(&self, call: Call) -> Result<Done, StoreError> {
        self.submit(None, call).await
    }

    /// Runs `call` in the next group transaction after recording `auth` as
    /// used ([`Done::Replayed`], and the call not run, if it already was).
    pub(crate) async fn run_spending(&self, auth: HttpAuthUse, call: Call) -> Result<Done, StoreError> {
        self.submit(Some(auth), call).await
    }

    async fn submit(&self, spends: Option<HttpAuthUse>, call: Call) -> Result<Done, StoreError> {
        let (reply, rx) = oneshot::channel();
        // Public keys and event ids are uniformly distributed: their first
        // bytes pick a writer evenly.
        let key = match (call.caller(), &spends) {
            (Some(pk), _) => pk.to_bytes(),
            (None, Some(auth)) => auth.event_id,
            (None, None) => [0; 32],
        };
        let pick = usize::from(u16::from_le_bytes([key[0], key[1]])) % self.txs.len();
        self.txs[pick]
            .send(Job { call, spends, reply })
            .await
            .map_err(|_| StoreError::Batch("the call writer stopped".into()))?;
        rx.await
            .map_err(|_| StoreError::Batch("the call writer stopped".into()))?
    }
}

/// Batches in a row on one held connection, at most, before the other
/// writers (events, the workflow engine) get their turn at it.
const HELD_BATCHES: usize = 8;

async fn writer(pool: Pool, origin: String, mut rx: mpsc::Receiver<Job>, batch_max: usize) {
    // Calls taken off the queue and not yet run: at most two batches.
    let mut waiting: VecDeque<Job> = VecDeque::with_capacity(2 * batch_max);
    let mut batch = Vec::with_capacity(batch_max);
    let mut starters_first = true;
    loop {
        if waiting.is_empty() {
            match rx.recv().await {
                Some(first) => waiting.push_back(first),
                None => return,
            }
        }
        let asked = std::time::Instant::now();
        // Keep the connection while calls keep coming (bounded), so that a
        // batch does not wait for the connection to come back to the pool.
        let acquired = pool.acquire_writer().await;
        tracing::debug!(
            waited_us = asked.elapsed().as_micros() as u64,
            "call writer got the write connection"
        );
        let mut conn = match acquired {
            Ok(c) => c,
            Err(e) => {
                let text = e.to_string();
                for job in waiting.drain(..) {
                    let _ = job.reply.send(Err(StoreError::Batch(text.clone())));
                }
                continue;
            }
        };
        for _ in 0..HELD_BATCHES {
            while waiting.len() < 2 * batch_max {
                match rx.try_recv() {
                    Ok(j) => waiting.push_back(j),
                    Err(_) => break,
                }
            }
            if waiting.is_empty() {
                break;
            }
            next_batch(&mut waiting, &mut batch, batch_max, starters_first);
            starters_first = !starters_first;
            let started = std::time::Instant::now();
            let n = batch.len();
            let (answers, healthy) = match run_batch(&mut conn, &origin, &batch, false).await {
                Ran::Done(answers, healthy) => (answers, healthy),
                // A call without a savepoint failed: nothing of the batch
                // was committed. Again, every call in a savepoint, so
                // that the failing one fails alone.
                Ran::Again => {
                    tracing::warn!(
                        calls = n,
                        "call batch failed; running each call in its own savepoint"
                    );
                    match run_batch(&mut conn, &origin, &batch, true).await {
                        Ran::Done(answers, healthy) => (answers, healthy),
                        Ran::Again => unreachable!("every call is guarded on the second run"),
                    }
                }
            };
            tracing::debug!(
                calls = n,
                elapsed_us = started.elapsed().as_micros() as u64,
                "call batch"
            );
            for (job, answer) in batch.drain(..).zip(answers) {
                let _ = job.reply.send(answer);
            }
            if !healthy {
                // A connection that failed is not reused (every job of the
                // batch was answered: nothing waits on it).
                break;
            }
        }
    }
}

/// Moves the next batch out of `waiting`. With `starters_first` (every
/// other batch) and calls that start work waiting, the batch is those
/// calls alone: a claim (one cheap statement) starts an agent's work and a
/// channel message may start workflow runs (and is what people in the
/// channel wait to see), while a finish (its reply event, several
/// statements) ends work, and a burst of finishes ahead of a claim or a
/// trigger would otherwise hold it for their whole batch (a trigger was
/// measured waiting about 30 ms behind them on PostgreSQL). Otherwise the
/// oldest calls, so that a finish waits at most one batch longer than in
/// arrival order.
fn next_batch(waiting: &mut VecDeque<Job>, batch: &mut Vec<Job>, batch_max: usize, starters_first: bool) {
    debug_assert!(batch.is_empty());
    let starts_work = |j: &Job| matches!(j.call, Call::Claim { .. } | Call::ChannelEvent { .. });
    if starters_first && waiting.iter().any(starts_work) {
        let mut rest = VecDeque::with_capacity(waiting.capacity());
        while let Some(j) = waiting.pop_front() {
            if batch.len() < batch_max && starts_work(&j) {
                batch.push(j);
            } else {
                rest.push_back(j);
            }
        }
        *waiting = rest;
    } else {
        while batch.len() < batch_max {
            match waiting.pop_front() {
                Some(j) => batch.push(j),
                None => break,
            }
        }
    }
}

/// What running a batch came to.
enum Ran {
    /// One answer per call, in order, and whether the connection is still
    /// fit for use.
    Done(Vec<Result<Done, StoreError>>, bool),
    /// A call that had no savepoint failed, so the transaction is lost
    /// (nothing was committed): run the batch again with `guard_all`.
    Again,
}

/// Runs every call of `batch` in one transaction on `conn`, each call in a
/// savepoint where it needs one (with `guard_all`: every call), so that a
/// call that is refused or fails is rolled back alone.
async fn run_batch(conn: &mut Conn, origin: &str, batch: &[Job], guard_all: bool) -> Ran {
    let fail_all = |e: &StoreError| -> Ran {
        let text = e.to_string();
        let answers = batch
            .iter()
            .map(|_| Err(StoreError::Batch(text.clone())))
            .collect();
        Ran::Done(answers, false)
    };
    let mut tx = match conn.begin().await {
        Ok(tx) => tx,
        Err(e) => return fail_all(&e),
    };
    if tx.dialect() == Dialect::Postgres {
        let keys = batch.iter().flat_map(|j| j.call.lock_keys()).collect();
        if let Err(e) = tx.lock_all(keys).await {
            return fail_all(&e);
        }
    }
    // The auth records first, outside the calls' savepoints: each stands
    // even if its call is refused (the request was made). A replay writes
    // nothing; an error fails the batch like any other.
    let spent = match spend_all(&mut tx, batch).await {
        Ok(s) => s,
        Err(e) => return fail_all(&e),
    };
    let mut answers: Vec<Result<Done, StoreError>> = Vec::with_capacity(batch.len());
    let postgres = tx.dialect() == Dialect::Postgres;
    for (job, fresh) in batch.iter().zip(spent) {
        if fresh == Some(false) {
            answers.push(Ok(Done::Replayed));
            continue;
        }
        // Calls with several writes get a savepoint, so that a refusal or
        // an error after a first write is undone for that call alone.
        // Savepoints are not released: they nest, at most `call_batch` deep,
        // and the commit keeps every one that was not rolled back.
        let guarded = guard_all || !job.call.one_write();
        let mark = tx.lock_mark();
        if guarded {
            if let Err(e) = tx.exec(Q::new("SAVEPOINT call")).await {
                return fail_all(&e);
            }
        }
        let answer = job.call.run(&mut tx).await;
        match (&answer, guarded) {
            (Ok(done), _) if done.keeps() => {}
            (_, true) => {
                if let Err(e) = tx.exec(Q::new("ROLLBACK TO SAVEPOINT call")).await {
                    return fail_all(&e);
                }
                tx.forget_locks_since(mark);
            }
            // A refusal of a one-write call wrote nothing.
            (Ok(_), false) => {}
            // An error without a savepoint: PostgreSQL has aborted the
            // transaction, SQLite may have ended it by itself (I/O errors,
            // a full disk), so nothing after it may run in it. Everything is
            // rolled back, and the batch runs again with a savepoint for
            // every call: one client's failing call never fails another's.
            (Err(_), false) => return Ran::Again,
        }
        answers.push(answer);
    }
    if postgres {
        // The kept calls' events reach other processes with the commit, in
        // one statement for the whole batch.
        let mut kept: Vec<(&str, &str)> = Vec::new();
        for (job, answer) in batch.iter().zip(&answers) {
            if let Ok(done) = answer {
                if done.keeps() {
                    kept.extend(
                        done.announced()
                            .into_iter()
                            .map(|raw| (job.call.community(), raw)),
                    );
                }
            }
        }
        if let Err(e) = super::postgres::notify(&mut tx, origin, &kept).await {
            return fail_all(&e);
        }
    }
    if let Err(e) = tx.commit().await {
        // What was kept is lost with the transaction; what was rolled back
        // keeps its answer (it stored nothing either way).
        let text = e.to_string();
        for a in &mut answers {
            if matches!(a, Ok(done) if done.keeps()) {
                *a = Err(StoreError::Batch(text.clone()));
            }
        }
        return Ran::Done(answers, false);
    }
    Ran::Done(answers, true)
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use std::sync::Arc;

    use nostr::prelude::{EventBuilder, FinalizeEvent, Keys, Kind};
    use tokio::sync::oneshot;

    use super::{next_batch, Call, Job};
    use crate::config::DeliveryConfig;

    /// What a test job is: a finish-like call, a claim, a channel message.
    #[derive(Clone, Copy)]
    enum What {
        Other,
        Claim,
        Message,
    }

    fn job(what: What, n: usize) -> Job {
        let community = format!("c{n}");
        let keys = Keys::generate();
        let call = match what {
            What::Claim => Call::Claim {
                community,
                caller: keys.public_key(),
                req: Default::default(),
                cfg: DeliveryConfig::default(),
            },
            What::Message => {
                let event = EventBuilder::new(Kind::from_u16(9), "hi")
                    .finalize(&keys)
                    .expect("sign");
                let raw = serde_json::to_string(&event).expect("json");
                Call::ChannelEvent {
                    community,
                    keys,
                    policy: Default::default(),
                    event: Arc::new(event),
                    raw: Arc::from(raw),
                }
            }
            What::Other => Call::HttpAuth { community },
        };
        Job {
            call,
            spends: None,
            reply: oneshot::channel().0,
        }
    }

    fn names(batch: &[Job]) -> Vec<&str> {
        batch.iter().map(|j| j.call.community()).collect()
    }

    #[test]
    fn work_starters_go_first_every_other_batch_within_bounds() {
        use What::*;
        // other, claim, other, message, claim (arrival order).
        let mut waiting: VecDeque<Job> = [Other, Claim, Other, Message, Claim]
            .iter()
            .enumerate()
            .map(|(n, w)| job(*w, n))
            .collect();
        let mut batch = Vec::new();
        // Claims and messages first, at most batch_max of them, in arrival order.
        next_batch(&mut waiting, &mut batch, 2, true);
        assert_eq!(names(&batch), ["c1", "c3"]);
        assert_eq!(waiting.len(), 3);
        batch.clear();
        // Then the oldest calls, whatever they are.
        next_batch(&mut waiting, &mut batch, 2, false);
        assert_eq!(names(&batch), ["c0", "c2"]);
        batch.clear();
        // A starters' turn takes the starters alone, even when there is room.
        waiting.push_back(job(Other, 5));
        next_batch(&mut waiting, &mut batch, 2, true);
        assert_eq!(names(&batch), ["c4"]);
        batch.clear();
        // No starter waiting: the oldest calls even on a starters' turn.
        next_batch(&mut waiting, &mut batch, 2, true);
        assert_eq!(names(&batch), ["c5"]);
        assert!(waiting.is_empty());
    }
}
