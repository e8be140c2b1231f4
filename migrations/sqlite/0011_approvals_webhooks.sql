-- Workflows v2, part 2: approvals by people, outbound webhook calls and
-- the owners' secrets they sign with.

-- One approval request per (run, step): the relay's request message, who
-- may decide, and the decision. The first decision wins by an UPDATE that
-- requires decision IS NULL, in the transaction that stores the reaction
-- (or, at the step's deadline, in the engine's: 'timed_out'), so two
-- relay processes can never both decide.
CREATE TABLE workflow_approvals (
    community_id      TEXT    NOT NULL,
    request_event_id  BLOB    NOT NULL,
    run_id            TEXT    NOT NULL,
    step_id           TEXT    NOT NULL,
    channel           TEXT    NOT NULL,
    -- JSON array of hex pubkeys (the owner first).
    approvers         TEXT    NOT NULL,
    decision          TEXT CHECK (decision IN ('approved', 'denied', 'timed_out')),
    decided_by        BLOB,
    decision_event_id BLOB,
    decided_at        INTEGER,
    created_at        INTEGER NOT NULL,
    PRIMARY KEY (community_id, request_event_id),
    UNIQUE (community_id, run_id, step_id)
);

-- One outbound call per (run, step), recorded before it is sent: an
-- attempt left 'sending' past its deadline was interrupted (the process
-- died); it is sent again only when the step says retry.
CREATE TABLE workflow_webhook_calls (
    community_id  TEXT    NOT NULL,
    run_id        TEXT    NOT NULL,
    step_id       TEXT    NOT NULL,
    attempt       INTEGER NOT NULL,
    state         TEXT    NOT NULL CHECK (state IN ('sending', 'answered', 'failed', 'interrupted')),
    url           TEXT    NOT NULL,
    request_body  TEXT    NOT NULL,
    status        INTEGER,
    answer        TEXT,
    error_code    TEXT,
    error         TEXT,
    recorded_at   INTEGER NOT NULL,
    deadline      INTEGER NOT NULL,
    answered_at   INTEGER,
    PRIMARY KEY (community_id, run_id, step_id)
);

-- Owners' named secrets, sealed (XChaCha20-Poly1305) with the relay's
-- secrets key, which is never in the database: a backup alone reveals
-- none of them.
CREATE TABLE workflow_secrets (
    community_id  TEXT    NOT NULL,
    workflow_id   TEXT    NOT NULL,
    name          TEXT    NOT NULL,
    sealed        BLOB    NOT NULL,
    updated_at    INTEGER NOT NULL,
    PRIMARY KEY (community_id, workflow_id, name)
);
