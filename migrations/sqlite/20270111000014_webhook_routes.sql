-- Fan-out's schema (issue 33, docs/design/fan-out.md §1–§2): an inbox event is three
-- things kept apart. `webhook_events` stays the key (source, id, type, object, livemode,
-- received_at, arrival, kind) and the dedupe claims' and `Once`'s rows, unchanged; an
-- inbox event keeps `next_attempt_at` set, at its accept time, as the marker "the
-- inbox's" (the claims' statements test it) and never moves it, its state columns NULL/0
-- and `processed_at` NULL. Its body and headers go to `webhook_bodies`, and its state to
-- `webhook_routes`: one row per (event, processor), what an inbox row held (attempts,
-- lease, token, next attempt, times, error), the event's immutable columns copied beside
-- it so the claim, its per-object cap, pauses and listings read one table. Every existing
-- inbox row becomes the event, its body and one route of the processor `default`, in
-- whatever state it was. A route whose `next_attempt_at` is NULL is a deleted dead one: a
-- tombstone (the event stays the key).
--
-- Order matters: the old triggers go first, so the rewrite of the rows fires nothing
-- (they would log one un-processed row per processed one and copy every processed
-- attempt into the history again); the new ones come after the copy.

DROP TRIGGER IF EXISTS webhook_counts_inserted;
DROP TRIGGER IF EXISTS webhook_counts_changed;
DROP TRIGGER IF EXISTS webhook_counts_deleted;
DROP TRIGGER IF EXISTS webhook_attempts_crashed;
DROP TRIGGER IF EXISTS webhook_attempts_requeued;
DROP TRIGGER IF EXISTS webhook_attempts_forgotten;
DROP TRIGGER IF EXISTS webhook_attempts_left_inbox;

CREATE TABLE webhook_bodies (
    source   TEXT NOT NULL,
    event_id TEXT NOT NULL,
    body     BLOB,
    headers  TEXT,
    PRIMARY KEY (source, event_id)
);

CREATE TABLE webhook_routes (
    source             TEXT    NOT NULL,
    event_id           TEXT    NOT NULL,
    processor          TEXT    NOT NULL,
    event_type         TEXT,
    object_id          TEXT,
    arrival            INTEGER,
    received_at        INTEGER NOT NULL,
    attempts           INTEGER NOT NULL DEFAULT 0,
    next_attempt_at    INTEGER,
    locked_until       INTEGER,
    lock_token         TEXT,
    attempt_started_at INTEGER,
    processed_at       INTEGER,
    processing_error   TEXT,
    dead_at            INTEGER,
    PRIMARY KEY (source, event_id, processor)
);

INSERT INTO webhook_bodies (source, event_id, body, headers)
SELECT source, event_id, body, headers FROM webhook_events
WHERE next_attempt_at IS NOT NULL AND kind <> 'once';

INSERT INTO webhook_routes
    (source, event_id, processor, event_type, object_id, arrival, received_at, attempts,
     next_attempt_at, locked_until, lock_token, attempt_started_at, processed_at,
     processing_error, dead_at)
SELECT source, event_id, 'default', event_type, object_id, arrival, received_at, attempts,
    next_attempt_at, locked_until, lock_token, attempt_started_at, processed_at,
    processing_error, dead_at
FROM webhook_events
WHERE next_attempt_at IS NOT NULL AND kind <> 'once';

-- The events keep their key, metadata and marker; claims, `Once` keys and the keys
-- deleted dead rows left (`next_attempt_at` NULL) are not touched.
UPDATE webhook_events
SET body = NULL, headers = NULL, attempts = 0, locked_until = NULL, lock_token = NULL,
    attempt_started_at = NULL, processed_at = NULL, processing_error = NULL, dead_at = NULL
WHERE next_attempt_at IS NOT NULL AND kind <> 'once';

-- The history is per route: every record so far is `default`'s.
ALTER TABLE webhook_attempts ADD COLUMN processor TEXT NOT NULL DEFAULT 'default';
DROP INDEX IF EXISTS webhook_attempts_event;
CREATE INDEX webhook_attempts_route
    ON webhook_attempts (source, event_id, processor, started_at);

-- Processed routes counted per processor, recomputed rather than carried over.
CREATE TABLE webhook_route_counts (
    processor TEXT    PRIMARY KEY,
    processed INTEGER NOT NULL
);
INSERT INTO webhook_route_counts (processor, processed)
SELECT 'default', count(*) FROM webhook_routes
WHERE next_attempt_at IS NOT NULL AND processed_at IS NOT NULL;
DROP TABLE webhook_counts;

-- The old state indexes: every inbox event would now match `webhook_events_due`.
DROP INDEX IF EXISTS webhook_events_due;
DROP INDEX IF EXISTS webhook_events_dead;
DROP INDEX IF EXISTS webhook_events_failing;
DROP INDEX IF EXISTS webhook_events_by_object;

-- The routes' hot queries, each on the rows it reads (as the old ones on webhook_events).
CREATE INDEX webhook_routes_due ON webhook_routes (processor, next_attempt_at)
    WHERE next_attempt_at IS NOT NULL AND processed_at IS NULL AND dead_at IS NULL;
CREATE INDEX webhook_routes_processed_at ON webhook_routes (processed_at)
    WHERE processed_at IS NOT NULL;
CREATE INDEX webhook_routes_dead ON webhook_routes (dead_at, source, event_id, processor)
    WHERE dead_at IS NOT NULL;
CREATE INDEX webhook_routes_dead_by ON webhook_routes (processor, dead_at, source, event_id)
    WHERE dead_at IS NOT NULL;
