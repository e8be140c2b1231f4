//! Group commit for the store's small write calls (`calls.rs`: NIP-98 auth
//! records, delivery claims, renews, operations and finishes, and channel
//! events). Each call is a type with its own reply ([`WriteCall`]); this
//! module queues, batches, runs and answers them.
//!
//! Why: each of these is a transaction of a few statements, and on SQLite
//! every one of them waited for the one writer connection. Measured in the
//! delivery benchmark, a claim spent 0.3 ms in its statements and 12 ms
//! waiting for the connection to be handed over from the previous
//! transaction. One task now takes every call that is queued (at most
//! `writer.call_batch`) and runs them in one transaction, back to back.
//!
//! Each call runs in its own savepoint (a call that refuses only before
//! its first write needs none; when such a call fails, the batch is run
//! again with a savepoint for every call), so a call that is refused or
//! fails is rolled back alone, exactly as if it had had its own transaction, and the
//! others still commit: one client's failing call never fails another's. No call is answered before the commit that
//! holds it: an answer is never sent for work that could still be lost.
//! If the commit fails, every call it held gets the error (nothing of
//! theirs was stored); the calls that were rolled back keep their answers.

use std::collections::VecDeque;
use std::sync::Arc;

use futures_util::future::BoxFuture;
use nostr::prelude::PublicKey;
use tokio::sync::{mpsc, oneshot};

use crate::config::DeliveryConfig;
use crate::delivery::claim::{NamedClaim, Turn};
use crate::persistence::db::{Conn, Dialect, Pool, Tx, Q};
use crate::persistence::StoreError;
use crate::refusal::{Answer, CallError, Refusal};

mod together;
use together::claim_together;
pub(crate) use together::ClaimsTogether;

/// A NIP-98 auth event that a delivery call spends: recorded as used in the
/// call's own transaction, before the call and outside its savepoint, so the
/// record stands even when the call is refused. An event already recorded
/// makes the call answer 401 `auth_replayed` without running it.
#[derive(Debug, Clone, Copy)]
pub struct HttpAuthUse {
    /// What identifies this signed event: SHA-256 of its signature (see
    /// `http::spend_of`).
    pub key: [u8; 32],
    /// Unix seconds until which the record is kept (then swept).
    pub keep_until: i64,
}

/// One write call: its arguments (owned: it outlives the caller's borrow),
/// how it runs and what it answers. Its reply type is its own, so a call
/// cannot be answered with another's.
pub(crate) trait WriteCall: Send + Sync + 'static {
    type Reply: Send + Sync + 'static;

    fn community(&self) -> &str;

    /// Who makes the call: its writer is chosen by it, so that one
    /// caller's calls (and the locks they take: its delivery rows, its
    /// author lock) never wait on each other from two writers at once.
    fn caller(&self) -> Option<&PublicKey>;

    /// Whether every refusal of this call comes before its first write:
    /// then the call needs no savepoint (a refusal has written nothing; an
    /// error fails the whole batch, which runs again with a savepoint for
    /// every call, see `run_batch`). The functions that say so keep that
    /// shape; see their doc comments. Such a call that fails is run once
    /// more, in the second run: a failure that does not recur is then not
    /// answered.
    fn refuses_before_writing(&self) -> bool {
        false
    }

    /// Whether the call starts work (see [`next_batch`]).
    fn starts_work(&self) -> bool {
        false
    }

    /// The [`Tx::lock`] keys this call takes, known before it runs: its
    /// batch takes all of them first, in one order (`Tx::lock_all`), so that
    /// two writers' batches never wait on each other in a cycle. A call may
    /// still lock something not listed here (a workflow run), but not
    /// something a concurrent batch takes up front and then waits behind.
    fn lock_keys(&self) -> Vec<String> {
        Vec::new()
    }

    /// The call, if its batch may make its claim by name with other
    /// callers' in one statement before the calls run ([`claim_together`]).
    fn claims_together(&self) -> Option<&dyn ClaimsTogether<Self::Reply>> {
        None
    }

    /// Runs the call in `tx` (inside its savepoint, when it has one).
    fn run<'a>(&'a self, tx: &'a mut Tx<'_>, cfg: &'a DeliveryConfig) -> BoxFuture<'a, Answer<Self::Reply>>;

    /// Whether a reply's writes stand. A refusal always rolls back: it must
    /// leave no trace (its own transaction would not have been committed
    /// either); so does a reply this says does not keep.
    fn keeps(_reply: &Self::Reply) -> bool {
        true
    }

    /// Raw events the reply stored, to announce to other relay processes.
    fn announced(_reply: &Self::Reply) -> Vec<&str> {
        Vec::new()
    }
}

