//! Fan-out on JetStream: one durable consumer per processor on the one stream, each with
//! its own claim keys, dead-letter and parked streams, deliveries that were not attempts,
//! pauses and counts.
//!
//! - The processor `default` is today's consumer (`tower-webhook`, or the name given to
//!   [`with_consumer`](super::JetStreamBuilder::with_consumer)), reading the stream from
//!   its start; another processor `name` is `<consumer>-<name>`, reading from the message
//!   after the stream's last when [`build`](super::JetStreamBuilder::build) made it. `build`
//!   makes every processor's consumer before it returns: each message published after it
//!   reaches every processor configured then.
//! - Each processor's worker acknowledges unrun a message its filter does not take.
//! - With more than one processor, a message buried or parked for one processor stays in
//!   the stream (the others' consumers still read it): it is acknowledged, not deleted. A
//!   parked message published back carries `Webhook-Processor: <name>`, and every other
//!   processor's worker acknowledges it unrun. Those messages a processor acknowledged
//!   unrun are each a key in its bucket `<stream>-passed[-<name>]` (`passes.rs`), so that
//!   its `processed` counts only what it processed.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_nats::jetstream::consumer::{pull, AckPolicy, DeliverPolicy};
use async_nats::jetstream::{self, kv};
use async_nats::HeaderMap;

use super::passes::Passes;
use super::{header, JetStream, JetStreamBuilder};
use crate::error::ConfigError;
use crate::inbox::processors::{Processors, DEFAULT_PROCESSOR};
use crate::inbox::{Counts, ProcessorSpec};
use crate::store::{StoreError, StoreErrorKind};
use crate::Event;

/// One processor on the stream: its spec and its durable consumer.
pub(super) struct Lane {
    spec: ProcessorSpec,
    pub(super) consumer: String,
    /// The messages it acknowledged unrun (with fan-out only: without, it takes them all).
    passes: Option<Passes>,
}

impl Lane {
    pub(super) fn new(spec: ProcessorSpec, consumer: &str) -> Self {
        let consumer = match spec.name() {
            DEFAULT_PROCESSOR => consumer.to_owned(),
            name => format!("{consumer}-{name}"),
        };
        Self {
            passes: None,
            spec,
            consumer,
        }
    }

    /// Its metrics' keys (`processor` label).
    pub(super) fn metrics(&self) -> &crate::metrics::Processor {
        self.spec.metrics()
    }

    pub(super) fn name(&self) -> &str {
        self.spec.name()
    }

    pub(super) fn spec(&self) -> &ProcessorSpec {
        &self.spec
    }

    /// `""` for `default`, `-<name>` for another: the suffix of its dead and parked streams.
    fn suffix(&self) -> String {
        suffix(self.name())
    }

    pub(super) fn dead_stream(&self, stream: &str) -> String {
        format!("{stream}-dead{}", self.suffix())
    }

    pub(super) fn paused_stream(&self, stream: &str) -> String {
        format!("{stream}-paused{}", self.suffix())
    }

    /// The key of the message at `seq` in `<stream>-held`: `<seq>` for `default` (as
    /// before fan-out), `<name>.<seq>` for another.
    pub(super) fn held_key(&self, seq: u64) -> String {
        match self.name() {
            DEFAULT_PROCESSOR => seq.to_string(),
            name => format!("{name}.{seq}"),
        }
    }

    /// Whether this processor runs the message: its filter takes the event, and it is no
    /// parked message published back for another processor.
    pub(super) fn takes(&self, headers: Option<&HeaderMap>, event: &Event) -> bool {
        let addressed = headers.and_then(|h| h.get(header::PROCESSOR));
        addressed.is_none_or(|to| to.as_str() == self.name()) && self.spec.matches(event)
    }

