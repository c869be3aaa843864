//! [`JetStreamWorker`]: the worker of `inbox/worker/` with the stream as its queue — each
//! message pulled, claimed in a store, renewed, then acknowledged, handed back or buried.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::consumer::PullConsumer;
use async_nats::jetstream::Message;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use super::pause::Paused;
use super::sealed;
use super::settle::{acknowledge, bury, bury_as, nak, BURY_AGAIN};
use super::{held, JetStream};
use crate::inbox::process::WorkerHandle;
use crate::inbox::worker::{shared_settings, ClaimDue, Claimed, Engine, Outcome, Queue, Runner};
use crate::inbox::Processor;
use crate::metrics::{self, Attempt};
use crate::store::{ClaimGuard, Completed, DedupeStore, Delivery, Heartbeat, StoreError};
use crate::Event;

mod order; // messages handed back in the stream's order
mod processor; // a processor's worker; messages it does not run
mod pulled; // the consumer, pulls, claims in the store, parking
mod renew; // messages on the consumer's ack_wait, claims on their lease
mod settings; // the settings only a JetStream worker has
mod turns; // objects' turns across workers: their lines in the bucket
use pulled::Claim;
pub(super) use renew::ACK_WAIT;

/// Processes a [`JetStream`]'s messages. Build it, then [`spawn`](Self::spawn) it. Workers
/// in any number of processes share the stream's durable consumer.
///
/// Each event is claimed in a [`DedupeStore`] before its processor runs, and marked done
/// there before its message is acknowledged: a message JetStream delivers again — its
/// acknowledgement lost when the server crashed, or the event published again after the
/// stream's duplicate window — is acknowledged without running again. Give it a store
/// every worker of the consumer shares (PostgreSQL or Redis across hosts).
/// [`at_least_once`](Self::at_least_once) builds one without a store.
#[must_use]
pub struct JetStreamWorker {
    engine: Engine<Stream>,
}

/// How long a pull waits for a new message while events wait in the worker for their turns.
const WAITING_POLL: Duration = Duration::from_millis(50);

/// What a dead message says as its error when every attempt crashed its worker.
const CRASHED: &str =
    "the last attempt ended without an outcome (the worker crashed or was stopped)";

impl JetStreamWorker {
    /// A worker running `processor` on each event once, claiming it in `store` first (see
    /// above): 4 at a time, 8 attempts, backoff from 1 s doubling to at most 10 min (with
    /// jitter), a 60 s lease of the claim and the consumer's `ack_wait` of 3 s, both
    /// renewed for up to 1 h of processing, each pull waiting up to 1 s for messages, and a
    /// shutdown that waits for running events — as [`Worker`]'s.
    ///
    /// The store may be the one [`DedupeLayer`](crate::DedupeLayer) uses in front of
    /// [`accept_service`](JetStream::accept_service): the worker's keys are its own
    /// (`jetstream/<stream>/<consumer>/<source>`, the event's id), kept for the store's
    /// retention as event keys are.
    ///
    #[cfg_attr(
        any(feature = "sqlite", feature = "postgres"),
        doc = "[`Worker`]: crate::inbox::Worker"
    )]
    #[cfg_attr(
        not(any(feature = "sqlite", feature = "postgres")),
        doc = "[`Worker`]: crate#features"
    )]
    pub fn new(jetstream: &JetStream, store: impl DedupeStore, processor: impl Processor) -> Self {
        Self::from_arc(jetstream, Arc::new(store), processor)
    }

    /// [`new`](Self::new), with a store already shared behind an `Arc`.
    pub fn from_arc(
        jetstream: &JetStream,
        store: Arc<dyn DedupeStore>,
        processor: impl Processor,
    ) -> Self {
        let mut worker = Self::at_least_once(jetstream, processor);
        worker.engine.queue.claims = Some(store);
        worker
    }

    /// A worker without a store: each message JetStream delivers again runs the processor
    /// again — after a NATS server crash lost the acknowledgements of messages already
    /// processed, or when the event was published again after the stream's duplicate
    /// window. At least once: make the processor's effects idempotent
    /// ([`Once`](crate::once::Once)), or use [`new`](Self::new).
    pub fn at_least_once(jetstream: &JetStream, processor: impl Processor) -> Self {
        let poll = Duration::from_secs(1);
        let stream = Stream {
            jetstream: jetstream.clone(),
            claims: None,
            consumer: Mutex::new(None),
            poll,
            lease: Duration::ZERO, // set by `open`
            ack_wait: renew::ACK_WAIT,
            paused: Paused::of(jetstream.lane.name()),
            holding: Arc::default(),
            lines: None,
        };
        Self {
            engine: Engine::new(stream, Runner::Plain(Arc::new(processor)), poll),
        }
    }

    shared_settings!();

    /// Starts the worker on the current Tokio runtime; with the `metrics` feature, it also
    /// refreshes the inbox's gauges from [`JetStream::counts`] every 5 s.
    pub fn spawn(self) -> WorkerHandle {
        self.engine.spawn()
    }
}

