//! [`JetStreamWorker`]: pulls messages from the stream and runs the processor on them, with
//! the SQL worker's retries, leases and shutdown.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::consumer::{pull, AckPolicy, PullConsumer};
use async_nats::jetstream::{AckKind, Message};
use futures_util::StreamExt;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::{event_of, header, JetStream};
use crate::inbox::process::{
    checked_concurrency, checked_poll, error_chain, hurry_up, AbortOnDrop, WorkerHandle,
};
use crate::inbox::{Processor, RetryPolicy};
use crate::metrics::{self, Attempt, Operation};
use crate::span;
use crate::store::{
    retry_until, ClaimGuard, Claimed, Completed, DedupeStore, Delivery, Heartbeat, Lease,
    PendingClaim, Renewed, StoreError, Token,
};
use crate::ConfigError;

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
    jetstream: JetStream,
    /// `None`: at least once (no claims).
    claims: Option<Arc<dyn DedupeStore>>,
    processor: Arc<dyn Processor>,
    concurrency: usize,
    retry: RetryPolicy,
    lease: Lease,
    poll: Duration,
    /// `None`: shutdown waits for running events however long they take.
    grace: Option<Duration>,
}

/// What a dead message says as its error when every attempt crashed its worker.
const CRASHED: &str =
    "the last attempt ended without an outcome (the worker crashed or was stopped)";