    /// Its consumer's settings: `default` reads the stream from its start, another from
    /// `start` (the message after the stream's last when it is made).
    pub(super) fn consumer_config(&self, ack_wait: Duration, start: u64) -> pull::Config {
        let deliver_policy = match self.name() {
            DEFAULT_PROCESSOR => DeliverPolicy::All,
            _ => DeliverPolicy::ByStartSequence {
                start_sequence: start.max(1),
            },
        };
        pull::Config {
            durable_name: Some(self.consumer.clone()),
            ack_policy: AckPolicy::Explicit,
            ack_wait,
            deliver_policy,
            // Dead messages are moved by the worker, with their error: never dropped.
            max_deliver: -1,
            ..Default::default()
        }
    }

    /// Its bucket of passes: `passed` for `default`, `passed-<name>` for another.
    pub(super) fn passes_bucket(&self) -> String {
        format!("passed{}", self.suffix())
    }

    /// Records a message acknowledged unrun, by the key `key` (`passes.rs`): counted once
    /// however often it comes.
    pub(super) async fn pass(&self, key: &str) -> Result<(), StoreError> {
        match &self.passes {
            Some(passes) => passes.record(key).await,
            None => Ok(()),
        }
    }
}

fn suffix(name: &str) -> String {
    match name {
        DEFAULT_PROCESSOR => String::new(),
        name => format!("-{name}"),
    }
}

impl JetStreamBuilder {
    /// Fans the stream out to `processors`: each gets a durable consumer of its own (see
    /// the [module docs](super)), made by [`build`](Self::build), and its own workers
    /// ([`JetStreamWorker::processor`](super::JetStreamWorker::processor)), claim keys,
    /// dead-letter stream (`<stream>-dead` for `default`, `<stream>-dead-<name>` for
    /// another), parked stream (`<stream>-paused[-<name>]`), pauses and counts. A
    /// processor other than `default` reads the messages published after `build` made its
    /// consumer; its filter decides which it runs. Without this, the stream has the one
    /// processor `default`, as before.
    ///
    /// # Errors
    ///
    /// [`ConfigErrorKind::InvalidProcessor`](crate::ConfigErrorKind::InvalidProcessor) for
    /// no processor or a name twice.
    pub fn with_processors(
        mut self,
        processors: impl IntoIterator<Item = ProcessorSpec>,
    ) -> Result<Self, ConfigError> {
        self.processors = Some(Processors::new(processors)?);
        Ok(self)
    }
}

/// What `build` makes for the processors: their lanes, and each one's consumer (only when
/// configured: without processors the worker makes `default`'s as it always did) and, with
/// fan-out, its bucket of passes (`bucket` configures it, from its name's end).
pub(super) async fn lanes(
    context: &jetstream::Context,
    (stream, consumer): (&str, &str),
    processors: Option<&Processors>,
    ack_wait: Duration,
    bucket: impl Fn(&str) -> kv::Config,
) -> Result<Vec<Arc<Lane>>, StoreError> {
    let Some(processors) = processors else {
        return Ok(vec![Arc::new(Lane::new(
            ProcessorSpec::default_processor(),
            consumer,
        ))]);
    };
    let err = |e: Box<dyn std::error::Error + Send + Sync>| {
        StoreError::new("jetstream consumer", e).with_kind(StoreErrorKind::Unavailable)
    };
    let mut lanes = Vec::new();
    let mut stream = context
        .get_stream(stream)
        .await
        .map_err(|e| err(e.into()))?;
    let fan_out = processors.iter().any(|p| p.name() != DEFAULT_PROCESSOR);
    for spec in processors.iter() {
        let mut lane = Lane::new(spec.clone(), consumer);
        if fan_out {
            let config = bucket(&lane.passes_bucket());
            let name = config.bucket.clone();
            let made = super::pause::bucket(context, config).await?;
            lane.passes = Some(Passes::new(made, &name));
        }
        let made = stream.get_consumer::<pull::Config>(&lane.consumer).await;
        if made.is_err() {
            let last = stream.info().await.map_err(|e| err(e.into()))?;
            let config = lane.consumer_config(ack_wait, last.state.last_sequence + 1);
            let made = stream.get_or_create_consumer(&lane.consumer, config).await;
            made.map_err(|e| err(e.into()))?;
        }
        lanes.push(Arc::new(lane));
    }
    Ok(lanes)
}

