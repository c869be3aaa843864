-- Pauses per processor (issue 33, docs/design/fan-out.md §4): a pause holds the routes of
-- one processor, or of every processor (''), as '' already matches any source or type.
-- Pauses made before are every processor's. SQLite cannot change a primary key in place:
-- the table is copied.
CREATE TABLE webhook_pauses_by_processor (
    processor  TEXT    NOT NULL DEFAULT '',
    source     TEXT    NOT NULL,
    event_type TEXT    NOT NULL,
    paused_at  INTEGER NOT NULL, -- milliseconds since the epoch
    PRIMARY KEY (processor, source, event_type)
);
INSERT INTO webhook_pauses_by_processor (processor, source, event_type, paused_at)
SELECT '', source, event_type, paused_at FROM webhook_pauses;
DROP TABLE webhook_pauses;
ALTER TABLE webhook_pauses_by_processor RENAME TO webhook_pauses;
