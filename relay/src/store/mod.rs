//! Storage: the one trait both backends implement, and the types that cross it.
//!
//! The relay talks to storage only through [`Store`]. The SQLite backend
//! (embedded, the default) and the PostgreSQL backend (several relay processes
//! on one database) implement it with the same observable behaviour, and the
//! integration suite runs unchanged against both.
//!
//! Invariants every backend keeps:
//! - every row is scoped by `community_id`, and every key includes it;
//! - an event acknowledged with `OK true` is committed before the answer;
//! - replaceable/addressable/deletion rules are decided inside the same
//!   transaction that writes, so concurrent writers cannot both win.

pub mod agents;
pub mod api;
pub mod approvals;
pub(crate) mod calls;
pub mod channels;
pub(crate) mod communities;
pub mod db;
pub mod deliveries;
pub(crate) mod events;
mod fair;
mod group;
pub(crate) mod lite;
pub mod machine;
pub mod manage;
pub mod notices;
pub mod outcalls;
pub mod overview;
pub mod postgres;
mod readers;
pub mod refusal;
mod row;
pub mod runs;
pub mod sql;
pub mod sqlite;
pub mod sqlstore;
pub mod workflows;
pub(crate) mod writer;

use async_trait::async_trait;
use nostr::prelude::{Event, Filter, Keys, PublicKey};
use protocol::nip_oa::Attestation;

use crate::config::ChannelPolicy;
pub use channels::{ChannelView, Published};
use tokio::sync::mpsc;

/// A community as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommunityRecord {
    /// Operator-chosen id (`[a-z0-9_-]{1,64}`).
    pub id: String,
    /// Public relay URL (`ws://` or `wss://`).
    pub relay_url: String,
    /// Hex secret key the relay signs this community's events with, or
    /// `file:<public key hex>` when the key is kept in a key file
    /// (`crate::keys`).
    pub secret_key_hex: String,
    /// Normalised hosts bound to the community.
    pub hosts: Vec<String>,
}

/// What happened to an event offered for storage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InsertOutcome {
    /// Newly committed.
    Stored,
    /// Already stored (same id in the same community); nothing changed.
    Duplicate,
    /// Refused by a storage rule; the text is the full machine-readable
    /// answer (`prefix: reason`).
    Rejected(String),
}

/// Who is reading, for read-side access rules.
#[derive(Debug, Clone)]
pub struct ReadScope {
    /// NIP-42 authenticated pubkey of the reader, if any.
    pub viewer: Option<PublicKey>,
    /// Kinds served only to a reader named in the event's `p` tags.
    pub gated_kinds: Vec<u16>,
    /// Unix seconds used for NIP-40 expiry.
    pub now: u64,
}

/// One event read back, newest-first order is the caller's to keep.
#[derive(Debug, Clone)]
pub struct StoredEvent {
    pub created_at: i64,
    pub id: [u8; 32],
    /// The event's JSON exactly as stored.
    pub raw: String,
}

/// Which part of one filter's stored events a REQ reads next.
#[derive(Debug, Clone)]
pub struct Page {
    /// The filter's (clamped) `limit`: the statement's `LIMIT`, the same
    /// on every page, so that a filter's pages share two statements.
    pub limit: usize,
    /// Rows wanted now, at most (what is left of `limit`).
    pub rows: usize,
    /// Where the page starts: after an event in REQ order (`None` for the
    /// first page), or, for a search filter, after the rows read.
    pub position: sql::Position,
    /// Bytes of event JSON the page may hold (at least one event is
    /// returned, whatever its size).
    pub max_bytes: usize,
}

/// A page read.
#[derive(Debug)]
pub struct PageRows {
    pub events: Vec<StoredEvent>,
    /// No event follows these (the page did not stop for its bounds).
    pub end: bool,
}

/// An event accepted by another relay process on the same database.
#[derive(Debug, Clone)]
pub struct RemoteEvent {
    pub community: String,
    pub raw: String,
}

