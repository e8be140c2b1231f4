-- Foreign keys into events need an index on the referencing side: without
-- one, deleting an event (a replaced profile or list, a NIP-09 deletion, an
-- expiry) checked the references by reading every delivery and every step
-- message of the database.
CREATE INDEX deliveries_by_message ON workflow_agent_deliveries (community_id, message_event_id);
CREATE INDEX step_messages_by_event ON workflow_step_messages (community_id, event_id);

-- No statement looks deliveries up by run alone, and the unique key
-- (community_id, run_id, step_id, target_pubkey) would serve one that did;
-- every delivery row version was written into this index for nothing.
DROP INDEX deliveries_by_run;
