//! The event rules inside a transaction (NIP-01 duplicates and
//! replaceable kinds, NIP-09 deletions, NIP-40 expiry) and the tag index
//! rows. Nothing here knows what other parts of the store make of an
//! event: a stored deletion says what it named ([`Deleted`]), and the
//! caller runs the reactions to it (`workflows::insert_event`).

use nostr::prelude::{Event, PublicKey};

use crate::events::address_key;
use crate::events::deletion_targets;
use crate::events::expiration;
use crate::events::indexed_tags;
use crate::events::query::value_hash;
use crate::events::replacement_key;
use crate::events::InsertOutcome;
use crate::persistence::db::{Tx, Q};
use crate::persistence::sql::{pieces, Dialect};
use crate::persistence::StoreError;

/// What storing an event came to.
#[must_use = "a stored deletion's targets need the caller's reactions"]
#[derive(Debug)]
pub(crate) struct Inserted {
    pub outcome: InsertOutcome,
    /// What the event deleted, when it is a stored NIP-09 deletion.
    pub deleted: Deleted,
}

impl Inserted {
    fn not_stored(outcome: InsertOutcome) -> Self {
        Self {
            outcome,
            deleted: Deleted::default(),
        }
    }

    /// The outcome of an event that cannot be a deletion (the relay's own
    /// events, a checked reply).
    pub fn of_no_deletion(self) -> InsertOutcome {
        debug_assert!(self.deleted.is_empty(), "a deletion's reactions were skipped");
        self.outcome
    }
}

/// The targets of a stored NIP-09 deletion: event ids, and `(kind, d)`
/// addresses.
#[derive(Debug, Default)]
pub(crate) struct Deleted {
    pub ids: Vec<[u8; 32]>,
    pub addresses: Vec<(u16, String)>,
}

impl Deleted {
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty() && self.addresses.is_empty()
    }
}

/// The key of the lock ([`Tx::lock`]) that serialises the storing of one
/// author's events in a community.
pub(crate) fn author_lock_key(community: &str, author: &PublicKey) -> String {
    format!("{community}:{}", author.to_hex())
}

/// Stores `event` inside `tx` under the NIP-01/09/40 rules. The caller
/// commits (or, on anything but `Stored`, may simply drop `tx`), and runs
/// what must follow a stored deletion ([`Inserted::deleted`]).
pub(crate) async fn insert(
    tx: &mut Tx<'_>,
    community: &str,
    event: &Event,
    raw: &str,
    channel: Option<&str>,
) -> Result<Inserted, StoreError> {
    // Every rule below is about one author's events: serialise per author.
    tx.lock(&author_lock_key(community, &event.pubkey)).await?;
    crate::faults::check_event(&event.content)?;
    let d_tag = replacement_key(event);
    if d_tag.is_none() {
        // The usual case, in one statement: stored unless it already is
        // or its author deleted it; which of the two only when neither
        // insert happened.
        if let Some((seq, tagged)) = insert_unless_known(tx, community, event, raw, channel).await? {
            return finish_insert(tx, community, event, seq, tagged).await;
        }
    }
    if let Some(refused) = known_or_deleted(tx, community, event, d_tag.as_deref()).await? {
        return Ok(Inserted::not_stored(refused));
    }
    if let Some(d) = &d_tag {
        if let Some(refused) = replace_older(tx, community, event, d).await? {
            return Ok(Inserted::not_stored(refused));
        }
    }
    let seq = insert_row(tx, community, event, raw, d_tag, channel).await?;
    finish_insert(tx, community, event, seq, false).await
}

/// Why the event is not stored, if it is already stored or its author
/// deleted it (NIP-09: an event its author deleted stays deleted; by
/// address, every version up to the deletion's time). One round trip.
async fn known_or_deleted(
    tx: &mut Tx<'_>,
    community: &str,
    event: &Event,
    d_tag: Option<&str>,
) -> Result<Option<InsertOutcome>, StoreError> {
    let address = d_tag.map(|d| address_key(event.kind.as_u16(), d));
    let checks = Q::new(
        "SELECT EXISTS (SELECT 1 FROM events WHERE community_id = $1 AND created_at = $2 AND id = $3) AS stored, \
         EXISTS (SELECT 1 FROM deletions WHERE community_id = $1 AND pubkey = $4 \
         AND (target = $5 OR (target = $6 AND deleted_until >= $2))) AS deleted",
    )
    .bind(community)
    .bind(created_at_of(event))
    .bind(event.id.to_bytes())
    .bind(event.pubkey.to_bytes())
    .bind(event.id.to_hex())
    .bind(address.unwrap_or_default());
    let row = tx
        .one(checks)
        .await?
        .ok_or_else(|| StoreError::Corrupt("no row from checks".into()))?;
    if row.bool("stored")? {
        return Ok(Some(InsertOutcome::Duplicate));
    }
    if row.bool("deleted")? {
        let why = "blocked: this event was deleted by its author".into();
        return Ok(Some(InsertOutcome::Rejected(why)));
    }
    Ok(None)
}

