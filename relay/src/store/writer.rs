//! The event writer: group commit of the events clients send (EVENT
//! frames without a channel), whatever is queued in one transaction, runs
//! of plain events in a few multi-row statements.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use nostr::prelude::Event;
use tokio::sync::{mpsc, oneshot};

use crate::events::expiration;
use crate::events::indexed_tags;
use crate::events::rules::{author_lock_key, created_at_of, index_words, insert_tags, TagRow};
use crate::events::InsertOutcome;
use crate::persistence::db::{Pool, Tx, Q};
use crate::persistence::sql::{piece_len, Bind, Dialect};
use crate::persistence::StoreError;
use crate::store::fair::Fair;
use crate::workflow::definitions::insert_event;

/// An event waiting for the batch writer.
pub(crate) struct InsertRequest {
    pub community: String,
    pub event: Arc<Event>,
    pub raw: Arc<str>,
    pub reply: oneshot::Sender<Result<InsertOutcome, StoreError>>,
}

/// Group commit: takes what is queued into the author-fair queue
/// ([`super::fair`], at most `max_queued`), then a batch from it (up to
/// `max_batch` events and `max_batch_bytes` of their JSON, one author's
/// events in turn with the others') and stores it in one transaction, then
/// answers each request. Every
/// refusal of `events::insert` happens before it writes anything, so one
/// refused event never leaves a trace in the batch. When the batch fails
/// as a whole, its events are written again one by one, each in its own
/// savepoint ([`write_isolated`]): a storage error of one event (one
/// client's) fails that event only, never the others of its batch (one
/// U+0000 in a tag value used to fail every client's events with it on
/// PostgreSQL). The bytes bound keeps one batch's full-text indexing short
/// (512 events of 120 KB held the write lock for 3.1 s on SQLite), so
/// that other writers, and other authors' events, wait for one bounded
/// batch rather than for a burst.
pub(crate) async fn batch_writer(
    pool: Pool,
    origin: String,
    mut rx: mpsc::Receiver<InsertRequest>,
    bounds: Bounds,
) {
    let pool = pool.for_writer();
    let mut queued: Fair<[u8; 32], InsertRequest> = Fair::default();
    loop {
        if queued.is_empty() {
            let Some(first) = rx.recv().await else { return };
            queued.push(first.event.pubkey.to_bytes(), first.raw.len(), first);
        }
        while queued.len() < bounds.max_queued {
            match rx.try_recv() {
                Ok(r) => queued.push(r.event.pubkey.to_bytes(), r.raw.len(), r),
                Err(_) => break,
            }
        }
        let batch = queued.take(bounds.max_batch, bounds.max_batch_bytes);
        write_and_answer(&pool, &origin, batch).await;
    }
}

/// The event writer's bounds (`writer.event_queue`, `event_batch`,
/// `event_batch_bytes`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bounds {
    pub max_queued: usize,
    pub max_batch: usize,
    pub max_batch_bytes: usize,
}

/// Writes one batch and answers each of its requests.
async fn write_and_answer(pool: &Pool, origin: &str, batch: Vec<InsertRequest>) {
    let started = std::time::Instant::now();
    metrics::histogram!(crate::telemetry::WRITE_BATCH).record(batch.len() as f64);
    let written = write_batch(pool, origin, &batch).await;
    tracing::debug!(
        events = batch.len(),
        elapsed_us = started.elapsed().as_micros() as u64,
        ok = written.is_ok(),
        "write batch"
    );
    let answers = match written {
        Ok(outcomes) => outcomes.into_iter().map(Ok).collect(),
        Err(e) => {
            tracing::warn!(events = batch.len(), error = %e, "batch write failed; writing its events one by one");
            write_isolated(pool, origin, &batch).await
        }
    };
    for (req, answer) in batch.into_iter().zip(answers) {
        let _ = req.reply.send(answer);
    }
}

/// Takes every author lock of `batch` up front, in one order (PostgreSQL),
/// so that this batch and the call writers' (of this process or another)
/// never wait on each other in a cycle.
async fn lock_authors(tx: &mut Tx<'_>, batch: &[InsertRequest]) -> Result<(), StoreError> {
    if tx.dialect() == Dialect::Postgres {
        let keys = batch
            .iter()
            .map(|r| author_lock_key(&r.community, &r.event.pubkey))
            .collect();
        tx.lock_all(keys).await?;
    }
    Ok(())
}

