//! Fan-out on RabbitMQ: one quorum queue per processor, every one bound to the exchange
//! with `#`, so the one confirmed publish of an event reaches every processor's queue.
//!
//! - The processor `default` keeps the queue `<queue>`, its dead queue `<queue>-dead` and
//!   its delay queues `<queue>-retry-<ms>`; another processor `name` has the queue
//!   `<queue>-<name>`, the dead queue `<queue>-<name>-dead` and the delay queues
//!   `<queue>-<name>-retry-<ms>`, each processor's queue dead-lettering to its own dead
//!   queue through `<exchange>-dead` (routing key: the processor's queue).
//! - [`build`](super::AmqpBuilder::build) declares (or checks) every processor's queue
//!   before it returns: each event published after it reaches every processor configured
//!   then (a processor added later starts from then on).
//! - Each processor's workers ([`AmqpWorker::processor`](super::AmqpWorker::processor))
//!   consume its queue alone, with their own claim keys (`amqp/<its queue>/<source>`),
//!   retries, dead queue, caps and rate; a message the processor's filter does not take is
//!   acknowledged unrun (never counted an attempt).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::worker::delays;
use super::{topology, Amqp, AmqpBuilder};
use crate::error::{ConfigError, ConfigErrorKind};
use crate::inbox::processors::{Processors, DEFAULT_PROCESSOR};
use crate::inbox::{Counts, ProcessorSpec};
use crate::store::StoreError;
use crate::Event;

/// One processor on the exchange: its spec, and the queues it owns.
pub(crate) struct Lane {
    spec: ProcessorSpec,
    /// `<queue>` for `default`, `<queue>-<name>` for another.
    pub(crate) queue: String,
    /// `<its queue>-dead`.
    pub(crate) dead_queue: String,
    /// `<its queue>-paused`: its paused events, parked (`../pause.rs`).
    pub(crate) paused_queue: String,
}

impl Lane {
    pub(crate) fn new(spec: ProcessorSpec, queue: &str) -> Self {
        let queue = queue_of(queue, spec.name());
        Self {
            dead_queue: format!("{queue}-dead"),
            paused_queue: format!("{queue}-paused"),
            queue,
            spec,
        }
    }

    pub(crate) fn name(&self) -> &str {
        self.spec.name()
    }

    /// Its metrics' keys (`processor` label).
    pub(crate) fn metrics(&self) -> &crate::metrics::Processor {
        self.spec.metrics()
    }

    /// Whether this processor runs the event: its filter takes it.
    pub(crate) fn takes(&self, event: &Event) -> bool {
        self.spec.matches(event)
    }

    /// Every name it uses on the broker: its queue, its dead and parked queues, its delay
    /// queues.
    fn broker_names(&self) -> Vec<String> {
        let mut names = vec![
            self.queue.clone(),
            self.dead_queue.clone(),
            self.paused_queue.clone(),
        ];
        names.extend(delays::names(&self.queue));
        names
    }
}

/// The queue of `processor` on the queue `queue`.
fn queue_of(queue: &str, processor: &str) -> String {
    match processor {
        DEFAULT_PROCESSOR => queue.to_owned(),
        name => format!("{queue}-{name}"),
    }
}

/// The lanes of `processors` on `queue` (`None`: `default` alone).
pub(super) fn lanes(queue: &str, processors: &Processors) -> Vec<Arc<Lane>> {
    processors
        .iter()
        .map(|spec| Arc::new(Lane::new(spec.clone(), queue)))
        .collect()
}

