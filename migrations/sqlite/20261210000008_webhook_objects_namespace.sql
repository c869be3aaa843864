-- The ordering guard keyed on (namespace, object): tenants and providers that share object
-- ids keep a clock each. Rows written before are the empty namespace's. SQLite cannot
-- change a primary key in place: the table is copied.
CREATE TABLE webhook_objects_keyed (
    namespace  TEXT    NOT NULL,
    object     TEXT    NOT NULL,
    applied_at INTEGER NOT NULL,
    PRIMARY KEY (namespace, object)
);
INSERT INTO webhook_objects_keyed (namespace, object, applied_at)
SELECT '', object, applied_at FROM webhook_objects;
DROP TABLE webhook_objects;
ALTER TABLE webhook_objects_keyed RENAME TO webhook_objects;
