//! [`Counts`]: how many of an inbox's rows are in each state.

use std::time::Duration;

/// How many rows are in each state, for dashboards.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Counts {
    /// Waiting for their first or next attempt.
    pub queued: u64,
    /// Claimed by a worker now.
    pub processing: u64,
    /// Processed.
    pub processed: u64,
    /// Gave up after the maximum attempts.
    pub dead: u64,
    /// Held back by a [pause][Inbox::pause]: on the SQL inbox the queued rows a pause
    /// covers (counted in `queued` too); on JetStream the messages parked while paused
    /// (out of the stream, so not in `queued`); on RabbitMQ those in `<queue>-paused`.
    ///
    #[cfg_attr(
        any(feature = "sqlite", feature = "postgres"),
        doc = "[Inbox::pause]: crate::inbox::Inbox::pause"
    )]
    #[cfg_attr(
        not(any(feature = "sqlite", feature = "postgres")),
        doc = "[Inbox::pause]: crate#features"
    )]
    pub paused: u64,
    /// Events kept invalid: their type's JSON Schema refused the body (issue 36). Counted
    /// per event, not per processor (an invalid event has no route): only in the whole
    /// inbox's [`counts`][Inbox::counts] (or stream's), 0 in each processor's.
    ///
    #[cfg_attr(
        any(feature = "sqlite", feature = "postgres"),
        doc = "[Inbox::counts]: crate::inbox::Inbox::counts"
    )]
    #[cfg_attr(
        not(any(feature = "sqlite", feature = "postgres")),
        doc = "[Inbox::counts]: crate#features"
    )]
    pub invalid: u64,
    /// How long the longest-waiting due row has waited (`None` when none is due): the
    /// queue's lag, the number to alert on when workers fall behind or stop.
    pub oldest_due: Option<Duration>,
}

impl Counts {
    /// Both counts together: each number summed, the longer wait.
    #[cfg(any(
        feature = "sqlite",
        feature = "postgres",
        feature = "nats",
        feature = "amqp"
    ))]
    pub(crate) fn plus(self, other: Counts) -> Counts {
        Counts {
            queued: self.queued + other.queued,
            processing: self.processing + other.processing,
            processed: self.processed + other.processed,
            dead: self.dead + other.dead,
            paused: self.paused + other.paused,
            invalid: self.invalid + other.invalid,
            oldest_due: self.oldest_due.max(other.oldest_due),
        }
    }

    /// Sets the inbox's gauges to these counts (feature `metrics`).
    #[cfg(any(
        feature = "sqlite",
        feature = "postgres",
        feature = "nats",
        feature = "amqp"
    ))]
    pub(crate) fn set_gauges(&self, processor: &crate::metrics::Processor) {
        let depth = (self.queued, self.processing, self.paused);
        crate::metrics::inbox_gauges(processor, depth, self.dead, self.oldest_due);
    }
}

/// What a requeue of the invalid events did (`Inbox::requeue_invalid`,
/// `JetStream::requeue_invalid`): each checked again against the schemas loaded now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RevalidatedCounts {
    /// Valid now: queued (routed on the SQL inbox), each to run once.
    pub queued: u64,
    /// Still invalid (on the SQL inbox their errors replaced by today's), or without a
    /// body to check.
    pub still_invalid: u64,
}
