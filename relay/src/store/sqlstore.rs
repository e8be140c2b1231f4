//! The one implementation of [`Store`] over both SQL backends.
//!
//! Every storage rule is written here once, against [`Tx`]; what differs
//! between SQLite and PostgreSQL (opening, partitions, cross-process
//! fan-out) lives in `sqlite.rs` and `postgres.rs`.

use std::sync::Arc;

use async_trait::async_trait;
use nostr::prelude::{Event, Filter, Keys, PublicKey};
use protocol::nip_oa::Attestation;
use tokio::sync::mpsc;
use tokio::sync::oneshot;

use super::api::HttpAuthUse;
use super::db::{Pool, Tx, Q};
use super::refusal::{CallError, Refusal};
use super::sql::{self, value_hash, Bind, Dialect};
use super::{
    address_key, deletion_targets, expiration, indexed_tags, replacement_key, ChannelView, CommunityRecord,
    InsertOutcome, Page, PageRows, Published, ReadScope, RemoteEvent, Store, StoreError, StoredEvent,
};
use crate::config::{ChannelPolicy, DeliveryConfig, WriterConfig};

/// A store on SQLite or PostgreSQL.
pub struct SqlStore {
    pub(crate) pool: Pool,
    /// Identifies this process in cross-process announcements (PostgreSQL).
    origin: String,
    partition_months_ahead: u32,
    /// The event writer's queue.
    writer: mpsc::Sender<InsertRequest>,
    /// The call writer (group commit of small write calls).
    pub(crate) calls: super::group::Calls,
}

/// An event waiting for the batch writer.
struct InsertRequest {
    community: String,
    event: Arc<Event>,
    raw: Arc<str>,
    reply: oneshot::Sender<Result<InsertOutcome, StoreError>>,
}

