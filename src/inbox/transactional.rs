//! The transactional processor form (PostgreSQL): the processor's writes and the row's
//! `processed_at` commit together, or neither does.

use std::error::Error as StdError;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use sqlx::PgPool;

use super::process::{BoxError, Failure};
use super::Attempt;
use crate::dedupe::PgTx;
use crate::store::Token;
use crate::Event;

/// What a [`transactional`](super::Worker::transactional) worker runs on each event: any
/// `Fn(Event, Attempt, PgTx) -> impl Future<Output = Result<(), E>>` whose error converts
/// into `Box<dyn Error + Send + Sync>` (as for [`Processor`](super::Processor)). Write
/// through the [`PgTx`] (lock it, use `&mut **guard`); on `Ok` the writes commit with the
/// row's `processed_at`, on `Err` (or a panic) both roll back and the row is retried — or,
/// for an `Err` holding a [`Later`](super::Later), snoozed without counting the attempt.
///
/// As for [`Processor`](super::Processor), the error must be `Send + Sync + 'static`:
/// `Box<dyn Error>` is not, `Box<dyn Error + Send + Sync>` is.
///
/// ```compile_fail,E0277
/// use tower_webhook::dedupe::PgTx;
/// use tower_webhook::inbox::{Attempt, TxProcessor};
/// use tower_webhook::Event;
///
/// async fn process(_: Event, _: Attempt, _: PgTx) -> Result<(), Box<dyn std::error::Error>> {
///     Ok(())
/// }
///
/// fn worker(_: impl TxProcessor) {}
/// worker(process); // error: `Box<dyn Error>` is neither `Send` nor `Sync`
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a transactional inbox processor",
    label = "not a `TxProcessor`",
    note = "a transactional processor is a `Fn(Event, Attempt, PgTx) -> impl Future<Output = Result<(), E>> + Send`, itself `Send + Sync + 'static` (a `fn`, or a `move` closure)",
    note = "its error `E` must convert into `Box<dyn Error + Send + Sync>`, so be `Send + Sync + 'static`: `Box<dyn Error>` is not; return `Box<dyn std::error::Error + Send + Sync>`, `sqlx::Error`, a `String`, or any `Error + Send + Sync + 'static`",
    note = "its future must be `Send`: hold nothing that is not (an `Rc`, a `std::sync::MutexGuard`) across an `.await`"
)]
pub trait TxProcessor: Send + Sync + 'static {
    /// Processes one event inside `tx`.
    #[allow(clippy::type_complexity)] // spelled out: readable in the docs
    fn process(
        &self,
        event: Event,
        attempt: Attempt,
        tx: PgTx,
    ) -> Pin<Box<dyn Future<Output = Result<(), Box<dyn StdError + Send + Sync>>> + Send>>;
}

// Not named in errors, so the trait's own message is (see `Processor`'s impl).
#[diagnostic::do_not_recommend]
impl<F, Fut, E> TxProcessor for F
where
    F: Fn(Event, Attempt, PgTx) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), E>> + Send + 'static,
    E: Into<Box<dyn StdError + Send + Sync>>,
{
    fn process(
        &self,
        event: Event,
        attempt: Attempt,
        tx: PgTx,
    ) -> Pin<Box<dyn Future<Output = Result<(), BoxError>> + Send>> {
        let future = self(event, attempt, tx);
        Box::pin(async move { future.await.map_err(Into::into) })
    }
}

/// Runs `processor` on `event` in a new transaction and, on success, marks the row
/// processed in it and commits. `Ok(false)`: `token` was fenced out (the lease ran out and
/// another worker has the row), so nothing was committed.
pub(super) async fn run(
    processor: Arc<dyn TxProcessor>,
    (pool, route): (PgPool, Arc<str>),
    event: Event,
    attempt: Attempt,
    token: Token,
) -> Result<bool, Failure> {
    let (source, id) = (event.source().to_owned(), event.stored_id().to_owned());
    let tx = PgTx::begin(&pool)
        .await
        .map_err(|e| format!("begin: {e}"))?;
    let shared = PgTx::new(tx);
    let processed = processor.process(event, attempt, shared.clone()).await;
    processed.map_err(|e| Failure::of(&*e))?; // Err: dropped, rolled back
    let mut tx = shared
        .into_inner()
        .ok_or("the processor kept its transaction after returning")?;
    // Fails too when one of the processor's statements failed and it returned Ok anyway
    // (the transaction is aborted): retried, never a silent rollback counted as done.
    let held = crate::sql::postgres::processed_in(&mut tx, (&source, &id, &route), token)
        .await
        .map_err(|e| format!("mark processed: {e}"))?;
    if !held {
        return Ok(false); // dropped: rolled back, the new holder processes it
    }
    tx.commit().await.map_err(|e| format!("commit: {e}"))?;
    Ok(true)
}
