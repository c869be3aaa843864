//! An attempt's outcome recorded on its row, fenced on the claim's token: in the
//! processor's own transaction, or on its own.

use sqlx::postgres::PgPool;
use sqlx::PgConnection;

use super::super::sealed::crate_text;
use super::super::shared::changed;
use super::super::{store_error, Outcome, ABANDONED, MAX_ATTEMPT_RECORDS};
use super::queue::{ABANDON, DEAD, LATER, PROCESSED, RETRY};
use crate::store::{StoreError, Token};

/// Marks an inbox route (`source`, `id`, `processor`) processed in the processor's own
/// transaction; `false` when `token` was fenced out (its lease ran out and another worker
/// took the route).
pub(crate) async fn processed_in(
    conn: &mut PgConnection,
    (source, id, processor): (&str, &str, &str),
    token: Token,
) -> Result<bool, sqlx::Error> {
    let query = sqlx::query(PROCESSED).bind(source).bind(id);
    let query = query.bind(token.as_uuid()).bind(processor);
    Ok(changed(query, conn).await? == 1)
}

/// Records one attempt's outcome if `token` still holds the route; `false` when fenced out.
pub(super) async fn finish_one(
    pool: &PgPool,
    (source, id, processor): (&str, &str, &str),
    token: Token,
    outcome: Outcome,
) -> Result<bool, StoreError> {
    let key = |sql| {
        sqlx::query_scalar::<_, i64>(sql)
            .bind(source)
            .bind(id)
            .bind(token.as_uuid())
    };
    let kept = KEPT_BEFORE_A_NEW_RECORD;
    // Whether a failure's error is the crate's own text, kept on an erased event (P11).
    let own = match &outcome {
        Outcome::Retry(error, _) | Outcome::Dead(error) => Some(crate_text(error)),
        _ => None,
    };
    let query = match outcome {
        Outcome::Processed => {
            let query = sqlx::query(PROCESSED).bind(source).bind(id);
            let query = query.bind(token.as_uuid()).bind(processor);
            let done = query.execute(pool).await;
            let done = done.map_err(|e| store_error("inbox finish", e))?;
            return Ok(done.rows_affected() == 1);
        }
        Outcome::Retry(error, after) => key(RETRY).bind(error).bind(after.as_secs_f64()).bind(kept),
        Outcome::Dead(error) => key(DEAD).bind(error),
        Outcome::Later(after) => key(LATER).bind(after.as_secs_f64()).bind(kept),
        Outcome::Abandoned => key(ABANDON).bind(ABANDONED).bind(kept),
    };
    // Each statement's last placeholder but `own`: the route's processor.
    let mut query = query.bind(processor);
    if let Some(own) = own {
        query = query.bind(own);
    }
    let done = query
        .fetch_one(pool)
        .await
        .map_err(|e| store_error("inbox finish", e))?;
    Ok(done == 1)
}

/// How many of an event's attempt records a failing, snoozed or abandoned attempt keeps
/// before adding its own.
const KEPT_BEFORE_A_NEW_RECORD: i64 = MAX_ATTEMPT_RECORDS as i64 - 1;
