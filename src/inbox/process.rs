//! What a worker runs ([`Processor`]) and the handle of a running one ([`WorkerHandle`]):
//! shared by the SQL inbox's [`Worker`](super::Worker) and the JetStream one.

use std::fmt;
use std::future::Future;
use std::pin::Pin;

use tokio::sync::watch;

use super::InboxEvent;

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

/// A running worker ([`Worker`](super::Worker), or the JetStream one).
#[derive(Debug)]
pub struct WorkerHandle {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
    /// Tasks beside the worker's own (PostgreSQL's `LISTEN`, the gauges' refresh),
    /// stopped with it.
    beside: Vec<tokio::task::JoinHandle<()>>,
}

impl WorkerHandle {
    /// Starts `run` on the current Tokio runtime, told through its receiver when to stop.
    pub(crate) fn spawn<F>(
        run: impl FnOnce(watch::Receiver<bool>) -> F,
        beside: Vec<tokio::task::JoinHandle<()>>,
    ) -> Self
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let (stop, stopped) = watch::channel(false);
        Self {
            stop,
            task: tokio::spawn(run(stopped)),
            beside,
        }
    }

    /// Stops claiming, lets running events finish (within the grace period, if one was
    /// set: past it the rest are stopped as by a crash, their attempt counted), and
    /// returns when the worker has stopped.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
        for task in self.beside {
            task.abort();
        }
    }

    /// Stops the worker at once, as a crash would: what it had claimed comes back when its
    /// lease runs out, the attempt counted.
    pub fn abort(self) {
        self.task.abort();
        for task in self.beside {
            task.abort();
        }
    }
}

/// A worker's concurrency, if it is at least 1.
pub(crate) fn checked_concurrency(n: usize) -> Result<usize, crate::ConfigError> {
    if n == 0 {
        return Err(crate::ConfigError::new(
            crate::ConfigErrorKind::InvalidValue,
            "a worker's concurrency must be at least 1",
        ));
    }
    Ok(n)
}

/// A worker's poll interval, if it is between 10 ms and 1 h.
pub(crate) fn checked_poll(
    poll: std::time::Duration,
) -> Result<std::time::Duration, crate::ConfigError> {
    use std::time::Duration;
    if (Duration::from_millis(10)..=Duration::from_secs(3600)).contains(&poll) {
        Ok(poll)
    } else {
        Err(crate::ConfigError::duration(
            "a poll interval",
            poll,
            "between 10 ms and 1 h",
        ))
    }
}

/// Returns when the worker hurries its running events (shutdown past its grace period);
/// never if the worker is gone (a crash: what it held comes back after its lease, not by
/// hand).
pub(crate) async fn hurry_up(hurried: &mut watch::Receiver<bool>) {
    if hurried.wait_for(|now| *now).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Aborts the task when dropped: a worker's processor task stops with the worker.
pub(crate) struct AbortOnDrop<T>(pub(crate) tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}
