-- The deadline of an approval request (unix seconds, the step's start plus
-- its timeout): a reaction decides the request only before it, in the
-- transaction that stores the reaction. Requests recorded before this
-- column existed have none, and are decided by the engine's pass alone.
ALTER TABLE workflow_approvals ADD COLUMN deadline BIGINT;
