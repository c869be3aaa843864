-- What operators paused: the inbox's workers start no event of a paused source or type
-- (accepts go on; resuming lets them start, in order). '' matches any source or type.
CREATE TABLE IF NOT EXISTS webhook_pauses (
    source     TEXT    NOT NULL,
    event_type TEXT    NOT NULL,
    paused_at  INTEGER NOT NULL, -- milliseconds since the epoch
    PRIMARY KEY (source, event_type)
);

