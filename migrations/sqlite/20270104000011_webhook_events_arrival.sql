-- Arrival order, which a per-object cap runs an object's events in. `received_at` is the
-- writer batch's millisecond, shared by every event a batch accepts, and its ties were
-- broken by event id: events of one object accepted together ran in their ids' order.
-- `arrival` numbers the accepts in the order they reached the writer, from the last number
-- given (`webhook_arrivals`, one row, moved by each batch that accepts, in its
-- transaction); an accept that adopts a `DedupeLayer` claim numbers it then. NULL on the
-- rows no accept wrote (claims, and processed or dead rows from before): they order
-- first, by their time and key, as before.
ALTER TABLE webhook_events ADD COLUMN arrival INTEGER;
CREATE TABLE IF NOT EXISTS webhook_arrivals (last INTEGER NOT NULL);
-- The queue as it stands, numbered in the order its rows went in (their rowids).
UPDATE webhook_events SET arrival = rowid
WHERE next_attempt_at IS NOT NULL AND processed_at IS NULL AND dead_at IS NULL;
INSERT INTO webhook_arrivals (last) SELECT coalesce(max(rowid), 0) FROM webhook_events;
