//! [`advance`]: the per-object ordering guard — an event older than the newest one already
//! applied to the same object is dropped, so a late event never moves state back
//! (features `sqlite`/`postgres`).
//!
//! Providers deliver out of order: Monday's `customer.updated` can arrive after
//! Wednesday's. In the transaction that applies an event, call [`advance`] with the
//! object's namespace (the event's [`source`](crate::Event::source): one per provider or
//! tenant, so two that share an object id keep a clock each), the object and the event's
//! own time — the body's `created`, not the delivery's signed timestamp, which is the
//! retry's:
//!
//! - [`Order::Newest`]: the object's time is now this event's; apply it, then commit.
//! - [`Order::Stale`]: a newer event of this object was applied already; skip this one.
//!
//! The object's row stays locked until the transaction ends, so a concurrent event of the
//! same object waits, then compares with what committed: events of one object apply one
//! at a time, never a newer one overwritten by an older. A rollback undoes the advance
//! with the rest. Events with *equal* times both apply (providers' times are often whole
//! seconds); where order within a second matters, re-read the object from the provider.
//!
//! Rows live in the `webhook_objects` table of `migrations/`, one per namespace and
//! object; the stores' constructors create it. Use it in a [`transactional`][Worker::transactional]
//! inbox processor, a [`PgTx`] handler, or any transaction of yours.
//!
//! ```
//! use std::time::{Duration, SystemTime};
//! use tower_webhook::latest::{self, Order};
//! use tower_webhook::store::SqliteStore;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let path = std::env::temp_dir().join(format!("latest-doc-{}.db", std::process::id()));
//! let store = SqliteStore::open(&path).await?;
//! let wednesday = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
//! let monday = wednesday - Duration::from_secs(2 * 86_400);
//!
//! let mut tx = store.pool().begin().await?;
//! assert_eq!(latest::advance(&mut *tx, "stripe", "cus_1", wednesday).await?, Order::Newest);
//! // … write Wednesday's state of cus_1 in `tx` …
//! tx.commit().await?;
//!
//! let mut tx = store.pool().begin().await?;
//! assert_eq!(latest::advance(&mut *tx, "stripe", "cus_1", monday).await?, Order::Stale); // dropped
//! // Another provider's (or tenant's) cus_1 is another object: its own clock.
//! assert_eq!(latest::advance(&mut *tx, "tenant-b", "cus_1", monday).await?, Order::Newest);
//! # drop(tx);
//! # std::fs::remove_file(&path)?;
//! # Ok(())
//! # }
//! ```
//!
#![cfg_attr(
    feature = "postgres",
    doc = "
[Worker::transactional]: crate::inbox::Worker::transactional
[`PgTx`]: crate::dedupe::PgTx"
)]
#![cfg_attr(
    not(feature = "postgres"),
    doc = "
[Worker::transactional]: crate#features
[`PgTx`]: crate#features"
)]

use std::future::Future;
use std::pin::Pin;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::sql::store_error;
use crate::store::StoreError;

/// What [`advance`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum Order {
    /// No newer event of this object was applied: apply this one.
    Newest,
    /// A newer event of this object was applied already: skip this one.
    Stale,
}

/// Moves the time of `object` of `namespace` forward to `at` in the transaction `conn`
/// belongs to, unless a newer event of it was applied; locks the object's row until the
/// transaction ends.
///
/// `namespace` scopes object ids: pass the event's [`source`](crate::Event::source) (a
/// provider's, or a tenant's), so tenants and providers whose object ids collide never
/// share a clock. Rows written before the namespace existed are the empty namespace's.
///
/// `conn` is a `&mut *tx` of a PostgreSQL or SQLite transaction (outside a transaction the
/// lock ends with the statement, and the guard no longer orders concurrent events). Call
/// it first in the transaction: on SQLite the first write takes the database's write
/// lock, and a transaction that read before it may fail with `SQLITE_BUSY` instead of
/// waiting. On PostgreSQL, at the default `READ COMMITTED` isolation a concurrent event
/// waits and then compares; under `REPEATABLE READ` or `SERIALIZABLE` it fails with a
/// serialization error instead (retry it).
///
/// # Errors
///
/// When the database fails (the transaction is then unusable: roll it back).
pub async fn advance<C: Connection + ?Sized>(
    conn: &mut C,
    namespace: &str,
    object: &str,
    at: SystemTime,
) -> Result<Order, StoreError> {
    // Milliseconds since the epoch; before it, negative.
    let ms = match at.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_millis()).unwrap_or(i64::MAX),
        Err(e) => i64::try_from(e.duration().as_millis()).map_or(i64::MIN, |ms| -ms),
    };
    match conn.advance(namespace, object, ms).await {
        Ok(true) => Ok(Order::Newest),
        Ok(false) => Ok(Order::Stale),
        Err(e) => Err(store_error("ordering guard", e)),
    }
}

/// A database connection [`advance`] works on: PostgreSQL's and SQLite's.
pub trait Connection: sealed::Sealed + Send {
    #[doc(hidden)]
    fn advance<'a>(
        &'a mut self,
        namespace: &'a str,
        object: &'a str,
        at_ms: i64,
    ) -> Pin<Box<dyn Future<Output = Result<bool, sqlx::Error>> + Send + 'a>>;
}

mod sealed {
    pub trait Sealed {}
}

/// One implementation per database: its statement lives with the dialect's others.
macro_rules! connection {
    ($feature:literal, $conn:ty, $dialect:ident) => {
        #[cfg(feature = $feature)]
        impl sealed::Sealed for $conn {}

        #[cfg(feature = $feature)]
        impl Connection for $conn {
            fn advance<'a>(
                &'a mut self,
                namespace: &'a str,
                object: &'a str,
                at_ms: i64,
            ) -> Pin<Box<dyn Future<Output = Result<bool, sqlx::Error>> + Send + 'a>> {
                Box::pin(crate::sql::$dialect::advance(
                    self, namespace, object, at_ms,
                ))
            }
        }
    };
}

connection!("postgres", sqlx::PgConnection, postgres);
connection!("sqlite", sqlx::SqliteConnection, sqlite);