impl fmt::Debug for JetStreamWorker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut f = f.debug_struct("JetStreamWorker");
        f.field("jetstream", &self.engine.queue.jetstream);
        self.engine.fields(&mut f);
        f.finish_non_exhaustive()
    }
}

/// The stream as the worker's queue: its durable consumer, and the store its events are
/// claimed in (`None`: at least once).
pub(crate) struct Stream {
    jetstream: JetStream,
    claims: Option<Arc<dyn DedupeStore>>,
    /// Set by `open`; replaced when a pull fails (the connection may have been replaced).
    consumer: Mutex<Option<PullConsumer>>,
    /// How long a pull waits for a message when none is there.
    poll: Duration,
    /// The lease of the events' claims in the store.
    lease: Duration,
    /// The consumer's `ack_wait`: asked for, then the consumer's own once open.
    ack_wait: Duration,
    /// The pauses in force, as this worker last heard.
    paused: Paused,
    /// The messages this worker holds, to hand back in the stream's order.
    holding: Arc<order::Holding>,
    /// The objects' lines it waits in (`with_per_object(1)`; `turns.rs`).
    lines: Option<turns::Lines>,
}

/// A pulled message: which delivery of it this is, and the event's claim in the store
/// while this attempt holds it (taken out to record the outcome; dropped armed — the
/// attempt stopped — it releases).
pub(crate) struct Pulled {
    message: Message,
    /// Whether this processor runs it (its filter takes it): else acknowledged unrun.
    taken: bool,
    /// Its attempt now (one more for each run again in the worker).
    attempt: AtomicU32,
    /// Its place in the stream, and how many of its deliveries were not attempts (less
    /// its attempts that were not deliveries).
    seq: u64,
    held: AtomicI64,
    claim: Mutex<Option<ClaimGuard>>,
    /// When the claim's lease ends, and its renewal in flight.
    claimed: Mutex<renew::ClaimLease>,
    /// Handed back with a delay: no longer renewed (a renewal would undo the delay).
    delayed: AtomicBool,
    /// Its object's line (`with_per_object(1)`), whether it is written down there, and
    /// whether it was the line's first as written.
    line: Option<String>,
    written: AtomicBool,
    first: AtomicBool,
    /// Its place among the messages this worker holds, given up with it.
    _holding: order::Held,
}

impl Queue for Stream {
    type Held = Pulled;
    // A pull waits up to `poll` for a message itself.
    const CLAIM_WAITS: bool = true;
    // A message handed back counts a delivery: a pull answered at shutdown is run instead.
    const GIVES_BACK: bool = false;
    // Read in order: an event over its object's cap waits in the worker, as over the others.
    const CAPS_OBJECTS: bool = false;

    fn wake(&self) -> Arc<Notify> {
        Arc::new(Notify::new()) // never woken: pulls wait for messages themselves
    }

    fn metrics(&self) -> &metrics::Processor {
        self.jetstream.lane.metrics()
    }

    fn processor(&self) -> &str {
        self.jetstream.lane.name()
    }

    fn beside(&self, _: Duration) -> Vec<tokio::task::JoinHandle<()>> {
        let gauges = metrics::ENABLED.then(|| tokio::spawn(gauges(self.jetstream.clone())));
        let watch = tokio::spawn(self.paused.clone().watch(self.jetstream.clone()));
        let unpark = tokio::spawn(self.paused.clone().unparking(self.jetstream.clone()));
        gauges.into_iter().chain([watch, unpark]).collect()
    }

