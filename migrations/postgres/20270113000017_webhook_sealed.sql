-- Payload protection's schema (issue 34, docs/design/payload-protection.md §2). Nothing
-- changes for a database without encryption keys: every new column is NULL there.
--
-- A sealed body is three parts: `key_id` (which key of the ring opens it; NULL: stored in
-- clear), the ciphertext in `body` as before, and its random nonce. The stored headers
-- and the application's subject are sealed under the same key (one `key_id` a row), each
-- with its own nonce; sealed, `headers` is NULL and the ciphertext is in
-- `sealed_headers`. Columns added NULL, without a default: no table rewrite.
ALTER TABLE webhook_bodies
    ADD COLUMN key_id TEXT,
    ADD COLUMN body_nonce BYTEA,
    ADD COLUMN sealed_headers BYTEA,
    ADD COLUMN headers_nonce BYTEA,
    ADD COLUMN sealed_subject BYTEA,
    ADD COLUMN subject_nonce BYTEA,
    -- A keyed digest of the subject (under `key_id`'s digest key): erasure by subject.
    ADD COLUMN subject_digest BYTEA;

-- What rekey reads (an index-only scan) and what erasure by subject looks up.
CREATE INDEX webhook_bodies_key ON webhook_bodies (key_id, source, event_id);
CREATE INDEX webhook_bodies_subject ON webhook_bodies (subject_digest)
    WHERE subject_digest IS NOT NULL;

-- Why an inbox event has no body any more: 'expired' or 'erased'; NULL: stored (or none
-- was ever kept). On the event's row, not the body's: expiry and erasure delete the body
-- row.
ALTER TABLE webhook_events ADD COLUMN body_state TEXT;

-- Body expiry's bookmark: the newest route `processed_at` it has passed.
CREATE TABLE webhook_body_expiry (
    id              INTEGER     PRIMARY KEY CHECK (id = 1),
    processed_until TIMESTAMPTZ NOT NULL
);
INSERT INTO webhook_body_expiry (id, processed_until) VALUES (1, '-infinity');
