-- Only the cancellation of a deleted channel's deliveries read this index,
-- while every insert and every claim wrote it. Worse, its predicate
-- (pending or claimed) is implied by both sweeps' conditions: statistics
-- gathered while no delivery was pending or claimed made it look empty, and
-- the lapsed-lease sweep then read every pending row through it, each
-- second. The cancellations now read the pending and claimed partial indexes
-- (`status = 'pending' OR status = 'claimed'`, a bitmap OR).
DROP INDEX deliveries_by_channel;