impl JetStream {
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

    /// The consumer this handle's workers share.
    pub(super) fn consumer(&self) -> &str {
        &self.lane.consumer
    }

    /// The dead-letter stream of `processor`: `<stream>-dead` for `default`,
    /// `<stream>-dead-<processor>` for another.
    #[must_use]
    pub fn dead_stream_of(&self, processor: &str) -> String {
        format!("{}-dead{}", self.inner.stream, suffix(processor))
    }

    /// The stream `processor`'s paused events are parked in: `<stream>-paused` for
    /// `default`, `<stream>-paused-<processor>` for another.
    #[must_use]
    pub fn paused_stream_of(&self, processor: &str) -> String {
        format!("{}-paused{}", self.inner.stream, suffix(processor))
    }

    /// Pauses the events of `source` of type `event_type` (`None`: any) for `processor`
    /// alone: its workers park them in its parked stream, the other processors run them.
    /// [`pause`](Self::pause) pauses for every processor. Returns `false` when it was
    /// paused already.
    ///
    /// # Errors
    ///
    /// [`StoreErrorKind::InvalidInput`] for a processor not configured; when NATS cannot
    /// answer.
    pub async fn pause_processor(
        &self,
        processor: &str,
        source: Option<&str>,
        event_type: Option<&str>,
    ) -> Result<bool, StoreError> {
        self.configured(processor)?;
        self.hold(Some(processor), source, event_type).await
    }

    /// Ends `processor`'s own pause of exactly that source and type (as
    /// [`pause_processor`](Self::pause_processor) took them); its workers then publish the
    /// events it parked back, for it alone. Returns `false` when there was no such pause.
    ///
    /// # Errors
    ///
    /// [`StoreErrorKind::InvalidInput`] for a processor not configured; when NATS cannot
    /// answer.
    pub async fn resume_processor(
        &self,
        processor: &str,
        source: Option<&str>,
        event_type: Option<&str>,
    ) -> Result<bool, StoreError> {
        self.configured(processor)?;
        self.release(Some(processor), source, event_type).await
    }

    /// Whether the stream has the processor `name`.
    pub(crate) fn has_processor(&self, name: &str) -> bool {
        self.inner.lanes.iter().any(|l| l.name() == name)
    }

    fn configured(&self, processor: &str) -> Result<(), StoreError> {
        match self.has_processor(processor) {
            true => Ok(()),
            false => Err(StoreError::new(
                "jetstream pause",
                format!("no processor {processor:?} is configured"),
            )
            .with_kind(StoreErrorKind::InvalidInput)),
        }
    }

    /// The counts of each configured processor, as [`counts`](Self::counts) has their sum:
    /// `processed` the messages it processed that the stream still holds (a message its
    /// filter does not take is in none of them).
    ///
    /// # Errors
    ///
    /// When NATS cannot answer.
    pub async fn counts_by_processor(&self) -> Result<BTreeMap<String, Counts>, StoreError> {
        let mut stream = self
            .inner
            .context
            .get_stream(&*self.inner.stream)
            .await
            .map_err(counts_err)?;
        let state = stream.info().await.map_err(counts_err)?.state.clone();
        let mut counts = BTreeMap::new();
        for lane in self.inner.lanes.iter() {
            let lane_counts = self.lane_counts(&stream, &state, lane).await?;
            lane_counts.set_gauges(lane.spec.metrics());
            counts.insert(lane.name().to_owned(), lane_counts);
        }
        Ok(counts)
    }

