-- What an operator's page shows of one inbox event: the request headers it arrived with,
-- and every attempt at it with its outcome, error and duration.
--
-- `headers`: the delivery's request headers as the SQL inbox's accept stored them, one
-- `name: value` a line (credentials left out, at most 8 KiB; NULL where none were kept:
-- rows from before, ingested events, `Inbox::accept` called directly).
ALTER TABLE webhook_events ADD COLUMN IF NOT EXISTS headers TEXT;
-- When the running (or last) attempt started: set by the worker's claim, read by the
-- statement that records the attempt's outcome in `webhook_attempts`.
ALTER TABLE webhook_events ADD COLUMN IF NOT EXISTS attempt_started_at TIMESTAMPTZ;

-- One row per finished attempt, written by the statement that records its outcome (the
-- worker's finish statements; a crashed attempt by the claim that takes its row over) —
-- but the attempt that processed the event: its row's `attempt_started_at` and
-- `processed_at` are that record (the drain writes no row here), copied here when a
-- requeue clears them.
-- outcome: 'processed', 'failed' (retried later), 'dead', 'snoozed' (the processor's
-- `Later`), 'abandoned' (stopped by a shutdown past its grace period) or 'crashed' (its
-- lease ran out without an outcome; `finished_at` is the lease's end). No key: the
-- attempt number repeats after a snooze (uncounted) and a requeue (counted from 1).
CREATE TABLE IF NOT EXISTS webhook_attempts (
    source      TEXT        NOT NULL,
    event_id    TEXT        NOT NULL,
    attempt     INTEGER     NOT NULL,
    started_at  TIMESTAMPTZ NOT NULL,
    finished_at TIMESTAMPTZ NOT NULL,
    outcome     TEXT        NOT NULL,
    error       TEXT
);
CREATE INDEX IF NOT EXISTS webhook_attempts_event
    ON webhook_attempts (source, event_id, started_at);

-- A claim that takes over a row whose attempt never finished (its token still set: every
-- outcome but "processed" clears it, and a processed row is claimed only after a requeue,
-- which clears it too) records that attempt as crashed. The claim is the one statement
-- that moves `attempt_started_at` while setting `attempts`; the WHEN clause is checked
-- without calling the function, so claims of rows whose last attempt ended cost nothing.
CREATE OR REPLACE FUNCTION webhook_attempts_crashed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO webhook_attempts (source, event_id, attempt, started_at, finished_at, outcome)
    VALUES (OLD.source, OLD.event_id, OLD.attempts, OLD.attempt_started_at,
            greatest(OLD.attempt_started_at, coalesce(OLD.locked_until, OLD.attempt_started_at)),
            'crashed');
    RETURN NULL;
END $$;

CREATE TRIGGER webhook_attempts_crashed AFTER UPDATE OF attempts ON webhook_events FOR EACH ROW
    WHEN (OLD.lock_token IS NOT NULL AND OLD.attempt_started_at IS NOT NULL
          AND NEW.attempt_started_at IS DISTINCT FROM OLD.attempt_started_at)
    EXECUTE FUNCTION webhook_attempts_crashed();

-- A requeue of a processed row keeps its processed attempt: the row's own record of it is
-- copied here before the requeue clears it.
CREATE OR REPLACE FUNCTION webhook_attempts_requeued() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO webhook_attempts (source, event_id, attempt, started_at, finished_at, outcome)
    VALUES (OLD.source, OLD.event_id, OLD.attempts, OLD.attempt_started_at,
            greatest(OLD.processed_at, OLD.attempt_started_at), 'processed');
    RETURN NULL;
END $$;

CREATE TRIGGER webhook_attempts_requeued AFTER UPDATE OF processed_at ON webhook_events
    FOR EACH ROW
    WHEN (OLD.processed_at IS NOT NULL AND NEW.processed_at IS NULL
          AND OLD.next_attempt_at IS NOT NULL AND OLD.attempt_started_at IS NOT NULL)
    EXECUTE FUNCTION webhook_attempts_requeued();

-- An inbox row's history goes with it, whichever statement deletes it (the inbox's
-- prunes, the dedupe prunes of processed and kept rows).
CREATE OR REPLACE FUNCTION webhook_attempts_forget() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM webhook_attempts WHERE source = OLD.source AND event_id = OLD.event_id;
    RETURN NULL;
END $$;

CREATE TRIGGER webhook_attempts_forgotten AFTER DELETE ON webhook_events FOR EACH ROW
    WHEN (OLD.next_attempt_at IS NOT NULL)
    EXECUTE FUNCTION webhook_attempts_forget();
