-- Relay core on PostgreSQL: communities, time-partitioned events, tag index,
-- deletions. Every key includes community_id.

CREATE TABLE communities (
    id             TEXT PRIMARY KEY,
    relay_url      TEXT NOT NULL,
    secret_key_hex TEXT NOT NULL,
    created_at     BIGINT NOT NULL DEFAULT extract(epoch FROM now())::bigint
);

CREATE TABLE community_hosts (
    host         TEXT PRIMARY KEY,
    community_id TEXT NOT NULL REFERENCES communities (id)
);

-- Partitioned by created_at (monthly partitions made ahead of time by the
-- relay, plus a default partition). The id determines created_at, so the
-- primary key (community_id, created_at, id) is unique per (community, id)
-- and other tables can hold a foreign key to one exact event.
CREATE TABLE events (
    community_id TEXT   NOT NULL,
    created_at   BIGINT NOT NULL,
    id           BYTEA  NOT NULL,
    pubkey       BYTEA  NOT NULL,
    kind         BIGINT NOT NULL,
    d_tag        TEXT,
    expires_at   BIGINT,
    raw          TEXT   NOT NULL,
    PRIMARY KEY (community_id, created_at, id)
) PARTITION BY RANGE (created_at);

CREATE TABLE events_default PARTITION OF events DEFAULT;

CREATE INDEX events_by_id ON events (community_id, id);
CREATE INDEX events_by_time ON events (community_id, created_at DESC, id);
CREATE INDEX events_by_author ON events (community_id, pubkey, created_at DESC);
CREATE INDEX events_by_kind ON events (community_id, kind, created_at DESC);
CREATE INDEX events_by_address ON events (community_id, pubkey, kind, d_tag) WHERE d_tag IS NOT NULL;
CREATE INDEX events_by_expiry ON events (expires_at) WHERE expires_at IS NOT NULL;

-- Single-letter tags (first value). Values are capped at ingest
-- (limits.max_tag_value_bytes) and indexed only through a 16-byte hash, so
-- no value can ever exceed a btree row limit.
CREATE TABLE event_tags (
    community_id     TEXT   NOT NULL,
    event_created_at BIGINT NOT NULL,
    event_id         BYTEA  NOT NULL,
    name             TEXT   NOT NULL,
    value            TEXT   NOT NULL,
    value_hash       BYTEA  NOT NULL,
    PRIMARY KEY (community_id, event_id, name, value_hash),
    FOREIGN KEY (community_id, event_created_at, event_id)
        REFERENCES events (community_id, created_at, id) ON DELETE CASCADE
);

CREATE INDEX event_tags_by_value ON event_tags (community_id, name, value_hash, event_created_at DESC, event_id);

CREATE TABLE deletions (
    community_id  TEXT   NOT NULL,
    pubkey        BYTEA  NOT NULL,
    target        TEXT   NOT NULL,
    deleted_until BIGINT NOT NULL,
    PRIMARY KEY (community_id, pubkey, target)
);

-- Live fan-out between relay processes travels by NOTIFY; an event too large
-- for a NOTIFY payload is parked here for a minute and sent by reference.
CREATE TABLE fanout_spill (
    seq          BIGSERIAL PRIMARY KEY,
    community_id TEXT   NOT NULL,
    raw          TEXT   NOT NULL,
    created_at   BIGINT NOT NULL DEFAULT extract(epoch FROM now())::bigint
);
