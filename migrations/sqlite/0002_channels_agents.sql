-- Channels (NIP-29 groups named by the h tag), managed agents (NIP-OA),
-- and single-use NIP-98 HTTP auth events.

-- The channel an event belongs to (its h tag; the d tag of the relay-signed
-- 39000-39002), so that reads can hide deleted and private channels.
ALTER TABLE events ADD COLUMN channel TEXT;
CREATE INDEX events_by_channel ON events (community_id, channel, created_at DESC) WHERE channel IS NOT NULL;

CREATE TABLE channels (
    community_id TEXT    NOT NULL,
    id           TEXT    NOT NULL,
    creator      BLOB    NOT NULL,
    name         TEXT    NOT NULL DEFAULT '',
    about        TEXT    NOT NULL DEFAULT '',
    picture      TEXT    NOT NULL DEFAULT '',
    private      BOOLEAN NOT NULL DEFAULT FALSE,
    closed       BOOLEAN NOT NULL DEFAULT FALSE,
    deleted      BOOLEAN NOT NULL DEFAULT FALSE,
    created_at   INTEGER NOT NULL,
    -- created_at of the newest relay-signed 39000-39002 (kept strictly increasing).
    metadata_at  INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (community_id, id)
);

CREATE TABLE channel_members (
    community_id TEXT    NOT NULL,
    channel_id   TEXT    NOT NULL,
    pubkey       BLOB    NOT NULL,
    role         TEXT    NOT NULL CHECK (role IN ('admin', 'member')),
    added_at     INTEGER NOT NULL,
    PRIMARY KEY (community_id, channel_id, pubkey),
    FOREIGN KEY (community_id, channel_id) REFERENCES channels (community_id, id)
);
CREATE INDEX channel_members_by_pubkey ON channel_members (community_id, pubkey);

CREATE TABLE channel_join_requests (
    community_id TEXT    NOT NULL,
    channel_id   TEXT    NOT NULL,
    pubkey       BLOB    NOT NULL,
    requested_at INTEGER NOT NULL,
    PRIMARY KEY (community_id, channel_id, pubkey),
    FOREIGN KEY (community_id, channel_id) REFERENCES channels (community_id, id)
);

-- agent -> owner, recorded from the first valid NIP-OA attestation; immutable.
CREATE TABLE agents (
    community_id  TEXT    NOT NULL,
    pubkey        BLOB    NOT NULL,
    owner         BLOB    NOT NULL,
    conditions    TEXT    NOT NULL,
    attestation   TEXT    NOT NULL,
    registered_at INTEGER NOT NULL,
    PRIMARY KEY (community_id, pubkey)
);

-- NIP-98 auth events already accepted (each is accepted once).
CREATE TABLE http_auth_seen (
    community_id TEXT    NOT NULL,
    event_id     BLOB    NOT NULL,
    expires_at   INTEGER NOT NULL,
    PRIMARY KEY (community_id, event_id)
);
CREATE INDEX http_auth_seen_by_expiry ON http_auth_seen (expires_at);
