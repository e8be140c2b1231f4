-- no-transaction
-- `events` becomes a rowid table: new rows append at the end of the table's
-- B-tree instead of landing at random places of a WITHOUT ROWID tree keyed
-- by the event id (whose pages, holding the raw JSON, split constantly), and
-- every secondary index stores an 8-byte rowid instead of the key
-- (community id + 32-byte event id). Measured on the bench machine: the
-- ingest writer's cost per event fell accordingly (docs/performance.md).
--
-- SQLite's table rebuild (https://www.sqlite.org/lang_altertable.html,
-- "making other kinds of table schema changes"): foreign keys off (other
-- tables reference events; with them on, DROP TABLE would cascade), one
-- transaction for the copy, then foreign keys on again. Without a
-- transaction around the whole file, because PRAGMA foreign_keys is a no-op
-- inside one; if the process dies after the COMMIT and before sqlx records
-- the migration, the rebuild simply runs again.
PRAGMA foreign_keys = OFF;

BEGIN;

DROP TABLE IF EXISTS events_new;

CREATE TABLE events_new (
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
    -- The key every other table references.
    UNIQUE (community_id, id)
);

INSERT INTO events_new (community_id, id, pubkey, created_at, kind, d_tag, expires_at, raw, channel, superseded)
SELECT community_id, id, pubkey, created_at, kind, d_tag, expires_at, raw, channel, superseded
FROM events ORDER BY created_at, id;

DROP TABLE events;
-- The indexes end with `id`: queries answer newest first, ties by lowest id
-- (the WITHOUT ROWID table's indexes carried the id implicitly).
ALTER TABLE events_new RENAME TO events;

CREATE INDEX events_by_time ON events (community_id, created_at DESC, id);
CREATE INDEX events_by_author ON events (community_id, pubkey, created_at DESC, id);
CREATE INDEX events_by_kind ON events (community_id, kind, created_at DESC, id);
CREATE INDEX events_by_address ON events (community_id, pubkey, kind, d_tag) WHERE d_tag IS NOT NULL;
CREATE INDEX events_by_expiry ON events (expires_at) WHERE expires_at IS NOT NULL;
CREATE INDEX events_by_channel ON events (community_id, channel, created_at DESC, id) WHERE channel IS NOT NULL;

COMMIT;

PRAGMA foreign_keys = ON;
