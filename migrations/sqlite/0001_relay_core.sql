-- Relay core: communities, events, tag index, deletions.
-- Every key includes community_id: nothing is shared across communities.

CREATE TABLE communities (
    id             TEXT PRIMARY KEY,
    relay_url      TEXT NOT NULL,
    secret_key_hex TEXT NOT NULL,
    created_at     INTEGER NOT NULL
);

CREATE TABLE community_hosts (
    host         TEXT PRIMARY KEY,
    community_id TEXT NOT NULL REFERENCES communities (id)
);

CREATE TABLE events (
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
    PRIMARY KEY (community_id, id)
) WITHOUT ROWID;

CREATE INDEX events_by_time ON events (community_id, created_at DESC, id);
CREATE INDEX events_by_author ON events (community_id, pubkey, created_at DESC);
CREATE INDEX events_by_kind ON events (community_id, kind, created_at DESC);
CREATE INDEX events_by_address ON events (community_id, pubkey, kind, d_tag) WHERE d_tag IS NOT NULL;
CREATE INDEX events_by_expiry ON events (expires_at) WHERE expires_at IS NOT NULL;

-- Single-letter tags (first value), for #x filters. Values are capped by
-- limits.max_tag_value_bytes at ingest.
CREATE TABLE event_tags (
    community_id     TEXT    NOT NULL,
    event_created_at INTEGER NOT NULL,
    event_id         BLOB    NOT NULL,
    name             TEXT    NOT NULL,
    value            TEXT    NOT NULL,
    -- Same columns as on PostgreSQL (which indexes the hash); unused here.
    value_hash       BLOB    NOT NULL,
    PRIMARY KEY (community_id, event_id, name, value),
    FOREIGN KEY (community_id, event_id) REFERENCES events (community_id, id) ON DELETE CASCADE
) WITHOUT ROWID;

CREATE INDEX event_tags_by_value ON event_tags (community_id, name, value, event_created_at DESC);

-- NIP-09: what an author deleted, so that a deleted event sent again stays deleted.
-- target is the event id in hex, or 'a:<kind>:<d>' for an address, in which case
-- deleted_until is the newest deletion's created_at (versions up to it are deleted).
CREATE TABLE deletions (
    community_id  TEXT    NOT NULL,
    pubkey        BLOB    NOT NULL,
    target        TEXT    NOT NULL,
    deleted_until INTEGER NOT NULL,
    PRIMARY KEY (community_id, pubkey, target)
) WITHOUT ROWID;
