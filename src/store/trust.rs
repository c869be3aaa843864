//! [`TrustStore`]: the URLs of the certificates that verified a delivery, kept across
//! restarts and shared by replicas, for
//! [`Certificates::with_trust_store`](crate::verify::Certificates::with_trust_store).

use super::StoreFuture;

/// At most this many URLs are kept, the most recently trusted: the number of trusted
/// certificates a [`Certificates`](crate::verify::Certificates) keeps.
pub(crate) const MAX_TRUSTED_URLS: usize = 64;

/// Where [`Certificates`](crate::verify::Certificates) keeps the URLs of the certificates
/// that verified a delivery, so that after a restart, and in every replica, a delivery
/// under one is fetched outside the fetch limit: a flood of forged deliveries cannot keep
/// it out. URLs only — public addresses on the provider's hosts, never a certificate or
/// a secret: a URL read back is checked against the provider's hosts again and its
/// certificate fetched anew.
///
/// Implemented by `SqliteStore`, `PgStore` (table `webhook_trusted_certificates`, in the
/// crate's migrations) and `RedisStore` (a sorted set, `<prefix>trusted-certificates`);
/// implement it for your own. Each keeps the 64 URLs trusted last.
pub trait TrustStore: Send + Sync + 'static {
    /// The URLs kept, the most recently trusted first.
    fn load(&self) -> StoreFuture<Vec<String>>;

    /// Keeps `url` (a canonical certificate URL), as trusted now.
    fn trust(&self, url: String) -> StoreFuture<()>;
}

#[cfg(feature = "sqlite")]
impl TrustStore for super::SqliteStore {
    fn load(&self) -> StoreFuture<Vec<String>> {
        self.sql().trusted_urls()
    }

    /// Through the store's one writer, as every write on its file.
    fn trust(&self, url: String) -> StoreFuture<()> {
        self.sql().trust_url(url)
    }
}

/// One statement: the URL kept, and the others but the 63 newest deleted (the subquery
/// reads the table as it was before the insert, so the URL itself is left out of it).
#[cfg(feature = "postgres")]
const PG_TRUST: &str = "WITH kept AS (
    INSERT INTO webhook_trusted_certificates (url, trusted_at) VALUES ($1, clock_timestamp())
    ON CONFLICT (url) DO UPDATE SET trusted_at = excluded.trusted_at)
DELETE FROM webhook_trusted_certificates WHERE url IN (
    SELECT url FROM webhook_trusted_certificates WHERE url <> $1
    ORDER BY trusted_at DESC, url DESC OFFSET $2)";

#[cfg(feature = "postgres")]
const PG_LOAD: &str =
    "SELECT url FROM webhook_trusted_certificates ORDER BY trusted_at DESC, url DESC LIMIT $1";

#[cfg(feature = "postgres")]
impl TrustStore for super::PgStore {
    fn load(&self) -> StoreFuture<Vec<String>> {
        let pool = self.pool().clone();
        Box::pin(async move {
            sqlx::query_scalar(PG_LOAD)
                .bind(MAX_TRUSTED_URLS as i64)
                .fetch_all(&pool)
                .await
                .map_err(|e| crate::sql::store_error("postgres trusted certificates", e))
        })
    }

    fn trust(&self, url: String) -> StoreFuture<()> {
        let pool = self.pool().clone();
        Box::pin(async move {
            sqlx::query(PG_TRUST)
                .bind(url)
                .bind(MAX_TRUSTED_URLS as i64 - 1)
                .execute(&pool)
                .await
                .map(drop)
                .map_err(|e| crate::sql::store_error("postgres trust a certificate", e))
        })
    }
}

#[cfg(feature = "redis")]
impl TrustStore for super::RedisStore {
    fn load(&self) -> StoreFuture<Vec<String>> {
        let (mut connection, key) = (self.connection.clone(), trusted_key(self));
        Box::pin(async move {
            redis::cmd("ZREVRANGE")
                .arg(key)
                .arg(0)
                .arg(MAX_TRUSTED_URLS - 1)
                .query_async(&mut connection)
                .await
                .map_err(|e| super::redis::redis_error("redis trusted certificates", e))
        })
    }

    /// Scored by the time in milliseconds, the older ones beyond 64 removed, in one
    /// `MULTI`.
    fn trust(&self, url: String) -> StoreFuture<()> {
        let (mut connection, key) = (self.connection.clone(), trusted_key(self));
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        Box::pin(async move {
            redis::pipe()
                .atomic()
                .zadd(&key, url, now)
                .ignore()
                .zremrangebyrank(&key, 0, -(MAX_TRUSTED_URLS as isize) - 1)
                .ignore()
                .query_async::<()>(&mut connection)
                .await
                .map_err(|e| super::redis::redis_error("redis trust a certificate", e))
        })
    }
}

/// The sorted set's key: no delivery's key (`<prefix><length>:…`) begins with a letter.
#[cfg(feature = "redis")]
fn trusted_key(store: &super::RedisStore) -> String {
    format!("{}trusted-certificates", store.prefix)
}
