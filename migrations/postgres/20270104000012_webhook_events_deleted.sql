-- Deleting dead rows keeps their keys: a dead row deleted becomes a done key (no longer
-- the inbox's: `next_attempt_at` NULL; `processed_at` when it was deleted; no token, no
-- body, headers or error), so the captured delivery posted again is a duplicate until the
-- retention has passed since (a kept event's key, until pruned by name), as a processed
-- event's. Its history goes with its inbox row, as when a row is deleted.
CREATE TRIGGER webhook_attempts_left_inbox
    AFTER UPDATE OF next_attempt_at ON webhook_events FOR EACH ROW
    WHEN (OLD.next_attempt_at IS NOT NULL AND NEW.next_attempt_at IS NULL)
    EXECUTE FUNCTION webhook_attempts_forget();
