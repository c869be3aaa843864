-- The processor registry (issue 33, docs/design/fan-out.md §3): each processor an Inbox
-- was configured with, upserted by its first write, so that tools without the
-- application's configuration (the CLI's backfill) know its filter, and counts can name
-- processors no longer configured. Only drop_processor deletes a row.
CREATE TABLE webhook_processors (
    name          TEXT        NOT NULL PRIMARY KEY,
    types         TEXT,                 -- a JSON array of type globs; NULL: every type
    has_predicate BOOLEAN     NOT NULL, -- a predicate in the application filters too
    registered_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
