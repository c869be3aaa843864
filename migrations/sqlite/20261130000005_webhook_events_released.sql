-- Claims given back (released, or left by a crash) and never finished: few, and what the
-- dedupe prune looks for by receipt time beside the old processed rows (which have
-- their own index) — so a prune pass does not read the table's history.
CREATE INDEX IF NOT EXISTS webhook_events_released ON webhook_events (received_at)
    WHERE processed_at IS NULL AND next_attempt_at IS NULL;
