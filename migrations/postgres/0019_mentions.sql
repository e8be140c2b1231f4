-- Mentions as durable work (docs/protocol.md, "Mentions"): an agent's
-- owner turns them on for the whole community (channel '') or for one
-- channel; a kind 9 that p-tags the agent in such a channel, by a member
-- who is not a managed agent, makes a delivery row in the transaction
-- that stores it. A mention's row has no workflow: `source` says so,
-- `run_id` is the message id (the request key: the unique key on run,
-- step and target makes a replayed message create nothing), `step_id`
-- is 'mention' and `definition_event_id` the message id too.
CREATE TABLE agent_mentions (
    community_id TEXT   NOT NULL,
    agent_pubkey BYTEA  NOT NULL,
    channel      TEXT   NOT NULL,
    by_pubkey    BYTEA  NOT NULL,
    created_at   BIGINT NOT NULL,
    PRIMARY KEY (community_id, agent_pubkey, channel)
);
ALTER TABLE workflow_agent_deliveries ADD COLUMN source TEXT NOT NULL DEFAULT 'workflow';
