-- Events their type's JSON Schema refused (issue 36): stored as an event with its body and
-- no route (so no worker ever claims or retries it), and a row here with the errors, a
-- JSON list of {"path", "message"} (at most ten; messages never quote the body). Its
-- state is `invalid`; a requeue that finds it valid makes its routes and deletes the row.
CREATE TABLE webhook_invalid (
    source   TEXT NOT NULL,
    event_id TEXT NOT NULL,
    errors   TEXT NOT NULL,
    PRIMARY KEY (source, event_id)
);

-- The row goes with its event, whichever statement deletes it (a prune).
CREATE OR REPLACE FUNCTION webhook_invalid_forget() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM webhook_invalid WHERE source = OLD.source AND event_id = OLD.event_id;
    RETURN NULL;
END $$;

CREATE TRIGGER webhook_invalid_forgotten AFTER DELETE ON webhook_events FOR EACH ROW
    EXECUTE FUNCTION webhook_invalid_forget();
