-- The inbox's hot queries read due rows only (the worker's claim, the lag): an index on
-- those alone stays the size of the queue, however much history the table keeps.
CREATE INDEX IF NOT EXISTS webhook_events_due ON webhook_events (next_attempt_at)
    WHERE next_attempt_at IS NOT NULL AND processed_at IS NULL AND dead_at IS NULL;
-- Dead rows are few; `prune_dead` and the dead count find them without a scan.
CREATE INDEX IF NOT EXISTS webhook_events_dead ON webhook_events (dead_at)
    WHERE dead_at IS NOT NULL;
