//! [`PgTx`]: the event's PostgreSQL transaction, handed to a handler behind
//! [`TxDedupeLayer`](super::TxDedupeLayer) or to a transactional inbox processor.

use std::sync::Arc;

use sqlx::{PgPool, Postgres, Transaction};
use tokio::sync::{Mutex, MutexGuard};

#[cfg(feature = "axum")]
use crate::response::{Rejection, RejectionKind};

/// The event's transaction, for the handler's own writes. Lock it, use `&mut **guard` as
/// the executor, and let go before answering: the middleware commits it on a 2xx.
#[derive(Clone)]
pub struct PgTx {
    tx: Arc<Mutex<Transaction<'static, Postgres>>>,
}

impl PgTx {
    /// Begins a transaction on `pool`, cancel-safe: the `BEGIN` runs on a task of its own.
    /// sqlx 0.9 counts a transaction only once `BEGIN` has answered, so a future dropped
    /// in between (a worker stopped mid-event) hands the pool a connection stuck inside a
    /// transaction that every later borrower runs in (sqlx#4393). On its own task the
    /// `BEGIN` always finishes, and a transaction nobody waits for any more rolls back.
    pub(crate) async fn begin(
        pool: &PgPool,
    ) -> Result<Transaction<'static, Postgres>, sqlx::Error> {
        let pool = pool.clone();
        match tokio::spawn(async move { pool.begin().await }).await {
            Ok(begun) => begun,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => Err(sqlx::Error::WorkerCrashed), // the runtime is shutting down
        }
    }

    pub(crate) fn new(tx: Transaction<'static, Postgres>) -> Self {
        Self {
            tx: Arc::new(Mutex::new(tx)),
        }
    }

    /// The transaction back, unless a clone of `self` is still alive somewhere (work that
    /// may still be running: never commit it).
    pub(crate) fn into_inner(self) -> Option<Transaction<'static, Postgres>> {
        Arc::try_unwrap(self.tx).ok().map(Mutex::into_inner)
    }

    /// Waits for the transaction (only the handler's own tasks compete for it).
    pub async fn lock(&self) -> MutexGuard<'_, Transaction<'static, Postgres>> {
        self.tx.lock().await
    }
}

impl std::fmt::Debug for PgTx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgTx").finish_non_exhaustive()
    }
}

/// The extractor's 500 without the layer in front.
#[cfg(feature = "axum")]
const MISSING_TRANSACTION: &str = "no webhook transaction in the request: add \
    tower_webhook::dedupe::TxDedupeLayer in front of this route";

/// Extracts the event's transaction; without [`TxDedupeLayer`](super::TxDedupeLayer) in
/// front, a [`Rejection`] of kind `MissingTransaction` (500).
#[cfg(feature = "axum")]
impl<S: Send + Sync> axum_core::extract::FromRequestParts<S> for PgTx {
    type Rejection = Rejection;

    async fn from_request_parts(
        parts: &mut http::request::Parts,
        _: &S,
    ) -> Result<Self, Self::Rejection> {
        parts
            .extensions
            .get::<PgTx>()
            .cloned()
            .ok_or(Rejection::new(
                RejectionKind::MissingTransaction,
                MISSING_TRANSACTION,
            ))
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::task::Poll;
    use std::time::Duration;

    use super::*;

    /// Polls `future` for `time` (yielding to the runtime between polls), then drops it:
    /// a cancellation at whatever point it had reached. Whether it finished.
    async fn cancel_after<F: Future>(future: F, time: Duration) -> bool {
        let mut future = std::pin::pin!(future);
        let until = std::time::Instant::now() + time;
        loop {
            let ready = std::future::poll_fn(|cx| Poll::Ready(future.as_mut().poll(cx).is_ready()));
            if ready.await {
                return true;
            }
            if std::time::Instant::now() >= until {
                return false;
            }
            tokio::task::yield_now().await;
        }
    }

    /// Whether the pool's next connection runs statements inside a transaction: two
    /// statements in a row then share one transaction id.
    async fn in_a_transaction(pool: &PgPool) -> bool {
        let xid = || sqlx::query_scalar::<_, i64>("SELECT txid_current()").fetch_one(pool);
        xid().await.unwrap() == xid().await.unwrap()
    }

    /// A `begin` dropped at any point, one poll after another across its round trip,
    /// leaves its pool's one connection outside any transaction.
    #[tokio::test]
    async fn a_begin_cancelled_anywhere_leaves_no_open_transaction_on_the_pool() {
        let url = std::env::var("DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .connect(&url)
            .await
            .expect("PostgreSQL is running");
        assert!(!in_a_transaction(&pool).await);
        // 0 to 4 ms in 20 µs steps, past the round trip: every point of it is hit.
        let mut finished = 0;
        for step in 0..200 {
            let time = Duration::from_micros(20 * step);
            finished += u32::from(cancel_after(PgTx::begin(&pool), time).await);
            assert!(
                !in_a_transaction(&pool).await,
                "a stale transaction after {time:?}"
            );
        }
        assert!(finished > 0, "the sweep reaches past the round trip");
    }
}
