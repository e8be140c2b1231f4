-- Turns by conversation (docs/protocol.md, "Mentions"): a mention's row
-- names its conversation, the channel or the thread (`<channel>/<root
-- event id>`) its message replies in; '' for a workflow step's row. An
-- agent claims the pending rows of one conversation together, one
-- conversation at a time; this index finds a conversation's open rows.
ALTER TABLE workflow_agent_deliveries ADD COLUMN conversation TEXT NOT NULL DEFAULT '';
CREATE INDEX deliveries_conversation ON workflow_agent_deliveries
    (community_id, target_pubkey, conversation)
    WHERE conversation <> '' AND status IN ('pending', 'claimed');
