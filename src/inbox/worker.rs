//! [`Worker`]: claims due rows and runs the processor on them, with retries.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

use super::backend::Outcome;
use super::{Inbox, InboxEvent};
use crate::store::Token;

/// What a worker runs on each event. Any `Fn(InboxEvent) -> impl Future<Output =
/// Result<(), E>>` with a displayable error is one. An `Err` (or a panic) is retried
/// later with backoff; its text is kept in the row's `processing_error`.
pub trait Processor: Send + Sync + 'static {
    /// Processes one event.
    fn process(
        &self,
        event: InboxEvent,
    ) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;
}

impl<F, Fut, E> Processor for F
where
    F: Fn(InboxEvent) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), E>> + Send + 'static,
    E: fmt::Display,
{
    fn process(
        &self,
        event: InboxEvent,
    ) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> {
        let future = self(event);
        Box::pin(async move { future.await.map_err(|e| e.to_string()) })
    }
}

/// Processes an [`Inbox`]'s rows. Build it, then [`spawn`](Self::spawn) it.
#[must_use]
pub struct Worker {
    inbox: Inbox,
    processor: Arc<dyn Processor>,
    concurrency: usize,
    max_attempts: u32,
    backoff: (Duration, Duration),
    lease: Duration,
    poll: Duration,
    grace: Duration,
}

impl Worker {
    /// A worker running `processor`: 4 at a time, 8 attempts, backoff from 1 s doubling
    /// to at most 10 min (with jitter), a 5 min lease, polling every 5 s besides wake-ups.
    pub fn new(inbox: &Inbox, processor: impl Processor) -> Self {
        Self {
            inbox: inbox.clone(),
            processor: Arc::new(processor),
            concurrency: 4,
            max_attempts: 8,
            backoff: (Duration::from_secs(1), Duration::from_secs(600)),
            lease: Duration::from_secs(300),
            poll: Duration::from_secs(5),
            grace: Duration::from_secs(10),
        }
    }

    /// Replaces how many events are processed at once (default 4).
    pub fn with_concurrency(mut self, n: usize) -> Self {
        self.concurrency = n.max(1);
        self
    }