    /// Gets the durable consumer, created or set with this `ack_wait`, asking again after
    /// a pause while NATS cannot answer; the worker's heartbeat beats on the shorter of
    /// `ack_wait` and the claim's lease. With a per-object cap of 1, the objects' turns are
    /// kept in their lines across workers (`turns.rs`); a greater cap is this worker's own.
    async fn open(
        &mut self,
        (lease, per_object): (Duration, Option<u32>),
        stopped: &mut watch::Receiver<bool>,
    ) -> Option<Duration> {
        if per_object == Some(1) {
            self.lines = Some(turns::Lines::new(self.jetstream.inner.held.clone()));
        }
        loop {
            let opened = async {
                // The pauses first: no paused event may start before they are known.
                self.paused.load(&self.jetstream).await?;
                let consumer = self.create_consumer(self.ack_wait).await?;
                self.catch_up(&consumer).await?; // with lines: before the first pull
                Ok::<_, StoreError>(consumer)
            };
            let opened = opened.await;
            match opened {
                Ok(consumer) => {
                    self.lease = lease;
                    self.ack_wait = consumer.cached_info().config.ack_wait;
                    *self.consumer.get_mut().expect("not poisoned") = Some(consumer);
                    return Some(self.ack_wait.min(self.lease));
                }
                Err(_error) => {
                    #[cfg(feature = "tracing")]
                    tracing::error!(target: "tower_webhook", "jetstream worker has no consumer yet: {_error}");
                }
            }
            tokio::select! {
                () = tokio::time::sleep(self.poll.max(Duration::from_millis(500))) => {}
                _ = stopped.changed() => return None,
            }
        }
    }

    /// The messages there now; when there are none, the first to arrive within the poll
    /// interval.
    // A stream is read in order: capped events wait in the worker instead of being skipped
    // (`due.skip` says only whether some wait).
    async fn claim(&self, due: ClaimDue) -> Result<Vec<Claimed<Pulled>>, StoreError> {
        let ClaimDue {
            limit: n,
            lease,
            skip,
            ..
        } = due;
        let consumer = self.consumer.lock().expect("not poisoned").clone();
        let consumer = consumer.expect("opened before the first claim");
        // While events wait for their turns, the processors this pull holds are theirs
        // soon: wait briefly.
        let wait = match skip.waiting {
            true => self.poll.min(WAITING_POLL),
            false => self.poll,
        };
        let sent = Instant::now();
        let mut pulled = self.pull(&consumer, (n, wait, false), lease).await;
        if matches!(&pulled, Ok(rows) if rows.is_empty()) && sent.elapsed() < wait / 2 {
            // Turned away at once (the consumer's other pulls wait for what is there):
            // wait in line with them. One: a pull's messages are delivered as they come,
            // and each must run.
            pulled = self.pull(&consumer, (1, wait, true), lease).await;
        }
        if let Ok(rows) = &pulled {
            self.write_down(rows).await; // with lines: before any of them runs
        }
        if pulled.is_err() {
            // The connection may have been replaced: ask for the consumer again.
            if let Ok(again) = self.create_consumer(self.ack_wait).await {
                *self.consumer.lock().expect("not poisoned") = Some(again);
            }
        }
        pulled
    }

    async fn give_back(&self, _: Vec<Pulled>) {
        unreachable!("GIVES_BACK is false")
    }

    fn holds_turns(&self) -> bool {
        self.lines.is_some()
    }

    async fn object_turn(&self, pulled: &Pulled) -> bool {
        self.wait_in_line(pulled).await
    }

    /// Claims the event's key in the store (a message processed already is acknowledged
    /// here), and buries a message delivered more often than the attempts allow.
    async fn start(
        &self,
        pulled: &Pulled,
        (event, attempt): (&Event, u32),
        max_attempts: u32,
        heartbeat: &Heartbeat,
        hurried: &mut watch::Receiver<bool>,
    ) -> bool {
        let until = heartbeat.lease_ends();
        let message = &pulled.message;
        if !pulled.taken {
            self.pass(pulled, until).await;
            return false;
        }
        if self.paused.covers(event) {
            self.park(pulled, until).await;
            // Resumed meanwhile: the parked event goes back at once.
            if !self.paused.covers(event) {
                self.paused.ended.notify_one();
            }
            return false;
        }
        if let Some(store) = &self.claims {
            let source = event.source();
            let delivery = Delivery::new(
                self.jetstream.claim_source(source),
                event.stored_id().to_owned(),
            );
            match self.claim_key(store, delivery, hurried).await {
                Claim::Granted(guard) => pulled.hold_claim(guard, self.lease),
                Claim::Done => {
                    // Processed already: by an attempt whose acknowledgement was lost, or
                    // as another message of the same event (published after the window).
                    #[cfg(feature = "tracing")]
                    tracing::debug!(target: "tower_webhook", source, event_id = event.stored_id(), "jetstream event already processed: acknowledged without running again");
                    metrics::duplicate(&metrics::Source::new(source));
                    if self.leave_line(pulled, until).await {
                        let _ = acknowledge(message, until).await;
                    } else {
                        let _ = nak(message, Some(BURY_AGAIN), until).await;
                    }
                    return false;
                }
                Claim::Stopped => {
                    let _ = self.hand_back(pulled, Duration::ZERO, until).await;
                    return false;
                }
                Claim::Elsewhere(after) => {
                    self.give_way(pulled, after, until).await;
                    return false;
                }
            }
        }
        if attempt > max_attempts {
            metrics::attempt(self.jetstream.lane.metrics(), Attempt::Dead);
            pulled.release(until).await;
            if bury(&self.jetstream, message, CRASHED, attempt, until)
                .await
                .is_ok()
            {
                self.leave_line(pulled, until).await;
            }
            return false;
        }
        true
    }