impl SqlStore {
    /// Wraps `pool` and starts its two writers (see [`WriterConfig`]).
    /// The call writer's calls read `deliveries`, handed over here once.
    pub fn new(
        pool: Pool,
        partition_months_ahead: u32,
        w: &WriterConfig,
        deliveries: DeliveryConfig,
    ) -> Result<Self, StoreError> {
        let origin = hex::encode(rand::random::<[u8; 8]>());
        let (tx, rx) = mpsc::channel(w.event_queue.max(1));
        crate::dedicated::spawn(
            "event-writer",
            batch_writer(pool.clone(), origin.clone(), rx, w.event_batch.max(1)),
        )
        .map_err(|e| StoreError::Start(format!("event writer: {e}")))?;
        let setup = super::group::WriterSetup {
            origin: origin.clone(),
            queue: w.call_queue,
            batch: w.call_batch,
            writers: w.call_writers,
            deliveries,
        };
        let calls = super::group::Calls::start(pool.clone(), setup)?;
        Ok(Self {
            pool,
            origin,
            partition_months_ahead,
            writer: tx,
            calls,
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
            super::postgres::notify(tx, &self.origin, &events).await?;
        }
        Ok(())
    }

    async fn hosts_of(&self, id: &str) -> Result<Vec<String>, StoreError> {
        let rows = self
            .pool
            .all(Q::new("SELECT host FROM community_hosts WHERE community_id = $1 ORDER BY host").bind(id))
            .await?;
        rows.iter().map(|r| r.text(0)).collect()
    }

    async fn community_rows(&self, q: Q) -> Result<Vec<CommunityRecord>, StoreError> {
        let mut out = Vec::new();
        for row in self.pool.all(q).await? {
            let id = row.text(0)?;
            let hosts = self.hosts_of(&id).await?;
            out.push(CommunityRecord {
                id,
                relay_url: row.text(1)?,
                secret_key_hex: row.text(2)?,
                hosts,
            });
        }
        Ok(out)
    }
}

/// The key of the lock ([`Tx::lock`]) that serialises the storing of one
/// author's events in a community.
pub(crate) fn author_lock_key(community: &str, author: &PublicKey) -> String {
    format!("{community}:{}", author.to_hex())
}

/// Stores `event` inside `tx` under the NIP-01/09/40 rules. The caller
/// commits (or, on anything but `Stored`, may simply drop `tx`).
pub(crate) async fn insert_event_tx(
    tx: &mut Tx<'_>,
    community: &str,
    event: &Event,
    raw: &str,
    channel: Option<&str>,
) -> Result<InsertOutcome, StoreError> {
    let id = event.id.as_bytes().to_vec();
    let pubkey = event.pubkey.to_bytes().to_vec();
    let created_at = created_at_of(event);
    let kind = i64::from(event.kind.as_u16());
    let d_tag = replacement_key(event);

    // Every rule below is about one author's events: serialise per author.
    tx.lock(&author_lock_key(community, &event.pubkey)).await?;
    crate::faults::check_event(&event.content)?;

    let address = d_tag.as_ref().map(|d| address_key(event.kind.as_u16(), d));
    if d_tag.is_none() {
        // The usual case, in one statement: stored unless it already is
        // or its author deleted it; which of the two only when neither
        // insert happened.
        if let Some((seq, tagged)) = insert_unless_known(tx, community, event, raw, channel).await? {
            return finish_insert(tx, community, event, &pubkey, created_at, seq, tagged).await;
        }
    }

    // Already stored? Deleted by its author (NIP-09: an event its author
    // deleted stays deleted)? One round trip.
    let checks = Q::new(
        "SELECT EXISTS (SELECT 1 FROM events WHERE community_id = $1 AND created_at = $2 AND id = $3), \
         EXISTS (SELECT 1 FROM deletions WHERE community_id = $1 AND pubkey = $4 \
         AND (target = $5 OR (target = $6 AND deleted_until >= $2)))",
    )
    .bind(community)
    .bind(created_at)
    .bind(id.clone())
    .bind(pubkey.clone())
    .bind(event.id.to_hex())
    .bind(address.unwrap_or_default());
    let row = tx
        .one(checks)
        .await?
        .ok_or_else(|| StoreError::Corrupt("no row from checks".into()))?;
    if row.bool(0)? {
        return Ok(InsertOutcome::Duplicate);
    }
    if row.bool(1)? {
        return Ok(InsertOutcome::Rejected(
            "blocked: this event was deleted by its author".into(),
        ));
    }

    // Replaceable and addressable: keep only the newest (ties: lowest id).
    if let Some(d) = &d_tag {
        let versions = tx
            .all(
                Q::new(
                    "SELECT id, created_at FROM events \
                     WHERE community_id = $1 AND pubkey = $2 AND kind = $3 AND d_tag = $4 AND superseded = FALSE",
                )
                .bind(community)
                .bind(pubkey.clone())
                .bind(kind)
                .bind(d.as_str()),
            )
            .await?;
        for v in &versions {
            let (old_id, old_created) = (v.blob(0)?, v.int(1)?);
            if old_created > created_at || (old_created == created_at && old_id < id) {
                return Ok(InsertOutcome::Rejected(
                    "duplicate: a newer version of this replaceable event is stored".into(),
                ));
            }
        }
        // Replaced workflow definitions stay fetchable by id: runs pin them.
        let sql = if event.kind.as_u16() == protocol::workflow::DEFINITION_KIND {
            "UPDATE events SET superseded = TRUE WHERE community_id = $1 AND created_at = $2 AND id = $3"
        } else {
            "DELETE FROM events WHERE community_id = $1 AND created_at = $2 AND id = $3"
        };
        for v in versions {
            tx.exec(Q::new(sql).bind(community).bind(v.int(1)?).bind(v.blob(0)?))
                .await?;
        }
    }

    let mut insert = Q::new(
        "INSERT INTO events (community_id, created_at, id, pubkey, kind, d_tag, expires_at, channel, raw) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
    )
    .bind(community)
    .bind(created_at)
    .bind(id.clone())
    .bind(pubkey.clone())
    .bind(kind)
    .bind(d_tag.clone())
    .bind(expiration(event))
    .bind(channel.map(str::to_string))
    .bind(raw);
    let seq = match tx.dialect() {
        Dialect::Sqlite => {
            insert.sql.push_str(" RETURNING seq");
            let row = tx
                .one(insert)
                .await?
                .ok_or_else(|| StoreError::Corrupt("no seq returned by insert".into()))?;
            Some(row.int(0)?)
        }
        Dialect::Postgres => {
            tx.exec(insert).await?;
            None
        }
    };
    finish_insert(tx, community, event, &pubkey, created_at, seq, false).await
}

/// The event's tag rows (unless `tagged`: the insert wrote them) and, for
/// a deletion, its effect: what follows the row's insert (`seq`: its
/// `events.seq` on SQLite).
async fn finish_insert(
    tx: &mut Tx<'_>,
    community: &str,
    event: &Event,
    pubkey: &[u8],
    created_at: i64,
    seq: Option<i64>,
    tagged: bool,
) -> Result<InsertOutcome, StoreError> {
    if !tagged {
        let tags = indexed_tags(event);
        let rows: Vec<TagRow<'_>> = TagRow::of(event, seq, &tags).collect();
        insert_tags(tx, community, &rows).await?;
    }

    if event.kind.as_u16() == protocol::kinds::DELETION {
        apply_deletion(tx, community, event, pubkey, created_at).await?;
    }
    Ok(InsertOutcome::Stored)
}

/// Inserts a non-replaceable event unless it is already stored or its
/// author deleted it, in one statement. `Some((seq, tagged))` when it was
/// inserted (`seq`: its `events.seq` on SQLite, `None` on PostgreSQL;
/// `tagged`: its tag rows were inserted by the same statement, as on
/// PostgreSQL for up to [`MAX_TAGS_WITH_EVENT`] of them); `None` when not:
/// the caller's checks then say why.
async fn insert_unless_known(
    tx: &mut Tx<'_>,
    community: &str,
    event: &Event,
    raw: &str,
    channel: Option<&str>,
) -> Result<Option<(Option<i64>, bool)>, StoreError> {
    let d = tx.dialect();
    let tags = match d {
        Dialect::Postgres => indexed_tags(event),
        Dialect::Sqlite => Vec::new(),
    };
    let tagged = d == Dialect::Postgres && (1..=MAX_TAGS_WITH_EVENT).contains(&tags.len());
    // PostgreSQL's events have no `seq` column (their tags key on the id).
    let returning = match d {
        Dialect::Sqlite => "seq",
        Dialect::Postgres => "created_at",
    };
    let insert = format!(
        "INSERT INTO events (community_id, created_at, id, pubkey, kind, d_tag, expires_at, channel, raw) \
         SELECT $1, $2, $3, $4, $5, NULL, $6, $7, $8 WHERE NOT EXISTS (SELECT 1 FROM deletions \
         WHERE community_id = $1 AND pubkey = $4 AND target = $9) \
         ON CONFLICT DO NOTHING RETURNING {returning}"
    );
    let mut q = Q::new(if tagged {
        // The tag rows in the same statement (a round trip less per
        // event), only if the event row went in: they join its RETURNING.
        let mut sql = format!(
            "WITH ins AS ({insert}), tagged AS (INSERT INTO event_tags \
             (community_id, event_created_at, event_id, name, value, value_hash) \
             SELECT $1, ins.created_at, $3, v.name, v.value, v.hash FROM ins CROSS JOIN (VALUES "
        );
        for k in 0..tags.len() {
            d.push_values_row_after(&mut sql, k, 3, 9);
        }
        sql.push_str(") AS v(name, value, hash) ON CONFLICT DO NOTHING) SELECT created_at FROM ins");
        sql
    } else {
        insert
    })
    .bind(community)
    .bind(created_at_of(event))
    .bind(event.id.as_bytes().to_vec())
    .bind(event.pubkey.to_bytes().to_vec())
    .bind(i64::from(event.kind.as_u16()))
    .bind(expiration(event))
    .bind(channel.map(str::to_string))
    .bind(raw)
    .bind(event.id.to_hex());
    if tagged {
        for (name, value) in &tags {
            q = q
                .bind(name.as_str())
                .bind(value.as_str())
                .bind(value_hash(value).to_vec());
        }
    }
    let Some(row) = tx.one(q).await? else {
        return Ok(None);
    };
    Ok(Some(match d {
        Dialect::Sqlite => (Some(row.int(0)?), false),
        Dialect::Postgres => (None, tagged),
    }))
}

/// Most tag rows written by the statement that inserts their event
/// (PostgreSQL); an event with more has them written by [`insert_tags`].
const MAX_TAGS_WITH_EVENT: usize = 64;

async fn apply_deletion(
    tx: &mut Tx<'_>,
    community: &str,
    event: &Event,
    pubkey: &[u8],
    created_at: i64,
) -> Result<(), StoreError> {
    let targets = deletion_targets(event);
    for target in targets.ids {
        super::workflows::on_definition_deleted(tx, community, &event.pubkey, Some(target), None).await?;
        tx.exec(
            Q::new("DELETE FROM events WHERE community_id = $1 AND id = $2 AND pubkey = $3 AND kind <> $4")
                .bind(community)
                .bind(target)
                .bind(pubkey)
                .bind(i64::from(protocol::kinds::DELETION)),
        )
        .await?;
        tx.exec(
            Q::new(
                "INSERT INTO deletions (community_id, pubkey, target, deleted_until) VALUES ($1, $2, $3, $4) \
                 ON CONFLICT (community_id, pubkey, target) DO NOTHING",
            )
            .bind(community)
            .bind(pubkey)
            .bind(hex::encode(target))
            .bind(created_at),
        )
        .await?;
    }
    for (k, d) in targets.addresses {
        if k == protocol::workflow::DEFINITION_KIND {
            super::workflows::on_definition_deleted(tx, community, &event.pubkey, None, Some(&d)).await?;
        }
        tx.exec(
            Q::new(
                "DELETE FROM events WHERE community_id = $1 AND pubkey = $2 AND kind = $3 \
                 AND d_tag = $4 AND created_at <= $5",
            )
            .bind(community)
            .bind(pubkey)
            .bind(i64::from(k))
            .bind(d.as_str())
            .bind(created_at),
        )
        .await?;
        tx.exec(
            Q::new(
                "INSERT INTO deletions (community_id, pubkey, target, deleted_until) VALUES ($1, $2, $3, $4) \
                 ON CONFLICT (community_id, pubkey, target) DO UPDATE SET deleted_until = \
                 CASE WHEN deletions.deleted_until > excluded.deleted_until \
                 THEN deletions.deleted_until ELSE excluded.deleted_until END",
            )
            .bind(community)
            .bind(pubkey)
            .bind(address_key(k, &d))
            .bind(created_at),
        )
        .await?;
    }
    Ok(())
}

/// Group commit: takes what is queued (up to `MAX_BATCH`) and stores it in
/// one transaction, in queue order, then answers each request. Every
/// refusal of `insert_event_tx` happens before it writes anything, so one
/// refused event never leaves a trace in the batch. When the batch fails
/// as a whole, its events are written again one by one, each in its own
/// savepoint ([`write_isolated`]): a storage error of one event (one
/// client's) fails that event only, never the others of its batch (one
/// U+0000 in a tag value used to fail every client's events with it on
/// PostgreSQL).
async fn batch_writer(pool: Pool, origin: String, mut rx: mpsc::Receiver<InsertRequest>, max_batch: usize) {
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        while batch.len() < max_batch {
            match rx.try_recv() {
                Ok(r) => batch.push(r),
                Err(_) => break,
            }
        }
        let started = std::time::Instant::now();
        let written = write_batch(&pool, &origin, &batch).await;
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
                write_isolated(&pool, &origin, &batch).await
            }
        };
        for (req, answer) in batch.into_iter().zip(answers) {
            let _ = req.reply.send(answer);
        }
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
        let answer = insert_event_tx(&mut tx, &r.community, &r.event, &r.raw, None).await;
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
        if let Err(e) = super::postgres::notify(&mut tx, origin, &stored).await {
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
            outcomes.extend(insert_plain_run(&mut tx, &batch[i..j]).await?);
        } else {
            j = i + 1;
            outcomes.push(
                insert_event_tx(&mut tx, &batch[i].community, &batch[i].event, &batch[i].raw, None).await?,
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
        super::postgres::notify(&mut tx, origin, &stored).await?;
    }
    tx.commit().await?;
    Ok(outcomes)
}

