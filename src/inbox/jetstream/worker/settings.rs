//! The settings only a [`JetStreamWorker`] has (the rest are the engine's, shared with the
//! SQL worker): the claim's lease, the consumer's `ack_wait`, the pulls' wait, and the
//! lookahead.

use std::time::Duration;

use super::{renew, JetStreamWorker};
use crate::inbox::process::checked_poll;
use crate::store::Lease;
use crate::ConfigError;

/// The most [`JetStreamWorker::with_lookahead`] takes (a semaphore's permits are bounded).
const MAX_LOOKAHEAD: usize = 1_000_000;

impl JetStreamWorker {
    /// Replaces the lease of an event's claim in the store (default 60 s), renewed every
    /// third of it while the processor runs. It bounds how long a *crashed* worker's
    /// running events wait to run again: their messages come back after the consumer's
    /// `ack_wait`, and go back (not counted) until the claim has lapsed.
    ///
    /// # Errors
    ///
    /// When `lease` is not between 100 ms and 1 day.
    pub fn with_lease(mut self, lease: Duration) -> Result<Self, ConfigError> {
        self.engine.lease.length = Lease::checked_length(lease)?;
        Ok(self)
    }

    /// Replaces the consumer's `ack_wait` (default 3 s), set on the consumer when the
    /// worker starts (give every worker of a consumer the same). Each message the worker
    /// holds — running, waiting for its turn, waiting out a retry — is renewed (`+WPI`)
    /// every third of it. It bounds how long a message lost in transit (sent as the
    /// connection to NATS dropped) and a crashed worker's waiting messages take to come
    /// back. Shorter costs more renewals; a renewal late by two thirds of it has the
    /// message delivered again meanwhile, which goes back while the claim holds (a worker
    /// without a store runs it again).
    ///
    /// # Errors
    ///
    /// When `ack_wait` is not between 100 ms and 1 day.
    pub fn with_ack_wait(mut self, ack_wait: Duration) -> Result<Self, ConfigError> {
        self.engine.queue.ack_wait = renew::checked(ack_wait)?;
        Ok(self)
    }

    /// Replaces how long each pull waits for messages (default 1 s; JetStream hands a
    /// message over as soon as it arrives). A shutdown waits for the pull in flight, whose
    /// messages are delivered already, and processes them.
    ///
    /// # Errors
    ///
    /// When `poll` is not between 10 ms and 1 h.
    pub fn with_poll_interval(mut self, poll: Duration) -> Result<Self, ConfigError> {
        self.engine.poll = checked_poll(poll)?;
        self.engine.queue.poll = self.engine.poll;
        Ok(self)
    }

    /// Replaces how many messages may wait in this worker for their turns under its caps
    /// and rates per source or type (default 256, beside one per processor): they wait
    /// without a processor, so the worker pulls on past them, and another source's
    /// messages further along the stream start meanwhile — the fair share a stream read
    /// in order can give. A source whose messages are further behind another's backlog
    /// waits until the worker has read that close (the SQL inbox's claim skips at any
    /// depth). The worker pulls no more than it has places for.
    ///
    /// Each waiting message is renewed (`+WPI`) every third of the consumer's `ack_wait`
    /// (1 s by default), and all of them count toward the consumer's `max_ack_pending`
    /// (NATS's default: 1 000, shared by every worker of the consumer): a pull beyond it
    /// gets nothing until some are done.
    /// The wait counts toward [`with_max_run`](Self::with_max_run) (default 1 h). A worker
    /// that crashes while messages wait has counted each a delivery, as it would a
    /// message it was running; one that shuts down hands them back uncounted.
    ///
    /// # Errors
    ///
    /// When `n` is over 1 000 000.
    pub fn with_lookahead(mut self, n: usize) -> Result<Self, ConfigError> {
        if n > MAX_LOOKAHEAD {
            let why = "a lookahead must be at most 1 000 000 messages";
            return Err(ConfigError::new(crate::ConfigErrorKind::InvalidValue, why));
        }
        self.engine.lookahead = n;
        Ok(self)
    }
}
