//! One SQL interface over both backends, so that every storage rule is
//! written once.
//!
//! Statements are built with [`Q`] (`sql.rs`); the few real differences
//! between the backends (placeholders, clock expression, locking, `SKIP
//! LOCKED`) are asked of [`Dialect`]. Rows come back as neutral [`Row`]s.

use std::sync::Arc;

use sqlx::postgres::{PgArguments, PgPool, PgRow};
use sqlx::sqlite::{SqliteArguments, SqlitePool, SqliteRow};
use sqlx::{Arguments, Database, Decode, Encode, Postgres, Sqlite, Transaction, Type, ValueRef};

use crate::persistence::page::{Bounds, Collector, Wants};
pub use crate::persistence::row::{named, Col, Names, Row, Val};
pub use crate::persistence::sql::{Bind, Dialect, Q};
use crate::persistence::standbys::{Replica, Standbys};
use crate::persistence::StoreError;

/// A connection pool of either backend.
#[derive(Clone, Debug)]
pub enum Pool {
    /// SQLite: readers, and the one connection every write of this process
    /// goes through. One writer connection means no writer of ours ever
    /// sleeps in SQLite's busy handler waiting for another, and its page
    /// cache stays valid from one transaction to the next (a connection's
    /// cache is dropped whenever another connection wrote).
    /// `writer` runs its statements on the caller's thread (`persistence::lite`),
    /// and `readers` serve REQ, COUNT and NIP-77 reads a whole page at a
    /// time, and every other one-statement read (`persistence::readers`), neither
    /// through sqlx's worker threads; `read` is sqlx's pool for read
    /// transactions of several statements and the background checkpoint.
    Sqlite {
        read: SqlitePool,
        writer: crate::persistence::lite::Writer,
        readers: Arc<crate::persistence::readers::Readers>,
    },
    /// PostgreSQL: `main` for everything but REQ and COUNT, which run on
    /// `queries` (`postgres.query_pool_size` connections with cached plans:
    /// `persistence::postgres::open`), so that a flood of reads never holds the
    /// connections that writes, claims and finishes need; or, when the
    /// caller names one, on a standby of `read_database_urls`
    /// (`persistence::standbys`).
    /// `pinned`: the writers' own pools ([`Pool::for_writer`]).
    Postgres {
        main: PgPool,
        queries: PgPool,
        standbys: Option<Arc<Standbys>>,
        pinned: Arc<crate::persistence::pinned::Pinned>,
    },
}

/// The advisory lock on the key that the SQL expression `key` gives (the
/// one place that says how a key becomes a lock). Its value is an empty
/// text (the function returns `void`, which rows cannot decode).
fn lock_of(key: &str) -> String {
    format!("CAST({} AS TEXT)", advisory("pg_advisory_xact_lock", key))
}

/// The advisory lock `function` applied to the key `key` gives.
fn advisory(function: &str, key: &str) -> String {
    format!("{function}(hashtextextended({key}, 0))")
}

