-- One row per (source, event id): the dedupe claim and the audit trail of what arrived.
-- Times are milliseconds since the Unix epoch (SQLite has no timestamp type).
CREATE TABLE IF NOT EXISTS webhook_events (
    source           TEXT    NOT NULL,
    event_id         TEXT    NOT NULL,
    event_type       TEXT,
    object_id        TEXT,
    livemode         INTEGER,
    body             BLOB,
    received_at      INTEGER NOT NULL,
    attempts         INTEGER NOT NULL DEFAULT 0,
    next_attempt_at  INTEGER,
    locked_until     INTEGER,
    lock_token       TEXT,
    processed_at     INTEGER,
    processing_error TEXT,
    dead_at          INTEGER,
    PRIMARY KEY (source, event_id)
);

CREATE INDEX IF NOT EXISTS webhook_events_processed_at
    ON webhook_events (processed_at) WHERE processed_at IS NOT NULL;
