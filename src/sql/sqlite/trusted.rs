//! `webhook_trusted_certificates`: the URLs of the certificates that verified a delivery
//! ([`TrustStore`](crate::store::TrustStore) for `SqliteStore`), the 64 trusted last.

use super::{Done, Op, Sqlite};
use crate::sql::store_error;
use crate::store::{StoreError, StoreFuture, MAX_TRUSTED_URLS};

const TRUST: &str = "INSERT INTO webhook_trusted_certificates (url, trusted_at) VALUES (?1, ?2) \
     ON CONFLICT (url) DO UPDATE SET trusted_at = excluded.trusted_at";

const KEEP_NEWEST: &str = "DELETE FROM webhook_trusted_certificates WHERE url IN \
     (SELECT url FROM webhook_trusted_certificates ORDER BY trusted_at DESC, url DESC \
      LIMIT -1 OFFSET ?1)";

const LOAD: &str =
    "SELECT url FROM webhook_trusted_certificates ORDER BY trusted_at DESC, url DESC LIMIT ?1";

impl Sqlite {
    /// The URLs kept, the most recently trusted first.
    pub(crate) fn trusted_urls(&self) -> StoreFuture<Vec<String>> {
        let pool = self.pool.clone();
        Box::pin(async move {
            sqlx::query_scalar(LOAD)
                .bind(MAX_TRUSTED_URLS as i64)
                .fetch_all(&pool)
                .await
                .map_err(|e| store_error("sqlite trusted certificates", e))
        })
    }

    /// Keeps `url` as trusted now, in the writer's next batch.
    pub(crate) fn trust_url(&self, url: String) -> StoreFuture<()> {
        let this = self.clone();
        Box::pin(async move { this.write(Op::Trust(url)).await.map(drop) })
    }
}

/// The writer's statements for [`Op::Trust`], at the batch's time.
pub(super) async fn trust(
    conn: &mut sqlx::SqliteConnection,
    now: i64,
    url: &str,
) -> Result<Done, StoreError> {
    let error = |e| store_error("sqlite trust a certificate", e);
    sqlx::query(TRUST)
        .bind(url)
        .bind(now)
        .execute(&mut *conn)
        .await
        .map_err(error)?;
    sqlx::query(KEEP_NEWEST)
        .bind(MAX_TRUSTED_URLS as i64)
        .execute(&mut *conn)
        .await
        .map_err(error)?;
    Ok(Done::Held(true))
}
