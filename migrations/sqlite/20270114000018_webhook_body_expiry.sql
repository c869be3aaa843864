-- Body expiry (issue 34 step 4, docs/design/payload-protection.md §7), SQLite only (the
-- trigger is PostgreSQL's `PRUNE_DEAD`, in code): a dead route deleted
-- (`Inbox::prune_dead`) that leaves its event no route but tombstones deletes the body as
-- before, and now also records why (`body_state = 'expired'`), so a requeue or a backfill
-- leaves the event out and a route of it claimed later ends dead naming the reason.

DROP TRIGGER IF EXISTS webhook_route_attempts_left_inbox;

CREATE TRIGGER webhook_route_attempts_left_inbox
AFTER UPDATE OF next_attempt_at ON webhook_routes
WHEN OLD.next_attempt_at IS NOT NULL AND NEW.next_attempt_at IS NULL
BEGIN
    DELETE FROM webhook_attempts
    WHERE source = OLD.source AND event_id = OLD.event_id AND processor = OLD.processor;
    -- Before the body goes: set only where a body row is deleted (an erased one keeps
    -- its state).
    UPDATE webhook_events SET body_state = 'expired'
    WHERE source = OLD.source AND event_id = OLD.event_id AND body_state IS NULL
      AND EXISTS (SELECT 1 FROM webhook_bodies b
          WHERE b.source = OLD.source AND b.event_id = OLD.event_id)
      AND NOT EXISTS (SELECT 1 FROM webhook_routes r
          WHERE r.source = OLD.source AND r.event_id = OLD.event_id
            AND r.next_attempt_at IS NOT NULL);
    DELETE FROM webhook_bodies
    WHERE source = OLD.source AND event_id = OLD.event_id
      AND NOT EXISTS (SELECT 1 FROM webhook_routes r
          WHERE r.source = OLD.source AND r.event_id = OLD.event_id
            AND r.next_attempt_at IS NOT NULL);
END;
