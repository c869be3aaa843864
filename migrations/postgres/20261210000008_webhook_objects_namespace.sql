-- The ordering guard keyed on (namespace, object): tenants and providers that share object
-- ids keep a clock each. Rows written before are the empty namespace's.
ALTER TABLE webhook_objects ADD COLUMN IF NOT EXISTS namespace TEXT NOT NULL DEFAULT '';
ALTER TABLE webhook_objects DROP CONSTRAINT IF EXISTS webhook_objects_pkey;
ALTER TABLE webhook_objects ADD PRIMARY KEY (namespace, object);
