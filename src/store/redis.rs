//! [`RedisStore`]: claims as Redis keys with a TTL, for services that dedupe without SQL.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::Script;

use super::{
    Claim, Completed, DedupeStore, Delivery, Renewed, Retention, StoreError, StoreErrorKind,
    StoreFuture, Token,
};

/// Claims in Redis (feature `redis`): `SET NX PX` claims a key for the lease; Lua scripts
/// renew, complete or release it only if it still holds this attempt's token
/// (compare-and-set) — a completion also when the key expired and no other attempt holds
/// it (the work succeeded). A renewal that comes after the lease ran out finds the key gone
/// and answers [`Renewed::Fenced`] even when no attempt took it over (the SQL stores still
/// renew a row under its token then): keep renewals well inside the lease. A done event key expires after the retention (default 7 days); a
/// done [`Once`](crate::once::Once) key or [kept key](Delivery::is_kept) never expires
/// ([`prune_once`](DedupeStore::prune_once) deletes it). Every operation but `prune_once` is one round trip.
///
/// # Durability
///
/// - Durable only as far as the server persists (AOF with `appendfsync always` for every
///   acknowledged write; RDB snapshots lose the last minutes). A Redis that restarts
///   empty forgets done keys, and their duplicates run again.
/// - **Eviction**: keys with a TTL are what `volatile-*` policies evict first, and
///   `allkeys-*` evict anything, so an evicted done key or live claim lets a duplicate
///   run. [`connect`](Self::connect) reads `maxmemory-policy` and refuses anything but
///   `noeviction`; [`from_connection`](Self::from_connection) does not check (to accept
///   the risk knowingly).
/// - **Failover**: replication is asynchronous; a primary that fails before a replica
///   copied a claim or a done key forgets it on the new primary.
///   [`with_replicas`](Self::with_replicas) waits (`WAIT`) until that many replicas have
///   each claim and completion, and fails the operation otherwise (503 before the
///   handler; a completion retried while the lease lasts). Even then a failover may pick a
///   replica that lagged; use PostgreSQL where that matters.
///
/// Cloning shares the connection.
#[derive(Clone)]
pub struct RedisStore {
    pub(super) connection: ConnectionManager,
    pub(super) prefix: Arc<str>,
    retention: Duration,
    /// How many replicas must acknowledge a claim or a completion, and how long to wait.
    replicas: Option<(u32, Duration)>,
    scripts: Arc<Scripts>,
}

struct Scripts {
    claim: Script,
    renew: Script,
    complete: Script,
    release: Script,
    prune_once: Script,
}

// Values: `claimed:<token>` while claimed; `done:<token>:<unix ms>` once done (the token
// makes a retried completion idempotent; the time is for `prune_once`). Plain `done` is
// what versions before renewals wrote: still done.

/// `{1, 0}` new; `{2, 0}` done; `{3, ms}` claimed for `ms` more.
const CLAIM: &str = r"
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return {1, 0} end
local v = redis.call('GET', KEYS[1])
if v == 'done' or (v and string.sub(v, 1, 5) == 'done:') then return {2, 0} end
return {3, redis.call('PTTL', KEYS[1])}";

const RENEW: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0";

/// `ARGV[1]` the claim, `ARGV[2]` the token, `ARGV[3]` the retention in ms (0: forever).
/// An absent key is our claim whose lease ran out with no attempt taking it over (or one
/// that did and gave it back): our work succeeded, so it is marked done, as the SQL stores
/// do for a row still under our token.
const COMPLETE: &str = r"
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] or not v then
  local t = redis.call('TIME')
  local done = 'done:' .. ARGV[2] .. ':' .. (t[1] * 1000 + math.floor(t[2] / 1000))
  if ARGV[3] == '0' then redis.call('SET', KEYS[1], done)
  else redis.call('SET', KEYS[1], done, 'PX', ARGV[3]) end
  return 1
end
if v and string.sub(v, 1, 6 + string.len(ARGV[2])) == 'done:' .. ARGV[2] .. ':' then return 1 end
return 0";

const RELEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0";

/// Deletes the key if it is done before `ARGV[1]` (unix ms).
const PRUNE_ONCE: &str = r"
local v = redis.call('GET', KEYS[1])
if not v or string.sub(v, 1, 5) ~= 'done:' then return 0 end
local at = tonumber(string.match(v, ':(%d+)$'))
if at and at < tonumber(ARGV[1]) then return redis.call('DEL', KEYS[1]) end
return 0";