/// Replaceable and addressable kinds keep only the newest version (ties:
/// the lowest id): refuses `event` if a newer one is stored, else removes
/// the older ones (a replaced workflow definition is kept, marked
/// superseded: runs pin their revision and fetch it by id).
async fn replace_older(
    tx: &mut Tx<'_>,
    community: &str,
    event: &Event,
    d_tag: &str,
) -> Result<Option<InsertOutcome>, StoreError> {
    let (id, created_at) = (event.id.to_bytes(), created_at_of(event));
    let versions = tx
        .all(
            Q::new(
                "SELECT id, created_at FROM events \
                 WHERE community_id = $1 AND pubkey = $2 AND kind = $3 AND d_tag = $4 AND superseded = FALSE",
            )
            .bind(community)
            .bind(event.pubkey.to_bytes())
            .bind(i64::from(event.kind.as_u16()))
            .bind(d_tag),
        )
        .await?;
    for v in &versions {
        let (old_id, old_created) = (v.id32("id")?, v.int("created_at")?);
        if old_created > created_at || (old_created == created_at && old_id < id) {
            let why = "duplicate: a newer version of this replaceable event is stored".into();
            return Ok(Some(InsertOutcome::Rejected(why)));
        }
    }
    let sql = if event.kind.as_u16() == protocol::workflow::DEFINITION_KIND {
        "UPDATE events SET superseded = TRUE WHERE community_id = $1 AND created_at = $2 AND id = $3"
    } else {
        "DELETE FROM events WHERE community_id = $1 AND created_at = $2 AND id = $3"
    };
    for v in versions {
        let q = Q::new(sql)
            .bind(community)
            .bind(v.int("created_at")?)
            .bind(v.id32("id")?);
        tx.exec(q).await?;
    }
    Ok(None)
}

/// Inserts the event's row; its `events.seq` on SQLite (the tag index's
/// key), `None` on PostgreSQL.
async fn insert_row(
    tx: &mut Tx<'_>,
    community: &str,
    event: &Event,
    raw: &str,
    d_tag: Option<String>,
    channel: Option<&str>,
) -> Result<Option<i64>, StoreError> {
    let mut insert = Q::new(
        "INSERT INTO events (community_id, created_at, id, pubkey, kind, d_tag, expires_at, channel, raw) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
    )
    .bind(community)
    .bind(created_at_of(event))
    .bind(event.id.to_bytes())
    .bind(event.pubkey.to_bytes())
    .bind(i64::from(event.kind.as_u16()))
    .bind(d_tag)
    .bind(expiration(event))
    .bind(channel.map(str::to_string))
    .bind(raw);
    match tx.dialect() {
        Dialect::Sqlite => {
            insert.push(" RETURNING seq");
            let row = tx
                .one(insert)
                .await?
                .ok_or_else(|| StoreError::Corrupt("no seq returned by insert".into()))?;
            Ok(Some(row.int("seq")?))
        }
        Dialect::Postgres => {
            tx.exec(insert).await?;
            Ok(None)
        }
    }
}

