//! [`Pause`]: a source or an event type whose events the inbox's workers do not start
//! while it lasts. Accepts go on; nothing is lost; resuming lets the events start, in the
//! order they were due. Kept in the database (`webhook_pauses`), so a pause holds for
//! every worker on it, in every replica; on JetStream, in a bucket beside the stream; on
//! RabbitMQ, in a stream queue beside the queue.

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

#[cfg(any(feature = "sqlite", feature = "postgres"))]
use super::Inbox;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
use crate::store::{StoreError, StoreErrorKind};

#[cfg(any(feature = "sqlite", feature = "postgres"))]
impl Inbox {
    /// Pauses the events of `source` of type `event_type` (`None`: any source, any type;
    /// both `None`: every event) for every processor: no worker on this database starts a
    /// route of one until it is [resumed](Self::resume). Accepts go on, and events already running finish.
    /// Returns `false` when it was paused already.
    ///
    /// # Errors
    ///
    /// When the database fails.
    pub async fn pause(
        &self,
        source: Option<&str>,
        event_type: Option<&str>,
    ) -> Result<bool, StoreError> {
        self.hold(None, source, event_type, true).await
    }

    /// Ends the pause of exactly that source and type (as [`pause`](Self::pause) took
    /// them): its events start again, in the order they were due (a pause of the whole
    /// source, or of the type in every source, still holds them). Returns `false` when
    /// there was no such pause.
    ///
    /// # Errors
    ///
    /// When the database fails.
    pub async fn resume(
        &self,
        source: Option<&str>,
        event_type: Option<&str>,
    ) -> Result<bool, StoreError> {
        self.hold(None, source, event_type, false).await
    }

    /// Pauses the events of `source` of type `event_type` (`None`: any) for the processor
    /// `processor` alone: its workers start none of their routes until it is
    /// [resumed](Self::resume_processor); the other processors' run.
    /// [`pause`](Self::pause) pauses for every processor. Returns `false` when it was
    /// paused already.
    ///
    /// # Errors
    ///
    /// [`StoreErrorKind::InvalidInput`] for a processor this inbox does not have; when the
    /// database fails.
    pub async fn pause_processor(
        &self,
        processor: &str,
        source: Option<&str>,
        event_type: Option<&str>,
    ) -> Result<bool, StoreError> {
        self.configured(processor)?;
        self.hold(Some(processor), source, event_type, true).await
    }

    /// Ends `processor`'s own pause of exactly that source and type (as
    /// [`pause_processor`](Self::pause_processor) took them): its routes start again (a
    /// pause of every processor still holds them). Returns `false` when there was no such
    /// pause.
    ///
    /// # Errors
    ///
    /// [`StoreErrorKind::InvalidInput`] for a processor this inbox does not have; when the
    /// database fails.
    pub async fn resume_processor(
        &self,
        processor: &str,
        source: Option<&str>,
        event_type: Option<&str>,
    ) -> Result<bool, StoreError> {
        self.configured(processor)?;
        self.hold(Some(processor), source, event_type, false).await
    }

    /// Pauses (`true`) or resumes (`false`) for `processor` (`None`: every processor); a
    /// resume wakes the workers.
    async fn hold(
        &self,
        processor: Option<&str>,
        source: Option<&str>,
        event_type: Option<&str>,
        pause: bool,
    ) -> Result<bool, StoreError> {
        let rule = (key(processor), key(source), key(event_type));
        let changed = self.backend.pause(rule, pause).await?;
        if !pause {
            self.wake.notify_waiters();
        }
        Ok(changed)
    }

    /// Whether this inbox has the processor `name`.
    pub(crate) fn has_processor(&self, name: &str) -> bool {
        self.processors.get(name).is_some()
    }

    fn configured(&self, processor: &str) -> Result<(), StoreError> {
        match self.has_processor(processor) {
            true => Ok(()),
            false => Err(StoreError::new(
                "inbox pause",
                self.processors.unknown(processor).to_string(),
            )
            .with_kind(StoreErrorKind::InvalidInput)),
        }
    }

    /// What is paused now (each pause's processor `None` when it holds every processor).
    ///
    /// # Errors
    ///
    /// When the database fails.
    pub async fn pauses(&self) -> Result<Vec<Pause>, StoreError> {
        self.backend.pauses().await
    }
}

/// A pause's processor, source and type as the database keeps them (`''`: any).
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) type Rule = (String, String, String);

/// A row of `webhook_pauses` as both dialects read it: processor, source, type, and when,
/// in milliseconds since the epoch.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn from_row(
    (processor, source, event_type, at_ms): (String, String, String, i64),
) -> Pause {
    Pause {
        processor: part(processor),
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