/// A queued call, its answer once it ran, and where the answer goes.
struct Job<C: WriteCall> {
    call: C,
    /// What its batch claimed for it before the calls ran (this run of the
    /// batch: set again at each, see [`claim_together`]).
    together: Option<Turn>,
    /// The auth event the call spends (recorded before the batch's calls
    /// run: `spend_all`).
    spends: Option<HttpAuthUse>,
    answer: Option<Answer<C::Reply>>,
    reply: oneshot::Sender<Answer<C::Reply>>,
}

/// A [`Job`] of any call, as the writer handles it.
trait Queued: Send + Sync {
    fn community(&self) -> &str;
    fn caller(&self) -> Option<&PublicKey>;
    /// Its call's claim by name, if its batch may make it with others'.
    fn named_claim(&self) -> Option<NamedClaim<'_>>;
    /// What its batch claimed for it in this run of the batch (`None`:
    /// nothing, the call runs as it is).
    fn set_together(&mut self, turn: Option<Turn>);
    fn spends(&self) -> Option<&HttpAuthUse>;
    fn refuses_before_writing(&self) -> bool;
    fn starts_work(&self) -> bool;
    fn lock_keys(&self) -> Vec<String>;
    /// Runs the call and keeps its answer.
    fn run<'a>(&'a mut self, tx: &'a mut Tx<'_>, cfg: &'a DeliveryConfig) -> BoxFuture<'a, ()>;
    /// Its auth event was already used: the call does not run.
    fn replayed(&mut self);
    /// Whether its answer's writes stand.
    fn kept(&self) -> bool;
    /// Whether it failed (not refused): an error of the store.
    fn failed(&self) -> bool;
    fn announced(&self) -> Vec<&str>;
    /// Its transaction was lost: the answer is `e`.
    fn lose(&mut self, e: &Arc<StoreError>);
    fn send(self: Box<Self>);
}

impl<C: WriteCall> Queued for Job<C> {
    fn community(&self) -> &str {
        self.call.community()
    }

    fn caller(&self) -> Option<&PublicKey> {
        self.call.caller()
    }

    fn named_claim(&self) -> Option<NamedClaim<'_>> {
        self.call.claims_together()?.named_claim()
    }

    fn set_together(&mut self, turn: Option<Turn>) {
        debug_assert!(turn.is_none() || self.call.claims_together().is_some());
        self.together = turn;
    }

    fn spends(&self) -> Option<&HttpAuthUse> {
        self.spends.as_ref()
    }

    fn refuses_before_writing(&self) -> bool {
        self.call.refuses_before_writing()
    }

    fn starts_work(&self) -> bool {
        self.call.starts_work()
    }

    fn lock_keys(&self) -> Vec<String> {
        self.call.lock_keys()
    }

    fn run<'a>(&'a mut self, tx: &'a mut Tx<'_>, cfg: &'a DeliveryConfig) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            self.answer = Some(match self.together.take() {
                Some(turn) => match self.call.claims_together() {
                    Some(call) => call.claimed(turn),
                    None => unreachable!("a claim made together is a call's that claims together"),
                },
                None => self.call.run(tx, cfg).await,
            });
        })
    }

    fn replayed(&mut self) {
        let r = Refusal::Replayed(protocol::nip98::Nip98Error::Replayed.to_string());
        self.answer = Some(Err(r.into()));
    }

    fn kept(&self) -> bool {
        matches!(&self.answer, Some(Ok(reply)) if C::keeps(reply))
    }

    fn failed(&self) -> bool {
        matches!(&self.answer, Some(Err(CallError::Store(_))))
    }

    fn announced(&self) -> Vec<&str> {
        match &self.answer {
            Some(Ok(reply)) => C::announced(reply),
            _ => Vec::new(),
        }
    }

    fn lose(&mut self, e: &Arc<StoreError>) {
        self.answer = Some(Err(StoreError::Batch(e.clone()).into()));
    }

    fn send(self: Box<Self>) {
        let answer = self.answer.unwrap_or_else(|| {
            debug_assert!(false, "a call is answered once it ran");
            Err(StoreError::Stopped("call writer").into())
        });
        let _ = self.reply.send(answer);
    }
}

