-- An `ask_agent` step may give its answers a shape (`output`, a JSON
-- Schema subset): each of its delivery rows keeps the schema (the finish
-- checks the reply against it, the claim hands it to the agent), which
-- revision of the step's message the row is on (0: the step's own), and,
-- between a refused answer and the revision the engine then posts, the
-- errors to quote back (the row is pending and not claimable meanwhile).
ALTER TABLE workflow_agent_deliveries ADD COLUMN output_schema TEXT;
ALTER TABLE workflow_agent_deliveries ADD COLUMN revision BIGINT NOT NULL DEFAULT 0;
ALTER TABLE workflow_agent_deliveries ADD COLUMN output_errors TEXT;
