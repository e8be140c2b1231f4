-- A mention's delivery rows go with their message: a kind 9 removed by
-- any path (its author's NIP-09 deletion, an admin's 9005, banevent, an
-- expiry purge) takes the rows it made as a mention, with their attempts
-- and operations, so that nothing of a deleted message is kept or acted
-- on (the rows copy its text; the agent's finish of one is refused 404).
-- A workflow step's row is not touched: its message is the relay's.
CREATE FUNCTION mention_message_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM delivery_operations o USING workflow_agent_deliveries d
    WHERE d.community_id = OLD.community_id AND d.message_event_id = OLD.id AND d.source = 'mention'
        AND o.community_id = d.community_id AND o.delivery_id = d.id;
    DELETE FROM delivery_attempts a USING workflow_agent_deliveries d
    WHERE d.community_id = OLD.community_id AND d.message_event_id = OLD.id AND d.source = 'mention'
        AND a.community_id = d.community_id AND a.delivery_id = d.id;
    DELETE FROM workflow_agent_deliveries
    WHERE community_id = OLD.community_id AND message_event_id = OLD.id AND source = 'mention';
    RETURN OLD;
END
$$;

CREATE TRIGGER events_take_their_mentions BEFORE DELETE ON events
    FOR EACH ROW WHEN (OLD.kind = 9) EXECUTE FUNCTION mention_message_deleted();
