-- NIP-29 invite codes (kind 9009, by a channel's admins): a join request
-- (9021) carrying one enters a closed channel at once.
CREATE TABLE channel_invites (
    community_id TEXT    NOT NULL,
    channel_id   TEXT    NOT NULL,
    code         TEXT    NOT NULL,
    created_by   BLOB    NOT NULL,
    created_at   INTEGER NOT NULL,
    PRIMARY KEY (community_id, channel_id, code),
    FOREIGN KEY (community_id, channel_id) REFERENCES channels (community_id, id)
);
