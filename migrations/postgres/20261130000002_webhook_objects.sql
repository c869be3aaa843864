-- The ordering guard (`tower_webhook::latest`): per object, the time of the newest event
-- applied to it. A row is locked by the transaction that advances it until it commits.
CREATE TABLE IF NOT EXISTS webhook_objects (
    object     TEXT        PRIMARY KEY,
    applied_at TIMESTAMPTZ NOT NULL
);
