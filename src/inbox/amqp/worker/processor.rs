//! A processor's worker (fan-out, `../processors.rs`): the same worker on the processor's
//! own queue.

use std::sync::Arc;

use super::AmqpWorker;
use crate::inbox::amqp::Amqp;
use crate::inbox::Processor;
use crate::store::DedupeStore;
use crate::ConfigError;

impl AmqpWorker {
    /// A worker of the processor `name` (configured with
    /// [`with_processors`](super::super::AmqpBuilder::with_processors)), running
    /// `processor` on each event its filter takes, claimed in `store` as
    /// [`new`](Self::new)'s (its keys `amqp/<queue>-<name>/<source>`: its own); a message
    /// its filter does not take is acknowledged unrun. It consumes the processor's own
    /// queue, waits out its backoffs in its own delay queues and buries in its own dead
    /// queue. [`new`](Self::new) is the processor `default`'s.
    ///
    /// # Errors
    ///
    /// [`ConfigErrorKind::InvalidProcessor`](crate::ConfigErrorKind::InvalidProcessor)
    /// when `amqp` has no processor `name`.
    pub fn processor(
        amqp: &Amqp,
        name: &str,
        store: impl DedupeStore,
        processor: impl Processor,
    ) -> Result<Self, ConfigError> {
        Self::from_arc_processor(amqp, name, Arc::new(store), processor)
    }

    /// [`processor`](Self::processor), with a store already shared behind an `Arc` (as
    /// [`from_arc`](Self::from_arc)).
    ///
    /// # Errors
    ///
    /// [`ConfigErrorKind::InvalidProcessor`](crate::ConfigErrorKind::InvalidProcessor)
    /// when `amqp` has no processor `name`.
    pub fn from_arc_processor(
        amqp: &Amqp,
        name: &str,
        store: Arc<dyn DedupeStore>,
        processor: impl Processor,
    ) -> Result<Self, ConfigError> {
        let amqp = amqp.for_processor(name)?;
        Ok(Self::from_arc(&amqp, store, processor))
    }

    /// [`processor`](Self::processor) without a store, at least once (as
    /// [`at_least_once`](Self::at_least_once)): a message delivered again runs the
    /// processor again.
    ///
    /// # Errors
    ///
    /// [`ConfigErrorKind::InvalidProcessor`](crate::ConfigErrorKind::InvalidProcessor)
    /// when `amqp` has no processor `name`.
    pub fn at_least_once_processor(
        amqp: &Amqp,
        name: &str,
        processor: impl Processor,
    ) -> Result<Self, ConfigError> {
        let amqp = amqp.for_processor(name)?;
        Ok(Self::at_least_once(&amqp, processor))
    }
}