/// Checks that every processor's queues fit AMQP's 255 bytes and that no two of the names
/// the queue's processors use on the broker are the same (a processor `dead` would be
/// `default`'s dead queue, `a-dead` the dead queue of `a`).
pub(super) fn check(queue: &str, processors: Option<&Processors>) -> Result<(), ConfigError> {
    let Some(processors) = processors else {
        return Ok(());
    };
    let invalid = |why: String| ConfigError::new(ConfigErrorKind::InvalidProcessor, why);
    let mut seen: BTreeMap<String, String> = BTreeMap::new();
    // Not a processor's: the queue the schemas' refusals go to, the pauses' records.
    seen.insert(format!("{queue}-invalid"), "the invalid queue".to_owned());
    seen.insert(format!("{queue}-pauses"), "the pauses' stream".to_owned());
    seen.insert(
        format!("{queue}-pauses-seq"),
        "the pauses' count".to_owned(),
    );
    for lane in lanes(queue, processors) {
        let longest = lane.queue.len() + delays::longest_suffix();
        if longest > super::builder::AMQP_NAME {
            return Err(invalid(format!(
                "processor {:?}: its longest queue name would be {longest} bytes, over \
                 AMQP's 255 (shorten the queue's or the processor's name)",
                lane.name()
            )));
        }
        let owner = format!("processor {:?}", lane.name());
        for name in lane.broker_names() {
            if let Some(other) = seen.insert(name.clone(), owner.clone()) {
                return Err(invalid(format!(
                    "{owner} would use the queue '{name}', which is {other}'s: rename one"
                )));
            }
        }
    }
    Ok(())
}

impl AmqpBuilder {
    /// Fans the exchange out to `processors`: each gets a quorum queue of its own (see
    /// the [module docs](super)), bound to the exchange with `#` and declared or checked
    /// by [`build`](Self::build), and its own workers
    /// ([`AmqpWorker::processor`](super::AmqpWorker::processor)), claim keys, retries,
    /// dead queue (`<queue>-dead` for `default`, `<queue>-<name>-dead` for another) and
    /// counts. The one confirmed publish of an event reaches every processor's queue;
    /// each processor's filter decides which it runs. Without this, the queue has the one
    /// processor `default`, as before.
    ///
    /// # Errors
    ///
    /// [`ConfigErrorKind::InvalidProcessor`] for no processor, a name twice, a processor
    /// whose longest queue name (`<queue>-<name>-retry-104857600`) is over AMQP's 255
    /// bytes, or two names that would share a queue (a processor `dead`, or `a` and
    /// `a-dead`).
    pub fn with_processors(
        mut self,
        processors: impl IntoIterator<Item = ProcessorSpec>,
    ) -> Result<Self, ConfigError> {
        let processors = Processors::new(processors)?;
        check(&self.queue, Some(&processors))?;
        self.processors = Some(processors);
        Ok(self)
    }
}

impl Amqp {
    /// The handle a processor's workers use: `name`'s lane, or the error naming the
    /// processors configured.
    pub(super) fn for_processor(&self, name: &str) -> Result<Self, ConfigError> {
        let lane = self.inner.lanes.iter().find(|l| l.name() == name);
        let lane = lane.ok_or_else(|| self.inner.processors.unknown(name))?;
        Ok(Self {
            inner: self.inner.clone(),
            lane: lane.clone(),
        })
    }

    /// The processor this handle's workers run (`default`, but for a processor's worker).
    pub(crate) fn lane(&self) -> &Lane {
        &self.lane
    }

    /// The lanes of every processor configured.
    pub(super) fn lanes(&self) -> &[Arc<Lane>] {
        &self.inner.lanes
    }

    /// The queue of `processor`: `<queue>` for `default`, `<queue>-<processor>` for
    /// another (whether it is configured or not).
    #[must_use]
    pub fn queue_of(&self, processor: &str) -> String {
        queue_of(self.queue(), processor)
    }

    /// The dead queue of `processor`: `<queue>-dead` for `default`,
    /// `<queue>-<processor>-dead` for another.
    #[must_use]
    pub fn dead_queue_of(&self, processor: &str) -> String {
        format!("{}-dead", self.queue_of(processor))
    }

    /// The queue `processor`'s workers park its paused events in: `<queue>-paused` for
    /// `default`, `<queue>-<processor>-paused` for another.
    #[must_use]
    pub fn paused_queue_of(&self, processor: &str) -> String {
        format!("{}-paused", self.queue_of(processor))
    }

    /// The processors configured, in order (`default` alone without
    /// [`with_processors`](AmqpBuilder::with_processors)).
    pub fn processors(&self) -> impl Iterator<Item = &ProcessorSpec> {
        self.inner.processors.iter()
    }

    /// Whether the exchange has the processor `name`.
    #[must_use]
    pub fn has_processor(&self, name: &str) -> bool {
        self.inner.lanes.iter().any(|l| l.name() == name)
    }