/// The event's tag rows (unless `tagged`: the insert wrote them) and, for
/// a deletion, its effect: what follows the row's insert (`seq`: its
/// `events.seq` on SQLite).
async fn finish_insert(
    tx: &mut Tx<'_>,
    community: &str,
    event: &Event,
    seq: Option<i64>,
    tagged: bool,
) -> Result<Inserted, StoreError> {
    if !tagged {
        let tags = indexed_tags(event);
        let rows: Vec<TagRow<'_>> = TagRow::of(event, seq, &tags).collect();
        insert_tags(tx, community, &rows).await?;
    }
    if let Some(seq) = seq {
        index_words(tx, &[(seq, event.content.as_str())]).await?;
    }

    let mut deleted = Deleted::default();
    if event.kind.as_u16() == protocol::kinds::DELETION {
        deleted = apply_deletion(tx, community, event).await?;
    }
    Ok(Inserted {
        outcome: InsertOutcome::Stored,
        deleted,
    })
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

/// Deletes what a NIP-09 deletion names (its author's events only) and
/// records it, so that the targets stay deleted; returns what it named.
async fn apply_deletion(tx: &mut Tx<'_>, community: &str, event: &Event) -> Result<Deleted, StoreError> {
    let (pubkey, created_at) = (event.pubkey.to_bytes(), created_at_of(event));
    let targets = deletion_targets(event);
    let mut deleted = Deleted::default();
    for target in targets.ids {
        deleted.ids.push(target);
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
        deleted.addresses.push((k, d.clone()));
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
    Ok(deleted)
}

/// An event's `created_at` as stored (a time past `i64::MAX` seconds,
/// which the relay's limits refuse anyway, saturates).
/// An event id written as 64 hex characters (a tag's value), as stored.
pub(crate) fn id_of_hex(s: &str) -> Option<[u8; 32]> {
    let mut out = [0u8; 32];
    hex::decode_to_slice(s, &mut out).ok()?;
    Some(out)
}

pub(crate) fn created_at_of(event: &Event) -> i64 {
    i64::try_from(event.created_at.as_secs()).unwrap_or(i64::MAX)
}

/// One row of the tag index.
pub(crate) struct TagRow<'a> {
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
    pub(crate) fn of(
        event: &Event,
        seq: Option<i64>,
        tags: &'a [(String, String)],
    ) -> impl Iterator<Item = TagRow<'a>> {
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

/// SQLite: the stored events' words into the full-text index
/// (`event_search`, NIP-50), each by its `events.seq`, at the commit of
/// the transaction that stores them. Every statement that inserts into
/// `events` on SQLite is followed by this one (a trigger would give those
/// statements a statement journal: migration 0023); the index's delete
/// trigger removes the words with the event. PostgreSQL indexes the
/// stored JSON's content itself (an expression index).
///
/// The words wait in a temporary table of the writer's connection until
/// [`WORDS_AT_COMMIT`] moves them in one statement: FTS5 writes the words
/// it holds as a new index segment whenever a later statement of the
/// transaction opens a statement journal or savepoint, so a call batch
/// that indexed each call's reply at once wrote a segment a call (6.4 % of
/// the call writer's CPU, docs/performance.md). A savepoint rolled back
/// takes its words with it; an event deleted later in the transaction
/// leaves none (the move takes only the events still stored); a seq freed
/// and given again within it keeps the last event's words.
pub(crate) async fn index_words(tx: &mut Tx<'_>, rows: &[(i64, &str)]) -> Result<(), StoreError> {
    let d = tx.dialect();
    if d != Dialect::Sqlite || rows.is_empty() {
        return Ok(());
    }
    tx.exec(Q::new(
        "CREATE TEMP TABLE IF NOT EXISTS pending_words (seq INTEGER PRIMARY KEY, content TEXT NOT NULL)",
    ))
    .await?;
    for chunk in pieces(rows, MAX_WORD_ROWS) {
        let mut q = Q::new("INSERT OR REPLACE INTO temp.pending_words (seq, content) VALUES ");
        for (k, (seq, content)) in chunk.iter().enumerate() {
            d.push_values_row(&mut q.sql, k, 2);
            q = q.bind(*seq).bind(*content);
        }
        tx.exec(q).await?;
    }
    tx.before_commit(WORDS_AT_COMMIT);
    Ok(())
}

/// Moves the words [`index_words`] kept into the full-text index, for the
/// events still stored, in one statement; then empties the table. Written
/// as `EXISTS`, not a join: SQLite planned the join as a scan of `events`
/// probing the kept words (`EXPLAIN QUERY PLAN`), where this reads the
/// kept words and looks each event up by its seq.
const WORDS_AT_COMMIT: &str = "INSERT INTO event_search (rowid, content) \
     SELECT p.seq, p.content FROM temp.pending_words AS p \
     WHERE EXISTS (SELECT 1 FROM events AS e WHERE e.seq = p.seq); \
     DELETE FROM temp.pending_words;";

/// Events in one statement of [`index_words`] (2 binds a row).
const MAX_WORD_ROWS: usize = 256;

/// Inserts tag index rows in few statements ([`pieces`] of at most 512
/// rows of 6 binds each, well under both backends' bind limits). SQLite
/// keys them by the event's seq; PostgreSQL by its id, with the value's
/// hash it indexes.
pub(crate) async fn insert_tags(
    tx: &mut Tx<'_>,
    community: &str,
    rows: &[TagRow<'_>],
) -> Result<(), StoreError> {
    let d = tx.dialect();
    for chunk in pieces(rows, 512) {
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
