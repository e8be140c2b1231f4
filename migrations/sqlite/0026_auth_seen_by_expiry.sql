-- NIP-98 auth events already accepted, keyed by when they may be
-- forgotten first. Each claim and finish records one; keyed by its
-- random key first, every record dirtied a page at a random place of
-- the table's key index, besides the table and its expiry index: the
-- WAL of a paced delivery run held more frames of that index than of any
-- other (docs/performance.md). Keyed by `expires_at` (the auth event's
-- `created_at` plus twice the allowed skew), the records of a batch land
-- together at the end of one tree, and the purge of expired records is a
-- range at its start. A replay is still found: the same auth event has
-- the same signature, so the same key and the same `expires_at`.
CREATE TABLE http_auth_seen_new (
    community_id TEXT    NOT NULL,
    event_id     BLOB    NOT NULL,
    expires_at   INTEGER NOT NULL,
    PRIMARY KEY (expires_at, community_id, event_id)
) WITHOUT ROWID;
INSERT INTO http_auth_seen_new (community_id, event_id, expires_at)
    SELECT community_id, event_id, expires_at FROM http_auth_seen;
DROP TABLE http_auth_seen;
ALTER TABLE http_auth_seen_new RENAME TO http_auth_seen;