/// Records the NIP-98 auth events that the jobs of a batch spend, in one
/// statement; returns, per job, whether its event was fresh (`None`: the
/// job spends none). Of two jobs spending the same event, the first gets
/// it: the later one is a replay, as if it had come in a later batch.
async fn spend_all(tx: &mut Tx<'_>, batch: &[Box<dyn Queued>]) -> Result<Vec<Option<bool>>, StoreError> {
    let keys: Vec<Option<(&str, &HttpAuthUse)>> = batch
        .iter()
        .map(|j| j.spends().map(|a| (j.community(), a)))
        .collect();
    let mut firsts: Vec<(&str, &HttpAuthUse)> = Vec::with_capacity(batch.len());
    for (community, auth) in keys.iter().flatten() {
        if !firsts.iter().any(|(c, a)| c == community && a.key == auth.key) {
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
        q = q.bind(*community).bind(auth.key).bind(auth.keep_until);
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
                match fresh.iter().position(|(c, e)| c == community && *e == auth.key) {
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

/// The sending side: what the store's methods submit calls to.
#[derive(Clone)]
pub(crate) struct Calls {
    /// One queue per writer.
    txs: Vec<mpsc::Sender<Box<dyn Queued>>>,
}

impl Calls {
    /// Whether every call writer still takes calls.
    pub(crate) fn alive(&self) -> bool {
        self.txs.iter().all(|t| !t.is_closed())
    }
}

/// How the call writers run (their queue and batch bounds, and the one
/// configuration their calls read).
pub(crate) struct WriterSetup {
    /// Names this process in cross-process announcements.
    pub origin: String,
    pub queue: usize,
    pub batch: usize,
    pub writers: usize,
    pub deliveries: DeliveryConfig,
}

impl Calls {
    /// Starts the writer tasks on `pool` (SQLite: always one, its one
    /// write connection), each with a queue of `queue` calls.
    ///
    /// Why several on PostgreSQL: a writer waits for the server once per
    /// statement, and one writer was measured busy all the time while the
    /// machine was a third idle. Several writers' transactions run side by
    /// side; each caller's calls go to one writer (`WriteCall::caller`), so
    /// one caller's delivery rows are only ever locked by one writer. Locks
    /// that several writers (and the event writer) do share, on channels,
    /// authors and the community key, every batch takes first, in one
    /// order (`WriteCall::lock_keys`), so they queue instead of deadlocking.
    pub(crate) fn start(
        pool: Pool,
        setup: WriterSetup,
        linger: &tokio_util::sync::CancellationToken,
    ) -> Result<Self, StoreError> {
        assert!(
            setup.queue > 0
                && (1..=64).contains(&setup.batch)
                && (1..=MAX_CALL_WRITERS).contains(&setup.writers),
            "call writer bounds"
        );
        let writers = match pool {
            Pool::Sqlite { .. } => 1,
            Pool::Postgres { .. } => setup.writers,
        };
        let cfg = Arc::new(setup.deliveries);
        let mut txs = Vec::with_capacity(writers);
        for i in 0..writers {
            let (tx, rx) = mpsc::channel(setup.queue);
            let name = if writers == 1 {
                "call-writer".to_string()
            } else {
                format!("call-writer-{i}")
            };
            let task = writer(pool.clone(), setup.origin.clone(), cfg.clone(), rx, setup.batch);
            crate::dedicated::spawn(&name, task, linger.clone())
                .map_err(|e| StoreError::Start(format!("{name}: {e}")))?;
            txs.push(tx);
        }
        Ok(Self { txs })
    }

    /// Runs `call` in the next group transaction; answers after its commit.
    pub(crate) async fn run<C: WriteCall>(&self, call: C) -> Answer<C::Reply> {
        self.submit(None, call).await
    }

    /// Runs `call` in the next group transaction after recording `auth` as
    /// used (refused with [`Refusal::Replayed`], and not run, if it already
    /// was).
    pub(crate) async fn run_spending<C: WriteCall>(&self, auth: HttpAuthUse, call: C) -> Answer<C::Reply> {
        self.submit(Some(auth), call).await
    }

    async fn submit<C: WriteCall>(&self, spends: Option<HttpAuthUse>, call: C) -> Answer<C::Reply> {
        let (reply, rx) = oneshot::channel();
        // Public keys and event ids are uniformly distributed: their first
        // bytes pick a writer evenly.
        let key = match (call.caller(), &spends) {
            (Some(pk), _) => pk.to_bytes(),
            (None, Some(auth)) => auth.key,
            (None, None) => [0; 32],
        };
        let pick = usize::from(u16::from_le_bytes([key[0], key[1]])) % self.txs.len();
        let job = Job {
            call,
            together: None,
            spends,
            answer: None,
            reply,
        };
        let stopped = || CallError::Store(StoreError::Stopped("call writer"));
        self.txs[pick].send(Box::new(job)).await.map_err(|_| stopped())?;
        rx.await.map_err(|_| stopped())?
    }
}

/// At most this many call writers side by side (PostgreSQL).
const MAX_CALL_WRITERS: usize = 64;

/// How many call writers PostgreSQL gets (`writer.call_writers`, bounded).
pub(crate) fn call_writers(cfg: &crate::config::WriterConfig) -> usize {
    cfg.call_writers.clamp(1, MAX_CALL_WRITERS)
}

/// Batches in a row on one held connection, at most, before the other
/// writers (events, the workflow engine) get their turn at it.
const HELD_BATCHES: usize = 8;

async fn writer(
    pool: Pool,
    origin: String,
    cfg: Arc<DeliveryConfig>,
    mut rx: mpsc::Receiver<Box<dyn Queued>>,
    batch_max: usize,
) {
    let pool = pool.for_writer();
    // Calls taken off the queue and not yet run: at most two batches.
    let mut waiting: VecDeque<Box<dyn Queued>> = VecDeque::with_capacity(2 * batch_max);
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
                let e = Arc::new(e);
                for mut job in waiting.drain(..) {
                    job.lose(&e);
                    job.send();
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
            let healthy = run_guarded(&mut conn, &origin, &cfg, &mut batch).await;
            for job in batch.drain(..) {
                job.send();
            }
            if !healthy {
                // A connection that failed is not reused (every job of the
                // batch was answered: nothing waits on it).
                break;
            }
        }
    }
}

/// Runs a batch, and again with a savepoint for every call if a call
/// without one failed (nothing of the first run was committed), so that
/// the failing call fails alone. Returns whether the connection is still
/// fit for use.
async fn run_guarded(
    conn: &mut Conn,
    origin: &str,
    cfg: &DeliveryConfig,
    batch: &mut [Box<dyn Queued>],
) -> bool {
    let started = std::time::Instant::now();
    let healthy = match run_batch(conn, origin, cfg, batch, false).await {
        Ran::Done { healthy } => healthy,
        Ran::Again => {
            tracing::warn!(
                calls = batch.len(),
                "call batch failed; running each call in its own savepoint"
            );
            match run_batch(conn, origin, cfg, batch, true).await {
                Ran::Done { healthy } => healthy,
                Ran::Again => unreachable!("every call is guarded on the second run"),
            }
        }
    };
    tracing::debug!(
        calls = batch.len(),
        elapsed_us = started.elapsed().as_micros() as u64,
        "call batch"
    );
    healthy
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
fn next_batch(
    waiting: &mut VecDeque<Box<dyn Queued>>,
    batch: &mut Vec<Box<dyn Queued>>,
    batch_max: usize,
    starters_first: bool,
) {
    debug_assert!(batch.is_empty());
    if starters_first && waiting.iter().any(|j| j.starts_work()) {
        let mut rest = VecDeque::with_capacity(waiting.capacity());
        while let Some(j) = waiting.pop_front() {
            if batch.len() < batch_max && j.starts_work() {
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
    /// Every call has its answer; `healthy`: the connection is still fit
    /// for use.
    Done { healthy: bool },
    /// A call that had no savepoint failed, so the transaction is lost
    /// (nothing was committed): run the batch again with `guard_all`.
    Again,
}

/// Every call of `batch` is answered with `e` (nothing of theirs was
/// stored).
fn fail_all(batch: &mut [Box<dyn Queued>], e: StoreError) -> Ran {
    let e = Arc::new(e);
    for job in batch {
        job.lose(&e);
    }
    Ran::Done { healthy: false }
}

/// Runs every call of `batch` in one transaction on `conn`, each call in a
/// savepoint where it needs one (with `guard_all`: every call), so that a
/// call that is refused or fails is rolled back alone.
async fn run_batch(
    conn: &mut Conn,
    origin: &str,
    cfg: &DeliveryConfig,
    batch: &mut [Box<dyn Queued>],
    guard_all: bool,
) -> Ran {
    let mut tx = match conn.begin().await {
        Ok(tx) => tx,
        Err(e) => return fail_all(batch, e),
    };
    if tx.dialect() == Dialect::Postgres {
        let keys = batch.iter().flat_map(|j| j.lock_keys()).collect();
        if let Err(e) = tx.lock_all(keys).await {
            return fail_all(batch, e);
        }
    }
    // The auth records first, outside the calls' savepoints: each stands
    // even if its call is refused (the request was made). A replay writes
    // nothing; an error fails the batch like any other.
    let spent = match spend_all(&mut tx, batch).await {
        Ok(s) => s,
        Err(e) => return fail_all(batch, e),
    };
    // A failure here is any call's: the batch runs again, each call on its
    // own (nothing of this run is committed).
    let together = if guard_all {
        Vec::new()
    } else {
        match claim_together(&mut tx, cfg, batch, &spent).await {
            Ok(t) => t,
            Err(e) => {
                tracing::debug!(error = %e, "claims of a batch in one statement failed");
                return Ran::Again;
            }
        }
    };
    let mut together = together.into_iter();
    for job in batch.iter_mut() {
        job.set_together(together.next().flatten());
    }
    for (job, fresh) in batch.iter_mut().zip(spent) {
        if fresh == Some(false) {
            job.replayed();
            continue;
        }
        match run_one(&mut tx, cfg, job.as_mut(), guard_all).await {
            Ok(true) => {}
            Ok(false) => return Ran::Again,
            Err(e) => return fail_all(batch, e),
        }
    }
    if tx.dialect() == Dialect::Postgres {
        // The kept calls' events reach other processes with the commit, in
        // one statement for the whole batch.
        let kept: Vec<(&str, &str)> = batch
            .iter()
            .filter(|j| j.kept())
            .flat_map(|j| j.announced().into_iter().map(|raw| (j.community(), raw)))
            .collect();
        if let Err(e) = crate::persistence::postgres::notify(&mut tx, origin, &kept).await {
            return fail_all(batch, e);
        }
    }
    if let Err(e) = tx.commit().await {
        // What was kept is lost with the transaction; what was rolled back
        // keeps its answer (it stored nothing either way).
        let e = Arc::new(e);
        for job in batch.iter_mut().filter(|j| j.kept()) {
            job.lose(&e);
        }
        return Ran::Done { healthy: false };
    }
    Ran::Done { healthy: true }
}

/// Runs one call in `tx`. Calls that may refuse after a first write get a
/// savepoint, so that the refusal undoes that call alone. Savepoints are
/// not released: they nest, at most `call_batch` deep, and the commit
/// keeps every one that was not rolled back.
/// `Ok(false)`: the call failed without a savepoint, and the transaction
/// is lost.
async fn run_one(
    tx: &mut Tx<'_>,
    cfg: &DeliveryConfig,
    job: &mut dyn Queued,
    guard_all: bool,
) -> Result<bool, StoreError> {
    let guarded = guard_all || !job.refuses_before_writing();
    let mark = tx.lock_mark();
    if guarded {
        tx.exec(Q::new("SAVEPOINT call")).await?;
    }
    job.run(tx, cfg).await;
    if job.kept() {
        return Ok(true);
    }
    if guarded {
        tx.exec(Q::new("ROLLBACK TO SAVEPOINT call")).await?;
        tx.forget_locks_since(mark);
        return Ok(true);
    }
    // A refusal of a call that refuses before writing wrote nothing. An
    // error without a savepoint: PostgreSQL has aborted the transaction,
    // SQLite may have ended it by itself (I/O errors, a full disk), so
    // nothing after it may run in it. Everything is rolled back, and the
    // batch runs again with a savepoint for every call: one client's
    // failing call never fails another's.
    Ok(!job.failed())
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use futures_util::future::BoxFuture;
    use nostr::prelude::PublicKey;
    use tokio::sync::oneshot;

    use super::{next_batch, Answer, Job, Queued, Tx, WriteCall};
    use crate::config::DeliveryConfig;

    /// A call that is never run: its community names it, and it may start
    /// work.
    struct Test {
        community: String,
        starts_work: bool,
    }

    impl WriteCall for Test {
        type Reply = ();

        fn community(&self) -> &str {
            &self.community
        }

        fn caller(&self) -> Option<&PublicKey> {
            None
        }

        fn starts_work(&self) -> bool {
            self.starts_work
        }

        fn run<'a>(&'a self, _tx: &'a mut Tx<'_>, _cfg: &'a DeliveryConfig) -> BoxFuture<'a, Answer<()>> {
            unreachable!("batches are only formed here")
        }
    }

    /// `starts`: a claim or a channel message; otherwise a finish-like call.
    fn job(starts: bool, n: usize) -> Box<dyn Queued> {
        Box::new(Job {
            together: None,
            call: Test {
                community: format!("c{n}"),
                starts_work: starts,
            },
            spends: None,
            answer: None,
            reply: oneshot::channel().0,
        })
    }

    fn names(batch: &[Box<dyn Queued>]) -> Vec<&str> {
        batch.iter().map(|j| j.community()).collect()
    }

    #[test]
    fn work_starters_go_first_every_other_batch_within_bounds() {
        // other, claim, other, message, claim (arrival order).
        let mut waiting: VecDeque<Box<dyn Queued>> = [false, true, false, true, true]
            .iter()
            .enumerate()
            .map(|(n, starts)| job(*starts, n))
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
        waiting.push_back(job(false, 5));
        next_batch(&mut waiting, &mut batch, 2, true);
        assert_eq!(names(&batch), ["c4"]);
        batch.clear();
        // No starter waiting: the oldest calls even on a starters' turn.
        next_batch(&mut waiting, &mut batch, 2, true);
        assert_eq!(names(&batch), ["c5"]);
        assert!(waiting.is_empty());
    }
}
