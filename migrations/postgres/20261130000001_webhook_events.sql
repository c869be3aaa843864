-- One row per (source, event id): the dedupe claim, the audit trail of what arrived, and
-- (later) the inbox's queue. Times are the database server's, shared by every replica.
CREATE TABLE IF NOT EXISTS webhook_events (
    source           TEXT        NOT NULL,
    event_id         TEXT        NOT NULL,
    event_type       TEXT,
    object_id        TEXT,
    livemode         BOOLEAN,
    body             BYTEA,
    received_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    attempts         INTEGER     NOT NULL DEFAULT 0,
    next_attempt_at  TIMESTAMPTZ,
    locked_until     TIMESTAMPTZ,
    lock_token       UUID,
    processed_at     TIMESTAMPTZ,
    processing_error TEXT,
    dead_at          TIMESTAMPTZ,
    PRIMARY KEY (source, event_id)
);

-- Pruning finds old processed rows without scanning the table.
CREATE INDEX IF NOT EXISTS webhook_events_processed_at
    ON webhook_events (processed_at) WHERE processed_at IS NOT NULL;