impl RedisStore {
    /// Connects to `url` (`redis://…`) and checks that the server never evicts keys.
    /// Operations time out after 2 s (then 503).
    ///
    /// # Errors
    ///
    /// When the URL is invalid, the server cannot be reached, or its `maxmemory-policy` is
    /// not `noeviction` (an evicted done key lets a duplicate run again: set
    /// `maxmemory-policy noeviction`, or build the store with
    /// [`from_connection`](Self::from_connection) to accept that risk).
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let client = redis::Client::open(url).map_err(|e| redis_error("redis url", e))?;
        let connection = ConnectionManager::new_with_config(client, Self::config())
            .await
            .map_err(|e| redis_error("redis connect", e))?;
        let store = Self::from_connection(connection);
        let policy = store.eviction_policy().await?;
        if policy != "noeviction" {
            return Err(StoreError::new(
                "redis connect",
                format!(
                    "the server's maxmemory-policy is {policy}: it may evict done keys and live \
                     claims, and duplicates would run again; set maxmemory-policy noeviction, \
                     or use RedisStore::from_connection to accept the risk"
                ),
            )
            .with_kind(StoreErrorKind::Other));
        }
        Ok(store)
    }

    /// The server's `maxmemory-policy` (from `INFO memory`, which managed services that
    /// disable `CONFIG` still answer).
    ///
    /// # Errors
    ///
    /// When the server cannot be reached or does not say.
    pub async fn eviction_policy(&self) -> Result<String, StoreError> {
        let mut connection = self.connection.clone();
        let info: String = redis::cmd("INFO")
            .arg("memory")
            .query_async(&mut connection)
            .await
            .map_err(|e| redis_error("redis info", e))?;
        info.lines()
            .find_map(|line| line.strip_prefix("maxmemory_policy:"))
            .map(|policy| policy.trim().to_owned())
            .ok_or_else(|| {
                StoreError::message("redis info: no maxmemory_policy")
                    .with_kind(StoreErrorKind::Other)
            })
    }

    /// Like [`connect`](Self::connect), but connects on first use: a store that is down
    /// now answers 503 until it is up, instead of failing here. The eviction policy is not
    /// checked (there is no server yet): call [`eviction_policy`](Self::eviction_policy)
    /// once it is up.
    ///
    /// # Errors
    ///
    /// When the URL is invalid.
    pub fn connect_lazy(url: &str) -> Result<Self, StoreError> {
        let client = redis::Client::open(url).map_err(|e| redis_error("redis url", e))?;
        let connection = ConnectionManager::new_lazy_with_config(client, Self::config())
            .map_err(|e| redis_error("redis connect", e))?;
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
            retention: Retention::default().get(),
            replicas: None,
            scripts: Arc::new(Scripts {
                claim: Script::new(CLAIM),
                renew: Script::new(RENEW),
                complete: Script::new(COMPLETE),
                release: Script::new(RELEASE),
                prune_once: Script::new(PRUNE_ONCE),
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

    /// Replaces how long done event keys are kept (default 7 days; `Once` keys are kept
    /// until pruned by name).
    #[must_use]
    pub fn with_retention(mut self, retention: Retention) -> Self {
        self.retention = retention.get();
        self
    }

    /// Waits after each claim and completion until `replicas` replicas have it (Redis
    /// `WAIT`), for at most `timeout`; fewer is a store error (a claim answers 503, a
    /// completion is retried while the lease lasts). `WAIT` covers every write sent
    /// before it on the store's connection — and blocks that connection, which every
    /// request of this store shares, for up to `timeout`: keep it well under a second.
    #[must_use]
    pub fn with_replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.replicas = Some((replicas, timeout));
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

/// Waits until `replicas` replicas have every write sent so far on `connection`.
async fn replicated(
    connection: &mut ConnectionManager,
    replicas: Option<(u32, Duration)>,
    context: &'static str,
) -> Result<(), StoreError> {
    let Some((wanted, timeout)) = replicas else {
        return Ok(());
    };
    let acknowledged: u32 = redis::cmd("WAIT")
        .arg(wanted)
        .arg(
            u64::try_from(timeout.as_millis())
                .unwrap_or(u64::MAX)
                .max(1),
        )
        .query_async(connection)
        .await
        .map_err(|e| redis_error(context, e))?;
    if acknowledged < wanted {
        return Err(StoreError::new(
            context,
            format!("only {acknowledged} of {wanted} replicas acknowledged the write in time"),
        ));
    }
    Ok(())
}

/// A failed command as a [`StoreError`] of `context`: a URL or option that does not
/// parse is [`InvalidInput`](StoreErrorKind::InvalidInput); a connection that failed,
/// dropped or timed out, or a server loading, failing over or read-only,
/// [`Unavailable`](StoreErrorKind::Unavailable); the rest (a script error, an unexpected
/// reply, refused authentication) [`Other`](StoreErrorKind::Other).
pub(super) fn redis_error(context: &'static str, e: redis::RedisError) -> StoreError {
    use redis::{ErrorKind, ServerErrorKind};
    let kind = match e.kind() {
        ErrorKind::InvalidClientConfig => StoreErrorKind::InvalidInput,
        ErrorKind::Io | ErrorKind::ClusterConnectionNotFound => StoreErrorKind::Unavailable,
        ErrorKind::Server(
            ServerErrorKind::BusyLoading
            | ServerErrorKind::TryAgain
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::MasterDown
            | ServerErrorKind::ReadOnly,
        ) => StoreErrorKind::Unavailable,
        _ if e.is_timeout() || e.is_connection_dropped() => StoreErrorKind::Unavailable,
        _ => StoreErrorKind::Other,
    };
    StoreError::new(context, e).with_kind(kind)
}

/// `s` with Redis glob characters escaped, for `SCAN MATCH`.
fn glob_escape(s: &str) -> String {
    let mut escaped = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\' | '^' | '-') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

fn claimed(token: Token) -> String {
    format!("claimed:{token}")
}

impl DedupeStore for RedisStore {
    fn claim(&self, d: Delivery, token: Token, lease: Duration) -> StoreFuture<Claim> {
        let (mut connection, scripts, key) =
            (self.connection.clone(), self.scripts.clone(), self.key(&d));
        let replicas = self.replicas;
        let checked = super::check_key(d.source(), d.id());
        Box::pin(async move {
            checked?;
            let (state, pttl): (i64, i64) = scripts
                .claim
                .key(key)
                .arg(claimed(token))
                .arg(ms(lease))
                .invoke_async(&mut connection)
                .await
                .map_err(|e| redis_error("redis claim", e))?;
            if state == 1 {
                replicated(&mut connection, replicas, "redis claim").await?;
            }
            Ok(match state {
                1 => Claim::New(token),
                2 => Claim::Done,
                _ => Claim::InFlight {
                    retry_after: Duration::from_millis(pttl.max(1).unsigned_abs()),
                },
            })
        })
    }

    fn renew(&self, d: Delivery, token: Token, lease: Duration) -> StoreFuture<Renewed> {
        let (mut connection, scripts, key) =
            (self.connection.clone(), self.scripts.clone(), self.key(&d));
        Box::pin(async move {
            let renewed: i64 = scripts
                .renew
                .key(key)
                .arg(claimed(token))
                .arg(ms(lease))
                .invoke_async(&mut connection)
                .await
                .map_err(|e| redis_error("redis renew", e))?;
            Ok(if renewed == 1 {
                Renewed::Held
            } else {
                Renewed::Fenced
            })
        })
    }

    fn complete(&self, d: Delivery, token: Token) -> StoreFuture<Completed> {
        let (mut connection, scripts, key) =
            (self.connection.clone(), self.scripts.clone(), self.key(&d));
        let replicas = self.replicas;
        // A once key or a kept key never expires (0); an event key after the retention.
        let retention = if d.kept_until_pruned() {
            0
        } else {
            ms(self.retention)
        };
        Box::pin(async move {
            let done: i64 = scripts
                .complete
                .key(key)
                .arg(claimed(token))
                .arg(token.to_string())
                .arg(retention)
                .invoke_async(&mut connection)
                .await
                .map_err(|e| redis_error("redis complete", e))?;
            if done == 1 {
                replicated(&mut connection, replicas, "redis complete").await?;
            }
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
                .map_err(|e| redis_error("redis release", e))?;
            Ok(())
        })
    }

    /// Nothing to do: done event keys expire by themselves after the retention.
    fn prune(&self, _older_than: Retention) -> StoreFuture<u64> {
        Box::pin(std::future::ready(Ok(0)))
    }

    /// Scans the namespace's keys (`SCAN`, in batches) and deletes those done that long ago.
    fn prune_once(&self, namespace: &str, older_than: Duration) -> StoreFuture<u64> {
        let (mut connection, scripts) = (self.connection.clone(), self.scripts.clone());
        // Every key of the namespace starts as the key of an empty id does.
        let pattern = format!(
            "{}*",
            glob_escape(&self.key(&Delivery::once_key(namespace, "")))
        );
        Box::pin(async move {
            let err = |e| redis_error("redis prune", e);
            let now: (u64, u64) = redis::cmd("TIME")
                .query_async(&mut connection)
                .await
                .map_err(err)?;
            let cutoff = (now.0 * 1000 + now.1 / 1000).saturating_sub(ms(older_than));
            let (mut cursor, mut pruned) = (0u64, 0u64);
            loop {
                let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(500)
                    .query_async(&mut connection)
                    .await
                    .map_err(err)?;
                for key in keys {
                    let deleted: i64 = scripts
                        .prune_once
                        .key(key)
                        .arg(cutoff)
                        .invoke_async(&mut connection)
                        .await
                        .map_err(err)?;
                    pruned += deleted.unsigned_abs();
                }
                if next == 0 {
                    return Ok(pruned);
                }
                cursor = next;
            }
        })
    }
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.prefix)
            .field("retention", &self.retention)
            .field("replicas", &self.replicas)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_url_that_does_not_parse_is_invalid_input_and_no_server_is_unavailable() {
        let e = RedisStore::connect_lazy("http://127.0.0.1:6379").unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::InvalidInput, "{e:?}");
        // Nothing listens on port 1.
        let e = RedisStore::connect("redis://127.0.0.1:1")
            .await
            .unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::Unavailable, "{e:?}");
    }
}
