-- The time-ordered indexes of events end at `created_at`, without the
-- 32-byte id after it (every entry still ends with the row's `seq`).
--
-- Measured (docs/performance.md): at 256 connections the event writer is
-- the bottleneck, and its time goes to the index pages each batch
-- dirties and writes; these three indexes are written for every stored
-- event, and the id was more than half of each entry. REQs are still
-- answered newest first, ties by lowest id: a REQ page orders each run of
-- events of one second by id as it reads them (`persistence::page`),
-- where an `ORDER BY created_at DESC, id` over these indexes would copy
-- every row into a sorter.
DROP INDEX events_by_time;
DROP INDEX events_by_author;
DROP INDEX events_by_kind;
CREATE INDEX events_by_time ON events (community_id, created_at DESC);
CREATE INDEX events_by_author ON events (community_id, pubkey, created_at DESC);
CREATE INDEX events_by_kind ON events (community_id, kind, created_at DESC);
