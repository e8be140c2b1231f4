//! The one implementation of [`Store`] over both SQL backends: it owns the
//! pools and the writers and hands each call to the module whose job it
//! is (`events.rs` the event rules, `writer.rs` the event writer,
//! `channels.rs`, `communities.rs`, `group.rs` the call writer). Every
//! storage rule is written once, against [`Tx`]; what differs between
//! SQLite and PostgreSQL (opening, partitions, cross-process fan-out)
//! lives in `sqlite.rs` and `postgres.rs`.

use std::sync::Arc;

use nostr::prelude::{Event, Filter, Keys, PublicKey};
use protocol::nip_oa::Attestation;
use tokio::sync::mpsc;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use crate::admin::communities;
use crate::admin::communities::CommunityRecord;
use crate::channels::state::ChannelView;
use crate::config::{ChannelPolicy, DeliveryConfig, WriterConfig};
use crate::events::query as sql;
use crate::events::windows;
use crate::events::InsertOutcome;
use crate::events::Page;
use crate::events::PageRows;
use crate::events::ReadScope;
use crate::events::StoredEvent;
use crate::persistence::db::{Pool, Tx, Q};
use crate::persistence::page::Bounds as PageBounds;
use crate::persistence::sql::Dialect;
use crate::persistence::RemoteEvent;
use crate::persistence::StoreError;
use crate::refusal::{CallError, Refusal};
use crate::store::group::HttpAuthUse;
use crate::store::writer::{batch_writer, Bounds, InsertRequest};

/// A store on SQLite or PostgreSQL.
pub struct Store {
    pub(crate) pool: Pool,
    /// Identifies this process in cross-process announcements (PostgreSQL).
    origin: String,
    partition_months_ahead: u32,
    /// The event writer's queue.
    writer: mpsc::Sender<InsertRequest>,
    /// The call writer (group commit of small write calls).
    pub(crate) calls: crate::store::group::Calls,
    /// Cancelled once the pool is closed (or the store dropped): until
    /// then the runtimes of the store's own threads, and of the engine's,
    /// keep serving the pooled connections they opened (see `dedicated`).
    closed: CancellationToken,
}

impl Store {
    /// Wraps `pool` and starts its two writers (see [`WriterConfig`]).
    /// The call writer's calls read `deliveries`, handed over here once.
    pub fn new(
        pool: Pool,
        partition_months_ahead: u32,
        w: &WriterConfig,
        deliveries: DeliveryConfig,
    ) -> Result<Self, StoreError> {
        let origin = hex::encode(rand::random::<[u8; 8]>());
        // The channel holds a batch's worth; the writer's own queue the
        // rest of `event_queue` (taken in turn by author).
        let (tx, rx) = mpsc::channel(w.event_batch.clamp(1, w.event_queue.max(1)));
        let bounds = Bounds {
            max_queued: w.event_queue.max(1),
            max_batch: w.event_batch.max(1),
            max_batch_bytes: w.event_batch_bytes.max(1),
        };
        let closed = CancellationToken::new();
        crate::dedicated::spawn(
            "event-writer",
            batch_writer(pool.clone(), origin.clone(), rx, bounds),
            closed.clone(),
        )
        .map_err(|e| StoreError::Start(format!("event writer: {e}")))?;
        let setup = crate::store::group::WriterSetup {
            origin: origin.clone(),
            queue: w.call_queue,
            batch: w.call_batch,
            writers: crate::store::group::call_writers(w),
            deliveries,
        };
        let calls = crate::store::group::Calls::start(pool.clone(), setup, &closed)?;
        Ok(Self {
            pool,
            origin,
            partition_months_ahead,
            writer: tx,
            calls,
            closed,
        })
    }

    pub fn dialect(&self) -> Dialect {
        self.pool.dialect()
    }

