-- A run may be a rerun of an ended run from the step it ended at
-- (NIP-86 `rerunrun`): its cause is ('rerun', <origin run id>), so the
-- unique (community, workflow, cause) makes a rerun once per origin.
ALTER TABLE workflow_runs DROP CONSTRAINT workflow_runs_cause_type_check;
ALTER TABLE workflow_runs ADD CONSTRAINT workflow_runs_cause_type_check
    CHECK (cause_type IN ('event', 'webhook', 'schedule', 'manual', 'rerun'));