    /// Replaces after how many failed attempts a row is dead (default 8).
    pub fn with_max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n.max(1);
        self
    }

    /// Replaces the backoff: `first` after the first failure, doubling up to `cap`; each
    /// wait is drawn between half and all of that (jitter spreads retries out).
    pub fn with_backoff(mut self, first: Duration, cap: Duration) -> Self {
        self.backoff = (first, cap.max(first));
        self
    }

    /// Replaces how long a claimed row stays with this worker (default 5 min): a worker
    /// that crashed gives its rows back when the lease runs out. Longer than the
    /// processor ever runs.
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lease = lease.max(Duration::from_millis(100));
        self
    }

    /// Replaces how often the worker looks for due rows without a wake-up (default 5 s).
    pub fn with_poll_interval(mut self, poll: Duration) -> Self {
        self.poll = poll.max(Duration::from_millis(10));
        self
    }

    /// Replaces how long [`WorkerHandle::shutdown`] lets running events finish (default
    /// 10 s) before it stops them and hands their rows back.
    pub fn with_grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// The wait before attempt `attempt + 1`, after attempt `attempt` failed.
    fn backoff(&self, attempt: u32) -> Duration {
        let (first, cap) = self.backoff;
        let full = first
            .checked_mul(1 << attempt.saturating_sub(1).min(30))
            .unwrap_or(cap)
            .min(cap);
        // Jitter from a fresh random token: half to all of the full wait.
        let unit = (Token::new().as_uuid().as_u128() >> 64) as f64 / u64::MAX as f64;
        full.mul_f64(0.5 + unit / 2.0)
    }

    /// Starts the worker on the current Tokio runtime.
    pub fn spawn(self) -> WorkerHandle {
        let (stop, stopped) = watch::channel(false);
        let listener = self.inbox.backend.listen(self.inbox.wake.clone());
        let task = tokio::spawn(self.run(stopped));
        WorkerHandle {
            stop,
            task,
            listener,
        }
    }

    async fn run(self, mut stopped: watch::Receiver<bool>) {
        let this = Arc::new(self);
        let permits = Arc::new(Semaphore::new(this.concurrency));
        let mut running: JoinSet<()> = JoinSet::new();
        let mut held: Vec<(tokio::task::AbortHandle, String, String, Token)> = Vec::new();
        loop {
            if *stopped.borrow() {
                break;
            }
            while running.try_join_next().is_some() {}
            held.retain(|(task, ..)| !task.is_finished());
            let free = permits.available_permits();
            let wake = this.inbox.wake.notified();
            let rows = if free == 0 {
                Vec::new()
            } else {
                let token = Token::new();
                match this.inbox.backend.claim(free, this.lease, token).await {
                    Ok(rows) => rows.into_iter().map(|r| (r, token)).collect(),
                    Err(_error) => {
                        #[cfg(feature = "tracing")]
                        tracing::error!(target: "tower_webhook", "inbox worker could not claim: {_error}");
                        Vec::new()
                    }
                }
            };
            let claimed = rows.len();
            for (event, token) in rows {
                let permit = permits.clone().acquire_owned().await.expect("never closed");
                let (source, id) = (event.source.clone(), event.id.clone());
                let worker = this.clone();
                let task = running.spawn(async move {
                    let _permit = permit;
                    worker.process(event, token).await;
                });
                held.push((task, source, id, token));
            }
            if claimed == free && free > 0 {
                continue; // there may be more due rows
            }
            tokio::select! {
                () = wake => {}
                () = tokio::time::sleep(this.poll) => {}
                _ = stopped.changed() => {}
                Some(_) = running.join_next(), if !running.is_empty() => {}
            }
        }
        // Graceful: let running events finish, then stop the rest and hand them back
        // with their attempt uncounted.
        let _ = tokio::time::timeout(this.grace, async {
            while running.join_next().await.is_some() {}
        })
        .await;
        for (task, source, id, token) in held {
            if !task.is_finished() {
                task.abort();
                let _ = this
                    .inbox
                    .backend
                    .finish(source, id, token, Outcome::HandBack)
                    .await;
            }
        }
        running.shutdown().await;
    }

    async fn process(&self, event: InboxEvent, token: Token) {
        let (source, id, attempt) = (event.source.clone(), event.id.clone(), event.attempt);
        // Its own task: a panicking processor is a failed attempt, not a dead worker. The
        // guard stops it too when this task is stopped (shutdown, or a simulated crash).
        let mut task = AbortOnDrop(tokio::spawn(self.processor.process(event)));
        let result = match (&mut task.0).await {
            Ok(result) => result,
            Err(e) if e.is_panic() => Err("the processor panicked".to_owned()),
            Err(_) => return, // cancelled by shutdown: handed back by the loop
        };
        let outcome = match result {
            Ok(()) => Outcome::Processed,
            Err(error) if attempt >= self.max_attempts => Outcome::Dead(error),
            Err(error) => Outcome::Retry(error, self.backoff(attempt)),
        };
        match self.inbox.backend.finish(source, id, token, outcome).await {
            Ok(true) => {}
            Ok(false) => {
                #[cfg(feature = "tracing")]
                tracing::warn!(target: "tower_webhook", "an inbox row's lease ran out while it was processed: lengthen the lease");
            }
            Err(_error) => {
                #[cfg(feature = "tracing")]
                tracing::error!(target: "tower_webhook", "inbox worker could not record an outcome: {_error}");
            }
        }
    }
}

/// Aborts the task when dropped.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl fmt::Debug for Worker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Worker")
            .field("concurrency", &self.concurrency)
            .field("max_attempts", &self.max_attempts)
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}

/// A running [`Worker`].
#[derive(Debug)]
pub struct WorkerHandle {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
    listener: Option<tokio::task::JoinHandle<()>>,
}

impl WorkerHandle {
    /// Stops claiming, lets running events finish within the grace period, hands the
    /// rest back uncounted, and returns when the worker has stopped.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
        if let Some(listener) = self.listener {
            listener.abort();
        }
    }

    /// Stops the worker at once, as a crash would: its claimed rows come back when their
    /// lease runs out, the attempt counted.
    pub fn abort(self) {
        self.task.abort();
        if let Some(listener) = self.listener {
            listener.abort();
        }
    }
}
