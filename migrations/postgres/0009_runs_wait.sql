-- Runs that wait (ask_agent, delay): status 'waiting' until wake_at, when
-- the engine looks at the run again; step_started_at is when its current
-- step began (a delay's end and a step's timeout count from it); wakes
-- counts the pokes by finishes of the step's deliveries, so the engine's
-- "still waiting" never overwrites a poke it did not see. error_step names
-- the step a failed run failed at.
ALTER TABLE workflow_runs DROP CONSTRAINT workflow_runs_status_check;
ALTER TABLE workflow_runs ADD CONSTRAINT workflow_runs_status_check
    CHECK (status IN ('running', 'waiting', 'completed', 'failed', 'cancelled'));
ALTER TABLE workflow_runs ADD COLUMN wake_at BIGINT;
ALTER TABLE workflow_runs ADD COLUMN step_started_at BIGINT;
ALTER TABLE workflow_runs ADD COLUMN wakes BIGINT NOT NULL DEFAULT 0;
ALTER TABLE workflow_runs ADD COLUMN error_step TEXT;
CREATE INDEX workflow_runs_waiting ON workflow_runs (community_id, wake_at) WHERE status = 'waiting';
-- A delivery of an ask_agent step: its end wakes the waiting run.
ALTER TABLE workflow_agent_deliveries ADD COLUMN awaited BOOLEAN NOT NULL DEFAULT FALSE;
