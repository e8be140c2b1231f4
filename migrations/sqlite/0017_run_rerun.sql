-- A run may be a rerun of an ended run from the step it ended at
-- (NIP-86 `rerunrun`): its cause is ('rerun', <origin run id>), so the
-- unique (community, workflow, cause) makes a rerun once per origin.
-- SQLite cannot change a CHECK in place: the table is built again, every
-- column and index as before (nothing references it).
CREATE TABLE workflow_runs_v2 (
    community_id        TEXT    NOT NULL,
    id                  TEXT    NOT NULL,
    workflow_id         TEXT    NOT NULL,
    definition_event_id BLOB    NOT NULL,
    channel             TEXT    NOT NULL,
    owner               BLOB    NOT NULL,
    cause_type          TEXT    NOT NULL CHECK (cause_type IN ('event', 'webhook', 'schedule', 'manual', 'rerun')),
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
    cause_id, status, current_step, trigger_context, trace, error, created_at, updated_at, error_code,
    wake_at, step_started_at, error_step)
    SELECT community_id, id, workflow_id, definition_event_id, channel, owner, cause_type, cause_id, status,
    current_step, trigger_context, trace, error, created_at, updated_at, error_code,
    wake_at, step_started_at, error_step FROM workflow_runs;
DROP TABLE workflow_runs;
ALTER TABLE workflow_runs_v2 RENAME TO workflow_runs;
CREATE INDEX workflow_runs_running ON workflow_runs (community_id, created_at) WHERE status = 'running';
CREATE INDEX workflow_runs_by_workflow ON workflow_runs (community_id, workflow_id, created_at DESC);
CREATE INDEX workflow_runs_waiting ON workflow_runs (community_id, wake_at) WHERE status = 'waiting';
