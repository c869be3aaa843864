-- What an operator lists: the dead rows, newest or oldest first, and the failing ones —
-- queued (or being retried) after at least one failed attempt. Each is read a page at a
-- time from an index on those rows alone, in the listing's order (the time, then the
-- key that breaks ties in time), so a page costs its own size however long the queue
-- or the history; rows that succeed the first time are in neither.
--
-- The dead rows' index gains the key: `prune_dead` and the dead count read it as before.
DROP INDEX IF EXISTS webhook_events_dead;
CREATE INDEX IF NOT EXISTS webhook_events_dead ON webhook_events (dead_at, source, event_id)
    WHERE dead_at IS NOT NULL;

CREATE INDEX IF NOT EXISTS webhook_events_failing
    ON webhook_events (received_at, source, event_id)
    WHERE next_attempt_at IS NOT NULL AND processed_at IS NULL AND dead_at IS NULL
      AND processing_error IS NOT NULL;
