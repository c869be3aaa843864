//! An event's attempts as the SQL inbox records them: each attempt's start, end, outcome
//! and error ([`StoredEvent::attempts`](super::StoredEvent::attempts)).

use std::fmt;
use std::time::{Duration, SystemTime};

/// One attempt at an event, as the inbox recorded it when the attempt ended
/// ([`StoredEvent::attempts`](super::StoredEvent::attempts)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct AttemptRecord {
    /// Whose route's attempt it was (the processor's name).
    pub processor: String,
    /// Its number, from 1 since the event was received or last requeued (a snoozed
    /// attempt is not counted: the attempt after it has the same number).
    pub attempt: u32,
    /// When the worker claimed the event for it (the database's clock).
    pub started_at: SystemTime,
    /// When its outcome was recorded; for a [crashed](AttemptOutcome::Crashed) attempt,
    /// when its lease ran out. Never before `started_at`.
    pub finished_at: SystemTime,
    /// How it ended.
    pub outcome: AttemptOutcome,
    /// The processor's error (its `Display`) for a failed or dead attempt, or why it was
    /// abandoned; `None` otherwise.
    pub error: Option<String>,
}

impl AttemptRecord {
    /// How long it ran: from its start to its outcome (to its lease's end when it
    /// crashed).
    #[must_use]
    pub fn duration(&self) -> Duration {
        self.finished_at
            .duration_since(self.started_at)
            .unwrap_or_default()
    }
}

/// How an [`AttemptRecord`]'s attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AttemptOutcome {
    /// The processor succeeded: the event is processed.
    Processed,
    /// The processor failed; the event was queued for a retry.
    Failed,
    /// The processor failed (or gave up) on the last attempt allowed: the event is dead.
    Dead,
    /// The processor said "not now" ([`Later`](super::Later)): the event was queued
    /// again, the attempt uncounted.
    Snoozed,
    /// The worker shut down past its grace period while it ran.
    Abandoned,
    /// It ended without an outcome (its worker crashed, or was stopped): its lease ran
    /// out, and the next claim of the event recorded it.
    Crashed,
}

impl AttemptOutcome {
    /// Its name in lower case: `processed`, `failed`, `dead`, `snoozed`, `abandoned`,
    /// `crashed` (as the `webhook_attempts` table stores it).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            AttemptOutcome::Processed => "processed",
            AttemptOutcome::Failed => "failed",
            AttemptOutcome::Dead => "dead",
            AttemptOutcome::Snoozed => "snoozed",
            AttemptOutcome::Abandoned => "abandoned",
            AttemptOutcome::Crashed => "crashed",
        }
    }

    /// The outcome a `webhook_attempts` row names; `None` for a name this version does
    /// not know.
    pub(crate) fn from_column(name: &str) -> Option<Self> {
        [
            AttemptOutcome::Processed,
            AttemptOutcome::Failed,
            AttemptOutcome::Dead,
            AttemptOutcome::Snoozed,
            AttemptOutcome::Abandoned,
            AttemptOutcome::Crashed,
        ]
        .into_iter()
        .find(|o| o.as_str() == name)
    }
}

impl fmt::Display for AttemptOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_attempt_outcome_reads_back_from_its_name() {
        for outcome in [
            AttemptOutcome::Processed,
            AttemptOutcome::Failed,
            AttemptOutcome::Dead,
            AttemptOutcome::Snoozed,
            AttemptOutcome::Abandoned,
            AttemptOutcome::Crashed,
        ] {
            assert_eq!(AttemptOutcome::from_column(outcome.as_str()), Some(outcome));
        }
        assert_eq!(AttemptOutcome::from_column("exploded"), None);
    }
}