impl JetStreamWorker {
    /// A worker running `processor` on each event once, claiming it in `store` first (see
    /// above): 4 at a time, 8 attempts, backoff from 1 s doubling to at most 10 min (with
    /// jitter), a 60 s lease (of the message and of the claim) renewed for up to 1 h of
    /// processing, each pull waiting up to 1 s for messages, and a shutdown that waits for
    /// running events — as [`Worker`](crate::inbox::Worker)'s.
    ///
    /// The store may be the one [`DedupeLayer`](crate::DedupeLayer) uses in front of
    /// [`accept_service`](JetStream::accept_service): the worker's keys are its own
    /// (`jetstream/<stream>/<consumer>/<source>`, the event's id), kept for the store's
    /// retention as event keys are.
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
        worker.claims = Some(store);
        worker
    }

    /// A worker without a store: each message JetStream delivers again runs the processor
    /// again — after a NATS server crash lost the acknowledgements of messages already
    /// processed, or when the event was published again after the stream's duplicate
    /// window. At least once: make the processor's effects idempotent
    /// ([`Once`](crate::once::Once)), or use [`new`](Self::new).
    pub fn at_least_once(jetstream: &JetStream, processor: impl Processor) -> Self {
        Self {
            jetstream: jetstream.clone(),
            claims: None,
            processor: Arc::new(processor),
            concurrency: 4,
            retry: RetryPolicy::default(),
            lease: Lease::renewed_for(Duration::from_secs(3600)),
            poll: Duration::from_secs(1),
            grace: None,
        }
    }

    /// Replaces how many messages are processed at once (default 4): no more are pulled
    /// than there is room to run, so none waits out its lease in a buffer.
    ///
    /// # Errors
    ///
    /// When `n` is 0.
    pub fn with_concurrency(mut self, n: usize) -> Result<Self, ConfigError> {
        self.concurrency = checked_concurrency(n)?;
        Ok(self)
    }

    /// Replaces how this worker retries (default: [`RetryPolicy::default`]).
    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// Replaces after how many failed attempts an event is dead (default 8): as
    /// [`RetryPolicy::with_max_attempts`].
    ///
    /// # Errors
    ///
    /// When `n` is 0.
    pub fn with_max_attempts(mut self, n: u32) -> Result<Self, ConfigError> {
        self.retry = self.retry.with_max_attempts(n)?;
        Ok(self)
    }

    /// Replaces the backoff: `first` after the first failure, doubling up to `cap`, each
    /// wait drawn between half and all of that: as [`RetryPolicy::with_backoff`].
    ///
    /// # Errors
    ///
    /// When `first` is zero, or `cap` is shorter than `first`.
    pub fn with_backoff(mut self, first: Duration, cap: Duration) -> Result<Self, ConfigError> {
        self.retry = self.retry.with_backoff(first, cap)?;
        Ok(self)
    }

    /// Replaces the lease (default 60 s): the consumer's `ack_wait` when this creates the
    /// consumer (an existing consumer keeps its own, and the worker renews on that), renewed
    /// every third of it while the processor runs. It bounds how long a *crashed* worker's
    /// messages wait to be redelivered.
    ///
    /// # Errors
    ///
    /// When `lease` is not between 100 ms and 1 day.
    pub fn with_lease(mut self, lease: Duration) -> Result<Self, ConfigError> {
        self.lease.length = Lease::checked_length(lease)?;
        Ok(self)
    }

    /// Replaces how long a running processor keeps its message's lease renewed (default
    /// 1 h); past it the message is redelivered to another worker.
    ///
    /// # Errors
    ///
    /// When `max_run` is shorter than 1 s.
    pub fn with_max_run(mut self, max_run: Duration) -> Result<Self, ConfigError> {
        self.lease.max_run = Lease::checked_max_run(max_run)?;
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
        self.poll = checked_poll(poll)?;
        Ok(self)
    }

    /// Bounds how long [`WorkerHandle::shutdown`] lets running events finish (by default
    /// it waits for them). Past it they are stopped mid-attempt and handed back for
    /// redelivery at once, the attempt counted.
    pub fn with_grace(mut self, grace: Duration) -> Self {
        self.grace = Some(grace);
        self
    }

    /// Starts the worker on the current Tokio runtime; with the `metrics` feature, it also
    /// refreshes the inbox's gauges from [`JetStream::counts`] every 5 s.
    pub fn spawn(self) -> WorkerHandle {
        let gauges = metrics::ENABLED.then(|| tokio::spawn(gauges(self.jetstream.clone())));
        WorkerHandle::spawn(|stopped| self.run(stopped), gauges.into_iter().collect())
    }

    /// The durable consumer, created with this worker's lease if it does not exist; asked
    /// again after a pause while NATS cannot answer.
    async fn consumer(&self, stopped: &mut watch::Receiver<bool>) -> Option<PullConsumer> {
        loop {
            match self.create_consumer().await {
                Ok(consumer) => return Some(consumer),
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

    async fn create_consumer(&self) -> Result<PullConsumer, StoreError> {
        let err = |e| StoreError::new("jetstream consumer", e);
        let js = &self.jetstream;
        let stream = js
            .inner
            .context
            .get_stream(&*js.inner.stream)
            .await
            .map_err(err)?;
        let config = pull::Config {
            durable_name: Some(js.inner.consumer.clone()),
            ack_policy: AckPolicy::Explicit,
            ack_wait: self.lease.length,
            // Dead messages are moved by the worker, with their error: never dropped.
            max_deliver: -1,
            ..Default::default()
        };
        stream
            .get_or_create_consumer(&js.inner.consumer, config)
            .await
            .map_err(|e| StoreError::new("jetstream consumer", e))
    }

    async fn run(self, mut stopped: watch::Receiver<bool>) {
        let Some(mut consumer) = self.consumer(&mut stopped).await else {
            return;
        };
        // The consumer's own lease, if it existed with another.
        let mut this = self;
        this.lease.length = consumer.cached_info().config.ack_wait;
        let client = this.jetstream.inner.context.client();
        let this = Arc::new(this);
        let permits = Arc::new(Semaphore::new(this.concurrency));
        let mut running: JoinSet<()> = JoinSet::new();
        let (hurry, hurried) = watch::channel(false);
        while !*stopped.borrow() {
            while running.try_join_next().is_some() {}
            let free = permits.available_permits();
            if free == 0 {
                tokio::select! {
                    Some(_) = running.join_next() => {}
                    _ = stopped.changed() => {}
                }
                continue;
            }
            let pull = consumer
                .batch()
                .max_messages(free)
                .expires(this.poll)
                .messages();
            let batch = metrics::timed(Operation::InboxClaim, pull).await;
            let mut batch = match batch {
                Ok(batch) => batch,
                Err(_error) => {
                    #[cfg(feature = "tracing")]
                    tracing::error!(target: "tower_webhook", "jetstream worker could not pull: {_error}");
                    tokio::select! {
                        () = tokio::time::sleep(this.poll) => {}
                        _ = stopped.changed() => {}
                    }
                    // The connection may have been replaced: ask for the consumer again.
                    if let Some(again) = this.consumer(&mut stopped).await {
                        consumer = again;
                    }
                    continue;
                }
            };
            // The whole pull, even once stopping: its messages are delivered already, and
            // one left unprocessed would count an attempt it never had. But not a pull the
            // connection lost: left to itself it waits 5 s past its expiry.
            let mut lost = std::pin::pin!(reconnected(client.clone(), this.poll));
            loop {
                let message = tokio::select! {
                    message = batch.next() => message,
                    () = &mut lost => break,
                };
                let Some(Ok(message)) = message else { break };
                let received = Instant::now();
                let permit = permits.clone().acquire_owned().await.expect("never closed");
                let (worker, hurried) = (this.clone(), hurried.clone());
                running.spawn(async move {
                    let _permit = permit;
                    worker.process(message, received, hurried).await;
                });
            }
        }
        let finish = async { while running.join_next().await.is_some() {} };
        match this.grace {
            None => finish.await,
            Some(grace) => {
                let _ = tokio::time::timeout(grace, finish).await;
            }
        }
        let _ = hurry.send(true);
        while running.join_next().await.is_some() {}
    }

    /// One delivery of `message`: renewed (the message, and the event's claim while this
    /// attempt holds it) until its outcome — the acknowledgement, the nak or the dead
    /// publish — has landed, not only while the processor runs.
    async fn process(
        &self,
        message: Message,
        received: Instant,
        mut hurried: watch::Receiver<bool>,
    ) {
        let heartbeat = Heartbeat::new(received, self.lease);
        let renewal = Renewal {
            message: &message,
            lease: self.lease.length,
            claim: Mutex::new(None),
        };
        tokio::select! {
            biased;
            () = self.attempt(&message, &renewal, &heartbeat, &mut hurried) => {}
            () = heartbeat.beat(|| renewal.renew()) => unreachable!("the heartbeat never ends"),
        }
    }

    async fn attempt(
        &self,
        message: &Message,
        renewal: &Renewal<'_>,
        heartbeat: &Heartbeat,
        hurried: &mut watch::Receiver<bool>,
    ) {
        let attempt = message.info().map_or(1, |info| {
            u32::try_from(info.delivered.max(1)).unwrap_or(u32::MAX)
        });
        let event = event_of(message.headers.as_ref(), message.payload.clone());
        let Some(event) = event else {
            let error = "not a tower-webhook event: no Webhook-Source or Webhook-Id header";
            metrics::attempt(Attempt::Dead);
            return self.bury(message, error, attempt, heartbeat).await;
        };
        let (source, id) = (event.source().to_owned(), event.stored_id().to_owned());
        if let Some(store) = &self.claims {
            let delivery = Delivery::new(self.jetstream.claim_source(&source), id.clone());
            match self.claim(store, delivery, hurried).await {
                Claim::Granted(guard) => *renewal.claim.lock().expect("not poisoned") = Some(guard),
                Claim::Done => {
                    // Processed already: by an attempt whose acknowledgement was lost, or
                    // as another message of the same event (published after the window).
                    #[cfg(feature = "tracing")]
                    tracing::debug!(target: "tower_webhook", source, event_id = id, "jetstream event already processed: acknowledged without running again");
                    metrics::duplicate(&metrics::Source::new(&source));
                    let _ = self.acknowledge(message, heartbeat).await;
                    return;
                }
                Claim::Stopped => {
                    let _ = message.ack_with(AckKind::Nak(None)).await;
                    return;
                }
            }
        }
        if attempt > self.retry.max_attempts() {
            metrics::attempt(Attempt::Dead);
            renewal.release(heartbeat).await;
            return self.bury(message, CRASHED, attempt, heartbeat).await;
        }
        let told = crate::inbox::Attempt::new(attempt, &self.retry);
        // Its own task: a panicking processor is a failed attempt, not a dead worker; the
        // guard stops it when this task is stopped (a simulated crash).
        let span = span::attempt(&event, told);
        let processed = self.processor.process(event, told);
        let run = span::instrument(span, async move {
            processed.await.map_err(|e| error_chain(&*e))
        });
        let mut task = AbortOnDrop(tokio::spawn(run));
        let joined = tokio::select! {
            biased;
            joined = &mut task.0 => joined,
            () = hurry_up(hurried) => {
                task.0.abort();
                match (&mut task.0).await {
                    Ok(finished) => Ok(finished),
                    Err(_) => {
                        // Stopped past the grace period: back for redelivery at once.
                        metrics::attempt(Attempt::Abandoned);
                        renewal.release(heartbeat).await;
                        let _ = message.ack_with(AckKind::Nak(None)).await;
                        return;
                    }
                }
            }
        };
        let result = match joined {
            Ok(result) => result,
            Err(_) => Err("the processor panicked".to_owned()),
        };
        match result {
            Ok(()) => {
                // Done in the store first, then acknowledged: a redelivery after a lost
                // acknowledgement finds the key done. Both retried while the lease lasts;
                // after it the message is redelivered (and acknowledged as processed, if
                // the key is done).
                let recorded = match (&self.claims, renewal.take()) {
                    (None, _) => true,
                    (Some(_), None) => false, // another attempt took the key over
                    (Some(_), Some(guard)) => {
                        let (store, delivery, token) = guard.into_parts();
                        let complete = retry_until(heartbeat.lease_ends(), || {
                            metrics::timed(
                                Operation::Complete,
                                store.complete(delivery.clone(), token),
                            )
                        });
                        matches!(complete.await, Ok(Completed::Done))
                    }
                };
                let acked = self.acknowledge(message, heartbeat).await;
                metrics::attempt(if recorded && acked.is_ok() {
                    Attempt::Processed
                } else {
                    Attempt::Lost
                });
                #[cfg(feature = "tracing")]
                if !recorded {
                    tracing::error!(target: "tower_webhook", source, event_id = id, "jetstream worker could not mark a processed event done in its store before the lease ended (another attempt may run it)");
                }
                if let Err(_error) = acked {
                    #[cfg(feature = "tracing")]
                    tracing::error!(target: "tower_webhook", source, event_id = id, "jetstream worker could not acknowledge a processed event (it will be redelivered): {_error}");
                }
            }
            Err(error) if told.is_last() => {
                #[cfg(feature = "tracing")]
                tracing::error!(target: "tower_webhook", source, event_id = id, attempt, error = %error, "jetstream event failed for the last time, now dead");
                metrics::attempt(Attempt::Dead);
                renewal.release(heartbeat).await;
                self.bury(message, &error, attempt, heartbeat).await;
            }
            Err(error) => {
                let after = self.retry.delay(attempt);
                #[cfg(feature = "tracing")]
                tracing::warn!(target: "tower_webhook", source, event_id = id, attempt, retry_in = ?after, error = %error, "jetstream event failed, will retry");
                let _ = (&source, &id, &error);
                metrics::attempt(Attempt::Retry);
                renewal.release(heartbeat).await;
                let _ = self.nak(message, after, heartbeat).await;
            }
        }
    }

    /// Claims the event's key, asking again while another attempt holds it (a redelivery
    /// while the first delivery still runs) or the store does not answer: a message waits
    /// here, renewed, rather than spend one of its attempts.
    async fn claim(
        &self,
        store: &Arc<dyn DedupeStore>,
        delivery: Delivery,
        hurried: &mut watch::Receiver<bool>,
    ) -> Claim {
        let mut backoff = Duration::from_millis(50);
        loop {
            let pending = PendingClaim::new(
                store.clone(),
                delivery.clone(),
                Token::new(),
                self.lease.length,
            );
            let claimed = tokio::select! {
                claimed = pending => claimed,
                () = hurry_up(hurried) => return Claim::Stopped,
            };
            let pause = match claimed {
                Claimed::Granted(guard) => return Claim::Granted(guard),
                Claimed::Done => return Claim::Done,
                Claimed::InFlight(after) => after.min(Duration::from_secs(1)),
                Claimed::Failed(_error) => {
                    #[cfg(feature = "tracing")]
                    tracing::warn!(target: "tower_webhook", "jetstream worker could not claim an event in its store: {_error}");
                    let pause = backoff;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                    pause
                }
            };
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                () = hurry_up(hurried) => return Claim::Stopped,
            }
        }
    }

    /// Acknowledges `message`, confirmed by the server, retried while the lease lasts.
    async fn acknowledge(
        &self,
        message: &Message,
        heartbeat: &Heartbeat,
    ) -> Result<(), StoreError> {
        let acked = retry_until(heartbeat.lease_ends(), || async {
            message
                .double_ack()
                .await
                .map_err(|e| StoreError::new("jetstream ack", e))
        });
        metrics::timed(Operation::InboxFinish, acked).await
    }

    /// Hands `message` back for redelivery after `after`, confirmed by the server, retried
    /// while the lease lasts (after it, JetStream redelivers it anyway).
    async fn nak(
        &self,
        message: &Message,
        after: Duration,
        heartbeat: &Heartbeat,
    ) -> Result<(), StoreError> {
        let naked = retry_until(heartbeat.lease_ends(), || async {
            message
                .double_ack_with(AckKind::Nak(Some(after)))
                .await
                .map_err(|e| StoreError::new("jetstream nak", e))
        });
        metrics::timed(Operation::InboxFinish, naked).await
    }

    /// Publishes `message` to the dead stream with its error, then acknowledges it. When
    /// the dead stream does not take it, it is left for redelivery (and buried then).
    async fn bury(&self, message: &Message, error: &str, attempts: u32, heartbeat: &Heartbeat) {
        let js = &self.jetstream;
        let subject = message
            .subject
            .strip_prefix(&*js.inner.stream)
            .map_or_else(|| format!(".{}", message.subject), str::to_owned);
        let mut headers = message.headers.clone().unwrap_or_default();
        // One line of text: the processor's error may hold anything.
        let error: String = error
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .take(1024)
            .collect();
        headers.insert(header::ERROR, error);
        headers.insert(header::ATTEMPTS, attempts.to_string());
        let published = async {
            js.inner
                .context
                .publish_with_headers(
                    format!("{}{subject}", js.dead_stream()),
                    headers,
                    message.payload.clone(),
                )
                .await
                .map_err(|e| StoreError::new("jetstream dead", e))?
                .await
                .map_err(|e| StoreError::new("jetstream dead", e))
        };
        match published.await {
            Ok(_) => {
                // Out of the stream, so it is counted once: as dead, not as processed.
                if self.acknowledge(message, heartbeat).await.is_ok() {
                    if let (Ok(info), Ok(stream)) = (
                        message.info(),
                        js.inner.context.get_stream_no_info(&*js.inner.stream).await,
                    ) {
                        let _ = stream.delete_message(info.stream_sequence).await;
                    }
                }
            }
            Err(_error) => {
                #[cfg(feature = "tracing")]
                tracing::error!(target: "tower_webhook", "jetstream worker could not move a dead event to the dead stream: {_error}");
                let _ = self
                    .nak(message, self.retry.delay(attempts), heartbeat)
                    .await;
            }
        }
    }
}

/// What [`JetStreamWorker::claim`] came to.
enum Claim {
    /// This attempt holds the event's key.
    Granted(ClaimGuard),
    /// The event was processed already.
    Done,
    /// The worker is stopping past its grace.
    Stopped,
}

/// What a delivery's heartbeat renews: its message (`+WPI`, confirmed by the server) and,
/// while this attempt holds it, the event's claim in the store.
struct Renewal<'a> {
    message: &'a Message,
    lease: Duration,
    /// Taken out to record the outcome; dropped armed (the attempt stopped), it releases.
    claim: Mutex<Option<ClaimGuard>>,
}

