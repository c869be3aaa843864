//! [`Pause`]: a source or an event type whose events the inbox's workers do not start
//! while it lasts. Accepts go on; nothing is lost; resuming lets the events start, in the
//! order they were due. Kept in the database (`webhook_pauses`), so a pause holds for
//! every worker on it, in every replica; on JetStream, in a bucket beside the stream.

use std::time::SystemTime;

/// One pause: of a source, of an event type, or of one type of one source (`None`: any).
/// Both `None` pauses the whole inbox.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Pause {
    /// The processor paused (`None`: every processor).
    pub processor: Option<String>,
    /// The source paused (`None`: every source).
    pub source: Option<String>,
    /// The event type paused (`None`: every type).
    pub event_type: Option<String>,
    /// When it was paused.
    pub paused_at: SystemTime,
}

/// A row of `webhook_pauses` as both dialects read it: source, type, and when, in
/// milliseconds since the epoch.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn from_row((source, event_type, at_ms): (String, String, i64)) -> Pause {
    Pause {
        processor: None,
        source: part(source),
        event_type: part(event_type),
        paused_at: std::time::UNIX_EPOCH
            + std::time::Duration::from_millis(u64::try_from(at_ms).unwrap_or(0)),
    }
}

/// How the database keeps "any": the empty string (a key column cannot be NULL).
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn key(part: Option<&str>) -> String {
    part.unwrap_or_default().to_owned()
}

/// The row's column back as an option.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
fn part(column: String) -> Option<String> {
    (!column.is_empty()).then_some(column)
}