/// Events in one multi-row run, at most (9 binds a row: well under the
/// bind limits of both backends).
const MAX_BULK: usize = 256;

/// A regular event: it replaces nothing and deletes nothing, so its only
/// rules are "not stored yet" and "not deleted by its author".
fn bulk_eligible(r: &InsertRequest) -> bool {
    use protocol::kinds::{storage_of, Storage};
    let kind = r.event.kind.as_u16();
    storage_of(kind) == Storage::Regular && kind != protocol::kinds::DELETION
}

/// `<select> WHERE community_id = <community> AND <column> IN (<values>)`.
fn community_in_list<B: Into<super::db::Bind>>(
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

/// An event's `created_at` as stored (a time past `i64::MAX` seconds,
/// which the relay's limits refuse anyway, saturates).
pub(crate) fn created_at_of(event: &Event) -> i64 {
    i64::try_from(event.created_at.as_secs()).unwrap_or(i64::MAX)
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
/// the same rules as [`insert_event_tx`] (duplicate, deleted by its author),
/// in run order (a repeat within the run is a duplicate).
async fn insert_plain_run(tx: &mut Tx<'_>, run: &[InsertRequest]) -> Result<Vec<InsertOutcome>, StoreError> {
    let d = tx.dialect();
    let community = run[0].community.as_str();
    // Which are already stored, and which did their author delete?
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
    let stored: std::collections::HashSet<[u8; 32]> = tx
        .all(q)
        .await?
        .iter()
        .map(|row| row.id32(0))
        .collect::<Result<_, _>>()?;
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
    let deleted: std::collections::HashSet<(Vec<u8>, String)> = tx
        .all(q)
        .await?
        .iter()
        .map(|row| Ok((row.blob(0)?, row.text(1)?)))
        .collect::<Result<_, StoreError>>()?;

    let mut outcomes = Vec::with_capacity(run.len());
    let mut fresh: Vec<&InsertRequest> = Vec::new();
    let mut seen = std::collections::HashSet::new();
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
    if fresh.is_empty() {
        return Ok(outcomes);
    }
    for r in &fresh {
        crate::faults::check_event(&r.event.content)?;
    }
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
    let seqs: std::collections::HashMap<[u8; 32], i64> = match d {
        Dialect::Sqlite => {
            q.sql.push_str(" RETURNING id, seq");
            tx.all(q)
                .await?
                .iter()
                .map(|row| Ok((row.id32(0)?, row.int(1)?)))
                .collect::<Result<_, StoreError>>()?
        }
        Dialect::Postgres => {
            tx.exec(q).await?;
            std::collections::HashMap::new()
        }
    };
    let tags: Vec<(&InsertRequest, Vec<(String, String)>)> =
        fresh.iter().map(|r| (*r, indexed_tags(&r.event))).collect();
    let mut rows = Vec::new();
    for (r, pairs) in &tags {
        let id = r.event.id.to_bytes();
        let seq = match d {
            Dialect::Sqlite => Some(
                *seqs
                    .get(&id)
                    .ok_or_else(|| StoreError::Corrupt("insert returned no seq for an event".into()))?,
            ),
            Dialect::Postgres => None,
        };
        rows.extend(TagRow::of(&r.event, seq, pairs));
    }
    insert_tags(tx, community, &rows).await?;
    Ok(outcomes)
}

/// One row of the tag index.
struct TagRow<'a> {
    /// The event's `events.seq` (SQLite's tag index is keyed by it);
    /// `None` on PostgreSQL.
    seq: Option<i64>,
    created_at: i64,
    id: [u8; 32],
    name: &'a str,
    value: &'a str,
}

impl<'a> TagRow<'a> {
    /// The tag index rows of `event`, whose [`indexed_tags`] are `tags`.
    fn of(event: &Event, seq: Option<i64>, tags: &'a [(String, String)]) -> impl Iterator<Item = TagRow<'a>> {
        let created_at = created_at_of(event);
        let id = event.id.to_bytes();
        tags.iter().map(move |(name, value)| TagRow {
            seq,
            created_at,
            id,
            name,
            value,
        })
    }
}

/// Inserts tag index rows in few statements (at most 500 rows of 6 binds
/// each, well under both backends' bind limits). SQLite keys them by the
/// event's seq; PostgreSQL by its id, with the value's hash it indexes.
async fn insert_tags(tx: &mut Tx<'_>, community: &str, rows: &[TagRow<'_>]) -> Result<(), StoreError> {
    let d = tx.dialect();
    for chunk in rows.chunks(500) {
        let mut q = Q::new(match d {
            Dialect::Sqlite => {
                "INSERT INTO event_tags (event_seq, community_id, event_created_at, event_id, name, value) VALUES "
            }
            Dialect::Postgres => {
                "INSERT INTO event_tags (community_id, event_created_at, event_id, name, value, value_hash) VALUES "
            }
        });
        for (k, t) in chunk.iter().enumerate() {
            d.push_values_row(&mut q.sql, k, 6);
            q = match d {
                Dialect::Sqlite => q.bind(
                    t.seq
                        .ok_or_else(|| StoreError::Corrupt("tag row without seq".into()))?,
                ),
                Dialect::Postgres => q,
            };
            q = q
                .bind(community)
                .bind(t.created_at)
                .bind(t.id)
                .bind(t.name)
                .bind(t.value);
            if d == Dialect::Postgres {
                q = q.bind(value_hash(t.value).to_vec());
            }
        }
        q.sql.push_str(" ON CONFLICT DO NOTHING");
        tx.exec(q).await?;
    }
    Ok(())
}

fn stored(rows: Vec<super::db::Row>) -> Result<Vec<StoredEvent>, StoreError> {
    rows.into_iter()
        .map(|mut r| {
            Ok(StoredEvent {
                raw: r.take_text(0)?,
                created_at: r.int(1)?,
                id: r.id32(2)?,
            })
        })
        .collect()
}

#[async_trait]
impl Store for SqlStore {
    fn backend(&self) -> &'static str {
        match self.dialect() {
            Dialect::Sqlite => "sqlite",
            Dialect::Postgres => "postgres",
        }
    }

    async fn community_for_host(&self, host: &str) -> Result<Option<CommunityRecord>, StoreError> {
        let bare = protocol::host::without_port(host).to_string();
        let q = Q::new(
            "SELECT c.id, c.relay_url, c.secret_key_hex FROM community_hosts h \
             JOIN communities c ON c.id = h.community_id \
             WHERE h.host IN ($1, $2) ORDER BY length(h.host) DESC LIMIT 1",
        )
        .bind(host)
        .bind(bare);
        Ok(self.community_rows(q).await?.into_iter().next())
    }

    async fn add_community(&self, c: &CommunityRecord) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        let now = tx.now().await?;
        let inserted = tx
            .exec(
                Q::new(
                    "INSERT INTO communities (id, relay_url, secret_key_hex, created_at) VALUES ($1, $2, $3, $4) \
                     ON CONFLICT (id) DO NOTHING",
                )
                .bind(c.id.as_str())
                .bind(c.relay_url.as_str())
                .bind(c.secret_key_hex.as_str())
                .bind(now),
            )
            .await?;
        if inserted == 0 {
            return Err(StoreError::Conflict(format!(
                "community {:?} already exists",
                c.id
            )));
        }
        for host in &c.hosts {
            let bound = tx
                .exec(
                    Q::new(
                        "INSERT INTO community_hosts (host, community_id) VALUES ($1, $2) ON CONFLICT (host) DO NOTHING",
                    )
                    .bind(host)
                    .bind(c.id.as_str()),
                )
                .await?;
            if bound == 0 {
                return Err(StoreError::Conflict(format!(
                    "host {host:?} is bound to another community"
                )));
            }
        }
        tx.commit().await
    }

    async fn list_communities(&self) -> Result<Vec<CommunityRecord>, StoreError> {
        self.community_rows(Q::new(
            "SELECT id, relay_url, secret_key_hex FROM communities ORDER BY id",
        ))
        .await
    }

    async fn set_community_key(&self, id: &str, stored: &str) -> Result<bool, StoreError> {
        let n = self
            .pool
            .exec(
                Q::new("UPDATE communities SET secret_key_hex = $2 WHERE id = $1")
                    .bind(id)
                    .bind(stored),
            )
            .await?;
        Ok(n == 1)
    }

    async fn enqueue_insert(
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

    async fn insert_event(
        &self,
        community: &str,
        event: &Event,
        raw: &str,
    ) -> Result<InsertOutcome, StoreError> {
        let mut tx = self.pool.begin().await?;
        let outcome = insert_event_tx(&mut tx, community, event, raw, None).await?;
        if outcome == InsertOutcome::Stored {
            self.announce(&mut tx, community, &[raw]).await?;
            tx.commit().await?;
        }
        Ok(outcome)
    }

    async fn apply_channel_event(
        &self,
        community: &str,
        keys: &Keys,
        policy: &ChannelPolicy,
        event: &Event,
        raw: &str,
    ) -> Result<(InsertOutcome, Published), StoreError> {
        let call = super::calls::ChannelEvent {
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

    async fn channel(&self, community: &str, id: &str) -> Result<Option<ChannelView>, StoreError> {
        let mut tx = self.pool.read().await?;
        super::channels::load(&mut tx, community, id).await
    }

    async fn register_agent(
        &self,
        community: &str,
        event: &Event,
        raw: &str,
        attestation: &Attestation,
    ) -> Result<InsertOutcome, StoreError> {
        let mut tx = self.pool.begin().await?;
        let outcome = super::agents::register(&mut tx, community, event, raw, attestation).await?;
        if outcome == InsertOutcome::Stored {
            self.announce(&mut tx, community, &[raw]).await?;
            tx.commit().await?;
        }
        Ok(outcome)
    }

    async fn agent_owner(&self, community: &str, agent: &PublicKey) -> Result<Option<PublicKey>, StoreError> {
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

    async fn channels_of(&self, community: &str, member: &PublicKey) -> Result<Vec<String>, StoreError> {
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

    async fn use_http_auth(
        &self,
        community: &str,
        event_id: &[u8; 32],
        expires_at: i64,
    ) -> Result<bool, StoreError> {
        let auth = HttpAuthUse {
            event_id: *event_id,
            keep_until: expires_at,
        };
        let call = super::calls::HttpAuth {
            community: community.to_string(),
        };
        match self.calls.run_spending(auth, call).await {
            Ok(()) => Ok(true),
            Err(CallError::Refused(Refusal::Replayed(_))) => Ok(false),
            Err(CallError::Store(e)) => Err(e),
            Err(CallError::Refused(r)) => unreachable!("an auth record is refused only as a replay: {r:?}"),
        }
    }

    async fn publish_ephemeral(&self, community: &str, raws: &[String]) -> Result<(), StoreError> {
        if self.dialect() == Dialect::Postgres && !raws.is_empty() {
            let mut tx = self.pool.begin().await?;
            self.announce(&mut tx, community, raws).await?;
            tx.commit().await?;
        }
        Ok(())
    }

    async fn subscribe_remote(
        &self,
        capacity: usize,
    ) -> Result<Option<mpsc::Receiver<RemoteEvent>>, StoreError> {
        match &self.pool {
            Pool::Postgres { main: p, .. } => Ok(Some(
                super::postgres::listen(p, self.origin.clone(), capacity).await?,
            )),
            Pool::Sqlite { .. } => Ok(None),
        }
    }

    async fn query_page(
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
        let s = sql::select_events(self.dialect(), community, filter, page.limit, page.after, scope);
        let q = Q {
            sql: s.text,
            binds: s.binds,
        };
        let (rows, end) = self.pool.query_page(q, page.rows, page.max_bytes).await?;
        Ok(PageRows {
            events: stored(rows)?,
            end,
        })
    }

    async fn count(&self, community: &str, filters: &[Filter], scope: &ReadScope) -> Result<u64, StoreError> {
        let s = sql::count_events(self.dialect(), community, filters, scope);
        let rows = self
            .pool
            .query_all(Q {
                sql: s.text,
                binds: s.binds,
            })
            .await?;
        Ok(rows
            .first()
            .map(|r| r.int(0))
            .transpose()?
            .map_or(0, |n| u64::try_from(n).unwrap_or(0)))
    }

    async fn purge_expired(&self, now: u64) -> Result<u64, StoreError> {
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

    async fn maintain(&self, now: u64) -> Result<(), StoreError> {
        if let Pool::Postgres { main: p, .. } = &self.pool {
            super::postgres::ensure_partitions(p, now, self.partition_months_ahead).await?;
        }
        Ok(())
    }

    async fn close(&self) {
        self.pool.close().await;
    }
}
