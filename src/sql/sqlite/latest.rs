//! The ordering guard (`webhook_objects`, `crate::latest`).

/// `ON CONFLICT DO UPDATE … WHERE` updates only when not older; SQLite's one writer
/// serialises the caller's whole transaction.
const ADVANCE: &str = "
INSERT INTO webhook_objects (namespace, object, applied_at) VALUES (?1, ?2, ?3)
ON CONFLICT (namespace, object) DO UPDATE SET applied_at = excluded.applied_at
WHERE webhook_objects.applied_at <= excluded.applied_at";

/// Moves `(namespace, object)`'s time to `at_ms` unless a newer one was applied; `true`
/// when it moved (or was first seen).
pub(crate) async fn advance(
    conn: &mut sqlx::SqliteConnection,
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
