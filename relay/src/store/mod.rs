//! The store: the one way the relay reaches its data. [`Store`] owns the
//! pools and the two writers (the event writer, `writer`; the call writer,
//! `group` with its calls in `calls`) and hands each call to the folder
//! whose rule it is (`events`, `channels`, `workflow`, `delivery`,
//! `admin`), over `persistence`. The SQLite backend (embedded, the
//! default) and the PostgreSQL backend (several relay processes on one
//! database) behave the same, and the integration suite runs unchanged
//! against both.
//!
//! May use every domain folder and `persistence` below it.
//!
//! Invariants every backend keeps:
//! - every row is scoped by `community_id`, and every key includes it;
//! - an event acknowledged with `OK true` is committed before the answer;
//! - replaceable/addressable/deletion rules are decided inside the same
//!   transaction that writes, so concurrent writers cannot both win.

pub mod api;
pub(crate) mod calls;
mod fair;
mod group;
pub mod sqlstore;
pub(crate) mod writer;

pub use crate::admin::communities::CommunityRecord;
pub use crate::admin::overview::Gauges;
pub use crate::channels::state::{ChannelView, Published};
pub use crate::events::{InsertOutcome, Page, PageRows, ReadScope, StoredEvent};
use crate::persistence::{db, postgres, sqlite};
pub use crate::persistence::{OpenMode, RemoteEvent, StoreError};

pub use sqlstore::Store;

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
        // The event writer's and each call writer's own connection.
        let pinned = crate::store::group::call_writers(&cfg.writer) + 1;
        let postgres::Opened {
            main,
            queries,
            standbys,
            pinned,
        } = postgres::open(url, &cfg.read_database_urls, &cfg.postgres, pinned as u32, mode).await?;
        let pool = db::Pool::Postgres {
            main,
            queries,
            standbys,
            pinned,
        };
        let store = sqlstore::Store::new(pool, ahead, &cfg.writer, cfg.deliveries.clone())?;
        store.maintain(crate::clock::unix_now()).await?;
        Ok(std::sync::Arc::new(store))
    } else {
        Err(StoreError::Conflict(format!(
            "unsupported database URL {url:?}: use sqlite://path or postgres://…"
        )))
    }
}
