-- The tag index ends at the event's time, without the 32-byte event id
-- after it (every entry still ends with the row's key, `event_seq`), as
-- 0024 did for the events' time-ordered indexes: one entry for every tag
-- of every stored event, written by the event writer. A REQ driven by a
-- tag orders each second's events by id as it reads them
-- (`persistence::page`).
DROP INDEX event_tags_by_value;
CREATE INDEX event_tags_by_value ON event_tags (community_id, name, value, event_created_at DESC);
