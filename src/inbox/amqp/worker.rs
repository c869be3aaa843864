//! [`AmqpWorker`]: the worker of `inbox/worker/` with the quorum queue as its queue — each
//! delivery claimed in a store, run, then acknowledged, sent to wait out its backoff in a
//! delay queue, or buried in `<queue>-dead`.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lapin::message::Delivery;
use tokio::sync::{mpsc, watch, Notify};
use tokio::time::Instant;

use super::Amqp;
use crate::inbox::message::{Read, FOREIGN};
use crate::inbox::process::{checked_poll, hurry_up, WorkerHandle};
use crate::inbox::worker::{shared_settings, ClaimDue, Claimed, Engine, Outcome, Queue, Runner};
use crate::inbox::Processor;
use crate::metrics::{self, Attempt};
use crate::store::{Completed, DedupeStore, Heartbeat, Lease, Renewed, StoreError};
use crate::{ConfigError, Event};

mod consume; // the consumer: a channel with its prefetch, made again when it dies
pub(crate) mod delays; // the delay queues retries and snoozes wait in: a ladder of steps
mod delivered; // a delivery as the worker holds it: its event, attempt and claim
mod park; // a paused event parked in `<queue>-paused`; moved back when its pause ends
mod processor; // fan-out: a processor's worker
mod settle; // a delivery acknowledged, handed back, sent to wait, or buried
#[cfg(feature = "schemas")]
pub(super) use delivered::text;
use delivered::{Claim, Delivered}; // the invalid queue's listing

/// Processes an [`Amqp`] queue's messages. Build it, then [`spawn`](Self::spawn) it.
/// Workers in any number of processes consume the same queue; RabbitMQ hands each message
/// to one of them at a time.
///
/// Each event is claimed in a [`DedupeStore`] before its processor runs, and marked done
/// there before its message is acknowledged: a message delivered again — its
/// acknowledgement lost with the connection, or the same event accepted twice — is
/// acknowledged without running again. Give it a store every worker of the queue shares
/// (PostgreSQL or Redis across hosts). [`at_least_once`](Self::at_least_once) builds one
/// without a store.
///
/// A failed attempt's message is not held while it waits out its backoff: a copy goes to
/// a delay queue (`<queue>-retry-<ms>`, declared when first needed: a quorum queue whose
/// message TTL is the delay and which dead-letters back to the queue), with its attempt in
/// a header, and the delivery is acknowledged once the broker confirmed the copy. The
/// delays are a ladder of steps doubling from 100 ms to about 29 h, and each backoff (and
/// [`Later`](crate::inbox::Later)) waits the step nearest it, within ×1.41 of it (a
/// longer snooze waits the last step, about 29 h, then runs). After the
/// last attempt the message is published to `<queue>-dead` with its error, then
/// acknowledged.
///
/// RabbitMQ closes a channel whose delivery stays unacknowledged past its
/// `consumer_timeout` (30 min by default), handing back every delivery on it: the worker's
/// [`with_max_run`](Self::with_max_run) is bounded by it (see there), and defaults to
/// 25 min with the broker's default ([`AmqpBuilder::with_consumer_timeout`] says what the
/// broker's is).
///
/// [`AmqpBuilder::with_consumer_timeout`]: super::AmqpBuilder::with_consumer_timeout
#[must_use]
pub struct AmqpWorker {
    engine: Engine<Consumed>,
}

/// What a dead message says as its error when every attempt crashed its worker.
const CRASHED: &str =
    "the last attempt ended without an outcome (the worker crashed or was stopped)";

/// What a max run leaves of the broker's consumer timeout (at most half of it): a delivery
/// waits in the worker for a processor (and its caps) before it runs, and the broker
/// checks its timeouts about once a minute.
const CONSUMER_TIMEOUT_MARGIN: Duration = Duration::from_secs(5 * 60);