/// A storage failure (never a rule decision; those are [`InsertOutcome::Rejected`]).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database error: {0}")]
    Db(#[from] sqlx::Error),
    /// A statement on a rusqlite connection (the SQLite writer, a REQ
    /// reader) failed.
    #[error("database error: {0}")]
    Sqlite(String),
    #[error("migration error: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("{0}")]
    Conflict(String),
    #[error("stored data is not valid: {0}")]
    Corrupt(String),
    #[error(transparent)]
    Injected(#[from] faults::Injected),
    /// A batched write failed as a whole: every write it held gets this,
    /// with the one cause.
    #[error("batched write failed: {0}")]
    Batch(#[source] std::sync::Arc<StoreError>),
    /// A writer (named) has stopped: nothing more can be written through it.
    #[error("the {0} stopped")]
    Stopped(&'static str),
    /// A writer thread could not be started.
    #[error("starting a store writer: {0}")]
    Start(String),
    /// The store is not there (and may not be created by this command),
    /// or cannot be created where the URL points; the text names it.
    #[error("{0}")]
    Missing(String),
}

/// Whether opening a store may create it. Only `relay serve` creates one;
/// the other commands read an existing store, and a command run in the
/// wrong directory must say so rather than create an empty one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenMode {
    Create,
    Existing,
}

pub use api::{ManageStore, WorkflowStore};

/// The storage interface of the relay (events, channels, agents; and through
/// [`WorkflowStore`] workflows and deliveries).
#[async_trait]
pub trait Store: WorkflowStore + ManageStore + Send + Sync + 'static {
    /// `"sqlite"` or `"postgres"`.
    fn backend(&self) -> &'static str;

    /// The community bound to a normalised host: an exact `host:port`
    /// binding wins over a port-less binding of the same name.
    async fn community_for_host(&self, host: &str) -> Result<Option<CommunityRecord>, StoreError>;

    /// Creates a community; fails with [`StoreError::Conflict`] when the id
    /// or one of the hosts is taken.
    async fn add_community(&self, community: &CommunityRecord) -> Result<(), StoreError>;

    /// All communities, by id.
    async fn list_communities(&self) -> Result<Vec<CommunityRecord>, StoreError>;

    /// Replaces a community's stored key (with the marker of a key moved to
    /// a file, see `crate::keys`); `false` when there is no such community.
    async fn set_community_key(&self, id: &str, stored: &str) -> Result<bool, StoreError>;

    /// Queues a verified event for storage under the NIP-01/09/40 rules,
    /// in one of the batched transactions of the store's writer (authors
    /// in turn, one author's events in queue order: a deletion or a
    /// replacement always follows what it names). The receiver yields the
    /// outcome once the batch committed.
    async fn enqueue_insert(
        &self,
        community: &str,
        event: std::sync::Arc<Event>,
        raw: std::sync::Arc<str>,
    ) -> tokio::sync::oneshot::Receiver<Result<InsertOutcome, StoreError>>;

    /// Stores a verified event under the NIP-01/09/40 rules.
    async fn insert_event(
        &self,
        community: &str,
        event: &Event,
        raw: &str,
    ) -> Result<InsertOutcome, StoreError>;

    /// Stores an `h`-tagged event (or a channel creation) under the NIP-29
    /// rules in one transaction with its state change and the relay-signed
    /// metadata it makes current (signed with `keys`). Returns the outcome
    /// and the events to announce.
    async fn apply_channel_event(
        &self,
        community: &str,
        keys: &Keys,
        policy: &ChannelPolicy,
        event: &Event,
        raw: &str,
    ) -> Result<(InsertOutcome, Published), StoreError>;

    /// A channel and its members.
    async fn channel(&self, community: &str, id: &str) -> Result<Option<ChannelView>, StoreError>;

    /// Stores a kind 0 carrying a valid NIP-OA attestation, recording
    /// agent -> owner on the first one; a later one naming another owner is
    /// rejected (ownership is immutable).
    async fn register_agent(
        &self,
        community: &str,
        event: &Event,
        raw: &str,
        attestation: &Attestation,
    ) -> Result<InsertOutcome, StoreError>;

    /// The recorded owner of a managed agent.
    async fn agent_owner(&self, community: &str, agent: &PublicKey) -> Result<Option<PublicKey>, StoreError>;

    /// Channels `member` belongs to.
    async fn channels_of(&self, community: &str, member: &PublicKey) -> Result<Vec<String>, StoreError>;

    /// Records a NIP-98 auth event as used; `false` when it already was.
    async fn use_http_auth(
        &self,
        community: &str,
        event_id: &[u8; 32],
        expires_at: i64,
    ) -> Result<bool, StoreError>;

    /// A page of the events matching one filter, newest first (ties by
    /// lowest id): see [`Page`].
    async fn query_page(
        &self,
        community: &str,
        filter: &Filter,
        page: &Page,
        scope: &ReadScope,
    ) -> Result<PageRows, StoreError>;

    /// `(created_at, id)` of the events matching `filter` under the read
    /// rules, in no order, at most `max` (NIP-77 sync: a caller that gets
    /// `max` refuses rather than reconciles part of a set).
    async fn sync_items(
        &self,
        community: &str,
        filter: &Filter,
        scope: &ReadScope,
        max: usize,
    ) -> Result<Vec<(u64, [u8; 32])>, StoreError>;

    /// Number of distinct events matching any of the filters (NIP-45).
    async fn count(&self, community: &str, filters: &[Filter], scope: &ReadScope) -> Result<u64, StoreError>;

    /// Deletes events whose NIP-40 expiration has passed; returns how many.
    async fn purge_expired(&self, now: u64) -> Result<u64, StoreError>;

    /// Tells the other relay processes on this database about ephemeral
    /// events, all in one transaction (stored events are announced by
    /// `insert_event` itself, inside its transaction). Nothing to do for a
    /// single-process backend.
    async fn publish_ephemeral(&self, _community: &str, _raws: &[String]) -> Result<(), StoreError> {
        Ok(())
    }

    /// Events accepted by other relay processes, or `None` for a
    /// single-process backend. `capacity` bounds the channel.
    async fn subscribe_remote(
        &self,
        _capacity: usize,
    ) -> Result<Option<mpsc::Receiver<RemoteEvent>>, StoreError> {
        Ok(None)
    }

    /// Periodic housekeeping (PostgreSQL: partitions ahead of time).
    async fn maintain(&self, _now: u64) -> Result<(), StoreError> {
        Ok(())
    }

    /// A community's gauges for the metrics: deliveries and runs by
    /// status, and the oldest pending delivery's age (database clock).
    async fn gauges(&self, community: &str) -> Result<Gauges, StoreError>;

    /// Whether the database answers a trivial statement now.
    async fn ping(&self) -> Result<(), StoreError>;

    /// Whether both writers (events, calls) still take work.
    fn writers_alive(&self) -> bool;

    /// Flushes and closes connections.
    async fn close(&self);
}

/// What the metrics read from the database, per community.
#[derive(Debug, Default, Clone)]
pub struct Gauges {
    /// (status, rows), only statuses that have rows.
    pub deliveries: Vec<(String, i64)>,
    /// Seconds since the oldest pending delivery was created (0: none).
    pub oldest_pending_secs: i64,
    /// (status, runs), only statuses that have runs.
    pub runs: Vec<(String, i64)>,
}

/// Opens the backend the URL names and runs its migrations.
pub async fn open(
    cfg: &crate::config::Config,
    mode: OpenMode,
) -> Result<std::sync::Arc<dyn Store>, StoreError> {
    let url = cfg.database_url.as_str();
    let ahead = cfg.postgres.partition_months_ahead;
    if url.starts_with("sqlite:") {
        let sqlite::Opened {
            read,
            writer,
            readers,
        } = sqlite::open(url, &cfg.sqlite, mode).await?;
        tokio::spawn(sqlite::checkpointer(
            read.clone(),
            std::time::Duration::from_millis(cfg.sqlite.checkpoint_interval_ms),
        ));
        let pool = db::Pool::Sqlite {
            read,
            writer,
            readers,
        };
        Ok(std::sync::Arc::new(sqlstore::SqlStore::new(
            pool,
            ahead,
            &cfg.writer,
            cfg.deliveries.clone(),
        )?))
    } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
        let (main, queries) = postgres::open(url, &cfg.postgres, mode).await?;
        let pool = db::Pool::Postgres { main, queries };
        let store = sqlstore::SqlStore::new(pool, ahead, &cfg.writer, cfg.deliveries.clone())?;
        store.maintain(crate::clock::unix_now()).await?;
        Ok(std::sync::Arc::new(store))
    } else {
        Err(StoreError::Conflict(format!(
            "unsupported database URL {url:?}: use sqlite://path or postgres://…"
        )))
    }
}

