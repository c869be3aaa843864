-- The URLs of the signing certificates that verified a delivery (SNS, PayPal), so that
-- after a restart, and in every process on the file, a delivery under one is fetched
-- outside the fetch limit. URLs only: the certificate is fetched again from the
-- provider. The 64 trusted last are kept.
CREATE TABLE IF NOT EXISTS webhook_trusted_certificates (
    url        TEXT    NOT NULL PRIMARY KEY,
    trusted_at INTEGER NOT NULL -- milliseconds since the epoch
);
