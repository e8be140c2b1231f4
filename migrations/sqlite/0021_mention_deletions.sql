-- A mention's delivery rows go with their message: a kind 9 removed by
-- any path (its author's NIP-09 deletion, an admin's 9005, banevent, an
-- expiry purge) takes the rows it made as a mention, with their attempts
-- and operations, so that nothing of a deleted message is kept or acted
-- on (the rows copy its text; the agent's finish of one is refused 404).
-- A workflow step's row is not touched: its message is the relay's.
CREATE TRIGGER events_take_their_mentions BEFORE DELETE ON events
WHEN OLD.kind = 9
BEGIN
    DELETE FROM delivery_operations WHERE community_id = OLD.community_id AND delivery_id IN
        (SELECT id FROM workflow_agent_deliveries WHERE community_id = OLD.community_id
         AND message_event_id = OLD.id AND source = 'mention');
    DELETE FROM delivery_attempts WHERE community_id = OLD.community_id AND delivery_id IN
        (SELECT id FROM workflow_agent_deliveries WHERE community_id = OLD.community_id
         AND message_event_id = OLD.id AND source = 'mention');
    DELETE FROM workflow_agent_deliveries WHERE community_id = OLD.community_id
        AND message_event_id = OLD.id AND source = 'mention';
END;