/// The longest max run the broker's consumer timeout allows.
fn longest_run(amqp: &Amqp) -> Duration {
    let timeout = amqp.consumer_timeout();
    timeout - CONSUMER_TIMEOUT_MARGIN.min(timeout / 2)
}

/// The most [`AmqpWorker::with_lookahead`] takes: a prefetch is 16 bits.
const MAX_LOOKAHEAD: usize = 60_000;

impl AmqpWorker {
    /// A worker running `processor` on each event once, claiming it in `store` first (see
    /// above): 4 at a time, 8 attempts, backoff from 1 s doubling to at most 10 min (with
    /// jitter), a 60 s lease of the claim renewed for up to 1 h of processing or the
    /// broker's consumer timeout less 5 min, whichever is shorter (25 min with RabbitMQ's
    /// default), and a shutdown that waits for running events.
    ///
    /// The store may be the one [`DedupeLayer`](crate::DedupeLayer) uses in front of
    /// [`accept_service`](Amqp::accept_service): the worker's keys are its own
    /// (`amqp/<queue>/<source>`, the event's id), kept for the store's retention as event
    /// keys are.
    pub fn new(amqp: &Amqp, store: impl DedupeStore, processor: impl Processor) -> Self {
        Self::from_arc(amqp, Arc::new(store), processor)
    }

    /// [`new`](Self::new), with a store already shared behind an `Arc`.
    pub fn from_arc(amqp: &Amqp, store: Arc<dyn DedupeStore>, processor: impl Processor) -> Self {
        let mut worker = Self::at_least_once(amqp, processor);
        worker.engine.queue.claims = Some(store);
        worker
    }

    /// A worker without a store: a message delivered again runs the processor again —
    /// after its acknowledgement was lost with the connection, or when the same event was
    /// accepted twice. At least once: make the processor's effects idempotent
    /// ([`Once`](crate::once::Once)), or use [`new`](Self::new).
    pub fn at_least_once(amqp: &Amqp, processor: impl Processor) -> Self {
        let poll = Duration::from_secs(1);
        let queue = Consumed {
            amqp: amqp.clone(),
            claims: None,
            poll,
            lease: Duration::ZERO, // set by `open`
            prefetch: 0,           // set by `spawn`
            inbox: tokio::sync::Mutex::new(None),
            consumer: Mutex::new(None),
            stopped: None,
            delays: delays::Declared::default(),
            metrics: amqp.lane().metrics().clone(),
        };
        let mut engine = Engine::new(queue, Runner::Plain(Arc::new(processor)), poll);
        engine.lease.max_run = engine.lease.max_run.min(longest_run(amqp));
        Self { engine }
    }

    shared_settings!(without_max_run);

    /// Replaces how long a running processor keeps its event's lease renewed (default
    /// 1 h, or less: see [`new`](Self::new)). Past it the lease runs out and another worker
    /// may take the event over; the late outcome is then fenced out (logged at `warn`).
    ///
    /// It must end well within the broker's `consumer_timeout` (as told by
    /// [`AmqpBuilder::with_consumer_timeout`], 30 min unless set): RabbitMQ closes the
    /// channel of a delivery unacknowledged longer, and every delivery on it comes back.
    /// A processor that may run longer needs the broker's timeout raised first.
    ///
    /// [`AmqpBuilder::with_consumer_timeout`]: super::AmqpBuilder::with_consumer_timeout
    ///
    /// # Errors
    ///
    /// When `max_run` is shorter than 1 s, or longer than the broker's consumer timeout
    /// less 5 min (less half of it, when it is under 10 min): the time a delivery may wait
    /// in the worker before it runs.
    pub fn with_max_run(mut self, max_run: Duration) -> Result<Self, ConfigError> {
        let max_run = Lease::checked_max_run(max_run)?;
        let longest = longest_run(&self.engine.queue.amqp);
        if max_run > longest {
            let timeout = self.engine.queue.amqp.consumer_timeout();
            let why = format!(
                "a max run of {max_run:?} outlasts what the broker's consumer_timeout of \
                 {timeout:?} allows ({longest:?}, leaving time for a delivery to wait in the \
                 worker): RabbitMQ would close the worker's channel under the running event; \
                 raise consumer_timeout on the broker and pass it to \
                 AmqpBuilder::with_consumer_timeout, or run shorter"
            );
            return Err(ConfigError::new(crate::ConfigErrorKind::InvalidValue, why));
        }
        self.engine.lease.max_run = max_run;
        Ok(self)
    }

