//! What the inbox deletes: events whose routes are all finished, dead routes (each left
//! as a tombstone), and the kept events pruned by name; and the per-object index.

/// The index a per-object cap reads (see `object_index!` in [`super::super`]), on the
/// routes: a processor's unfinished routes of an object (tombstones are finished). Made by
/// the first worker with a cap, not by a migration.
pub(super) const OBJECT_INDEX: &str = "CREATE INDEX IF NOT EXISTS webhook_routes_by_object
    ON webhook_routes (processor, object_id)
    WHERE processed_at IS NULL AND dead_at IS NULL AND object_id IS NOT NULL";

/// Inbox events received before the cutoff (`?1`) whose every route was processed (or
/// deleted dead) before it, by receipt (`webhook_events_inbox`); their routes, body and
/// history go with them (the trigger `webhook_events_forgotten`). Kept events (no signed
/// time: only the key refuses a replay) are pruned by name only ([`PRUNE_KEPT`]).
pub(super) const PRUNE_EVENTS: &str = "
DELETE FROM webhook_events
WHERE kind = 'event' AND next_attempt_at IS NOT NULL AND received_at < ?1
  AND NOT EXISTS (SELECT 1 FROM webhook_routes r
      WHERE r.source = webhook_events.source AND r.event_id = webhook_events.event_id
        AND (r.processed_at IS NULL OR r.processed_at >= ?1))";

/// The keys dead rows deleted before fan-out's migration left (done, without a token, no
/// longer the inbox's), done before the cutoff (`?1`).
pub(super) const PRUNE_OLD_TOMBSTONES: &str = "
DELETE FROM webhook_events
WHERE kind = 'event' AND processed_at IS NOT NULL AND processed_at < ?1
  AND next_attempt_at IS NULL AND lock_token IS NULL";

/// [`PRUNE_EVENTS`] for the kept inbox events of source `?1`, by name (`PRUNE_ONCE` takes
/// the kept claims, and the keys kept rows deleted dead left): their routes finished
/// before `?2`.
pub(super) const PRUNE_KEPT: &str = "
DELETE FROM webhook_events
WHERE kind = 'kept' AND source = ?1 AND next_attempt_at IS NOT NULL AND received_at < ?2
  AND NOT EXISTS (SELECT 1 FROM webhook_routes r
      WHERE r.source = webhook_events.source AND r.event_id = webhook_events.event_id
        AND (r.processed_at IS NULL OR r.processed_at >= ?2))";

/// Dead routes deleted: each becomes a tombstone, done at `?4` (no longer queued: its
/// error and history go, and the event's body with its last route that was not one, its
/// `body_state` set to `expired` — the trigger `webhook_route_attempts_left_inbox`), so
/// the event's delivery posted again is a duplicate until the inbox's prune deletes the
/// event.
pub(super) const PRUNE_DEAD: &str = "
UPDATE webhook_routes SET next_attempt_at = NULL, processed_at = ?4, dead_at = NULL,
    processing_error = NULL, attempt_started_at = NULL, locked_until = NULL, lock_token = NULL
WHERE next_attempt_at IS NOT NULL AND dead_at IS NOT NULL AND dead_at < ?1
AND (?2 IS NULL OR source = ?2) AND (?3 IS NULL OR event_type = ?3)";