    /// Renews the message, and the event's claim when it is due (`renew.rs`).
    async fn renew(&self, pulled: &Pulled, _: Duration) -> Result<bool, StoreError> {
        self.keep(pulled).await
    }

    /// Runs the message again here, its claim given up (the next run claims it again): a
    /// failed attempt's next is one more that is no delivery, said in `<stream>-held`
    /// first, so that a crash during it counts it. `false` when the bucket did not take
    /// it: handed back, a delivery counts the attempt.
    async fn again(&self, pulled: &Pulled, counted: bool, until: Instant) -> bool {
        if counted {
            let now = pulled.held() - 1;
            if !held::set(&self.jetstream, pulled.seq, now).await {
                return false;
            }
            pulled.held.store(now, Ordering::Relaxed);
            pulled.attempt.fetch_add(1, Ordering::Relaxed);
        }
        pulled.release(until).await;
        true
    }

    /// Processed: done in the store first, then acknowledged — a redelivery after a lost
    /// acknowledgement finds the key done (after `ack_wait` the message is redelivered,
    /// and acknowledged as processed if the key is done). A failure gives the key up so
    /// the next delivery runs: handed back with its backoff, or buried.
    async fn finish(
        &self,
        pulled: &Pulled,
        outcome: Outcome,
        until: Instant,
    ) -> Result<bool, StoreError> {
        let message = &pulled.message;
        pulled.delays(&outcome);
        match outcome {
            Outcome::Processed => {
                let recorded = match (&self.claims, pulled.take()) {
                    (None, _) => true,
                    (Some(_), None) => false, // another attempt took the key over
                    (Some(_), Some(guard)) => {
                        // Tried while the claim lasts, past the message's shorter lease.
                        let claimed = pulled.claim_ends().unwrap_or(until);
                        let complete = guard.complete_until(claimed.max(until));
                        matches!(complete.await, Ok(Completed::Done))
                    }
                };
                #[cfg(feature = "tracing")]
                if !recorded {
                    tracing::error!(target: "tower_webhook", "jetstream worker could not mark a processed event done in its store before the lease ended (another attempt may run it)");
                }
                // Out of its object's line before it is acknowledged, or a line would wait
                // for a message never delivered again: when the bucket does not take it,
                // handed back, and taken out at its next delivery (the store finds it done).
                if !self.leave_line(pulled, until).await {
                    nak(message, Some(BURY_AGAIN), until).await?;
                    return Ok(recorded);
                }
                acknowledge(message, until).await?;
                pulled.forget(&self.jetstream).await;
                Ok(recorded)
            }
            Outcome::Later(after) => {
                pulled.release(until).await;
                held::add(&self.jetstream, pulled.seq, pulled.held()).await;
                self.hand_back(pulled, after, until).await.map(|()| true)
            }
            Outcome::Retry(_, after) => {
                pulled.release(until).await;
                nak(message, Some(after), until).await.map(|()| true)
            }
            Outcome::Dead(error) => {
                pulled.release(until).await;
                // Sealed with a ring: a processor's error may quote the body.
                let error = sealed::error(&self.jetstream, message, &error);
                let buried = bury_as(&self.jetstream, message, error, pulled.attempt(), until);
                buried.await?;
                // After: a dead message leaves the stream, so a line still holding it is
                // seen to be stale (`turns.rs`); a failed burial keeps it in line.
                self.leave_line(pulled, until).await;
                pulled.forget(&self.jetstream).await;
                Ok(true)
            }
            Outcome::Abandoned => {
                pulled.release(until).await;
                self.hand_back(pulled, Duration::ZERO, until)
                    .await
                    .map(|()| true)
            }
        }
    }
}

/// Reads the stream's counts every 5 s, which sets the inbox's gauges (feature `metrics`).
async fn gauges(jetstream: JetStream) {
    loop {
        let _ = jetstream.counts().await;
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
}
