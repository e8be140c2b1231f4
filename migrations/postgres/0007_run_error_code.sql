-- A failed or cancelled run names why in a stable code (for example
-- message_too_large, owner_not_member) beside its human-readable error.
ALTER TABLE workflow_runs ADD COLUMN error_code TEXT;
