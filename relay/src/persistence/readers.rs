//! REQ pages on SQLite, read whole on the relay's own reader threads
//! (and the relay's other one-statement reads: `Pool::all`).
//!
//! Why not through sqlx like every other read: sqlx-sqlite runs each
//! connection on a worker thread and hands every row to the async task
//! over a channel, copying each value and waking the task once per row.
//! For a REQ of 50 events that plumbing cost more CPU than SQLite spent
//! reading them (perf on the query benchmark: the channel's wakes and
//! parks, the per-row copies, and the context switches between the two).
//! Here a page is one job: a reader thread runs the statement, keeps the
//! rows that fit the page's bounds, and hands the page back at once, one
//! wake each way.
//!
//! The threads read the same file as the sqlx pools, through their own
//! read-only connections with the same settings (WAL readers: they never
//! block the writer nor each other). They run until the [`Readers`] is
//! dropped (its job queue closes), each finishing the job it holds.

use rusqlite::Connection;
use std::path::Path;
use tokio::sync::oneshot;

use crate::config::SqliteConfig;
use crate::persistence::lite;
use crate::persistence::page::Bounds;
use crate::persistence::row::Row;
use crate::persistence::sql::Q;
use crate::persistence::StoreError;

/// Pages waiting for a reader thread, at most: past it a REQ waits to
/// queue its page (the connection's own bounds stop it long before).
const QUEUED_PAGES_MAX: usize = 1024;

/// Prepared statements each reader keeps (the REQ shapes in use: one per
/// filter shape, number of values and `LIMIT`).
const STATEMENTS_PER_READER: usize = 256;

/// A page asked of a reader thread.
struct Job {
    q: Q,
    bounds: Bounds,
    reply: oneshot::Sender<Result<(Vec<Row>, bool), StoreError>>,
}

/// The reader threads of one database file.
#[derive(Debug)]
pub struct Readers {
    jobs: flume::Sender<Job>,
}

impl Readers {
    /// Opens `sqlite.pool_size` (at least one) read-only connections to
    /// `path` (which exists and is migrated) and starts a thread for each.
    pub fn start(path: &Path, cfg: &SqliteConfig) -> Result<Self, StoreError> {
        let threads = cfg.pool_size.max(1);
        let (jobs, queue) = flume::bounded::<Job>(QUEUED_PAGES_MAX);
        for i in 0..threads {
            let conn = lite::connect(path, cfg, lite::Access::Read, STATEMENTS_PER_READER)?;
            let queue = queue.clone();
            std::thread::Builder::new()
                .name(format!("sqlite-reader-{i}"))
                .spawn(move || serve(conn, queue))
                .map_err(|e| StoreError::Start(format!("a SQLite reader thread: {e}")))?;
        }
        Ok(Self { jobs })
    }

    /// The rows of `q` in order within `bounds`; also whether the
    /// statement had no more rows. The contract of
    /// [`super::db::Pool::query_page`] (read by [`lite::page`]).
    pub async fn page(&self, q: Q, bounds: Bounds) -> Result<(Vec<Row>, bool), StoreError> {
        let (reply, answer) = oneshot::channel();
        let job = Job { q, bounds, reply };
        self.jobs
            .send_async(job)
            .await
            .map_err(|_| StoreError::Stopped("SQLite readers"))?;
        answer.await.map_err(|_| StoreError::Stopped("SQLite readers"))?
    }
}

fn serve(conn: Connection, queue: flume::Receiver<Job>) {
    while let Ok(job) = queue.recv() {
        let page = lite::page(&conn, &job.q, job.bounds);
        // The REQ may have ended meanwhile (its connection closed): nobody
        // waits for the page then.
        let _ = job.reply.send(page);
    }
}