    /// The counts of each configured processor, as [`counts`](Self::counts) has their
    /// sum: `queued` its queue's ready messages, `processing` those waiting out a backoff
    /// in its delay queues, `dead` its dead queue's, `paused` its parked queue's. A message its filter does not take is
    /// queued until a worker of it acknowledged it unrun, then in none of them; `invalid`
    /// is 0 (the invalid queue is the exchange's, counted by [`counts`](Self::counts)).
    /// Each processor's gauges (feature `metrics`) are set from them.
    ///
    /// # Errors
    ///
    /// When there is no connection, or a queue is missing.
    pub async fn counts_by_processor(&self) -> Result<BTreeMap<String, Counts>, StoreError> {
        let queues: Vec<&str> = self.lanes().iter().map(|l| l.queue.as_str()).collect();
        let waiting = delays::waiting_in(self, &queues).await?;
        let channel = self.channel().await?;
        let mut by = BTreeMap::new();
        for (lane, processing) in self.lanes().iter().zip(waiting) {
            let queued = topology::message_count(&channel, &lane.queue).await;
            let dead = topology::message_count(&channel, &lane.dead_queue).await;
            let paused = topology::message_count(&channel, &lane.paused_queue).await;
            let counts = Counts {
                queued: queued?.into(),
                processing,
                dead: dead?.into(),
                paused: paused?.into(),
                ..Counts::default()
            };
            counts.set_gauges(lane.metrics());
            by.insert(lane.name().to_owned(), counts);
        }
        super::connection::close(&channel, "done").await;
        Ok(by)
    }

    /// Every queue the processors use: their queues, dead and parked queues (their delay
    /// queues are `delays.rs`').
    pub(super) fn lane_queues(&self) -> BTreeSet<String> {
        let lanes = self.lanes().iter();
        let queues = |l: &Arc<Lane>| [&l.queue, &l.dead_queue, &l.paused_queue].map(Clone::clone);
        lanes.flat_map(queues).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn processors(names: &[&str]) -> Processors {
        let specs = names.iter().map(|n| match *n {
            DEFAULT_PROCESSOR => ProcessorSpec::default_processor(),
            n => ProcessorSpec::new(n).unwrap(),
        });
        Processors::new(specs).unwrap()
    }

    #[test]
    fn default_keeps_todays_queues_and_another_processor_has_its_own() {
        let default = Lane::new(ProcessorSpec::default_processor(), "webhooks");
        assert_eq!(
            (default.queue.as_str(), default.dead_queue.as_str()),
            ("webhooks", "webhooks-dead")
        );
        let billing = Lane::new(ProcessorSpec::new("billing").unwrap(), "webhooks");
        assert_eq!(
            (billing.queue.as_str(), billing.dead_queue.as_str()),
            ("webhooks-billing", "webhooks-billing-dead")
        );
        assert!(billing
            .broker_names()
            .contains(&"webhooks-billing-retry-800".to_owned()));
    }

    #[test]
    fn processors_that_would_share_a_queue_are_refused() {
        assert!(check("q", Some(&processors(&["default", "billing", "email"]))).is_ok());
        for clash in [
            &["default", "dead"][..],
            &["default", "invalid"],
            &["default", "retry-800"],
            &["default", "paused"],
            &["default", "pauses"],
            &["a", "a-paused"],
            &["a", "a-dead"],
            &["a", "a-retry-100"],
        ] {
            let error = check("q", Some(&processors(clash))).unwrap_err();
            assert!(
                error.to_string().contains("would use the queue"),
                "{clash:?}: {error}"
            );
        }
        // `retry-7` is no step of the ladder: no delay queue of `default` is named so.
        assert!(check("q", Some(&processors(&["default", "retry-7"]))).is_ok());
    }

    #[test]
    fn a_processors_longest_queue_name_fits_amqps_255_bytes() {
        let max = super::super::builder::AMQP_NAME - delays::longest_suffix();
        let name = "p".repeat(64);
        let queue = "q".repeat(max - 65);
        assert!(check(&queue, Some(&processors(&[&name]))).is_ok());
        let queue = "q".repeat(max - 64);
        let error = check(&queue, Some(&processors(&[&name]))).unwrap_err();
        assert!(error.to_string().contains("over AMQP's 255"), "{error}");
    }
}
