-- The inbox's processed rows, counted as they come and go, so `counts` never reads the
-- table's history. Triggers log +1 or -1 here with every change of a row into or out of
-- that state, in the same transaction, whichever statement makes it; `counts` sums the
-- log and folds it into one row now and then. A log rather than a counter row: many
-- changes to one row in one transaction (a requeue of a million rows) each walk the
-- row's versions, and concurrent workers would queue on it.
CREATE TABLE IF NOT EXISTS webhook_counts (delta BIGINT NOT NULL);

INSERT INTO webhook_counts (delta)
SELECT count(*) FROM webhook_events
WHERE next_attempt_at IS NOT NULL AND processed_at IS NOT NULL;

-- TG_ARGV[0]: what the row adds to the count.
CREATE OR REPLACE FUNCTION webhook_counts_log() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO webhook_counts (delta) VALUES (TG_ARGV[0]::bigint);
    RETURN NULL;
END $$;

-- The WHEN clauses are checked without calling the function: claims, renewals and
-- retries, which never change the count, cost nothing here.
CREATE TRIGGER webhook_counts_inserted AFTER INSERT ON webhook_events FOR EACH ROW
    WHEN (NEW.next_attempt_at IS NOT NULL AND NEW.processed_at IS NOT NULL)
    EXECUTE FUNCTION webhook_counts_log('1');

CREATE TRIGGER webhook_counts_processed
    AFTER UPDATE OF processed_at, next_attempt_at ON webhook_events FOR EACH ROW
    WHEN (NOT (OLD.next_attempt_at IS NOT NULL AND OLD.processed_at IS NOT NULL)
          AND NEW.next_attempt_at IS NOT NULL AND NEW.processed_at IS NOT NULL)
    EXECUTE FUNCTION webhook_counts_log('1');

CREATE TRIGGER webhook_counts_unprocessed
    AFTER UPDATE OF processed_at, next_attempt_at ON webhook_events FOR EACH ROW
    WHEN (OLD.next_attempt_at IS NOT NULL AND OLD.processed_at IS NOT NULL
          AND NOT (NEW.next_attempt_at IS NOT NULL AND NEW.processed_at IS NOT NULL))
    EXECUTE FUNCTION webhook_counts_log('-1');

CREATE TRIGGER webhook_counts_deleted AFTER DELETE ON webhook_events FOR EACH ROW
    WHEN (OLD.next_attempt_at IS NOT NULL AND OLD.processed_at IS NOT NULL)
    EXECUTE FUNCTION webhook_counts_log('-1');