    /// One processor's counts (see [`JetStream::counts`]).
    async fn lane_counts(
        &self,
        stream: &jetstream::stream::Stream,
        state: &jetstream::stream::State,
        lane: &Lane,
    ) -> Result<Counts, StoreError> {
        let consumer = stream.get_consumer::<pull::Config>(&lane.consumer).await;
        // No worker has created the consumer yet: every message is queued.
        let (queued, processing, first, start) = match consumer {
            Ok(mut consumer) => {
                let info = consumer.info().await.map_err(counts_err)?;
                let start = match info.config.deliver_policy {
                    DeliverPolicy::ByStartSequence { start_sequence } => start_sequence,
                    _ => 1,
                };
                let pending = (info.num_pending, info.num_ack_pending as u64);
                (
                    pending.0,
                    pending.1,
                    info.ack_floor.stream_sequence + 1,
                    start,
                )
            }
            Err(_) if state.consumer_count == 0 => (state.messages, 0, state.first_sequence, 1),
            Err(e) => return Err(counts_err(e)),
        };
        // The messages since the consumer's start: with fan-out nothing is deleted.
        let since = (state.last_sequence + 1).saturating_sub(start.max(state.first_sequence));
        let messages = state.messages.min(since);
        let oldest_due = if queued + processing > 0 {
            let oldest = stream.get_raw_message(first);
            oldest.await.ok().and_then(|m| {
                let published = SystemTime::from(m.time);
                SystemTime::now().duration_since(published).ok()
            })
        } else {
            None
        };
        let size = |name: String| async move {
            match self.inner.context.get_stream(name).await {
                Ok(mut s) => s.info().await.map(|i| i.state.messages).map_err(counts_err),
                Err(_) => Ok(0), // no message has gone there yet
            }
        };
        let dead = size(lane.dead_stream(&self.inner.stream)).await?;
        let paused = size(lane.paused_stream(&self.inner.stream)).await?;
        // With fan-out a dead or parked message stays in the stream, acknowledged, as do
        // those acknowledged unrun.
        let passed = match &lane.passes {
            Some(passes) => size(passes.stream().to_owned()).await?,
            None => 0,
        };
        let out = match self.inner.fan_out {
            true => dead + paused + passed,
            false => 0,
        };
        Ok(Counts {
            queued,
            processing,
            processed: messages.saturating_sub(queued + processing + out),
            dead,
            paused,
            invalid: 0,
            oldest_due,
        })
    }
}

fn counts_err(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> StoreError {
    StoreError::new("jetstream counts", e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_keeps_todays_names_and_another_processor_has_its_own() {
        let default = Lane::new(ProcessorSpec::default_processor(), "tower-webhook");
        assert_eq!(default.consumer, "tower-webhook");
        assert_eq!(default.dead_stream("s"), "s-dead");
        assert_eq!(default.paused_stream("s"), "s-paused");
        assert_eq!(default.held_key(7), "7");
        let billing = Lane::new(ProcessorSpec::new("billing").unwrap(), "tower-webhook");
        assert_eq!(billing.consumer, "tower-webhook-billing");
        assert_eq!(billing.dead_stream("s"), "s-dead-billing");
        assert_eq!(billing.paused_stream("s"), "s-paused-billing");
        assert_eq!(billing.held_key(7), "billing.7");
        assert!(matches!(
            billing
                .consumer_config(Duration::from_secs(3), 9)
                .deliver_policy,
            DeliverPolicy::ByStartSequence { start_sequence: 9 }
        ));
        assert!(matches!(
            default
                .consumer_config(Duration::from_secs(3), 9)
                .deliver_policy,
            DeliverPolicy::All
        ));
    }

    #[test]
    fn a_message_published_back_for_another_processor_is_not_taken() {
        let lane = Lane::new(
            ProcessorSpec::new("billing")
                .unwrap()
                .with_types(["invoice.*"])
                .unwrap(),
            "c",
        );
        let (paid, other) = (
            Event::of_type("stripe", "invoice.paid"),
            Event::of_type("stripe", "customer.created"),
        );
        assert!(lane.takes(None, &paid));
        assert!(!lane.takes(None, &other));
        let mut to = HeaderMap::new();
        to.insert(header::PROCESSOR, "billing");
        assert!(lane.takes(Some(&to), &paid));
        to.insert(header::PROCESSOR, "email");
        assert!(!lane.takes(Some(&to), &paid));
    }
}
