//! The ordering guard (`webhook_objects`, `crate::latest`).

use sqlx::PgConnection;

/// `ON CONFLICT DO UPDATE … WHERE` updates only when not older, and locks the row either
/// way, until the caller's transaction ends.
const ADVANCE: &str = "
INSERT INTO webhook_objects (namespace, object, applied_at)
VALUES ($1, $2, to_timestamp($3 / 1000.0))
ON CONFLICT (namespace, object) DO UPDATE SET applied_at = excluded.applied_at
WHERE webhook_objects.applied_at <= excluded.applied_at";

/// Moves `(namespace, object)`'s time to `at_ms` unless a newer one was applied; `true`
/// when it moved (or was first seen).
pub(crate) async fn advance(
    conn: &mut PgConnection,
    namespace: &str,
    object: &str,
    at_ms: i64,
) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(ADVANCE)
        .bind(namespace)
        .bind(object)
        .bind(at_ms)
        .execute(conn)
        .await?;
    Ok(done.rows_affected() == 1)
}
