-- Fair shares: a step's `priority` orders an agent's backlog (higher is
-- claimed first), and a workflow's `concurrency` caps its deliveries
-- claimed at once (NULL: no cap). Both are copied onto each delivery row
-- when the step makes it, so that a claim reads them from the row.
ALTER TABLE workflow_agent_deliveries ADD COLUMN priority BIGINT NOT NULL DEFAULT 0;
ALTER TABLE workflow_agent_deliveries ADD COLUMN concurrency BIGINT;
-- Exactly the due-work predicate of a claim, in the claim's order.
DROP INDEX deliveries_due;
CREATE INDEX deliveries_due ON workflow_agent_deliveries
    (community_id, target_pubkey, priority DESC, next_attempt_at)
    WHERE status = 'pending';
-- What the caps count: the claimed rows of one workflow (by its prefix)
-- and of one agent (the community's claimed rows, bounded by what its
-- agents hold).
CREATE INDEX deliveries_in_flight ON workflow_agent_deliveries
    (community_id, workflow_id, target_pubkey)
    WHERE status = 'claimed';
