-- Management (NIP-86, PROTOCOL section 11). The community's lists: banned
-- pubkeys, allowed pubkeys and banned events, each entry with who put it
-- there, when and why. Relay processes cache them and forget the cache
-- when the relay's notice of a change reaches them.
CREATE TABLE moderation (
    community_id    TEXT    NOT NULL,
    list            TEXT    NOT NULL,
    value           BLOB    NOT NULL,
    reason          TEXT    NOT NULL,
    actor           BLOB    NOT NULL,
    created_at      INTEGER NOT NULL,
    PRIMARY KEY (community_id, list, value)
);

-- A community's NIP-11 name and description as its admins set them
-- (changerelayname, changerelaydescription); unset, the configured ones.
CREATE TABLE community_info (
    community_id    TEXT    PRIMARY KEY,
    name            TEXT,
    description     TEXT,
    updated_at      INTEGER NOT NULL
);

-- pauseworkflow: no new runs, open work held until resumeworkflow
-- (unlike enabled = FALSE, which cancels open work).
ALTER TABLE workflows ADD COLUMN paused BOOLEAN NOT NULL DEFAULT FALSE;
