//! [`RedisStore`]: claims as Redis keys with a TTL, for services that dedupe without SQL.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::Script;

use super::{Claim, Completed, DedupeStore, Delivery, StoreError, StoreFuture, Token};

/// Claims in Redis (feature `redis`): `SET NX PX` claims a key for the lease; Lua scripts
/// complete or release it only if it still holds this attempt's token (compare-and-set),
/// and a done key expires after the retention (default 7 days). Every operation is one
/// round trip.
///
/// Durable only as far as the server persists (AOF or RDB); a Redis that restarts empty
/// forgets done keys. Cloning shares the connection.
#[derive(Clone)]
pub struct RedisStore {
    connection: ConnectionManager,
    prefix: Arc<str>,
    retention: Duration,
    scripts: Arc<Scripts>,
}

struct Scripts {
    claim: Script,
    complete: Script,
    release: Script,
}

/// `{1, 0}` new; `{2, 0}` done; `{3, ms}` claimed for `ms` more.
const CLAIM: &str = r"
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return {1, 0} end
local v = redis.call('GET', KEYS[1])
if v == 'done' then return {2, 0} end
return {3, redis.call('PTTL', KEYS[1])}";

const COMPLETE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], 'done', 'PX', ARGV[2])
  return 1
end
return 0";

const RELEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0";

impl RedisStore {
    /// Connects to `url` (`redis://…`). Operations time out after 2 s (then 503).
    ///
    /// # Errors
    ///
    /// When the URL is invalid or the server cannot be reached.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let client = redis::Client::open(url).map_err(|e| StoreError::new("redis url", e))?;
        let connection = ConnectionManager::new_with_config(client, Self::config())
            .await
            .map_err(|e| StoreError::new("redis connect", e))?;
        Ok(Self::from_connection(connection))
    }

    /// Like [`connect`](Self::connect), but connects on first use: a store that is down
    /// now answers 503 until it is up, instead of failing here.
    ///
    /// # Errors
    ///
    /// When the URL is invalid.
    pub fn connect_lazy(url: &str) -> Result<Self, StoreError> {
        let client = redis::Client::open(url).map_err(|e| StoreError::new("redis url", e))?;
        let connection = ConnectionManager::new_lazy_with_config(client, Self::config())
            .map_err(|e| StoreError::new("redis connect", e))?;
        Ok(Self::from_connection(connection))
    }

    fn config() -> ConnectionManagerConfig {
        ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(2)))
            .set_response_timeout(Some(Duration::from_secs(2)))
            .set_number_of_retries(1)
    }

    /// Uses a connection you configured yourself.
    #[must_use]
    pub fn from_connection(connection: ConnectionManager) -> Self {
        Self {
            connection,
            prefix: Arc::from("webhook:dedupe:"),
            retention: Duration::from_secs(7 * 24 * 3600),
            scripts: Arc::new(Scripts {
                claim: Script::new(CLAIM),
                complete: Script::new(COMPLETE),
                release: Script::new(RELEASE),
            }),
        }
    }

    /// Replaces the key prefix (default `webhook:dedupe:`), to share a Redis between
    /// services.
    #[must_use]
    pub fn with_prefix(mut self, prefix: &str) -> Self {
        self.prefix = Arc::from(prefix);
        self
    }

    /// Replaces how long done keys are kept (default 7 days).
    #[must_use]
    pub fn with_retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    /// The key of a delivery; the source's length comes first, so no source and id can
    /// spell another pair's key.
    fn key(&self, d: &Delivery) -> String {
        format!(
            "{}{}:{}:{}",
            self.prefix,
            d.source().len(),
            d.source(),
            d.id()
        )
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

fn claimed(token: Token) -> String {
    format!("claimed:{token}")
}

impl DedupeStore for RedisStore {
    fn claim(&self, d: Delivery, token: Token, lease: Duration) -> StoreFuture<Claim> {
        let (mut connection, scripts, key) =
            (self.connection.clone(), self.scripts.clone(), self.key(&d));
        Box::pin(async move {
            let (state, pttl): (i64, i64) = scripts
                .claim
                .key(key)
                .arg(claimed(token))
                .arg(ms(lease))
                .invoke_async(&mut connection)
                .await
                .map_err(|e| StoreError::new("redis claim", e))?;
            Ok(match state {
                1 => Claim::New(token),
                2 => Claim::Done,
                _ => Claim::InFlight {
                    retry_after: Duration::from_millis(pttl.max(1).unsigned_abs()),
                },
            })
        })
    }

    fn complete(&self, d: Delivery, token: Token) -> StoreFuture<Completed> {
        let (mut connection, scripts, key) =
            (self.connection.clone(), self.scripts.clone(), self.key(&d));
        let retention = ms(self.retention);
        Box::pin(async move {
            let done: i64 = scripts
                .complete
                .key(key)
                .arg(claimed(token))
                .arg(retention)
                .invoke_async(&mut connection)
                .await
                .map_err(|e| StoreError::new("redis complete", e))?;
            Ok(if done == 1 {
                Completed::Done
            } else {
                Completed::Fenced
            })
        })
    }

    fn release(&self, d: Delivery, token: Token) -> StoreFuture<()> {
        let (mut connection, scripts, key) =
            (self.connection.clone(), self.scripts.clone(), self.key(&d));
        Box::pin(async move {
            let _: i64 = scripts
                .release
                .key(key)
                .arg(claimed(token))
                .invoke_async(&mut connection)
                .await
                .map_err(|e| StoreError::new("redis release", e))?;
            Ok(())
        })
    }

    /// Nothing to do: done keys expire by themselves after the retention.
    fn prune(&self, _older_than: Duration) -> StoreFuture<u64> {
        Box::pin(std::future::ready(Ok(0)))
    }
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.prefix)
            .field("retention", &self.retention)
            .finish_non_exhaustive()
    }
}
