-- NIP-50 search: a full-text index of every stored event's content.
--
-- Contentless (the text lives only in `events.raw`; the index keeps its
-- words), with deletes allowed so that an event's words leave with it.
-- `unicode61` without diacritic removal splits words on the boundaries
-- PostgreSQL's `simple` configuration and live matching
-- (`protocol::search`) use, so both backends and live subscriptions agree.
-- Triggers keep it whole for every way an event is stored or removed
-- (client events, relay-signed ones, NIP-09, replacement, expiry).
CREATE VIRTUAL TABLE event_search USING fts5(
    content,
    content = '',
    contentless_delete = 1,
    tokenize = 'unicode61 remove_diacritics 0'
);

INSERT INTO event_search (rowid, content)
SELECT seq, json_extract(raw, '$.content') FROM events;

CREATE TRIGGER events_search_insert AFTER INSERT ON events BEGIN
    INSERT INTO event_search (rowid, content) VALUES (new.seq, json_extract(new.raw, '$.content'));
END;

CREATE TRIGGER events_search_delete AFTER DELETE ON events BEGIN
    DELETE FROM event_search WHERE rowid = old.seq;
END;
