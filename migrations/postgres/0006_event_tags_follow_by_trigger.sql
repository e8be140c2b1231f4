-- Tag rows follow their event by a trigger instead of a foreign key.
--
-- The key cost PostgreSQL more than the rows it guarded: one referential
-- check per tag row, a query against the partitioned events table that
-- also locks the event (FOR KEY SHARE, a WAL record of its own). In the
-- ingest benchmark that check was 70% of the tag insert's time and 40% of
-- all the database's execution time. The check can never fail: the relay
-- writes tag rows only in the transaction, and after the statement, that
-- inserted their event. What the key did that matters is ON DELETE
-- CASCADE, which this trigger keeps, for every way an event is deleted
-- (NIP-09, replacement, expiry, or by hand).
ALTER TABLE event_tags DROP CONSTRAINT event_tags_community_id_event_created_at_event_id_fkey;

CREATE FUNCTION event_tags_follow_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM event_tags WHERE community_id = OLD.community_id AND event_id = OLD.id;
    RETURN NULL;
END
$$;

CREATE TRIGGER events_take_their_tags AFTER DELETE ON events
    FOR EACH ROW EXECUTE FUNCTION event_tags_follow_event();