/// An open transaction of either backend. PostgreSQL's carries what a
/// statement would only tell again, at one round trip each: the
/// transaction's clock once read (`now()` is the transaction's start time)
/// and the advisory locks it holds.
pub enum Tx<'c> {
    /// A read-only transaction on sqlx's readers.
    Sqlite(Transaction<'c, Sqlite>),
    /// A write transaction on the writer connection.
    SqliteWrite(crate::persistence::lite::WriteTx<'c>),
    Postgres(Transaction<'c, Postgres>, PgKnown),
}

/// What a PostgreSQL transaction already knows (see [`Tx`]).
#[derive(Default)]
pub struct PgKnown {
    now: Option<i64>,
    /// Keys of [`Tx::lock`] held; bounded by the locks a transaction takes
    /// (a batch's worth: one per author of an event batch, at most three
    /// per call of a call batch, see `Call::lock_keys`).
    locks: Vec<String>,
}

/// A connection held across several transactions (the call writer keeps
/// the one SQLite writer connection while calls keep coming, instead of
/// handing it back and waiting for it before every batch).
pub enum Conn {
    Sqlite(crate::persistence::lite::Held),
    Postgres(sqlx::pool::PoolConnection<Postgres>),
}

impl Conn {
    /// A write transaction on this connection (SQLite: `BEGIN IMMEDIATE`).
    pub async fn begin(&mut self) -> Result<Tx<'_>, StoreError> {
        use sqlx::Connection;
        Ok(match self {
            Conn::Sqlite(c) => Tx::SqliteWrite(c.begin()?),
            Conn::Postgres(c) => Tx::Postgres((**c).begin().await?, PgKnown::default()),
        })
    }
}

/// Takes a page from a row stream (see [`Pool::query_page`]).
async fn take_page<R>(
    mut stream: impl futures_util::Stream<Item = Result<R, sqlx::Error>> + Unpin,
    convert: fn(&R, &mut Option<Names>) -> Result<Row, StoreError>,
    bounds: Bounds,
) -> Result<(Vec<Row>, bool), StoreError> {
    use futures_util::TryStreamExt;
    let mut page = Collector::new(bounds);
    let mut names = None;
    // One row past the page says there are more. (Asking for it also reads
    // the statement's end when there are none, so a page of exactly
    // `rows` leaves its connection clean.)
    while let Some(r) = stream.try_next().await? {
        if page.is_full() || page.offer(convert(&r, &mut names)?)? == Wants::Nothing {
            return Ok(page.finish(false));
        }
    }
    Ok(page.finish(true))
}

/// The arguments of a statement; `array` binds the array variants, which
/// only PostgreSQL has.
fn args<A>(
    binds: Vec<Bind>,
    mut array: impl FnMut(&mut A, Bind) -> Result<(), StoreError>,
) -> Result<A, StoreError>
where
    A: Arguments,
    i64: for<'q> Encode<'q, A::Database> + Type<A::Database>,
    Option<i64>: for<'q> Encode<'q, A::Database> + Type<A::Database>,
    String: for<'q> Encode<'q, A::Database> + Type<A::Database>,
    Option<String>: for<'q> Encode<'q, A::Database> + Type<A::Database>,
    Vec<u8>: for<'q> Encode<'q, A::Database> + Type<A::Database>,
    Option<Vec<u8>>: for<'q> Encode<'q, A::Database> + Type<A::Database>,
    bool: for<'q> Encode<'q, A::Database> + Type<A::Database>,
{
    let mut a = A::default();
    for b in binds {
        let r = match b {
            Bind::Int(v) => a.add(v),
            Bind::OptInt(v) => a.add(v),
            Bind::Text(v) => a.add(v),
            Bind::OptText(v) => a.add(v),
            Bind::Blob(v) => a.add(v),
            Bind::OptBlob(v) => a.add(v),
            Bind::Bool(v) => a.add(v),
            b @ (Bind::TextArray(_) | Bind::IntArray(_) | Bind::BlobArray(_)) => {
                array(&mut a, b)?;
                continue;
            }
        };
        r.map_err(|e| StoreError::Corrupt(format!("bind: {e}")))?;
    }
    Ok(a)
}

fn sqlite_args(binds: Vec<Bind>) -> Result<SqliteArguments, StoreError> {
    args(binds, |_, _| {
        Err(StoreError::Corrupt("bind: SQLite has no array parameters".into()))
    })
}

fn pg_args(binds: Vec<Bind>) -> Result<PgArguments, StoreError> {
    args(binds, |a: &mut PgArguments, b| {
        let r = match b {
            Bind::TextArray(v) => a.add(v),
            Bind::IntArray(v) => a.add(v),
            Bind::BlobArray(v) => a.add(v),
            _ => return Err(StoreError::Corrupt("bind: not an array".into())),
        };
        r.map_err(|e| StoreError::Corrupt(format!("bind: {e}")))
    })
}

/// `row` as a neutral [`Row`]; `names`: its result set's column names,
/// read from the first row and shared by the others.
fn neutral<DB, R>(row: &R, names: &mut Option<Names>) -> Result<Row, StoreError>
where
    DB: Database,
    R: sqlx::Row<Database = DB>,
    usize: sqlx::ColumnIndex<R>,
    i64: Type<DB> + for<'r> Decode<'r, DB>,
    i32: Type<DB> + for<'r> Decode<'r, DB>,
    String: Type<DB> + for<'r> Decode<'r, DB>,
    Vec<u8>: Type<DB> + for<'r> Decode<'r, DB>,
    bool: Type<DB> + for<'r> Decode<'r, DB>,
{
    let mut out = Vec::with_capacity(row.len());
    for i in 0..row.len() {
        let raw = row.try_get_raw(i)?;
        if raw.is_null() {
            out.push(Val::Null);
            continue;
        }
        let ty = raw.type_info().into_owned();
        let v = if <i64 as Type<DB>>::compatible(&ty) {
            Val::Int(row.try_get::<i64, _>(i)?)
        } else if <i32 as Type<DB>>::compatible(&ty) {
            Val::Int(i64::from(row.try_get::<i32, _>(i)?))
        } else if <bool as Type<DB>>::compatible(&ty) {
            Val::Bool(row.try_get::<bool, _>(i)?)
        } else if <String as Type<DB>>::compatible(&ty) {
            Val::Text(row.try_get::<String, _>(i)?)
        } else if <Vec<u8> as Type<DB>>::compatible(&ty) {
            Val::Blob(row.try_get::<Vec<u8>, _>(i)?)
        } else {
            return Err(StoreError::Corrupt(format!(
                "column {i}: unsupported type {ty:?}"
            )));
        };
        out.push(v);
    }
    let names = names
        .get_or_insert_with(|| {
            use sqlx::Column;
            row.columns().iter().map(|c| Box::from(c.name())).collect()
        })
        .clone();
    Ok(Row::of(names, out))
}

fn sqlite_row(r: &SqliteRow, names: &mut Option<Names>) -> Result<Row, StoreError> {
    neutral::<Sqlite, _>(r, names)
}

fn pg_row(r: &PgRow, names: &mut Option<Names>) -> Result<Row, StoreError> {
    neutral::<Postgres, _>(r, names)
}

/// A result set's rows, sharing one list of names.
fn rows_of<R>(
    rs: &[R],
    convert: fn(&R, &mut Option<Names>) -> Result<Row, StoreError>,
) -> Result<Vec<Row>, StoreError> {
    let mut names = None;
    rs.iter().map(|r| convert(r, &mut names)).collect()
}

macro_rules! dispatch {
    ($self:expr, $conn:ident, $q:expr, $method:ident, $conv:ident) => {{
        let q: Q = $q;
        match $self {
            Tx::SqliteWrite(tx) => tx.$conn(&q),
            Tx::Sqlite(tx) => {
                let args = sqlite_args(q.binds)?;
                let r = sqlx::query_with(sqlx::AssertSqlSafe(q.sql), args)
                    .$method(&mut **tx)
                    .await?;
                $conv!(r, sqlite_row)
            }
            Tx::Postgres(tx, _) => {
                let args = pg_args(q.binds)?;
                let r = sqlx::query_with(sqlx::AssertSqlSafe(q.sql), args)
                    .$method(&mut **tx)
                    .await?;
                $conv!(r, pg_row)
            }
        }
    }};
}

macro_rules! conv_exec {
    ($r:expr, $f:ident) => {
        Ok($r.rows_affected())
    };
}
macro_rules! conv_opt {
    ($r:expr, $f:ident) => {
        $r.as_ref().map(|r| $f(r, &mut None)).transpose()
    };
}
macro_rules! conv_all {
    ($r:expr, $f:ident) => {
        rows_of(&$r, $f)
    };
}

impl Tx<'_> {
    pub fn dialect(&self) -> Dialect {
        match self {
            Tx::Sqlite(..) | Tx::SqliteWrite(..) => Dialect::Sqlite,
            Tx::Postgres(..) => Dialect::Postgres,
        }
    }

    /// Runs a statement; returns the number of rows it affected.
    pub async fn exec(&mut self, q: Q) -> Result<u64, StoreError> {
        dispatch!(self, exec, q, execute, conv_exec)
    }

    /// The first row, if any.
    pub async fn one(&mut self, q: Q) -> Result<Option<Row>, StoreError> {
        dispatch!(self, one, q, fetch_optional, conv_opt)
    }

    /// Every row.
    pub async fn all(&mut self, q: Q) -> Result<Vec<Row>, StoreError> {
        dispatch!(self, all, q, fetch_all, conv_all)
    }

    /// `true` when the query returns a row.
    pub async fn exists(&mut self, q: Q) -> Result<bool, StoreError> {
        Ok(self.one(q).await?.is_some())
    }

    /// Serialises this transaction against others taking the same key, until
    /// it ends. SQLite needs nothing: `BEGIN IMMEDIATE` already holds the one
    /// write lock.
    pub async fn lock(&mut self, key: &str) -> Result<(), StoreError> {
        if let Tx::Postgres(_, known) = self {
            if known.locks.iter().any(|k| k == key) {
                return Ok(());
            }
            self.exec(Q::new(format!("SELECT {}", lock_of("$1"))).bind(key))
                .await?;
            self.locked(key);
        }
        Ok(())
    }

    /// [`Tx::lock`] without waiting: `false` when another transaction
    /// holds the key (nothing is taken then). For a lock taken in the
    /// middle of a batch, where waiting could close a cycle with another
    /// batch (`lock_all`). SQLite: always `true` (one writer).
    pub async fn try_lock(&mut self, key: &str) -> Result<bool, StoreError> {
        let Tx::Postgres(_, known) = self else {
            return Ok(true);
        };
        if known.locks.iter().any(|k| k == key) {
            return Ok(true);
        }
        let q = Q::new(format!(
            "SELECT {} AS taken",
            advisory("pg_try_advisory_xact_lock", "$1")
        ))
        .bind(key);
        let taken = match self.one(q).await? {
            Some(row) => row.bool("taken")?,
            None => false,
        };
        if taken {
            self.locked(key);
        }
        Ok(taken)
    }

    /// [`Tx::lock`] on each of `keys`, in one statement and in one order
    /// for every caller (sorted; `unnest` returns an array's elements in
    /// order). Why: a writer's batch holds the locks of many events or calls
    /// at once, and two batches that took theirs in different orders would
    /// wait on each other in a cycle; PostgreSQL then fails one of them
    /// after `deadlock_timeout`. Batches that take all their keys here,
    /// first, only ever wait for a batch that is ahead of them.
    pub async fn lock_all(&mut self, mut keys: Vec<String>) -> Result<(), StoreError> {
        let Tx::Postgres(_, known) = self else {
            return Ok(());
        };
        keys.sort_unstable();
        keys.dedup();
        let fresh: Vec<String> = keys.into_iter().filter(|k| !known.locks.contains(k)).collect();
        if fresh.is_empty() {
            return Ok(());
        }
        self.exec(
            Q::new(format!("SELECT {} FROM unnest($1::text[]) AS k", lock_of("k"))).bind(fresh.clone()),
        )
        .await?;
        for k in &fresh {
            self.locked(k);
        }
        Ok(())
    }

    /// Records that a statement of this transaction took [`Tx::lock`]'s
    /// lock on `key`.
    fn locked(&mut self, key: &str) {
        if let Tx::Postgres(_, known) = self {
            if !known.locks.iter().any(|k| k == key) {
                known.locks.push(key.to_string());
            }
        }
    }

    /// How many locks this transaction has recorded: taken before a
    /// savepoint, it is what [`Tx::forget_locks_since`] keeps.
    pub fn lock_mark(&self) -> usize {
        match self {
            Tx::Postgres(_, known) => known.locks.len(),
            Tx::Sqlite(_) | Tx::SqliteWrite(_) => 0,
        }
    }

    /// Forgets the locks recorded after `mark` ([`Tx::lock_mark`]): a
    /// rollback to a savepoint releases the locks taken since it, and keeps
    /// those taken before (a batch's up-front locks stay held and known).
    pub fn forget_locks_since(&mut self, mark: usize) {
        if let Tx::Postgres(_, known) = self {
            known.locks.truncate(mark);
        }
    }

    /// The database clock, unix seconds. SQLite runs in this process, so
    /// its clock (`unixepoch()`) is this process's clock: read it here,
    /// without a statement. PostgreSQL's clock is the one every relay
    /// process on the database shares.
    pub async fn now(&mut self) -> Result<i64, StoreError> {
        if self.dialect() == Dialect::Sqlite {
            return Ok(i64::try_from(crate::clock::unix_now()).unwrap_or(i64::MAX));
        }
        if let Tx::Postgres(_, PgKnown { now: Some(now), .. }) = self {
            return Ok(*now);
        }
        let sql = format!("SELECT {}", self.dialect().now());
        let now = self
            .one(Q::new(sql))
            .await?
            .ok_or_else(|| StoreError::Corrupt("no clock".into()))?
            .int(0)?;
        self.remember_now(now);
        Ok(now)
    }

    /// Records the database clock read by a statement of this transaction
    /// (PostgreSQL: `now()` is the transaction's start time, so any
    /// statement's reading is the one [`Tx::now`] would get).
    pub fn remember_now(&mut self, now: i64) {
        if let Tx::Postgres(_, known) = self {
            debug_assert!(known.now.is_none_or(|c| c == now), "one clock per transaction");
            known.now = Some(now);
        }
    }

    /// SQLite's write transaction: runs `sql` once just before the commit
    /// (`persistence::lite::WriteTx::before_commit`). Other transactions
    /// have nothing to defer.
    pub fn before_commit(&mut self, sql: &'static str) {
        if let Tx::SqliteWrite(tx) = self {
            tx.before_commit(sql);
        }
    }

    pub async fn commit(self) -> Result<(), StoreError> {
        match self {
            Tx::Sqlite(tx) => tx.commit().await?,
            Tx::SqliteWrite(tx) => tx.commit()?,
            Tx::Postgres(tx, _) => tx.commit().await?,
        }
        Ok(())
    }
}