    /// Replaces the lease of an event's claim in the store (default 60 s), renewed every
    /// third of it while the processor runs. It bounds how long the running events of a
    /// worker that died without releasing their claims (a killed process) wait to run
    /// again: their messages come back when the broker sees the connection gone, and go
    /// back (not counted) until the claim has lapsed.
    ///
    /// # Errors
    ///
    /// When `lease` is not between 100 ms and 1 day.
    pub fn with_lease(mut self, lease: Duration) -> Result<Self, ConfigError> {
        self.engine.lease.length = Lease::checked_length(lease)?;
        Ok(self)
    }

    /// Replaces how long a claim waits for a delivery before the worker looks again
    /// (default 1 s; deliveries are handed over as they arrive).
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
    /// and rates (default 256, beside one per processor): with any cap or rate per source
    /// or type, the consumer's prefetch is the concurrency plus this, so the worker reads
    /// on past a capped source's messages. Without caps the prefetch is twice the
    /// concurrency. A worker that crashes holding prefetched messages has counted each a
    /// delivery (the quorum queue's `x-delivery-count`); one that shuts down hands them
    /// back uncounted.
    ///
    /// # Errors
    ///
    /// When `n` is over 60 000.
    pub fn with_lookahead(mut self, n: usize) -> Result<Self, ConfigError> {
        if n > MAX_LOOKAHEAD {
            let why = "a lookahead must be at most 60 000 messages";
            return Err(ConfigError::new(crate::ConfigErrorKind::InvalidValue, why));
        }
        self.engine.lookahead = n;
        Ok(self)
    }

    /// Starts the worker on the current Tokio runtime; with the `metrics` feature, it also
    /// refreshes the inbox's gauges from [`Amqp::counts`] every 5 s.
    pub fn spawn(mut self) -> WorkerHandle {
        let engine = &self.engine;
        let capped = engine.per_source.is_some()
            || engine.per_type.is_some()
            || engine.per_object.is_some()
            || engine.rate_per_source.is_some();
        let extra = match capped {
            true => engine.lookahead,
            false => engine.concurrency,
        };
        let prefetch = engine.concurrency.saturating_add(extra);
        self.engine.queue.prefetch = u16::try_from(prefetch).unwrap_or(u16::MAX);
        self.engine.spawn()
    }
}

impl fmt::Debug for AmqpWorker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut f = f.debug_struct("AmqpWorker");
        f.field("amqp", &self.engine.queue.amqp)
            .field("at_least_once", &self.engine.queue.claims.is_none());
        self.engine.fields(&mut f);
        f.finish_non_exhaustive()
    }
}

/// The queue as the worker's queue: its consumer, and the store its events are claimed in
/// (`None`: at least once).
pub(crate) struct Consumed {
    amqp: Amqp,
    claims: Option<Arc<dyn DedupeStore>>,
    /// How long a claim waits for a delivery.
    poll: Duration,
    /// The lease of the events' claims in the store.
    lease: Duration,
    prefetch: u16,
    /// The deliveries the consumer handed over that no claim took yet.
    inbox: tokio::sync::Mutex<Option<mpsc::Receiver<Delivery>>>,
    /// The consumer's task and channel, set by `open`.
    consumer: Mutex<Option<consume::Consumer>>,
    /// Told when the worker stops (a claim waiting for deliveries returns at once).
    stopped: Option<watch::Receiver<bool>>,
    /// The delay queues this process declared.
    delays: delays::Declared,
    metrics: metrics::Processor,
}

