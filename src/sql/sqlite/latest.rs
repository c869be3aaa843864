//! The ordering guard (`webhook_objects`, `crate::latest`).

use super::super::shared::advance;

/// `ON CONFLICT DO UPDATE … WHERE` updates only when not older; SQLite's one writer
/// serialises the caller's whole transaction.
const ADVANCE: &str = "
INSERT INTO webhook_objects (namespace, object, applied_at) VALUES (?1, ?2, ?3)
ON CONFLICT (namespace, object) DO UPDATE SET applied_at = excluded.applied_at
WHERE webhook_objects.applied_at <= excluded.applied_at";

advance!(sqlx::SqliteConnection);
