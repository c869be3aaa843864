//! What a worker runs ([`Processor`], told the [`Attempt`]) and the handle of a running one
//! ([`WorkerHandle`]):
//! shared by the SQL inbox's [`Worker`](super::Worker) and the JetStream one.

use std::error::Error as StdError;
use std::fmt::Write as _;
use std::future::Future;
use std::pin::Pin;

use tokio::sync::watch;

use super::RetryPolicy;
use crate::Event;

/// An error a processor returns: anything that converts into one (`std::io::Error`,
/// `sqlx::Error`, `String`, `&'static str`, …), as in tower.
pub(crate) type BoxError = Box<dyn StdError + Send + Sync>;

/// What a worker runs on each event. Any `Fn(Event, Attempt) -> impl Future<Output =
/// Result<(), E>>` whose error converts into `Box<dyn Error + Send + Sync>` is one
/// (`String` and `&'static str` do). An `Err` (or a panic) is retried later with backoff;
/// its text, with its [`source`](std::error::Error::source) chain (`error: cause: cause`),
/// is kept as the row's last error and logged. An `Err` holding a [`Later`](super::Later)
/// is no failure: the event is snoozed, the attempt not counted.
///
/// The [`Event`] is the one the inbox stored: see its docs, "From the inbox", for what
/// its accessors hold there.
///
/// The error must be `Send + Sync + 'static`, as the worker moves it between threads and
/// keeps it: a function returning `Box<dyn Error>` is no processor (the compiler says so,
/// and names the fix); return `Box<dyn Error + Send + Sync>` instead.
///
/// ```compile_fail,E0277
/// use tower_webhook::inbox::{Attempt, Processor};
/// use tower_webhook::Event;
///
/// async fn process(_: Event, _: Attempt) -> Result<(), Box<dyn std::error::Error>> {
///     Ok(())
/// }
///
/// fn worker(_: impl Processor) {}
/// worker(process); // error: `Box<dyn Error>` is neither `Send` nor `Sync`
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not an inbox processor",
    label = "not a `Processor`",
    note = "a processor is a `Fn(Event, Attempt) -> impl Future<Output = Result<(), E>> + Send`, itself `Send + Sync + 'static` (a `fn`, or a `move` closure)",
    note = "its error `E` must convert into `Box<dyn Error + Send + Sync>`, so be `Send + Sync + 'static`: `Box<dyn Error>` is not; return `Box<dyn std::error::Error + Send + Sync>`, a `String`, or any `Error + Send + Sync + 'static`",
    note = "its future must be `Send`: hold nothing that is not (an `Rc`, a `std::sync::MutexGuard`) across an `.await`"
)]
pub trait Processor: Send + Sync + 'static {
    /// Processes one event.
    #[allow(clippy::type_complexity)] // spelled out: readable in the docs
    fn process(
        &self,
        event: Event,
        attempt: Attempt,
    ) -> Pin<Box<dyn Future<Output = Result<(), Box<dyn StdError + Send + Sync>>> + Send>>;
}

// Not named in errors: without this, a bad error type is reported as three errors about
// `dyn Error` (`Send`, `Sync`, `Sized`) instead of the trait's own message above.
#[diagnostic::do_not_recommend]
impl<F, Fut, E> Processor for F
where
    F: Fn(Event, Attempt) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), E>> + Send + 'static,
    E: Into<Box<dyn StdError + Send + Sync>>,
{
    fn process(
        &self,
        event: Event,
        attempt: Attempt,
    ) -> Pin<Box<dyn Future<Output = Result<(), BoxError>> + Send>> {
        let future = self(event, attempt);
        Box::pin(async move { future.await.map_err(Into::into) })
    }
}

/// Which attempt at an event a processor is running: its [`number`](Self::number), and
/// whether it [`is_last`](Self::is_last) the worker's [`RetryPolicy`] allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attempt {
    number: u32,
    max: u32,
}

impl Attempt {
    /// Attempt `number` (from 1) under `retry`.
    pub(crate) fn new(number: u32, retry: &RetryPolicy) -> Self {
        Self {
            number,
            max: retry.max_attempts(),
        }
    }