    /// Announces a committed (or, inside `tx`, committing) event to other
    /// relay processes. Only PostgreSQL has other processes.
    pub(crate) async fn announce<S: AsRef<str>>(
        &self,
        tx: &mut Tx<'_>,
        community: &str,
        raws: &[S],
    ) -> Result<(), StoreError> {
        if tx.dialect() == Dialect::Postgres {
            let events: Vec<(&str, &str)> = raws.iter().map(|raw| (community, raw.as_ref())).collect();
            crate::persistence::postgres::notify(tx, &self.origin, &events).await?;
        }
        Ok(())
    }
}

fn stored(rows: Vec<crate::persistence::db::Row>) -> Result<Vec<StoredEvent>, StoreError> {
    rows.into_iter()
        .map(|mut r| {
            Ok(StoredEvent {
                raw: r.take_text("raw")?,
                created_at: r.int("created_at")?,
                id: r.id32("id")?,
            })
        })
        .collect()
}

/// The storage interface of the relay (events, channels, agents; and through
/// [`api`](super::api), workflows and deliveries).
impl Store {
    /// `"sqlite"` or `"postgres"`.
    pub fn backend(&self) -> &'static str {
        match self.dialect() {
            Dialect::Sqlite => "sqlite",
            Dialect::Postgres => "postgres",
        }
    }

    /// The community bound to a normalised host: an exact `host:port`
    /// binding wins over a port-less binding of the same name.
    pub async fn community_for_host(&self, host: &str) -> Result<Option<CommunityRecord>, StoreError> {
        communities::for_host(&self.pool, host).await
    }

    /// Creates a community; fails with [`StoreError::Conflict`] when the id
    /// or one of the hosts is taken.
    pub async fn add_community(&self, c: &CommunityRecord) -> Result<(), StoreError> {
        communities::add(&self.pool, c).await
    }

    /// All communities, by id.
    pub async fn list_communities(&self) -> Result<Vec<CommunityRecord>, StoreError> {
        communities::list(&self.pool).await
    }

    /// Replaces a community's stored key (with the marker of a key moved to
    /// a file, see `crate::keys`); `false` when there is no such community.
    pub async fn set_community_key(&self, id: &str, stored: &str) -> Result<bool, StoreError> {
        communities::set_key(&self.pool, id, stored).await
    }

    /// Queues a verified event for storage under the NIP-01/09/40 rules,
    /// in one of the batched transactions of the store's writer (authors
    /// in turn, one author's events in queue order: a deletion or a
    /// replacement always follows what it names). The receiver yields the
    /// outcome once the batch committed.
    pub async fn enqueue_insert(
        &self,
        community: &str,
        event: Arc<Event>,
        raw: Arc<str>,
    ) -> oneshot::Receiver<Result<InsertOutcome, StoreError>> {
        let (reply, rx) = oneshot::channel();
        let req = InsertRequest {
            community: community.to_string(),
            event,
            raw,
            reply,
        };
        if let Err(mpsc::error::SendError(req)) = self.writer.send(req).await {
            let _ = req.reply.send(Err(StoreError::Stopped("event writer")));
        }
        rx
    }

    /// Stores a verified event under the NIP-01/09/40 rules.
    pub async fn insert_event(
        &self,
        community: &str,
        event: &Event,
        raw: &str,
    ) -> Result<InsertOutcome, StoreError> {
        let mut tx = self.pool.begin().await?;
        let outcome =
            crate::workflow::definitions::insert_event(&mut tx, community, event, raw, None).await?;
        if outcome == InsertOutcome::Stored {
            self.announce(&mut tx, community, &[raw]).await?;
            tx.commit().await?;
        }
        Ok(outcome)
    }

    /// Stores an `h`-tagged event (or a channel creation) under the NIP-29
    /// rules in one transaction with its state change and the relay-signed
    /// metadata it makes current (signed with `keys`). Returns the outcome,
    /// the events to announce, and whether a workflow run started or woke.
    pub async fn apply_channel_event(
        &self,
        community: &str,
        keys: &Keys,
        policy: &ChannelPolicy,
        event: &Event,
        raw: &str,
    ) -> Result<crate::channels::rules::Applied, StoreError> {
        let call = crate::store::calls::ChannelEvent {
            community: community.to_string(),
            keys: keys.clone(),
            policy: policy.clone(),
            event: Arc::new(event.clone()),
            raw: Arc::from(raw),
        };
        match self.calls.run(call).await {
            Ok(applied) => Ok(applied),
            Err(CallError::Store(e)) => Err(e),
            Err(CallError::Refused(r)) => unreachable!("a channel event is answered, not refused: {r:?}"),
        }
    }

    /// A channel and its members.
    pub async fn channel(&self, community: &str, id: &str) -> Result<Option<ChannelView>, StoreError> {
        let mut tx = self.pool.read().await?;
        crate::channels::state::load(&mut tx, community, id).await
    }

    /// Stores a kind 0 carrying a valid NIP-OA attestation, recording
    /// agent -> owner on the first one; a later one naming another owner is
    /// rejected (ownership is immutable).
    pub async fn register_agent(
        &self,
        community: &str,
        event: &Event,
        raw: &str,
        attestation: &Attestation,
    ) -> Result<InsertOutcome, StoreError> {
        let mut tx = self.pool.begin().await?;
        let outcome = crate::channels::agents::register(&mut tx, community, event, raw, attestation).await?;
        if outcome == InsertOutcome::Stored {
            self.announce(&mut tx, community, &[raw]).await?;
            tx.commit().await?;
        }
        Ok(outcome)
    }

    /// The recorded owner of a managed agent.
    pub async fn agent_owner(
        &self,
        community: &str,
        agent: &PublicKey,
    ) -> Result<Option<PublicKey>, StoreError> {
        let row = self
            .pool
            .one(
                Q::new("SELECT owner FROM agents WHERE community_id = $1 AND pubkey = $2")
                    .bind(community)
                    .bind(agent.to_bytes()),
            )
            .await?;
        match row {
            Some(r) => PublicKey::from_slice(&r.blob(0)?)
                .map(Some)
                .map_err(|e| StoreError::Corrupt(e.to_string())),
            None => Ok(None),
        }
    }

    /// Channels `member` belongs to.
    pub async fn channels_of(&self, community: &str, member: &PublicKey) -> Result<Vec<String>, StoreError> {
        let rows = self
            .pool
            .all(
                Q::new(
                    "SELECT m.channel_id FROM channel_members m JOIN channels c                      ON c.community_id = m.community_id AND c.id = m.channel_id                      WHERE m.community_id = $1 AND m.pubkey = $2 AND c.deleted = FALSE ORDER BY m.channel_id",
                )
                .bind(community)
                .bind(member.to_bytes()),
            )
            .await?;
        rows.iter().map(|r| r.text(0)).collect()
    }

    /// Records a NIP-98 auth event (by its key, `HttpAuthUse::key`) as
    /// used; `false` when it already was.
    pub async fn use_http_auth(
        &self,
        community: &str,
        key: &[u8; 32],
        expires_at: i64,
    ) -> Result<bool, StoreError> {
        let auth = HttpAuthUse {
            key: *key,
            keep_until: expires_at,
        };
        let call = crate::store::calls::HttpAuth {
            community: community.to_string(),
        };
        match self.calls.run_spending(auth, call).await {
            Ok(()) => Ok(true),
            Err(CallError::Refused(Refusal::Replayed(_))) => Ok(false),
            Err(CallError::Store(e)) => Err(e),
            Err(CallError::Refused(r)) => unreachable!("an auth record is refused only as a replay: {r:?}"),
        }
    }

    /// Tells the other relay processes on this database about ephemeral
    /// events, all in one transaction (stored events are announced by
    /// `insert_event` itself, inside its transaction). Nothing to do for a
    /// single-process backend.
    pub async fn publish_ephemeral(&self, community: &str, raws: &[String]) -> Result<(), StoreError> {
        if self.dialect() == Dialect::Postgres && !raws.is_empty() {
            let mut tx = self.pool.begin().await?;
            self.announce(&mut tx, community, raws).await?;
            tx.commit().await?;
        }
        Ok(())
    }

    /// Events accepted by other relay processes, or `None` for a
    /// single-process backend. `capacity` bounds the channel.
    pub async fn subscribe_remote(
        &self,
        capacity: usize,
    ) -> Result<Option<mpsc::Receiver<RemoteEvent>>, StoreError> {
        match &self.pool {
            Pool::Postgres { main: p, .. } => Ok(Some(
                crate::persistence::postgres::listen(p, self.origin.clone(), capacity).await?,
            )),
            Pool::Sqlite { .. } => Ok(None),
        }
    }

    /// A standby that may serve a read now (PostgreSQL with
    /// `read_database_urls`): the reader sets it as its scope's `from`.
    pub fn replica(&self) -> Option<crate::persistence::standbys::Replica> {
        self.pool.replica()
    }

    /// A page of the events matching one filter, newest first (ties by
    /// lowest id): see [`Page`].
    pub async fn query_page(
        &self,
        community: &str,
        filter: &Filter,
        page: &Page,
        scope: &ReadScope,
    ) -> Result<PageRows, StoreError> {
        if page.limit == 0 || page.rows == 0 {
            return Ok(PageRows {
                events: Vec::new(),
                end: true,
            });
        }
        if !sql::by_author_window(self.dialect(), filter) {
            return self.read_page(community, filter, page, scope).await;
        }
        // A follow list: window by window until one holds the page, then
        // the plain read (see `events::windows`).
        let mut windows = windows::Windows::new(filter, page.position.after, scope.now);
        let mut windowed = filter.clone();
        while let Some(floor) = windows.floor() {
            windowed.since = Some(floor);
            let rows = self.read_page(community, &windowed, page, scope).await?;
            if !rows.end || rows.events.len() >= page.rows {
                // Events older than the floor may follow this page.
                return Ok(PageRows { end: false, ..rows });
            }
            windows.widen(rows.events.len(), page.rows);
        }
        self.read_page(community, filter, page, scope).await
    }

    /// A page of `filter`'s events read by one statement.
    async fn read_page(
        &self,
        community: &str,
        filter: &Filter,
        page: &Page,
        scope: &ReadScope,
    ) -> Result<PageRows, StoreError> {
        let select = sql::select_events(
            self.dialect(),
            community,
            filter,
            page.limit,
            page.position,
            scope,
        );
        let bounds = PageBounds {
            rows: page.rows,
            bytes: page.max_bytes,
            ties: select.ties,
        };
        let (rows, end) = self.pool.query_page(select.q, bounds, scope.from).await?;
        Ok(PageRows {
            events: stored(rows)?,
            end,
        })
    }

    /// `(created_at, id)` of the events matching `filter` under the read
    /// rules, in no order, at most `max` (NIP-77 sync: a caller that gets
    /// `max` refuses rather than reconciles part of a set).
    pub async fn sync_items(
        &self,
        community: &str,
        filter: &Filter,
        scope: &ReadScope,
        max: usize,
    ) -> Result<Vec<(u64, [u8; 32])>, StoreError> {
        let q = sql::select_items(self.dialect(), community, filter, max, scope);
        let rows = self.pool.query_all(q, scope.from).await?;
        rows.iter()
            .map(|r| Ok((u64::try_from(r.int(0)?).unwrap_or(0), r.id32("id")?)))
            .collect()
    }

    /// Number of distinct events matching any of the filters (NIP-45).
    pub async fn count(
        &self,
        community: &str,
        filters: &[Filter],
        scope: &ReadScope,
    ) -> Result<u64, StoreError> {
        let q = sql::count_events(self.dialect(), community, filters, scope);
        let rows = self.pool.query_all(q, scope.from).await?;
        Ok(rows
            .first()
            .map(|r| r.int(0))
            .transpose()?
            .map_or(0, |n| u64::try_from(n).unwrap_or(0)))
    }

    /// Deletes events whose NIP-40 expiration has passed; returns how many.
    pub async fn purge_expired(&self, now: u64) -> Result<u64, StoreError> {
        let now = i64::try_from(now).unwrap_or(i64::MAX);
        let n = self
            .pool
            .exec(Q::new("DELETE FROM events WHERE expires_at IS NOT NULL AND expires_at <= $1").bind(now))
            .await?;
        self.pool
            .exec(Q::new("DELETE FROM http_auth_seen WHERE expires_at < $1").bind(now))
            .await?;
        if self.dialect() == Dialect::Postgres {
            self.pool
                .exec(Q::new("DELETE FROM fanout_spill WHERE created_at < $1").bind(now - 60))
                .await?;
        }
        Ok(n)
    }

    /// Periodic housekeeping (PostgreSQL: partitions ahead of time).
    pub async fn maintain(&self, now: u64) -> Result<(), StoreError> {
        if let Pool::Postgres { main: p, .. } = &self.pool {
            crate::persistence::postgres::ensure_partitions(p, now, self.partition_months_ahead).await?;
        }
        Ok(())
    }

    /// PostgreSQL: the statistics of the tables that grew from nothing
    /// (`postgres::refresh_statistics`); the tables analyzed.
    pub async fn refresh_statistics(&self) -> Result<Vec<String>, StoreError> {
        match &self.pool {
            Pool::Postgres { main: p, .. } => crate::persistence::postgres::refresh_statistics(p).await,
            _ => Ok(Vec::new()),
        }
    }

    /// A community's gauges for the metrics: deliveries and runs by
    /// status, and the oldest pending delivery's age (database clock).
    pub async fn gauges(&self, community: &str) -> Result<crate::admin::overview::Gauges, StoreError> {
        let by_status = |table: &str| {
            Q::new(format!(
                "SELECT status, COUNT(*) AS n FROM {table} WHERE community_id = $1 GROUP BY status"
            ))
            .bind(community)
        };
        let pairs = |rows: Vec<crate::persistence::db::Row>| -> Result<Vec<(String, i64)>, StoreError> {
            rows.iter()
                .map(|r| Ok((r.text("status")?, r.int("n")?)))
                .collect()
        };
        let deliveries = pairs(self.pool.all(by_status("workflow_agent_deliveries")).await?)?;
        let runs = pairs(self.pool.all(by_status("workflow_runs")).await?)?;
        let now = self.pool.dialect().now();
        let oldest = self
            .pool
            .one(
                Q::new(format!(
                    "SELECT COALESCE({now} - MIN(created_at), 0) AS age FROM workflow_agent_deliveries \
                     WHERE community_id = $1 AND status = 'pending'"
                ))
                .bind(community),
            )
            .await?;
        let oldest_pending_secs = match oldest {
            Some(r) => r.opt_int("age")?.unwrap_or(0).max(0),
            None => 0,
        };
        Ok(crate::admin::overview::Gauges {
            deliveries,
            oldest_pending_secs,
            runs,
        })
    }

    /// Whether the database answers a trivial statement now, and (on
    /// PostgreSQL) takes writes: a standby, or a primary demoted under the
    /// relay, does not (`persistence::primary` looks for another host).
    pub async fn ping(&self) -> Result<(), StoreError> {
        if self.dialect() == Dialect::Sqlite {
            return self.pool.all(Q::new("SELECT 1")).await.map(|_| ());
        }
        let row = self
            .pool
            .one(Q::new("SELECT current_setting('transaction_read_only') AS ro"))
            .await?;
        match row.map(|r| r.text("ro")).transpose()?.as_deref() {
            Some("off") => Ok(()),
            _ => Err(StoreError::Unreachable(
                "a writable database host: the one in use is read-only".into(),
            )),
        }
    }

    /// Whether both writers (events, calls) still take work.
    pub fn writers_alive(&self) -> bool {
        !self.writer.is_closed() && self.calls.alive()
    }

    /// Flushes and closes connections.
    pub async fn close(&self) {
        self.pool.close().await;
        self.closed.cancel();
    }

    /// For a task on a thread of its own that uses this store: its runtime
    /// lingers until this is cancelled (see `dedicated`).
    pub(crate) fn closed(&self) -> CancellationToken {
        self.closed.clone()
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        self.closed.cancel();
    }
}