/// Writes `batch` in one transaction, each event in a savepoint of its
/// own: an event that fails is rolled back alone and answered with its
/// error; the others commit. Only after the batched write failed (it
/// costs a savepoint per event).
async fn write_isolated(
    pool: &Pool,
    origin: &str,
    batch: &[InsertRequest],
) -> Vec<Result<InsertOutcome, StoreError>> {
    let fail_all = |e: StoreError| -> Vec<Result<InsertOutcome, StoreError>> {
        let e = Arc::new(e);
        batch.iter().map(|_| Err(StoreError::Batch(e.clone()))).collect()
    };
    let mut tx = match pool.begin().await {
        Ok(tx) => tx,
        Err(e) => return fail_all(e),
    };
    if let Err(e) = lock_authors(&mut tx, batch).await {
        return fail_all(e);
    }
    let mut answers = Vec::with_capacity(batch.len());
    for r in batch {
        if let Err(e) = tx.exec(Q::new("SAVEPOINT event")).await {
            return fail_all(e);
        }
        let mark = tx.lock_mark();
        let answer = insert_event(&mut tx, &r.community, &r.event, &r.raw, None).await;
        let end = match &answer {
            Ok(_) => "RELEASE SAVEPOINT event",
            Err(e) => {
                tracing::warn!(community = %r.community, event = %r.event.id, error = %e, "event not stored");
                "ROLLBACK TO SAVEPOINT event"
            }
        };
        if let Err(e) = tx.exec(Q::new(end)).await {
            return fail_all(e);
        }
        if answer.is_err() {
            // Released by the rollback, and the savepoint with it.
            tx.forget_locks_since(mark);
            if let Err(e) = tx.exec(Q::new("RELEASE SAVEPOINT event")).await {
                return fail_all(e);
            }
        }
        answers.push(answer);
    }
    if tx.dialect() == Dialect::Postgres {
        let stored: Vec<(&str, &str)> = batch
            .iter()
            .zip(&answers)
            .filter(|(_, a)| matches!(a, Ok(InsertOutcome::Stored)))
            .map(|(r, _)| (r.community.as_str(), &*r.raw))
            .collect();
        if let Err(e) = crate::persistence::postgres::notify(&mut tx, origin, &stored).await {
            return fail_all(e);
        }
    }
    if let Err(e) = tx.commit().await {
        return fail_all(e);
    }
    answers
}

async fn write_batch(
    pool: &Pool,
    origin: &str,
    batch: &[InsertRequest],
) -> Result<Vec<InsertOutcome>, StoreError> {
    let mut tx = pool.begin().await?;
    lock_authors(&mut tx, batch).await?;
    let mut outcomes = Vec::with_capacity(batch.len());
    let mut i = 0;
    while i < batch.len() {
        // A run of plain events (one community, regular kinds, no deletion)
        // is written with a few multi-row statements; anything else one by one.
        let mut j = i;
        while j < batch.len()
            && j - i < MAX_BULK
            && bulk_eligible(&batch[j])
            && batch[j].community == batch[i].community
        {
            j += 1;
        }
        if j - i >= 2 {
            // Runs cut to a few lengths: a few statement texts, prepared once.
            j = i + piece_len(j - i, MAX_BULK);
            outcomes.extend(insert_plain_run(&mut tx, &batch[i..j]).await?);
        } else {
            j = i + 1;
            outcomes.push(
                insert_event(&mut tx, &batch[i].community, &batch[i].event, &batch[i].raw, None).await?,
            );
        }
        i = j;
    }
    if tx.dialect() == Dialect::Postgres {
        let stored: Vec<(&str, &str)> = batch
            .iter()
            .zip(&outcomes)
            .filter(|(_, outcome)| **outcome == InsertOutcome::Stored)
            .map(|(r, _)| (r.community.as_str(), &*r.raw))
            .collect();
        crate::persistence::postgres::notify(&mut tx, origin, &stored).await?;
    }
    tx.commit().await?;
    Ok(outcomes)
}

/// Events in one multi-row run, at most (9 binds a row: well under the
/// bind limits of both backends); a power of two ([`piece_len`]).
const MAX_BULK: usize = 256;

/// A regular event: it replaces nothing and deletes nothing, so its only
/// rules are "not stored yet" and "not deleted by its author".
fn bulk_eligible(r: &InsertRequest) -> bool {
    use protocol::kinds::{storage_of, Storage};
    let kind = r.event.kind.as_u16();
    storage_of(kind) == Storage::Regular && kind != protocol::kinds::DELETION
}