    /// This attempt's number, from 1: one more for each earlier attempt, failed or
    /// crashed (a requeue starts again at 1).
    #[must_use]
    pub fn number(self) -> u32 {
        self.number
    }

    /// Whether this is the last attempt the retry policy allows: if it fails, the event is
    /// dead (alert, or keep what an operator needs to fix it).
    #[must_use]
    pub fn is_last(self) -> bool {
        self.number >= self.max
    }
}

/// A panicking processor's error text: the crate's own, naming no payload, so it stays in
/// clear with a ring (`crate::sql::sealed::crate_text`).
pub(crate) const PANICKED: &str = "the processor panicked";

/// How a processor's attempt ended without success.
#[derive(Debug)]
pub(crate) enum Failure {
    /// An error (or a panic), as one line of text.
    Error(String),
    /// A [`Later`](super::Later) in its error: snoozed this long, not an attempt.
    Later(std::time::Duration),
}

impl Failure {
    /// The failure `error` says.
    pub(crate) fn of(error: &(dyn StdError + 'static)) -> Self {
        match super::Later::find(error) {
            Some(later) => Self::Later(later.delay()),
            None => Self::Error(error_chain(error)),
        }
    }
}

impl From<String> for Failure {
    fn from(error: String) -> Self {
        Self::Error(error)
    }
}

impl From<&str> for Failure {
    fn from(error: &str) -> Self {
        Self::Error(error.to_owned())
    }
}

/// A processor's error as one line of text for the row and the log: its message, then
/// each [`source`](std::error::Error::source)'s, joined by `: ` (a source whose text the
/// message already holds is not repeated).
pub(crate) fn error_chain(error: &(dyn StdError + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            let _ = write!(text, ": {cause_text}");
        }
        source = cause.source();
    }
    text
}

/// A running worker ([`Worker`], or the JetStream one).
///
#[cfg_attr(
    any(feature = "sqlite", feature = "postgres"),
    doc = "[`Worker`]: super::Worker"
)]
#[cfg_attr(
    not(any(feature = "sqlite", feature = "postgres")),
    doc = "[`Worker`]: crate#features"
)]
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

/// A worker's count (`n`), if it is at least 1; else `why` is the error.
pub(crate) fn at_least_one<T: Default + PartialEq>(
    n: T,
    why: &'static str,
) -> Result<T, crate::ConfigError> {
    if n == T::default() {
        return Err(crate::ConfigError::new(
            crate::ConfigErrorKind::InvalidValue,
            why,
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

#[cfg(test)]
mod tests {
    use std::fmt;

    use super::*;

    #[derive(Debug)]
    struct Layered(&'static str, Option<Box<Layered>>);

    impl fmt::Display for Layered {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.0)
        }
    }

    impl StdError for Layered {
        fn source(&self) -> Option<&(dyn StdError + 'static)> {
            self.1.as_deref().map(|e| e as _)
        }
    }

    #[test]
    fn error_chain_joins_each_source_once() {
        let io = Layered("connection refused", None);
        let error = Layered(
            "charge failed",
            Some(Box::new(Layered("http", Some(Box::new(io))))),
        );
        assert_eq!(
            error_chain(&error),
            "charge failed: http: connection refused"
        );
        assert_eq!(error_chain(&Layered("alone", None)), "alone");
        // A message that already says its cause (as some libraries' do) is not repeated.
        let said = Layered(
            "query failed: timeout",
            Some(Box::new(Layered("timeout", None))),
        );
        assert_eq!(error_chain(&said), "query failed: timeout");
    }

    #[test]
    fn the_last_attempt_is_the_policys_last() {
        let retry = RetryPolicy::default().with_max_attempts(3).unwrap();
        let attempts: Vec<_> = (1..=3).map(|n| Attempt::new(n, &retry)).collect();
        assert_eq!(
            attempts.iter().map(|a| a.number()).collect::<Vec<_>>(),
            [1, 2, 3]
        );
        assert_eq!(
            attempts.iter().map(|a| a.is_last()).collect::<Vec<_>>(),
            [false, false, true]
        );
        assert!(
            Attempt::new(4, &retry).is_last(),
            "a crashed worker's extra delivery"
        );
    }
}
