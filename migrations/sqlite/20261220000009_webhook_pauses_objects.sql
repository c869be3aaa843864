-- Flow control: pauses, and the index a per-object cap reads.
-- What operators paused: the inbox's workers start no event of a paused source or type
-- (accepts go on; resuming lets them start, in order). '' matches any source or type.
CREATE TABLE IF NOT EXISTS webhook_pauses (
    source     TEXT    NOT NULL,
    event_type TEXT    NOT NULL,
    paused_at  INTEGER NOT NULL, -- milliseconds since the epoch
    PRIMARY KEY (source, event_type)
);

-- A per-object cap reads an object's unfinished rows (running, or before the one to
-- claim): the inbox's rows with an object, until they are processed or dead.
CREATE INDEX IF NOT EXISTS webhook_events_object
    ON webhook_events (source, object_id, received_at, event_id)
    WHERE next_attempt_at IS NOT NULL AND processed_at IS NULL AND dead_at IS NULL
      AND object_id IS NOT NULL;
