-- Workflows, durable runs, and managed-agent deliveries.

-- Replaced revisions of a workflow definition (kind 30620) stay stored so that
-- a run pinned to one can still be fetched by id; they answer only filters
-- that name their id.
ALTER TABLE events ADD COLUMN superseded BOOLEAN NOT NULL DEFAULT FALSE;

CREATE TABLE workflows (
    community_id        TEXT    NOT NULL,
    id                  TEXT    NOT NULL,
    channel             TEXT    NOT NULL,
    owner               BLOB    NOT NULL,
    definition_event_id BLOB    NOT NULL,
    trigger             TEXT    NOT NULL,
    interval_secs       INTEGER,
    enabled             BOOLEAN NOT NULL,
    deleted             BOOLEAN NOT NULL DEFAULT FALSE,
    -- sha256 of the webhook secret, hex; NULL until the owner sets one.
    webhook_secret_hash TEXT,
    enabled_at          INTEGER NOT NULL,
    updated_at          INTEGER NOT NULL,
    PRIMARY KEY (community_id, id)
);
CREATE INDEX workflows_by_channel ON workflows (community_id, channel) WHERE enabled AND NOT deleted;
CREATE INDEX workflows_by_schedule ON workflows (trigger) WHERE trigger = 'schedule' AND enabled AND NOT deleted;

CREATE TABLE workflow_runs (
    community_id        TEXT    NOT NULL,
    id                  TEXT    NOT NULL,
    workflow_id         TEXT    NOT NULL,
    definition_event_id BLOB    NOT NULL,
    channel             TEXT    NOT NULL,
    owner               BLOB    NOT NULL,
    cause_type          TEXT    NOT NULL CHECK (cause_type IN ('event', 'webhook', 'schedule', 'manual')),
    cause_id            TEXT    NOT NULL,
    status              TEXT    NOT NULL CHECK (status IN ('running', 'completed', 'failed', 'cancelled')),
    current_step        INTEGER NOT NULL DEFAULT 0,
    -- Private trigger data (never copied into tags).
    trigger_context     TEXT    NOT NULL,
    -- JSON array of {"step", "output"} for completed steps.
    trace               TEXT    NOT NULL DEFAULT '[]',
    error               TEXT,
    created_at          INTEGER NOT NULL,
    updated_at          INTEGER NOT NULL,
    PRIMARY KEY (community_id, id),
    UNIQUE (community_id, workflow_id, cause_type, cause_id)
);
CREATE INDEX workflow_runs_running ON workflow_runs (community_id, created_at) WHERE status = 'running';
CREATE INDEX workflow_runs_by_workflow ON workflow_runs (community_id, workflow_id, created_at DESC);

-- The one message a step of a run produced (a replay reuses it).
CREATE TABLE workflow_step_messages (
    community_id     TEXT    NOT NULL,
    run_id           TEXT    NOT NULL,
    step_id          TEXT    NOT NULL,
    event_id         BLOB    NOT NULL,
    event_created_at INTEGER NOT NULL,
    PRIMARY KEY (community_id, run_id, step_id),
    FOREIGN KEY (community_id, event_id) REFERENCES events (community_id, id)
);

CREATE TABLE workflow_agent_deliveries (
    community_id        TEXT    NOT NULL,
    id                  TEXT    NOT NULL,
    workflow_id         TEXT    NOT NULL,
    run_id              TEXT    NOT NULL,
    step_id             TEXT    NOT NULL,
    target_pubkey       BLOB    NOT NULL,
    channel             TEXT    NOT NULL,
    definition_event_id BLOB    NOT NULL,
    message_event_id    BLOB    NOT NULL,
    message_created_at  INTEGER NOT NULL,
    status              TEXT    NOT NULL
        CHECK (status IN ('pending', 'claimed', 'delivered', 'failed', 'expired', 'cancelled')),
    attempt             INTEGER NOT NULL DEFAULT 0,
    max_attempts        INTEGER NOT NULL,
    claim_token         TEXT,
    claim_expires_at    INTEGER,
    records_operations  BOOLEAN NOT NULL DEFAULT FALSE,
    next_attempt_at     INTEGER NOT NULL,
    expires_at          INTEGER NOT NULL,
    trigger_context     TEXT    NOT NULL,
    execution_trace     TEXT    NOT NULL,
    failure_code        TEXT,
    failure_message     TEXT,
    reply_event_id      BLOB,
    -- The last successful finish (token and outcome), for idempotent replay.
    finished_token      TEXT,
    finished_outcome    TEXT,
    finished_status     TEXT,
    created_at          INTEGER NOT NULL,
    updated_at          INTEGER NOT NULL,
    PRIMARY KEY (community_id, id),
    UNIQUE (community_id, run_id, step_id, target_pubkey),
    FOREIGN KEY (community_id, message_event_id) REFERENCES events (community_id, id)
);
-- Exactly the due-work predicate of a claim.
CREATE INDEX deliveries_due ON workflow_agent_deliveries (community_id, target_pubkey, next_attempt_at)
    WHERE status = 'pending';
CREATE INDEX deliveries_by_target ON workflow_agent_deliveries (community_id, target_pubkey, created_at DESC);
CREATE INDEX deliveries_claimed ON workflow_agent_deliveries (claim_expires_at) WHERE status = 'claimed';
CREATE INDEX deliveries_pending_expiry ON workflow_agent_deliveries (expires_at) WHERE status = 'pending';
CREATE INDEX deliveries_by_channel ON workflow_agent_deliveries (community_id, channel)
    WHERE status IN ('pending', 'claimed');
CREATE INDEX deliveries_by_run ON workflow_agent_deliveries (community_id, run_id);

-- Tool calls recorded by an attempt, before it does them.
CREATE TABLE delivery_operations (
    community_id TEXT    NOT NULL,
    delivery_id  TEXT    NOT NULL,
    attempt      INTEGER NOT NULL,
    seq          INTEGER NOT NULL,
    name         TEXT    NOT NULL,
    effect       TEXT    NOT NULL CHECK (effect IN ('read', 'write')),
    created_at   INTEGER NOT NULL,
    PRIMARY KEY (community_id, delivery_id, attempt, seq),
    FOREIGN KEY (community_id, delivery_id) REFERENCES workflow_agent_deliveries (community_id, id)
);