CREATE INDEX webhook_routes_failing
    ON webhook_routes (received_at, source, event_id, processor)
    WHERE next_attempt_at IS NOT NULL AND processed_at IS NULL AND dead_at IS NULL
      AND processing_error IS NOT NULL;
CREATE INDEX webhook_routes_failing_by
    ON webhook_routes (processor, received_at, source, event_id)
    WHERE next_attempt_at IS NOT NULL AND processed_at IS NULL AND dead_at IS NULL
      AND processing_error IS NOT NULL;
-- The inbox's events by receipt: the inbox's prune (and backfill's receipt window).
CREATE INDEX webhook_events_inbox ON webhook_events (received_at, source, event_id)
    WHERE next_attempt_at IS NOT NULL;

-- The processed count, kept by every change of a route into or out of that state. A
-- processor's row is made by its first route (one probe of the tiny table an accept).
CREATE TRIGGER webhook_route_counts_known AFTER INSERT ON webhook_routes
WHEN NOT EXISTS (SELECT 1 FROM webhook_route_counts WHERE processor = NEW.processor)
BEGIN
    INSERT INTO webhook_route_counts (processor, processed) VALUES (NEW.processor, 0);
END;

-- A route inserted processed (none is, but by hand) counts whichever of the two fires
-- first.
CREATE TRIGGER webhook_route_counts_inserted AFTER INSERT ON webhook_routes
WHEN NEW.next_attempt_at IS NOT NULL AND NEW.processed_at IS NOT NULL
BEGIN
    INSERT INTO webhook_route_counts (processor, processed) VALUES (NEW.processor, 1)
    ON CONFLICT (processor) DO UPDATE SET processed = processed + 1;
END;

CREATE TRIGGER webhook_route_counts_changed
AFTER UPDATE OF processed_at, next_attempt_at ON webhook_routes
WHEN (OLD.next_attempt_at IS NOT NULL AND OLD.processed_at IS NOT NULL)
  IS NOT (NEW.next_attempt_at IS NOT NULL AND NEW.processed_at IS NOT NULL)
BEGIN
    UPDATE webhook_route_counts
    SET processed = processed
        + CASE WHEN NEW.next_attempt_at IS NOT NULL AND NEW.processed_at IS NOT NULL
               THEN 1 ELSE -1 END
    WHERE processor = NEW.processor;
END;

CREATE TRIGGER webhook_route_counts_deleted AFTER DELETE ON webhook_routes
WHEN OLD.next_attempt_at IS NOT NULL AND OLD.processed_at IS NOT NULL
BEGIN
    UPDATE webhook_route_counts SET processed = processed - 1
    WHERE processor = OLD.processor;
END;

-- A claim that takes over a route whose attempt never finished records it as crashed
-- (as `webhook_attempts_crashed` did for a row).
CREATE TRIGGER webhook_route_attempts_crashed AFTER UPDATE OF attempts ON webhook_routes
WHEN OLD.lock_token IS NOT NULL AND OLD.attempt_started_at IS NOT NULL
  AND NEW.attempt_started_at IS NOT OLD.attempt_started_at
BEGIN
    INSERT INTO webhook_attempts
        (source, event_id, processor, attempt, started_at, finished_at, outcome)
    VALUES (OLD.source, OLD.event_id, OLD.processor, OLD.attempts, OLD.attempt_started_at,
            max(OLD.attempt_started_at, coalesce(OLD.locked_until, OLD.attempt_started_at)),
            'crashed');
END;

-- A requeue of a processed route keeps its processed attempt.
CREATE TRIGGER webhook_route_attempts_requeued AFTER UPDATE OF processed_at ON webhook_routes
WHEN OLD.processed_at IS NOT NULL AND NEW.processed_at IS NULL
  AND OLD.next_attempt_at IS NOT NULL AND OLD.attempt_started_at IS NOT NULL
BEGIN
    INSERT INTO webhook_attempts
        (source, event_id, processor, attempt, started_at, finished_at, outcome)
    VALUES (OLD.source, OLD.event_id, OLD.processor, OLD.attempts, OLD.attempt_started_at,
            max(OLD.processed_at, OLD.attempt_started_at), 'processed');
END;

-- A route's history goes with it.
CREATE TRIGGER webhook_route_attempts_forgotten AFTER DELETE ON webhook_routes
BEGIN
    DELETE FROM webhook_attempts
    WHERE source = OLD.source AND event_id = OLD.event_id AND processor = OLD.processor;
END;

-- A dead route deleted becomes a tombstone: its history goes, and the event's body with
-- its last route that was not one (the event stays the key: its delivery posted again
-- is a duplicate until the inbox's prune deletes it).
CREATE TRIGGER webhook_route_attempts_left_inbox
AFTER UPDATE OF next_attempt_at ON webhook_routes
WHEN OLD.next_attempt_at IS NOT NULL AND NEW.next_attempt_at IS NULL
BEGIN
    DELETE FROM webhook_attempts
    WHERE source = OLD.source AND event_id = OLD.event_id AND processor = OLD.processor;
    DELETE FROM webhook_bodies
    WHERE source = OLD.source AND event_id = OLD.event_id
      AND NOT EXISTS (SELECT 1 FROM webhook_routes r
          WHERE r.source = OLD.source AND r.event_id = OLD.event_id
            AND r.next_attempt_at IS NOT NULL);
END;

-- An inbox event's routes (firing theirs) and body go with it, whichever statement
-- deletes it.
CREATE TRIGGER webhook_events_forgotten AFTER DELETE ON webhook_events
WHEN OLD.next_attempt_at IS NOT NULL
BEGIN
    DELETE FROM webhook_routes WHERE source = OLD.source AND event_id = OLD.event_id;
    DELETE FROM webhook_bodies WHERE source = OLD.source AND event_id = OLD.event_id;
END;
