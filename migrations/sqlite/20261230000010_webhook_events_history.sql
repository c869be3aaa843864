-- What an operator's page shows of one inbox event: the request headers it arrived with,
-- and every attempt at it with its outcome, error and duration.
--
-- `headers`: the delivery's request headers as the SQL inbox's accept stored them, one
-- `name: value` a line (credentials left out, at most 8 KiB; NULL where none were kept:
-- rows from before, ingested events, `Inbox::accept` called directly).
ALTER TABLE webhook_events ADD COLUMN headers TEXT;
-- When the running (or last) attempt started (milliseconds since the epoch): set by the
-- worker's claim, read by the writer when it records the attempt's outcome.
ALTER TABLE webhook_events ADD COLUMN attempt_started_at INTEGER;

-- One row per finished attempt, written in the transaction that records its outcome (the
-- writer's batch; a crashed attempt by the claim that takes its row over) — but the
-- attempt that processed the event: its row's `attempt_started_at` and `processed_at` are
-- that record (the drain writes no row here), copied here when a requeue clears them.
-- outcome:
-- 'processed', 'failed' (retried later), 'dead', 'snoozed' (the processor's `Later`),
-- 'abandoned' (stopped by a shutdown past its grace period) or 'crashed' (its lease ran
-- out without an outcome; `finished_at` is the lease's end). Times in milliseconds since
-- the epoch. No key: the attempt number repeats after a snooze (uncounted) and a requeue.
CREATE TABLE IF NOT EXISTS webhook_attempts (
    source      TEXT    NOT NULL,
    event_id    TEXT    NOT NULL,
    attempt     INTEGER NOT NULL,
    started_at  INTEGER NOT NULL,
    finished_at INTEGER NOT NULL,
    outcome     TEXT    NOT NULL,
    error       TEXT
);
CREATE INDEX IF NOT EXISTS webhook_attempts_event
    ON webhook_attempts (source, event_id, started_at);

-- A claim that takes over a row whose attempt never finished (its token still set: every
-- outcome but "processed" clears it, and a processed row is claimed only after a requeue,
-- which clears it too) records that attempt as crashed. The claim is the one statement
-- that moves `attempt_started_at` while setting `attempts`.
CREATE TRIGGER IF NOT EXISTS webhook_attempts_crashed AFTER UPDATE OF attempts ON webhook_events
WHEN OLD.lock_token IS NOT NULL AND OLD.attempt_started_at IS NOT NULL
  AND NEW.attempt_started_at IS NOT OLD.attempt_started_at
BEGIN
    INSERT INTO webhook_attempts (source, event_id, attempt, started_at, finished_at, outcome)
    VALUES (OLD.source, OLD.event_id, OLD.attempts, OLD.attempt_started_at,
            max(OLD.attempt_started_at, coalesce(OLD.locked_until, OLD.attempt_started_at)),
            'crashed');
END;

-- A requeue of a processed row keeps its processed attempt: the row's own record of it is
-- copied here before the requeue clears it.
CREATE TRIGGER IF NOT EXISTS webhook_attempts_requeued AFTER UPDATE OF processed_at ON webhook_events
WHEN OLD.processed_at IS NOT NULL AND NEW.processed_at IS NULL
  AND OLD.next_attempt_at IS NOT NULL AND OLD.attempt_started_at IS NOT NULL
BEGIN
    INSERT INTO webhook_attempts (source, event_id, attempt, started_at, finished_at, outcome)
    VALUES (OLD.source, OLD.event_id, OLD.attempts, OLD.attempt_started_at,
            max(OLD.processed_at, OLD.attempt_started_at), 'processed');
END;

-- An inbox row's history goes with it, whichever statement deletes it (the inbox's
-- prunes, the dedupe prunes of processed and kept rows).
CREATE TRIGGER IF NOT EXISTS webhook_attempts_forgotten AFTER DELETE ON webhook_events
WHEN OLD.next_attempt_at IS NOT NULL
BEGIN
    DELETE FROM webhook_attempts WHERE source = OLD.source AND event_id = OLD.event_id;
END;
