-- The inbox's processed rows, counted as they come and go, so `counts` never reads the
-- table's history. Triggers keep the one row's count with every change of a row into or
-- out of that state, in the same transaction, whichever statement makes it.
CREATE TABLE IF NOT EXISTS webhook_counts (processed INTEGER NOT NULL);

INSERT INTO webhook_counts (processed)
SELECT count(*) FROM webhook_events
WHERE next_attempt_at IS NOT NULL AND processed_at IS NOT NULL;

CREATE TRIGGER IF NOT EXISTS webhook_counts_inserted AFTER INSERT ON webhook_events
WHEN NEW.next_attempt_at IS NOT NULL AND NEW.processed_at IS NOT NULL
BEGIN
    UPDATE webhook_counts SET processed = processed + 1;
END;

CREATE TRIGGER IF NOT EXISTS webhook_counts_changed
AFTER UPDATE OF processed_at, next_attempt_at ON webhook_events
WHEN (OLD.next_attempt_at IS NOT NULL AND OLD.processed_at IS NOT NULL)
  IS NOT (NEW.next_attempt_at IS NOT NULL AND NEW.processed_at IS NOT NULL)
BEGIN
    UPDATE webhook_counts
    SET processed = processed
        + CASE WHEN NEW.next_attempt_at IS NOT NULL AND NEW.processed_at IS NOT NULL
               THEN 1 ELSE -1 END;
END;

CREATE TRIGGER IF NOT EXISTS webhook_counts_deleted AFTER DELETE ON webhook_events
WHEN OLD.next_attempt_at IS NOT NULL AND OLD.processed_at IS NOT NULL
BEGIN
    UPDATE webhook_counts SET processed = processed - 1;
END;
