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

use nostr::prelude::{Event, PublicKey};

pub use channels::{ChannelView, Published};

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

pub use sqlstore::Store;

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
pub async fn open(cfg: &crate::config::Config, mode: OpenMode) -> Result<std::sync::Arc<Store>, StoreError> {
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
        Ok(std::sync::Arc::new(sqlstore::Store::new(
            pool,
            ahead,
            &cfg.writer,
            cfg.deliveries.clone(),
        )?))
    } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
        let (main, queries) = postgres::open(url, &cfg.postgres, mode).await?;
        let pool = db::Pool::Postgres { main, queries };
        let store = sqlstore::Store::new(pool, ahead, &cfg.writer, cfg.deliveries.clone())?;
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