/// `<select> WHERE community_id = <community> AND <column> IN (<values>)`.
fn community_in_list<B: Into<crate::persistence::db::Bind>>(
    d: Dialect,
    select: &str,
    community: &str,
    column: &str,
    values: impl IntoIterator<Item = B>,
) -> Q {
    let mut q = Q::new(format!("{select} WHERE community_id = ")).arg(d, community);
    q.sql.push_str(&format!(" AND {column} IN "));
    q.in_list(d, values)
}

/// PostgreSQL: the pairs `(a[i], b[i])` that some row of `table` in
/// `community` has in its columns `cols` (name, SQL type), each pair looked
/// up by itself in a LATERAL subquery, which the planner cannot turn into
/// one scan of the community. With `IN (…)` lists it did, whenever the
/// statistics (a minute old during a bulk load) put the community at a few
/// dozen rows: every event of the community read for each batch, 117 ms a
/// batch of 256 (docs/performance.md, "Plans that depend on a quiet
/// moment's statistics"). Arrays also make it one
/// statement text for every batch size.
fn pg_pairs_present(table: &str, cols: [(&str, &str); 2], community: &str, a: Bind, b: Bind) -> Q {
    let [(ca, ta), (cb, tb)] = cols;
    Q::new(format!(
        "SELECT k.{ca}, k.{cb} FROM unnest($2::{ta}[], $3::{tb}[]) AS k({ca}, {cb}) \
         CROSS JOIN LATERAL (SELECT 1 FROM {table} x WHERE x.community_id = $1 \
         AND x.{ca} = k.{ca} AND x.{cb} = k.{cb} LIMIT 1) AS hit"
    ))
    .bind(community)
    .bind(a)
    .bind(b)
}

/// Stores a run of regular events of one community with a few statements:
/// the same rules as `events::insert` (duplicate, deleted by its author),
/// in run order (a repeat within the run is a duplicate).
async fn insert_plain_run(tx: &mut Tx<'_>, run: &[InsertRequest]) -> Result<Vec<InsertOutcome>, StoreError> {
    let community = run[0].community.as_str();
    debug_assert!(run.iter().all(|r| r.community == community && bulk_eligible(r)));
    let stored = already_stored(tx, community, run).await?;
    let deleted = deleted_by_author(tx, community, run).await?;
    let (outcomes, fresh) = sort_run(run, &stored, &deleted);
    if fresh.is_empty() {
        return Ok(outcomes);
    }
    for r in &fresh {
        crate::faults::check_event(&r.event.content)?;
    }
    let seqs = insert_rows(tx, community, &fresh).await?;
    let tags: Vec<Vec<(String, String)>> = fresh.iter().map(|r| indexed_tags(&r.event)).collect();
    let mut rows = Vec::new();
    for (r, pairs) in fresh.iter().zip(&tags) {
        let seq = match tx.dialect() {
            Dialect::Sqlite => Some(
                *seqs
                    .get(&r.event.id.to_bytes())
                    .ok_or_else(|| StoreError::Corrupt("insert returned no seq for an event".into()))?,
            ),
            Dialect::Postgres => None,
        };
        rows.extend(TagRow::of(&r.event, seq, pairs));
    }
    insert_tags(tx, community, &rows).await?;
    let words: Vec<(i64, &str)> = fresh
        .iter()
        .filter_map(|r| Some((*seqs.get(&r.event.id.to_bytes())?, r.event.content.as_str())))
        .collect();
    index_words(tx, &words).await?;
    Ok(outcomes)
}

/// The ids of the run that are already stored.
async fn already_stored(
    tx: &mut Tx<'_>,
    community: &str,
    run: &[InsertRequest],
) -> Result<HashSet<[u8; 32]>, StoreError> {
    let d = tx.dialect();
    let q = match d {
        // An id fixes its event's created_at: one partition's primary key.
        Dialect::Postgres => {
            let (ids, times): (Vec<Vec<u8>>, Vec<i64>) = run
                .iter()
                .map(|r| (r.event.id.to_bytes().to_vec(), created_at_of(&r.event)))
                .unzip();
            pg_pairs_present(
                "events",
                [("id", "bytea"), ("created_at", "bigint")],
                community,
                Bind::BlobArray(ids),
                Bind::IntArray(times),
            )
        }
        Dialect::Sqlite => community_in_list(
            d,
            "SELECT id FROM events",
            community,
            "id",
            run.iter().map(|r| r.event.id.to_bytes()),
        ),
    };
    tx.all(q).await?.iter().map(|row| row.id32(0)).collect()
}

