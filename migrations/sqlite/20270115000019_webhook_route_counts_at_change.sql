-- An accept inserts its routes without entering a trigger (issue 33's bar: three
-- processors accept at >= 0.9x one). Each AFTER INSERT trigger ran a sub-program for
-- every route even when its WHEN was false: the two below were ~30 % of a route's insert
-- (callgrind, 5 000 events x 3 processors).
--
-- `webhook_route_counts_known` made a processor's counter row on its first route, so that
-- the update of `webhook_route_counts_changed` found one: the counter row is now made by
-- that change itself (an upsert, on the drain's path once per route processed, as the
-- update was). The processors the admin lists are the counter's and the registry's, and
-- every processor that routes are made for is registered first (an accept, a backfill).
DROP TRIGGER webhook_route_counts_known;

-- `webhook_route_counts_inserted` counted a route inserted already processed: no
-- statement of the crate inserts one (a route is made queued, by an accept or a
-- backfill), so nothing is counted at insert. A route inserted processed by hand is not
-- counted until it changes state.
DROP TRIGGER webhook_route_counts_inserted;

DROP TRIGGER webhook_route_counts_changed;
CREATE TRIGGER webhook_route_counts_changed
AFTER UPDATE OF processed_at, next_attempt_at ON webhook_routes
WHEN (OLD.next_attempt_at IS NOT NULL AND OLD.processed_at IS NOT NULL)
  IS NOT (NEW.next_attempt_at IS NOT NULL AND NEW.processed_at IS NOT NULL)
BEGIN
    INSERT INTO webhook_route_counts (processor, processed)
    VALUES (NEW.processor,
            CASE WHEN NEW.next_attempt_at IS NOT NULL AND NEW.processed_at IS NOT NULL
                 THEN 1 ELSE -1 END)
    ON CONFLICT (processor) DO UPDATE SET processed = processed + excluded.processed;
END;
