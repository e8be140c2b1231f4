//! REQ pages on SQLite, read whole on the relay's own reader threads.
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

use rusqlite::{Connection, OpenFlags};
use std::path::Path;
use tokio::sync::oneshot;

use super::lite;
use super::row::Row;
use super::sql::Q;
use super::StoreError;
use crate::config::SqliteConfig;

/// Pages waiting for a reader thread, at most: past it a REQ waits to
/// queue its page (the connection's own bounds stop it long before).
const QUEUED_PAGES_MAX: usize = 1024;

/// Prepared statements each reader keeps (the REQ shapes in use: one per
/// filter shape, number of values and `LIMIT`).
const STATEMENTS_PER_READER: usize = 256;

/// A page asked of a reader thread.
struct Job {
    q: Q,
    rows: usize,
    max_bytes: usize,
    reply: oneshot::Sender<Result<(Vec<Row>, bool), StoreError>>,
}

/// The reader threads of one database file.
#[derive(Debug)]
pub struct Readers {
    jobs: flume::Sender<Job>,
}

impl Readers {
    /// Opens `threads` read-only connections to `path` (which exists and is
    /// migrated) and starts a thread for each.
    pub fn start(path: &Path, cfg: &SqliteConfig, threads: usize) -> Result<Self, StoreError> {
        assert!(threads > 0, "at least one reader thread");
        let (jobs, queue) = flume::bounded::<Job>(QUEUED_PAGES_MAX);
        for i in 0..threads {
            let conn = connect(path, cfg)?;
            let queue = queue.clone();
            std::thread::Builder::new()
                .name(format!("sqlite-reader-{i}"))
                .spawn(move || serve(conn, queue))
                .map_err(|e| StoreError::Start(format!("a SQLite reader thread: {e}")))?;
        }
        Ok(Self { jobs })
    }

    /// The rows of `q` in order, at most `rows`, and only while their first
    /// column (the event's JSON) fits in `max_bytes` (at least one row);
    /// also whether the statement had no more rows. The contract of
    /// [`super::db::Pool::query_page`].
    pub async fn page(&self, q: Q, rows: usize, max_bytes: usize) -> Result<(Vec<Row>, bool), StoreError> {
        let (reply, answer) = oneshot::channel();
        let job = Job {
            q,
            rows,
            max_bytes,
            reply,
        };
        self.jobs
            .send_async(job)
            .await
            .map_err(|_| StoreError::Stopped("SQLite readers"))?;
        answer.await.map_err(|_| StoreError::Stopped("SQLite readers"))?
    }
}

/// A reader's connection: read-only, the pools' cache and memory map.
fn connect(path: &Path, cfg: &SqliteConfig) -> Result<Connection, StoreError> {
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags).map_err(lite::error)?;
    conn.busy_timeout(std::time::Duration::from_millis(cfg.busy_timeout_ms))
        .map_err(lite::error)?;
    conn.pragma_update(
        None,
        "mmap_size",
        i64::try_from(cfg.mmap_size_bytes).unwrap_or(i64::MAX),
    )
    .map_err(lite::error)?;
    conn.pragma_update(None, "cache_size", -i64::from(cfg.cache_size_kib))
        .map_err(lite::error)?;
    conn.pragma_update(None, "temp_store", "memory")
        .map_err(lite::error)?;
    conn.set_prepared_statement_cache_capacity(STATEMENTS_PER_READER);
    Ok(conn)
}

fn serve(conn: Connection, queue: flume::Receiver<Job>) {
    while let Ok(job) = queue.recv() {
        let page = read_page(&conn, &job.q, job.rows, job.max_bytes);
        // The REQ may have ended meanwhile (its connection closed): nobody
        // waits for the page then.
        let _ = job.reply.send(page);
    }
}

fn read_page(
    conn: &Connection,
    q: &Q,
    rows: usize,
    max_bytes: usize,
) -> Result<(Vec<Row>, bool), StoreError> {
    let mut stmt = conn.prepare_cached(&q.sql).map_err(lite::error)?;
    lite::bind_all(&mut stmt, &q.binds)?;
    let names = lite::names_of(&stmt);
    let mut cursor = stmt.raw_query();
    let (mut out, mut bytes) = (Vec::new(), 0usize);
    while let Some(r) = cursor.next().map_err(lite::error)? {
        if out.len() == rows {
            // One row past the page: there are more.
            return Ok((out, false));
        }
        let row = lite::neutral(r, &names)?;
        let len = row.first_text_len();
        if !out.is_empty() && bytes + len > max_bytes {
            return Ok((out, false));
        }
        bytes += len;
        out.push(row);
    }
    Ok((out, true))
}
