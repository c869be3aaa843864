-- The ordering guard (`tower_webhook::latest`): per object, the time of the newest event
-- applied to it, in milliseconds since the Unix epoch.
CREATE TABLE IF NOT EXISTS webhook_objects (
    object     TEXT    PRIMARY KEY,
    applied_at INTEGER NOT NULL
);
