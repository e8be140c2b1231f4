-- Every attempt of a delivery is kept (PROTOCOL section 11): when it was
-- claimed, when and how it ended. Triggers write them in the statement
-- that changes the delivery, whichever path that is (a claim, a finish,
-- the sweeper, a cancellation), so no path can forget one; an attempt
-- that goes back to pending (the agent's retry, a lapsed lease) is ended
-- by the relay with its cause, which the row itself does not keep.
CREATE TABLE delivery_attempts (
    community_id    TEXT    NOT NULL,
    delivery_id     TEXT    NOT NULL,
    attempt         INTEGER NOT NULL,
    claimed_at      INTEGER NOT NULL,
    finished_at     INTEGER,
    outcome         TEXT,
    failure_code    TEXT,
    failure_message TEXT,
    PRIMARY KEY (community_id, delivery_id, attempt)
);

CREATE TRIGGER delivery_attempt_claimed AFTER UPDATE OF attempt ON workflow_agent_deliveries
    WHEN NEW.attempt > OLD.attempt
BEGIN
    INSERT OR IGNORE INTO delivery_attempts (community_id, delivery_id, attempt, claimed_at)
    VALUES (NEW.community_id, NEW.id, NEW.attempt, NEW.updated_at);
END;

CREATE TRIGGER delivery_attempt_ended AFTER UPDATE OF status ON workflow_agent_deliveries
    WHEN OLD.status = 'claimed' AND NEW.status IN ('delivered', 'failed', 'expired', 'cancelled')
BEGIN
    UPDATE delivery_attempts SET finished_at = NEW.updated_at, outcome = NEW.status,
        failure_code = NEW.failure_code, failure_message = substr(NEW.failure_message, 1, 1024)
    WHERE community_id = NEW.community_id AND delivery_id = NEW.id AND attempt = OLD.attempt
        AND finished_at IS NULL;
END;