impl Renewal<'_> {
    /// Renews both at once; `Ok(true)` once both were heard. A claim another attempt took
    /// over is no longer renewed (and [`take`](Self::take) then finds none); the message
    /// still is, until its outcome lands.
    async fn renew(&self) -> Result<bool, StoreError> {
        let claim = self
            .claim
            .lock()
            .expect("not poisoned")
            .as_ref()
            .map(|guard| guard.renew(self.lease));
        let claim = async {
            match claim {
                Some(renewal) => renewal.await.map(Some),
                None => Ok(None),
            }
        };
        // A request on the reply subject: the server answers once it has the renewal.
        let message = metrics::timed(Operation::InboxRenew, async {
            self.message
                .double_ack_with(AckKind::Progress)
                .await
                .map_err(|e| StoreError::new("jetstream renew", e))
        });
        let (claim, message) = tokio::join!(claim, message);
        if let Ok(Some(Renewed::Fenced)) = claim {
            if let Some(lost) = self.take() {
                let _ = lost.into_parts(); // nothing to release: it is another's
            }
        }
        claim?;
        message?;
        Ok(true)
    }

    /// The claim, to record the outcome with; `None` once another attempt took it over.
    fn take(&self) -> Option<ClaimGuard> {
        self.claim.lock().expect("not poisoned").take()
    }

    /// Gives the claim up (a failed or stopped attempt), so the next delivery runs.
    async fn release(&self, heartbeat: &Heartbeat) {
        if let Some(guard) = self.take() {
            guard.release_until(heartbeat.lease_ends().into_std()).await;
        }
    }
}

/// Ends once `client` lost its connection and has it again, plus `poll`: a pull request
/// sent before survives the server at most that long, so none of its messages comes later.
async fn reconnected(client: async_nats::Client, poll: Duration) {
    let connected = || client.connection_state() == async_nats::connection::State::Connected;
    while connected() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    while !connected() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(poll).await;
}

/// Reads the stream's counts every 5 s, which sets the inbox's gauges (feature `metrics`).
async fn gauges(jetstream: JetStream) {
    loop {
        let _ = jetstream.counts().await;
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
}

impl fmt::Debug for JetStreamWorker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JetStreamWorker")
            .field("jetstream", &self.jetstream)
            .field("concurrency", &self.concurrency)
            .field("retry", &self.retry)
            .field("lease", &self.lease.length)
            .field("max_run", &self.lease.max_run)
            .finish_non_exhaustive()
    }
}
