-- Runs that wait (ask_agent, delay): status 'waiting' until wake_at, when
-- the engine looks at the run again; step_started_at is when its current
-- step began (a delay's end and a step's timeout count from it).
-- error_step names the step a failed run failed at. SQLite cannot change a CHECK in place:
-- the table is built again (nothing references it).
CREATE TABLE workflow_runs_v2 (
    community_id        TEXT    NOT NULL,
    id                  TEXT    NOT NULL,
    workflow_id         TEXT    NOT NULL,
    definition_event_id BLOB    NOT NULL,
    channel             TEXT    NOT NULL,
    owner               BLOB    NOT NULL,
    cause_type          TEXT    NOT NULL CHECK (cause_type IN ('event', 'webhook', 'schedule', 'manual')),
    cause_id            TEXT    NOT NULL,
    status              TEXT    NOT NULL
        CHECK (status IN ('running', 'waiting', 'completed', 'failed', 'cancelled')),
    current_step        INTEGER NOT NULL DEFAULT 0,
    trigger_context     TEXT    NOT NULL,
    trace               TEXT    NOT NULL DEFAULT '[]',
    error               TEXT,
    created_at          INTEGER NOT NULL,
    updated_at          INTEGER NOT NULL,
    error_code          TEXT,
    wake_at             INTEGER,
    step_started_at     INTEGER,
    error_step          TEXT,
    PRIMARY KEY (community_id, id),
    UNIQUE (community_id, workflow_id, cause_type, cause_id)
);
INSERT INTO workflow_runs_v2 (community_id, id, workflow_id, definition_event_id, channel, owner, cause_type,
    cause_id, status, current_step, trigger_context, trace, error, created_at, updated_at, error_code)
    SELECT community_id, id, workflow_id, definition_event_id, channel, owner, cause_type, cause_id, status,
    current_step, trigger_context, trace, error, created_at, updated_at, error_code FROM workflow_runs;
DROP TABLE workflow_runs;
ALTER TABLE workflow_runs_v2 RENAME TO workflow_runs;
CREATE INDEX workflow_runs_running ON workflow_runs (community_id, created_at) WHERE status = 'running';
CREATE INDEX workflow_runs_by_workflow ON workflow_runs (community_id, workflow_id, created_at DESC);
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