impl Queue for Consumed {
    type Held = Delivered;
    // A claim waits up to `poll` for a delivery itself.
    const CLAIM_WAITS: bool = true;
    // A message put back counts a delivery (`x-delivery-count`): one claimed runs.
    const GIVES_BACK: bool = false;
    // Delivered in order: an event over its object's cap waits in the worker.
    const CAPS_OBJECTS: bool = false;

    fn wake(&self) -> Arc<Notify> {
        Arc::new(Notify::new()) // never woken: deliveries arrive by themselves
    }

    fn metrics(&self) -> &metrics::Processor {
        &self.metrics
    }

    fn processor(&self) -> &str {
        self.amqp.lane().name()
    }

    fn beside(&self, _: Duration) -> Vec<tokio::task::JoinHandle<()>> {
        let gauges = metrics::ENABLED.then(|| tokio::spawn(gauges(self.amqp.clone())));
        let unpark = tokio::spawn(park::unparking(self.amqp.clone()));
        gauges.into_iter().chain([unpark]).collect()
    }

    /// Starts consuming (the consumer makes its channel again whenever it dies); the
    /// worker's heartbeat beats on the claim's lease.
    async fn open(
        &mut self,
        (lease, _): (Duration, Option<u32>),
        stopped: &mut watch::Receiver<bool>,
    ) -> Option<Duration> {
        if *stopped.borrow() {
            return None;
        }
        self.lease = lease;
        let prefetch = self.prefetch.max(1);
        let (consumer, inbox) = consume::Consumer::start(&self.amqp, prefetch, stopped.clone());
        *self.consumer.get_mut().expect("not poisoned") = Some(consumer);
        *self.inbox.get_mut() = Some(inbox);
        self.stopped = Some(stopped.clone());
        Some(lease)
    }

