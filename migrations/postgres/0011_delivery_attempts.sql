-- Every attempt of a delivery is kept (PROTOCOL section 11): when it was
-- claimed, when and how it ended. A trigger writes them in the statement
-- that changes the delivery, whichever path that is (a claim, a finish,
-- the sweeper, a cancellation), so no path can forget one; an attempt
-- that goes back to pending (the agent's retry, a lapsed lease) is ended
-- by the relay with its cause, which the row itself does not keep.
CREATE TABLE delivery_attempts (
    community_id    TEXT    NOT NULL,
    delivery_id     TEXT    NOT NULL,
    attempt         BIGINT  NOT NULL,
    claimed_at      BIGINT  NOT NULL,
    finished_at     BIGINT,
    outcome         TEXT,
    failure_code    TEXT,
    failure_message TEXT,
    PRIMARY KEY (community_id, delivery_id, attempt)
);

CREATE FUNCTION delivery_attempts_follow() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.attempt > OLD.attempt THEN
        INSERT INTO delivery_attempts (community_id, delivery_id, attempt, claimed_at)
        VALUES (NEW.community_id, NEW.id, NEW.attempt, NEW.updated_at) ON CONFLICT DO NOTHING;
    END IF;
    IF OLD.status = 'claimed' AND NEW.status IN ('delivered', 'failed', 'expired', 'cancelled') THEN
        UPDATE delivery_attempts SET finished_at = NEW.updated_at, outcome = NEW.status,
            failure_code = NEW.failure_code, failure_message = left(NEW.failure_message, 1024)
        WHERE community_id = NEW.community_id AND delivery_id = NEW.id AND attempt = OLD.attempt
            AND finished_at IS NULL;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER deliveries_keep_attempts AFTER UPDATE ON workflow_agent_deliveries
    FOR EACH ROW WHEN (NEW.attempt IS DISTINCT FROM OLD.attempt OR NEW.status IS DISTINCT FROM OLD.status)
    EXECUTE FUNCTION delivery_attempts_follow();
