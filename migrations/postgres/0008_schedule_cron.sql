-- A schedule trigger is either every interval_secs or a five-field cron
-- expression in an IANA time zone (NULL: UTC).
ALTER TABLE workflows ADD COLUMN cron TEXT;
ALTER TABLE workflows ADD COLUMN timezone TEXT;
