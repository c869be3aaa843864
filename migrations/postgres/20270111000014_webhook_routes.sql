-- Fan-out (issue 33, docs/design/fan-out.md §1, §2): an inbox event is three things —
-- the event (`webhook_events`: the dedupe key and its metadata), its body and stored
-- headers (`webhook_bodies`), and one route per processor (`webhook_routes`: state,
-- attempts, lease, next attempt, last error, history). Every inbox row of before becomes
-- an event, a body and one route of the processor `default`, in place, in this one
-- transaction. Claims of `DedupeLayer`, `Once` keys and the keys deleted dead rows left
-- (rows without `next_attempt_at`) stay as they are.
--
-- An inbox event keeps `next_attempt_at` (its accept time, never moved again: the mark
-- "the inbox's" that claims, completions and the dedupe prune test) and loses the rest
-- of its state, which its route holds; its `processed_at` stays NULL, so the dedupe prune
-- never deletes it.
--
-- Every inbox row is rewritten: the table takes about twice its size until vacuumed.
-- Stop every replica of the version before, then start this one: an old one would claim
-- nothing and accept events without a route.

-- 1. The triggers on webhook_events go first: the update below would otherwise log -1
-- for every processed row and copy every processed attempt into the history.
DROP TRIGGER IF EXISTS webhook_counts_inserted ON webhook_events;
DROP TRIGGER IF EXISTS webhook_counts_processed ON webhook_events;
DROP TRIGGER IF EXISTS webhook_counts_unprocessed ON webhook_events;
DROP TRIGGER IF EXISTS webhook_counts_deleted ON webhook_events;
DROP TRIGGER IF EXISTS webhook_attempts_crashed ON webhook_events;
DROP TRIGGER IF EXISTS webhook_attempts_requeued ON webhook_events;
DROP TRIGGER IF EXISTS webhook_attempts_forgotten ON webhook_events;
DROP TRIGGER IF EXISTS webhook_attempts_left_inbox ON webhook_events;

-- The queue's indexes on webhook_events: with `processed_at` NULL on every inbox event,
-- `webhook_events_due` would hold all of them. Dropped before the update, which then
-- maintains fewer indexes.
DROP INDEX IF EXISTS webhook_events_due;
DROP INDEX IF EXISTS webhook_events_dead;
DROP INDEX IF EXISTS webhook_events_failing;
DROP INDEX IF EXISTS webhook_events_by_object;

-- 2. The tables, and the copy.
CREATE TABLE webhook_bodies (
    source   TEXT NOT NULL,
    event_id TEXT NOT NULL,
    body     BYTEA,
    headers  TEXT,
    PRIMARY KEY (source, event_id)
);

