//! A processor's worker (fan-out, `../processors.rs`), and what it does with a message its
//! processor does not run.

use std::sync::Arc;

use tokio::time::Instant;

use super::super::settle::{nak, pass, BURY_AGAIN};
use super::{JetStream, JetStreamWorker, Pulled, Stream};
use crate::inbox::Processor;
use crate::store::DedupeStore;
use crate::ConfigError;

impl JetStreamWorker {
    /// A worker of the processor `name` (configured with
    /// [`with_processors`](super::super::JetStreamBuilder::with_processors)), running
    /// `processor` on each event its filter takes, claimed in `store` as
    /// [`new`](Self::new)'s; a message its filter does not take is acknowledged unrun.
    /// It reads the processor's own consumer, and buries in its own dead-letter stream.
    /// [`new`](Self::new) is the processor `default`'s.
    ///
    /// # Errors
    ///
    /// [`ConfigErrorKind::InvalidProcessor`](crate::ConfigErrorKind::InvalidProcessor)
    /// when `jetstream` has no processor `name`.
    pub fn processor(
        jetstream: &JetStream,
        name: &str,
        store: impl DedupeStore,
        processor: impl Processor,
    ) -> Result<Self, ConfigError> {
        Self::from_arc_processor(jetstream, name, Arc::new(store), processor)
    }

    /// [`processor`](Self::processor), with a store already shared behind an `Arc` (as
    /// [`from_arc`](Self::from_arc)).
    ///
    /// # Errors
    ///
    /// [`ConfigErrorKind::InvalidProcessor`](crate::ConfigErrorKind::InvalidProcessor)
    /// when `jetstream` has no processor `name`.
    pub fn from_arc_processor(
        jetstream: &JetStream,
        name: &str,
        store: Arc<dyn DedupeStore>,
        processor: impl Processor,
    ) -> Result<Self, ConfigError> {
        let jetstream = jetstream.for_processor(name)?;
        Ok(Self::from_arc(&jetstream, store, processor))
    }

    /// [`processor`](Self::processor) without a store, at least once (as
    /// [`at_least_once`](Self::at_least_once)): a message JetStream delivers again runs
    /// the processor again.
    ///
    /// # Errors
    ///
    /// [`ConfigErrorKind::InvalidProcessor`](crate::ConfigErrorKind::InvalidProcessor)
    /// when `jetstream` has no processor `name`.
    pub fn at_least_once_processor(
        jetstream: &JetStream,
        name: &str,
        processor: impl Processor,
    ) -> Result<Self, ConfigError> {
        let jetstream = jetstream.for_processor(name)?;
        Ok(Self::at_least_once(&jetstream, processor))
    }
}

impl Stream {
    /// Acknowledges unrun a message this processor does not run (recorded as such), out of
    /// its object's line first; handed back for a while when it cannot leave it.
    pub(super) async fn pass(&self, pulled: &Pulled, until: Instant) {
        let (message, js) = (&pulled.message, &self.jetstream);
        if !self.leave_line(pulled, until).await {
            let _ = nak(message, Some(BURY_AGAIN), until).await;
            return;
        }
        if pass(js, message, &pulled.seq.to_string(), until)
            .await
            .is_ok()
        {
            pulled.forget(js).await;
        }
    }
}
