-- Arrival order, which a per-object cap runs an object's events in. `received_at` is the
-- accepting statement's time, shared by every event a batch accepts, and its ties were
-- broken by event id: events of one object accepted together ran in their ids' order.
-- `arrival` numbers the accepts in the order they reached the writer: a batch takes one
-- number of the sequence and gives each of its accepts that number × 1024 plus its place
-- in the batch (a batch holds at most 64); an accept that adopts a `DedupeLayer` claim
-- numbers it then. NULL on the rows no accept wrote (claims, and rows from before: these
-- order first, by their time and key, as before).
ALTER TABLE webhook_events ADD COLUMN IF NOT EXISTS arrival BIGINT;
CREATE SEQUENCE IF NOT EXISTS webhook_events_arrival;
