-- Pauses per processor (issue 33, docs/design/fan-out.md §4): a pause holds the routes of
-- one processor, or of every processor (''), as '' already matches any source or type.
-- Pauses made before are every processor's.
ALTER TABLE webhook_pauses ADD COLUMN processor TEXT NOT NULL DEFAULT '';
ALTER TABLE webhook_pauses DROP CONSTRAINT webhook_pauses_pkey;
ALTER TABLE webhook_pauses ADD PRIMARY KEY (processor, source, event_type);