/// The `d` tag value that names an addressable event ("" when absent), or
/// "" for replaceable kinds, or `None` for kinds that are not replaced.
pub fn replacement_key(event: &Event) -> Option<String> {
    use protocol::kinds::{storage_of, Storage};
    match storage_of(event.kind.as_u16()) {
        Storage::Replaceable => Some(String::new()),
        Storage::Addressable => Some(event.tags.identifier().unwrap_or_default()),
        _ => None,
    }
}

/// NIP-40 expiration as unix seconds, if the event carries one.
pub fn expiration(event: &Event) -> Option<i64> {
    event
        .tags
        .expiration()
        .map(|t| i64::try_from(t.as_secs()).unwrap_or(i64::MAX))
}

/// Single-letter tags with a value: the (name, first value) pairs a filter
/// can match, each indexed once.
pub fn indexed_tags(event: &Event) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for tag in event.tags.iter() {
        let slice = tag.as_slice();
        if slice.len() < 2 || slice[0].chars().count() != 1 {
            continue;
        }
        let Some(c) = slice[0].chars().next() else {
            continue;
        };
        if !c.is_ascii_alphabetic() {
            continue;
        }
        let pair = (slice[0].clone(), slice[1].clone());
        if !out.contains(&pair) {
            out.push(pair);
        }
    }
    out
}