-- The event's immutable columns are copied into its routes: the claim, its per-object
-- cap, pauses and listings read one table.
CREATE TABLE webhook_routes (
    source             TEXT        NOT NULL,
    event_id           TEXT        NOT NULL,
    processor          TEXT        NOT NULL,
    event_type         TEXT,
    object_id          TEXT,
    arrival            BIGINT,
    received_at        TIMESTAMPTZ NOT NULL,
    attempts           INTEGER     NOT NULL DEFAULT 0,
    -- NULL: a dead route deleted, a tombstone (its `processed_at` when it was deleted).
    next_attempt_at    TIMESTAMPTZ,
    locked_until       TIMESTAMPTZ,
    lock_token         UUID,
    attempt_started_at TIMESTAMPTZ,
    processed_at       TIMESTAMPTZ,
    processing_error   TEXT,
    dead_at            TIMESTAMPTZ,
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

-- 3. The events lose what moved.
UPDATE webhook_events SET body = NULL, headers = NULL, attempts = 0, locked_until = NULL,
    lock_token = NULL, attempt_started_at = NULL, processed_at = NULL,
    processing_error = NULL, dead_at = NULL
WHERE next_attempt_at IS NOT NULL AND kind <> 'once';

-- The history is per route: every record of before is `default`'s.
ALTER TABLE webhook_attempts ADD COLUMN processor TEXT NOT NULL DEFAULT 'default';
DROP INDEX IF EXISTS webhook_attempts_event;
CREATE INDEX webhook_attempts_route
    ON webhook_attempts (source, event_id, processor, started_at);

-- 4. The processed count per processor, recomputed rather than carried.
ALTER TABLE webhook_counts ADD COLUMN processor TEXT NOT NULL DEFAULT 'default';
TRUNCATE webhook_counts;
INSERT INTO webhook_counts (processor, delta)
SELECT 'default', count(*) FROM webhook_routes
WHERE next_attempt_at IS NOT NULL AND processed_at IS NOT NULL;

-- 5. Indexes and triggers, after the copy.
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
-- The inbox's events by receipt: the inbox prune, a backfill's window.
CREATE INDEX webhook_events_inbox ON webhook_events (received_at, source, event_id)
    WHERE next_attempt_at IS NOT NULL;

-- TG_ARGV[0]: what the route adds to its processor's count.
CREATE OR REPLACE FUNCTION webhook_route_counts_log() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        INSERT INTO webhook_counts (processor, delta) VALUES (OLD.processor, TG_ARGV[0]::bigint);
    ELSE
        INSERT INTO webhook_counts (processor, delta) VALUES (NEW.processor, TG_ARGV[0]::bigint);
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER webhook_route_counts_inserted AFTER INSERT ON webhook_routes FOR EACH ROW
    WHEN (NEW.next_attempt_at IS NOT NULL AND NEW.processed_at IS NOT NULL)
    EXECUTE FUNCTION webhook_route_counts_log('1');

CREATE TRIGGER webhook_route_counts_processed
    AFTER UPDATE OF processed_at, next_attempt_at ON webhook_routes FOR EACH ROW
    WHEN (NOT (OLD.next_attempt_at IS NOT NULL AND OLD.processed_at IS NOT NULL)
          AND NEW.next_attempt_at IS NOT NULL AND NEW.processed_at IS NOT NULL)
    EXECUTE FUNCTION webhook_route_counts_log('1');

CREATE TRIGGER webhook_route_counts_unprocessed
    AFTER UPDATE OF processed_at, next_attempt_at ON webhook_routes FOR EACH ROW
    WHEN (OLD.next_attempt_at IS NOT NULL AND OLD.processed_at IS NOT NULL
          AND NOT (NEW.next_attempt_at IS NOT NULL AND NEW.processed_at IS NOT NULL))
    EXECUTE FUNCTION webhook_route_counts_log('-1');

CREATE TRIGGER webhook_route_counts_deleted AFTER DELETE ON webhook_routes FOR EACH ROW
    WHEN (OLD.next_attempt_at IS NOT NULL AND OLD.processed_at IS NOT NULL)
    EXECUTE FUNCTION webhook_route_counts_log('-1');

-- The attempt functions of migration 10, per route now (no trigger on webhook_events
-- calls them any more).
CREATE OR REPLACE FUNCTION webhook_attempts_crashed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO webhook_attempts
        (source, event_id, processor, attempt, started_at, finished_at, outcome)
    VALUES (OLD.source, OLD.event_id, OLD.processor, OLD.attempts, OLD.attempt_started_at,
            greatest(OLD.attempt_started_at, coalesce(OLD.locked_until, OLD.attempt_started_at)),
            'crashed');
    RETURN NULL;
END $$;

CREATE TRIGGER webhook_route_attempts_crashed AFTER UPDATE OF attempts ON webhook_routes
    FOR EACH ROW
    WHEN (OLD.lock_token IS NOT NULL AND OLD.attempt_started_at IS NOT NULL
          AND NEW.attempt_started_at IS DISTINCT FROM OLD.attempt_started_at)
    EXECUTE FUNCTION webhook_attempts_crashed();

CREATE OR REPLACE FUNCTION webhook_attempts_requeued() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO webhook_attempts
        (source, event_id, processor, attempt, started_at, finished_at, outcome)
    VALUES (OLD.source, OLD.event_id, OLD.processor, OLD.attempts, OLD.attempt_started_at,
            greatest(OLD.processed_at, OLD.attempt_started_at), 'processed');
    RETURN NULL;
END $$;

CREATE TRIGGER webhook_route_attempts_requeued AFTER UPDATE OF processed_at ON webhook_routes
    FOR EACH ROW
    WHEN (OLD.processed_at IS NOT NULL AND NEW.processed_at IS NULL
          AND OLD.next_attempt_at IS NOT NULL AND OLD.attempt_started_at IS NOT NULL)
    EXECUTE FUNCTION webhook_attempts_requeued();

CREATE OR REPLACE FUNCTION webhook_attempts_forget() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM webhook_attempts
    WHERE source = OLD.source AND event_id = OLD.event_id AND processor = OLD.processor;
    RETURN NULL;
END $$;

-- A route's history goes with it, deleted or made a tombstone.
CREATE TRIGGER webhook_route_attempts_forgotten AFTER DELETE ON webhook_routes FOR EACH ROW
    WHEN (OLD.next_attempt_at IS NOT NULL)
    EXECUTE FUNCTION webhook_attempts_forget();

CREATE TRIGGER webhook_route_attempts_left_inbox
    AFTER UPDATE OF next_attempt_at ON webhook_routes FOR EACH ROW
    WHEN (OLD.next_attempt_at IS NOT NULL AND NEW.next_attempt_at IS NULL)
    EXECUTE FUNCTION webhook_attempts_forget();

-- An inbox event's routes (firing theirs) and body go with it, whichever statement
-- deletes it.
CREATE OR REPLACE FUNCTION webhook_events_forget() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM webhook_routes WHERE source = OLD.source AND event_id = OLD.event_id;
    DELETE FROM webhook_bodies WHERE source = OLD.source AND event_id = OLD.event_id;
    RETURN NULL;
END $$;

CREATE TRIGGER webhook_events_forgotten AFTER DELETE ON webhook_events FOR EACH ROW
    WHEN (OLD.next_attempt_at IS NOT NULL)
    EXECUTE FUNCTION webhook_events_forget();

-- Plans made on tables born full (or on the empty ones of a new database) start from
-- statistics, not from the defaults of a table never analyzed.
ANALYZE webhook_routes, webhook_bodies, webhook_events, webhook_attempts;
