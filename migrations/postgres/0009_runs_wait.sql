-- Runs that wait (ask_agent, delay): status 'waiting' until wake_at, when
-- the engine looks at the run again; step_started_at is when its current
-- step began (a delay's end and a step's timeout count from it).
-- error_step names the step a failed run failed at.
ALTER TABLE workflow_runs DROP CONSTRAINT workflow_runs_status_check;
ALTER TABLE workflow_runs ADD CONSTRAINT workflow_runs_status_check
    CHECK (status IN ('running', 'waiting', 'completed', 'failed', 'cancelled'));
ALTER TABLE workflow_runs ADD COLUMN wake_at BIGINT;
ALTER TABLE workflow_runs ADD COLUMN step_started_at BIGINT;
ALTER TABLE workflow_runs ADD COLUMN error_step TEXT;
CREATE INDEX workflow_runs_waiting ON workflow_runs (community_id, wake_at) WHERE status = 'waiting';
-- A delivery of an ask_agent step: its end wakes the waiting run.
ALTER TABLE workflow_agent_deliveries ADD COLUMN awaited BOOLEAN NOT NULL DEFAULT FALSE;
-- A delivery of a waiting step ended: the engine looks at its run now
-- (and deletes the wake before it reads the step's rows). One row per
-- delivery, inserted by the transaction that ends it: finishes never
-- touch the run's row, so call writers side by side never wait on one
-- another for it (with an UPDATE of the run row there, two writers'
-- batches finishing rows of the same two runs in opposite orders wait
-- on each other in a cycle).
CREATE TABLE workflow_run_wakes (
    community_id TEXT NOT NULL,
    run_id       TEXT NOT NULL,
    delivery_id  TEXT NOT NULL,
    PRIMARY KEY (community_id, run_id, delivery_id)
);
