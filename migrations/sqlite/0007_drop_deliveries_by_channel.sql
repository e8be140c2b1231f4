-- Only the cancellation of a deleted channel's deliveries read this index,
-- while every insert and every claim wrote it. The cancellations now test
-- `status = 'pending' OR status = 'claimed'`, which each partial index on
-- the status can serve. (On PostgreSQL the index also misled the
-- lapsed-lease sweep: migrations/postgres/0005.)
DROP INDEX deliveries_by_channel;
