-- NIP-50 search: a GIN index of every stored event's content as text
-- search words (`simple` configuration: lower-cased, no stemming, no stop
-- words, the boundaries SQLite's FTS5 index and live matching use). An
-- expression index: no column to keep in step, and every partition gets
-- it. Queries must write the expression exactly as here
-- (`store::sql::PG_SEARCH_VECTOR`) to use it.
--
-- `->>` turns a JSON string into text and fails on the escape `\u0000`
-- (text holds no NUL), which NIP-01 content may carry; each `\u0000` is
-- read as `\u0020` (a space) first. The swap keeps the JSON valid even
-- where those six characters follow an escaped backslash.
CREATE INDEX events_search ON events
    USING GIN (to_tsvector('simple'::regconfig, (replace(raw, '\u0000', '\u0020')::json) ->> 'content'));