    /// The deliveries there now; when there are none, the first to arrive within the poll
    /// interval. A delivery of a channel that died since is dropped: it comes back on the
    /// next one.
    async fn claim(&self, due: ClaimDue) -> Result<Vec<Claimed<Delivered>>, StoreError> {
        let mut inbox = self.inbox.lock().await;
        let Some(inbox) = inbox.as_mut() else {
            return Ok(Vec::new());
        };
        let mut stopped = self.stopped.clone().expect("opened before the first claim");
        if *stopped.borrow() {
            return Ok(Vec::new());
        }
        let first = tokio::select! {
            delivery = inbox.recv() => match delivery {
                Some(delivery) => Some(delivery),
                None => {
                    // The consumer is gone (the worker is stopping): nothing more comes.
                    tokio::time::sleep(self.poll).await;
                    None
                }
            },
            () = tokio::time::sleep(self.poll) => None,
            () = hurry_up(&mut stopped) => None,
        };
        let mut rows = Vec::new();
        let mut next = first;
        while let Some(delivery) = next {
            if let Some(row) = self.read(delivery, due.lease) {
                rows.push(row);
            }
            next = match rows.len() < due.limit {
                true => inbox.try_recv().ok(),
                false => None,
            };
        }
        // Every pause that returned before these arrived is known before any of them
        // starts (`amqp/pause.rs`): one passive declare, and a wait for the log.
        while !rows.is_empty() {
            let Err(_error) = self.amqp.pause_log().sync(&self.amqp).await else {
                break;
            };
            #[cfg(feature = "tracing")]
            tracing::warn!(target: "tower_webhook", "amqp worker cannot read the pauses yet: {_error}");
            for _ in &rows {
                metrics::held_back(&self.metrics, metrics::HeldBack::PausesUnread);
            }
            if rows.iter().all(|row| !row.held.delivery.acker.usable()) {
                return Ok(Vec::new()); // their channel died: delivered again on the next
            }
            if *stopped.borrow() {
                // Stopping unsynced: none of them starts (a pause may hold it); left
                // unacknowledged, each is delivered again once this channel closes.
                return Ok(Vec::new());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(rows)
    }

    async fn give_back(&self, _: Vec<Delivered>) {
        unreachable!("GIVES_BACK is false")
    }

    /// Claims the event's key in the store (a message processed already is acknowledged
    /// here), and buries a message delivered more often than the attempts allow.
    async fn start(
        &self,
        held: &Delivered,
        (event, attempt): (&Event, u32),
        max_attempts: u32,
        heartbeat: &Heartbeat,
        hurried: &mut watch::Receiver<bool>,
    ) -> bool {
        let until = heartbeat.lease_ends();
        if !held.delivery.acker.usable() {
            return false; // its channel died: delivered again on the next one
        }
        if !self.amqp.lane().takes(event) {
            // Not this processor's (its filter): acknowledged unrun, never an attempt.
            let _ = settle::ack(&held.delivery, until).await;
            return false;
        }
        let (log, processor) = (self.amqp.pause_log(), self.amqp.lane().name());
        if log.covers(processor, event.source(), event.event_type()) {
            park::park(self, held, until).await;
            // Resumed meanwhile: the parked event goes back at once.
            if !log.covers(processor, event.source(), event.event_type()) {
                log.poke();
            }
            return false;
        }
        if let Some(store) = &self.claims {
            let source = event.source();
            match held
                .claim_key(store, self.claim_source(source), event, self.lease, hurried)
                .await
            {
                Claim::Granted(guard) => held.hold_claim(guard, self.lease),
                Claim::Done => {
                    // Processed already: by an attempt whose acknowledgement was lost, or
                    // as another message of the same event.
                    #[cfg(feature = "tracing")]
                    tracing::debug!(target: "tower_webhook", source, event_id = event.stored_id(), "amqp event already processed: acknowledged without running again");
                    metrics::duplicate(&metrics::Source::new(source));
                    let _ = settle::ack(&held.delivery, until).await;
                    return false;
                }
                Claim::Stopped => {
                    settle::back(self, held, Duration::ZERO, false, until).await;
                    return false;
                }
                Claim::Elsewhere(after) => {
                    // Another attempt holds it (a delivery again while it runs, or its
                    // worker died holding the claim): back until then, not counted.
                    settle::back(self, held, after, false, until).await;
                    return false;
                }
            }
        }
        if attempt > max_attempts {
            metrics::attempt(&self.metrics, Attempt::Dead);
            held.release(until).await;
            let _ = settle::bury(&self.amqp, held, CRASHED, attempt, until).await;
            return false;
        }
        true
    }

    /// Renews the event's claim (a message needs no renewal: RabbitMQ waits for its
    /// acknowledgement up to the broker's `consumer_timeout`).
    async fn renew(&self, held: &Delivered, lease: Duration) -> Result<bool, StoreError> {
        let renewal = held.renewal(lease);
        let Some(renewal) = renewal else {
            return Ok(true); // at least once: nothing to renew
        };
        let sent = Instant::now();
        match renewal.await? {
            Renewed::Held => {
                held.renewed(sent + lease);
                Ok(true)
            }
            Renewed::Fenced => {
                held.lost();
                Ok(false)
            }
        }
    }

    /// Processed: done in the store first, then acknowledged — a delivery again after a
    /// lost acknowledgement finds the key done. A failure gives the key up so the next
    /// delivery runs: a copy sent to wait out its backoff in a delay queue, or buried.
    async fn finish(
        &self,
        held: &Delivered,
        outcome: Outcome,
        until: Instant,
    ) -> Result<bool, StoreError> {
        match outcome {
            Outcome::Processed => {
                let recorded = match (&self.claims, held.take()) {
                    (None, _) => true,
                    (Some(_), None) => false, // another attempt took the key over
                    (Some(_), Some(guard)) => {
                        let claimed = held.claim_ends().unwrap_or(until);
                        let complete = guard.complete_until(claimed.max(until));
                        matches!(complete.await, Ok(Completed::Done))
                    }
                };
                #[cfg(feature = "tracing")]
                if !recorded {
                    tracing::error!(target: "tower_webhook", "amqp worker could not mark a processed event done in its store before the lease ended (another attempt may run it)");
                }
                settle::ack(&held.delivery, until).await?;
                Ok(recorded)
            }
            Outcome::Retry(_, after) => {
                held.release(until).await;
                settle::back(self, held, after, true, until).await;
                Ok(true)
            }
            Outcome::Later(after) => {
                held.release(until).await;
                settle::back(self, held, after, false, until).await;
                Ok(true)
            }
            Outcome::Dead(error) => {
                held.release(until).await;
                // Sealed with a ring: a processor's error may quote the body.
                let error = held.sealed_error(self.amqp.keys(), self.processor(), &error);
                settle::bury(&self.amqp, held, &error, held.attempt, until).await?;
                Ok(true)
            }
            Outcome::Abandoned => {
                held.release(until).await;
                // Back at once, the attempt counted: the broker counts a requeue.
                settle::requeue(&held.delivery).await;
                Ok(true)
            }
        }
    }

    /// Hands back what the consumer delivered and no claim took, uncounted, and closes the
    /// consumer's channel.
    async fn stop(&self) {
        let consumer = self.consumer.lock().expect("not poisoned").take();
        if let Some(consumer) = &consumer {
            consumer.cancelled().await;
        }
        let mut inbox = self.inbox.lock().await;
        if let Some(inbox) = inbox.as_mut() {
            inbox.close();
            while let Ok(delivery) = inbox.try_recv() {
                let Some(row) = self.read(delivery, self.lease) else {
                    continue;
                };
                let until = Instant::now() + Duration::from_secs(5);
                settle::back(self, &row.held, Duration::ZERO, false, until).await;
            }
        }
        if let Some(consumer) = consumer {
            consumer.close().await;
        }
    }
}

impl Consumed {
    /// The source of the workers' claim keys for events of `source`:
    /// `amqp/<queue>/<source>`, the queue the processor's (`<queue>-<name>` for a
    /// processor other than `default`): apart from `DedupeLayer`'s keys of the same events
    /// (neither name holds a `/`), and per processor (each queue has every event).
    fn claim_source(&self, source: &str) -> String {
        format!("amqp/{}/{source}", self.amqp.lane().queue)
    }

    /// A delivery as a claimed event; `None` when it is not to run here: its channel died,
    /// it is no event this crate published, or its body does not open (buried at once, in
    /// the background, with the reason: never run, never retried).
    fn read(&self, delivery: Delivery, lease: Duration) -> Option<Claimed<Delivered>> {
        if !delivery.acker.usable() {
            return None;
        }
        let at = Instant::now();
        let (held, read, trace) = Delivered::read(delivery, self.amqp.keys());
        let error = match read {
            Read::Event(event) => {
                let attempt = held.attempt;
                return Some(Claimed {
                    event,
                    attempt,
                    held,
                    at,
                    trace,
                });
            }
            Read::Foreign => FOREIGN.to_owned(),
            Read::Unreadable { reason, why, about } => {
                metrics::unreadable(about.source(), why);
                reason
            }
        };
        metrics::attempt(&self.metrics, Attempt::Dead);
        let amqp = self.amqp.clone();
        tokio::spawn(async move {
            let _ = settle::bury(&amqp, &held, &error, held.attempt, at + lease).await;
        });
        None
    }
}

/// Reads the queues' counts every 5 s, which sets each processor's gauges (feature
/// `metrics`).
async fn gauges(amqp: Amqp) {
    loop {
        let _ = amqp.counts_by_processor().await;
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
}
