//! Persistence: storage only. The SQL builder, neutral rows, one
//! transaction type over both backends, and each backend's opening (SQLite
//! with its writer connection and reader threads; PostgreSQL with its pools,
//! partitions and LISTEN/NOTIFY). It knows no Nostr, channel, workflow or
//! delivery rule: those are written once, above it, against [`db::Tx`].
//!
//! May use: `config`, `clock`, `faults`. Used by every folder above it.

pub mod db;
pub mod hosts;
pub(crate) mod lite;
pub mod page;
pub mod pinned;
pub mod postgres;
pub mod primary;
pub(crate) mod readers;
pub mod row;
pub mod sql;
pub mod sqlite;
pub mod standbys;

/// An event accepted by another relay process on the same database.
#[derive(Debug, Clone)]
pub struct RemoteEvent {
    pub community: String,
    pub raw: String,
}

/// A storage failure (never a rule decision; those are `events::InsertOutcome::Rejected`).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database error: {0}")]
    Db(#[from] sqlx::Error),
    /// The database server could not be reached: where, and why (a
    /// pool's own error says only that it timed out).
    #[error("cannot reach {0}")]
    Unreachable(String),
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
