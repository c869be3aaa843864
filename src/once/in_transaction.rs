//! `Once::run_in`: the key recorded in the caller's PostgreSQL transaction.

use std::future::Future;

use super::{IdempotencyKey, Once, OnceError, Ran};
use crate::store::{Claim, Delivery, Token};

impl Once {
    /// Runs `action` unless it already ran for `key`, recording the key **in `tx`**: the
    /// key is done exactly when the transaction commits, together with the action's own
    /// writes (make them through the same [`PgTx`](crate::dedupe::PgTx)). For a
    /// [`Worker::transactional`](crate::inbox::Worker::transactional) processor or a
    /// handler behind [`TxDedupeLayer`](crate::dedupe::TxDedupeLayer).
    ///
    /// The key and the action's writes sit in a savepoint: a failed action rolls back to
    /// it (the key is not done, the transaction goes on), so the caller may still commit
    /// its other work. A transaction that rolls back later takes the key with it, and the
    /// retry runs the action again — its writes were rolled back too. A concurrent
    /// transaction with the same key waits for this one to end.
    ///
    /// The keys live in the same table as [`run`](Self::run)'s, on the transaction's
    /// database: use one `Once` namespace with a [`PgStore`](crate::store::PgStore) on the
    /// same database to mix the two.
    ///
    /// # Errors
    ///
    /// [`OnceErrorKind::Action`](super::OnceErrorKind::Action) when the action fails
    /// (rolled back to the savepoint); [`OnceErrorKind::Store`](super::OnceErrorKind::Store)
    /// when a statement fails (the transaction is then aborted: let it roll back).
    pub async fn run_in<F, Fut, T, E>(
        &self,
        tx: &crate::dedupe::PgTx,
        key: &str,
        action: F,
    ) -> Result<Ran<T>, OnceError<E>>
    where
        F: FnOnce(IdempotencyKey) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let store = |e| OnceError::of_store(crate::sql::store_error("once in transaction", e));
        // Refused before any statement: a key PostgreSQL cannot keep would abort the caller's transaction.
        crate::store::check_key(&self.namespace, key).map_err(OnceError::of_store)?;
        let claimed = {
            let mut conn = tx.lock().await;
            sqlx::query("SAVEPOINT tower_webhook_once")
                .execute(&mut **conn)
                .await
                .map_err(store)?;
            let once_key = Delivery::once_key(&self.namespace, key);
            let claim = crate::sql::postgres::done_in(&mut conn, &once_key, Token::new())
                .await
                .map_err(store)?;
            match claim {
                Claim::New(_) => None,
                Claim::Done | Claim::InFlight { .. } => {
                    sqlx::query("RELEASE SAVEPOINT tower_webhook_once")
                        .execute(&mut **conn)
                        .await
                        .map_err(store)?;
                    Some(match claim {
                        Claim::InFlight { retry_after } => Ran::InProgress { retry_after },
                        _ => Ran::Already,
                    })
                }
            }
        };
        if let Some(answer) = claimed {
            return Ok(answer);
        }
        let outcome = action(self.idempotency_key(key)).await;
        let mut conn = tx.lock().await;
        if outcome.is_err() {
            sqlx::query("ROLLBACK TO SAVEPOINT tower_webhook_once")
                .execute(&mut **conn)
                .await
                .map_err(store)?;
        }
        sqlx::query("RELEASE SAVEPOINT tower_webhook_once")
            .execute(&mut **conn)
            .await
            .map_err(store)?;
        outcome.map(Ran::Now).map_err(OnceError::of_action)
    }
}
