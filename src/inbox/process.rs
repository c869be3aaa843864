//! What a worker runs ([`Processor`]), how long it waits between attempts, and the handle
//! of a running one ([`WorkerHandle`]): shared by the SQL inbox's [`Worker`](super::Worker)
//! and the JetStream one.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio::sync::watch;

use super::InboxEvent;
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

/// The wait before attempt `attempt + 1`, after attempt `attempt` failed: `first`, doubling
/// up to `cap`, each wait drawn between half and all of that (jitter spreads retries out).
pub(crate) fn backoff(first: Duration, cap: Duration, attempt: u32) -> Duration {
    // Jitter from a fresh random token, in 0..=1.
    let unit = (Token::new().as_uuid().as_u128() >> 64) as f64 / u64::MAX as f64;
    backoff_with(first, cap, attempt, unit)
}

/// [`backoff`] for a given jitter `unit` in 0..=1.
fn backoff_with(first: Duration, cap: Duration, attempt: u32, unit: f64) -> Duration {
    let full = first
        .checked_mul(1 << attempt.saturating_sub(1).min(30))
        .unwrap_or(cap)
        .min(cap);
    full.mul_f64(0.5 + unit.clamp(0.0, 1.0) / 2.0)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_first_to_the_cap_with_jitter_between_half_and_all() {
        let (first, cap) = (Duration::from_secs(1), Duration::from_secs(10));
        let secs = |attempt, unit| backoff_with(first, cap, attempt, unit).as_secs_f64();
        let full: Vec<f64> = (1..=6).map(|a| secs(a, 1.0)).collect();
        assert_eq!(full, [1.0, 2.0, 4.0, 8.0, 10.0, 10.0], "doubling, capped");
        let least: Vec<f64> = (1..=6).map(|a| secs(a, 0.0)).collect();
        assert_eq!(
            least,
            [0.5, 1.0, 2.0, 4.0, 5.0, 5.0],
            "jitter takes off at most half"
        );
        assert_eq!(secs(3, 0.5), 3.0);
        assert_eq!(
            secs(u32::MAX, 1.0),
            10.0,
            "no overflow on a huge attempt count"
        );
        for _ in 0..1000 {
            let d = backoff(first, cap, 4).as_secs_f64();
            assert!((4.0..=8.0).contains(&d), "{d}");
        }
    }
}