/// What a kind 5 asks to delete (NIP-09), restricted to the author's own events.
#[derive(Debug, Default)]
pub struct DeletionTargets {
    /// Event ids (`e` tags).
    pub ids: Vec<[u8; 32]>,
    /// Addresses (`a` tags) `kind:pubkey:d` whose pubkey is the author.
    pub addresses: Vec<(u16, String)>,
}

/// Parses the targets of a NIP-09 deletion request.
pub fn deletion_targets(event: &Event) -> DeletionTargets {
    let mut t = DeletionTargets::default();
    let author = event.pubkey.to_hex();
    for tag in event.tags.iter() {
        let s = tag.as_slice();
        if s.len() < 2 {
            continue;
        }
        match s[0].as_str() {
            "e" => {
                if let Ok(bytes) = hex::decode(&s[1]) {
                    if let Ok(id) = <[u8; 32]>::try_from(bytes.as_slice()) {
                        t.ids.push(id);
                    }
                }
            }
            "a" => {
                let mut parts = s[1].splitn(3, ':');
                let (Some(k), Some(pk), Some(d)) = (parts.next(), parts.next(), parts.next()) else {
                    continue;
                };
                if pk != author {
                    continue;
                }
                if let Ok(kind) = k.parse::<u16>() {
                    t.addresses.push((kind, d.to_string()));
                }
            }
            _ => {}
        }
    }
    t
}

/// The text form of an address used in the deletions table.
pub fn address_key(kind: u16, d: &str) -> String {
    format!("a:{kind}:{d}")
}