/// The (author, id) pairs of the run that their author deleted.
async fn deleted_by_author(
    tx: &mut Tx<'_>,
    community: &str,
    run: &[InsertRequest],
) -> Result<HashSet<(Vec<u8>, String)>, StoreError> {
    let d = tx.dialect();
    let q = match d {
        // The whole primary key, (author, target), on both backends:
        // `target IN (…)` could use only its first column and read every
        // deletion of the community for each batch.
        Dialect::Postgres => {
            let (authors, targets): (Vec<Vec<u8>>, Vec<String>) = run
                .iter()
                .map(|r| (r.event.pubkey.to_bytes().to_vec(), r.event.id.to_hex()))
                .unzip();
            pg_pairs_present(
                "deletions",
                [("pubkey", "bytea"), ("target", "text")],
                community,
                Bind::BlobArray(authors),
                Bind::TextArray(targets),
            )
        }
        // SQLite probes the key for each row of a VALUES list joined to
        // the table.
        Dialect::Sqlite => {
            let mut q = Q::new("SELECT x.pubkey, x.target FROM (VALUES ");
            for (k, r) in run.iter().enumerate() {
                d.push_values_row(&mut q.sql, k, 2);
                q = q
                    .bind(r.event.pubkey.to_bytes().to_vec())
                    .bind(r.event.id.to_hex());
            }
            q.sql
                .push_str(") AS k CROSS JOIN deletions x ON x.community_id = ");
            q = q.arg(d, community);
            q.sql
                .push_str(" AND x.pubkey = k.column1 AND x.target = k.column2");
            q
        }
    };
    tx.all(q)
        .await?
        .iter()
        .map(|row| Ok((row.blob("pubkey")?, row.text("target")?)))
        .collect()
}

/// Each event's outcome, in run order, and the ones to store.
fn sort_run<'r>(
    run: &'r [InsertRequest],
    stored: &HashSet<[u8; 32]>,
    deleted: &HashSet<(Vec<u8>, String)>,
) -> (Vec<InsertOutcome>, Vec<&'r InsertRequest>) {
    let mut outcomes = Vec::with_capacity(run.len());
    let mut fresh = Vec::new();
    let mut seen = HashSet::new();
    for r in run {
        let id = r.event.id.to_bytes();
        if stored.contains(&id) || !seen.insert(id) {
            outcomes.push(InsertOutcome::Duplicate);
        } else if deleted.contains(&(r.event.pubkey.to_bytes().to_vec(), r.event.id.to_hex())) {
            outcomes.push(InsertOutcome::Rejected(
                "blocked: this event was deleted by its author".into(),
            ));
        } else {
            outcomes.push(InsertOutcome::Stored);
            fresh.push(r);
        }
    }
    (outcomes, fresh)
}

/// Inserts the event rows in one statement; on SQLite returns each new
/// row's `seq` (the tag index's key), on PostgreSQL nothing.
async fn insert_rows(
    tx: &mut Tx<'_>,
    community: &str,
    fresh: &[&InsertRequest],
) -> Result<HashMap<[u8; 32], i64>, StoreError> {
    let d = tx.dialect();
    // SQLite: `OR FAIL` (a failing row fails the statement without undoing
    // the rows before it, and the batch's error then rolls the whole
    // transaction back) spares SQLite the statement journal, a copy of every
    // page the statement touches; and the new rows' `seq` comes back for
    // the tag index.
    let verb = match d {
        Dialect::Sqlite => "INSERT OR FAIL",
        Dialect::Postgres => "INSERT",
    };
    let mut q = Q::new(format!(
        "{verb} INTO events (community_id, created_at, id, pubkey, kind, d_tag, expires_at, channel, raw) VALUES "
    ));
    for (k, r) in fresh.iter().enumerate() {
        d.push_values_row(&mut q.sql, k, 9);
        let e = &r.event;
        q = q
            .bind(community)
            .bind(created_at_of(e))
            .bind(e.id.to_bytes())
            .bind(e.pubkey.to_bytes())
            .bind(i64::from(e.kind.as_u16()))
            .bind(Option::<String>::None)
            .bind(expiration(e))
            .bind(Option::<String>::None)
            .bind(r.raw.as_ref());
    }
    match d {
        Dialect::Sqlite => {
            q.sql.push_str(" RETURNING id, seq");
            tx.all(q)
                .await?
                .iter()
                .map(|row| Ok((row.id32("id")?, row.int("seq")?)))
                .collect()
        }
        Dialect::Postgres => {
            tx.exec(q).await?;
            Ok(HashMap::new())
        }
    }
}
