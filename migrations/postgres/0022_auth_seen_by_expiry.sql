-- NIP-98 auth events already accepted, keyed by when they may be
-- forgotten first (as SQLite's 0026): records of a batch land together
-- at the end of the key's tree instead of at random places of it, and the
-- purge of expired records reads the key's start, so the expiry index
-- goes. A replay is still found: the same auth event has the same
-- signature, so the same key and the same `expires_at`.
ALTER TABLE http_auth_seen DROP CONSTRAINT http_auth_seen_pkey;
ALTER TABLE http_auth_seen ADD PRIMARY KEY (expires_at, community_id, event_id);
DROP INDEX http_auth_seen_by_expiry;
