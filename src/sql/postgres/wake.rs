//! When the inbox's workers wake: the `LISTEN` that hears every process's accepts and
//! when its retries and snoozes fall due, and the read of the next due time.

use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgListener, PgPool};
use tokio::sync::Notify;

use super::super::store_error;
use super::CHANNEL;
use crate::inbox::worker::due::{self, Dues};
use crate::store::StoreFuture;

/// How many seconds until the processor `$1`'s earliest queued route not due yet falls
/// due: on the due routes' index, one row read.
const NEXT_DUE: &str = "
SELECT extract(epoch FROM next_attempt_at - now())::float8 FROM webhook_routes
WHERE processor = $1 AND next_attempt_at > now() AND processed_at IS NULL AND dead_at IS NULL
ORDER BY next_attempt_at LIMIT 1";

/// How long until the earliest queued row not due yet falls due, if one waits so.
pub(super) fn next_due(pool: &PgPool, processor: Arc<str>) -> StoreFuture<Option<Duration>> {
    let pool = pool.clone();
    Box::pin(async move {
        let after: Option<f64> = sqlx::query_scalar(NEXT_DUE)
            .bind(&*processor)
            .fetch_optional(&pool)
            .await
            .map_err(|e| store_error("inbox next due", e))?;
        Ok(after.and_then(|secs| Duration::try_from_secs_f64(secs).ok()))
    })
}

/// Listens on the channel: a notification that says in how many seconds a processor's
/// route falls due (a retry's, a snooze's, `<processor> <seconds>`) tells that processor's
/// workers (every processor's for a bare number, an older replica's, or a processor this
/// process does not know); any other wakes `wake` now (every worker).
pub(super) fn listen(pool: PgPool, wake: Arc<Notify>, due: Dues) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        // Reconnects after a failure; the worker's polling covers the gap.
        loop {
            if let Ok(mut listener) = PgListener::connect_with(&pool).await {
                if listener.listen(CHANNEL).await.is_ok() {
                    while let Ok(told) = listener.recv().await {
                        // Counted from the write, before it was heard: never early.
                        match due::heard(told.payload()) {
                            Some((processor, after)) => due.after(processor, after),
                            None => wake.notify_waiters(),
                        }
                    }
                }
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    })
}
