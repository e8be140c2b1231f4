-- no-transaction
-- The tag index is keyed by the event's row number instead of its id.
--
-- Measured (docs/performance.md): with `event_tags` keyed by (community,
-- event id, ...), every stored event inserted one row at a random place of
-- that tree (event ids are random), dirtying one more page per event: one
-- more 4 KiB WAL frame per event, written again at checkpoint. Keyed by
-- `event_seq`, which grows with every insert, the rows of a batch land
-- together at the end of the tree.
--
-- `events.seq` is an INTEGER PRIMARY KEY (an alias of the rowid) so that it
-- never changes, not even under VACUUM (a plain rowid may be renumbered),
-- and can be referenced by a foreign key. Existing rows keep their rowid as
-- their seq.
--
-- Same procedure as 0004 (SQLite's table rebuild, foreign keys off around
-- one transaction; reruns cleanly if the process dies before sqlx records
-- the migration).
PRAGMA foreign_keys = OFF;

BEGIN;

DROP TABLE IF EXISTS events_new;
DROP TABLE IF EXISTS event_tags_new;

CREATE TABLE events_new (
    -- Insertion order; what the tag index refers to.
    seq          INTEGER PRIMARY KEY,
    community_id TEXT    NOT NULL,
    id           BLOB    NOT NULL,
    pubkey       BLOB    NOT NULL,
    created_at   INTEGER NOT NULL,
    kind         INTEGER NOT NULL,
    -- '' for replaceable kinds, the d tag for addressable ones, NULL otherwise.
    d_tag        TEXT,
    -- NIP-40 expiration (unix seconds) or NULL.
    expires_at   INTEGER,
    raw          TEXT    NOT NULL,
    -- The NIP-29 channel (h tag) of a channel event.
    channel      TEXT,
    -- A replaced workflow definition kept for runs pinned to it.
    superseded   BOOLEAN NOT NULL DEFAULT FALSE,
    -- The key other tables (deliveries, workflow records) reference.
    UNIQUE (community_id, id)
);

INSERT INTO events_new (seq, community_id, id, pubkey, created_at, kind, d_tag, expires_at, raw, channel, superseded)
SELECT rowid, community_id, id, pubkey, created_at, kind, d_tag, expires_at, raw, channel, superseded
FROM events ORDER BY rowid;

-- Single-letter tags (first value), for #x filters. PostgreSQL keeps its
-- own layout (partitioned by time, hashed values); here no value hash.
-- The key's columns come first: SQLite before 3.41 (the sqlite3 shell of
-- older distributions) reports false NULLs from PRAGMA integrity_check on a
-- WITHOUT ROWID table whose key is not its leading columns.
CREATE TABLE event_tags_new (
    event_seq        INTEGER NOT NULL REFERENCES events (seq) ON DELETE CASCADE,
    name             TEXT    NOT NULL,
    value            TEXT    NOT NULL,
    community_id     TEXT    NOT NULL,
    event_created_at INTEGER NOT NULL,
    event_id         BLOB    NOT NULL,
    PRIMARY KEY (event_seq, name, value)
) WITHOUT ROWID;

INSERT INTO event_tags_new (event_seq, name, value, community_id, event_created_at, event_id)
SELECT e.rowid, t.name, t.value, t.community_id, t.event_created_at, t.event_id
FROM event_tags t JOIN events e ON e.community_id = t.community_id AND e.id = t.event_id
ORDER BY e.rowid;

DROP TABLE event_tags;
DROP TABLE events;
ALTER TABLE events_new RENAME TO events;
ALTER TABLE event_tags_new RENAME TO event_tags;

-- The indexes end with `id`: queries answer newest first, ties by lowest id.
CREATE INDEX events_by_time ON events (community_id, created_at DESC, id);
CREATE INDEX events_by_author ON events (community_id, pubkey, created_at DESC, id);
CREATE INDEX events_by_kind ON events (community_id, kind, created_at DESC, id);
CREATE INDEX events_by_address ON events (community_id, pubkey, kind, d_tag) WHERE d_tag IS NOT NULL;
CREATE INDEX events_by_expiry ON events (expires_at) WHERE expires_at IS NOT NULL;
CREATE INDEX events_by_channel ON events (community_id, channel, created_at DESC, id) WHERE channel IS NOT NULL;
CREATE INDEX event_tags_by_value ON event_tags (community_id, name, value, event_created_at DESC, event_id);

COMMIT;

PRAGMA foreign_keys = ON;
