-- NIP-50 search: a GIN index of every stored event's content as text
-- search words (`simple` configuration: lower-cased, no stemming, no stop
-- words, the boundaries SQLite's FTS5 index and live matching use). An
-- expression index: no column to keep in step, and every partition gets
-- it. Queries must write the expression exactly as here
-- (`store::sql::PG_SEARCH_VECTOR`) to use it.
CREATE INDEX events_search ON events
    USING GIN (to_tsvector('simple'::regconfig, (raw::json) ->> 'content'));