impl Pool {
    pub fn dialect(&self) -> Dialect {
        match self {
            Pool::Sqlite { .. } => Dialect::Sqlite,
            Pool::Postgres { .. } => Dialect::Postgres,
        }
    }

    /// This pool as a store writer sees it, called on the writer's own
    /// thread: on PostgreSQL its writes go to a pool of one connection of
    /// its own, opened on that thread (`persistence::pinned`).
    pub fn for_writer(&self) -> Pool {
        match self {
            Pool::Sqlite { .. } => self.clone(),
            Pool::Postgres {
                main,
                queries,
                standbys,
                pinned,
            } => Pool::Postgres {
                main: pinned.make(main),
                queries: queries.clone(),
                standbys: standbys.clone(),
                pinned: pinned.clone(),
            },
        }
    }

    /// The writer connection (SQLite), or a connection of the pool, to hold
    /// across several transactions ([`Conn::begin`]).
    pub async fn acquire_writer(&self) -> Result<Conn, StoreError> {
        Ok(match self {
            Pool::Sqlite { writer, .. } => Conn::Sqlite(writer.hold().await),
            Pool::Postgres { main, .. } => Conn::Postgres(main.acquire().await?),
        })
    }

    /// A write transaction: `BEGIN IMMEDIATE` on SQLite (take the write lock
    /// before reading what the writer decides on), plain `BEGIN` on PostgreSQL
    /// (whose callers take row or advisory locks as they need).
    pub async fn begin(&self) -> Result<Tx<'static>, StoreError> {
        Ok(match self {
            Pool::Sqlite { writer, .. } => Tx::SqliteWrite(writer.begin().await?),
            Pool::Postgres { main, .. } => Tx::Postgres(main.begin().await?, PgKnown::default()),
        })
    }

    /// A read-only transaction (a consistent snapshot for several reads;
    /// on SQLite a deferred transaction, which takes no write lock).
    pub async fn read(&self) -> Result<Tx<'static>, StoreError> {
        Ok(match self {
            Pool::Sqlite { read, .. } => Tx::Sqlite(read.begin().await?),
            Pool::Postgres { main, .. } => Tx::Postgres(main.begin().await?, PgKnown::default()),
        })
    }

    /// A read: every row of one statement, outside any write transaction.
    /// On SQLite it runs on the REQ readers: the engine asks for due runs
    /// after every trigger and every finish, and through sqlx's worker
    /// threads those three statements cost about 550 µs a pass, most of it
    /// the hand-over and not SQLite (measured in the delivery benchmark).
    pub async fn all(&self, q: Q) -> Result<Vec<Row>, StoreError> {
        match self {
            Pool::Sqlite { readers, .. } => Ok(readers.page(q, Bounds::ALL).await?.0),
            Pool::Postgres { main, .. } => Self::pg_all(main, q).await,
        }
    }

    /// A REQ's or COUNT's statement (built by `sql::select_events` or
    /// `sql::count_events`): every row, on the query pool on PostgreSQL
    /// (or the standby `from`, see [`Pool::replica`]) and on the REQ
    /// readers on SQLite.
    pub async fn query_all(&self, q: Q, from: Option<Replica>) -> Result<Vec<Row>, StoreError> {
        match self {
            Pool::Sqlite { readers, .. } => Ok(readers.page(q, Bounds::ALL).await?.0),
            Pool::Postgres {
                queries, standbys, ..
            } => {
                let all = |pool: PgPool, q: Q| async move { Self::pg_all(&pool, q).await };
                read_on(queries, standbys.as_deref(), from, q, all).await
            }
        }
    }

    /// A REQ page: rows of `q` (whose first column is the event's JSON) in
    /// order, within `bounds` (the JSON of at least one row, whatever its
    /// size; runs of equal values ordered by [`Bounds::ties`]). The rows are read as a
    /// stream and the statement is dropped when the page is full, so a
    /// page never holds more than that in memory, whatever the statement's
    /// `LIMIT`. On PostgreSQL, read on the standby `from` when one is
    /// named (on the primary if it fails).
    /// Also says whether the statement had no more rows.
    pub async fn query_page(
        &self,
        q: Q,
        bounds: Bounds,
        from: Option<Replica>,
    ) -> Result<(Vec<Row>, bool), StoreError> {
        let page = |pool: &PgPool, q: Q| -> Result<_, StoreError> {
            let stream = sqlx::query_with(sqlx::AssertSqlSafe(q.sql), pg_args(q.binds)?).fetch(pool);
            Ok(take_page(stream, pg_row, bounds))
        };
        match self {
            Pool::Sqlite { readers, .. } => readers.page(q, bounds).await,
            Pool::Postgres {
                queries, standbys, ..
            } => {
                let page = &page;
                let read = |pool: PgPool, q: Q| async move { page(&pool, q)?.await };
                read_on(queries, standbys.as_deref(), from, q, read).await
            }
        }
    }

    /// A standby to read from now (PostgreSQL with `read_database_urls`,
    /// one within the lag bound), else `None`: the primary.
    pub fn replica(&self) -> Option<Replica> {
        match self {
            Pool::Postgres {
                standbys: Some(s), ..
            } => s.pick(),
            _ => None,
        }
    }

    async fn pg_all(p: &PgPool, q: Q) -> Result<Vec<Row>, StoreError> {
        let rows = sqlx::query_with(sqlx::AssertSqlSafe(q.sql), pg_args(q.binds)?)
            .fetch_all(p)
            .await?;
        rows_of(&rows, pg_row)
    }

    /// A read of at most one row.
    pub async fn one(&self, q: Q) -> Result<Option<Row>, StoreError> {
        Ok(self.all(q).await?.into_iter().next())
    }

    /// A statement outside any explicit transaction.
    pub async fn exec(&self, q: Q) -> Result<u64, StoreError> {
        Ok(match self {
            Pool::Sqlite { writer, .. } => writer.exec(&q).await?,
            Pool::Postgres { main: p, .. } => sqlx::query_with(sqlx::AssertSqlSafe(q.sql), pg_args(q.binds)?)
                .execute(p)
                .await?
                .rows_affected(),
        })
    }

    pub async fn close(&self) {
        match self {
            Pool::Sqlite { read, .. } => read.close().await,
            Pool::Postgres {
                main,
                queries,
                pinned,
                ..
            } => {
                queries.close().await;
                pinned.close().await;
                main.close().await;
            }
        }
    }
}

/// Reads `q` with `read` on the standby `from` when one is named, else,
/// or when that standby fails (it is then noted as failed), on the query
/// pool. `q` is cloned only when a standby is tried.
async fn read_on<T, F, Fut>(
    queries: &PgPool,
    standbys: Option<&Standbys>,
    from: Option<Replica>,
    q: Q,
    read: F,
) -> Result<T, StoreError>
where
    F: Fn(PgPool, Q) -> Fut,
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    if let Some((standbys, r)) = standbys.zip(from) {
        match read(standbys.pool(r.index).clone(), q.clone()).await {
            Ok(got) => return Ok(got),
            Err(e) => standbys.failed(r.index, &e),
        }
    }
    read(queries.clone(), q).await
}
