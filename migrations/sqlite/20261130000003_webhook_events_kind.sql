-- Which kind of key a row is: 'event' (a delivery, pruned after the retention) or 'once'
-- (a business key of `Once`, kept until pruned by name: it must outlive every event that
-- could trigger its action again).
ALTER TABLE webhook_events ADD COLUMN kind TEXT NOT NULL DEFAULT 'event';
-- `Once` wrote its keys under sources named `once:<namespace>` before this column existed.
UPDATE webhook_events SET kind = 'once' WHERE source LIKE 'once:%';
