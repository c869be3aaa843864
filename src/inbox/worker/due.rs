//! When queued events fall due (a retry's backoff, a snooze): the times told to every
//! worker of a queue, and each worker's earliest, which it wakes for rather than waiting
//! for its next poll.

use std::time::Duration;

use tokio::sync::broadcast;
use tokio::time::Instant;

/// Due times a worker may leave unread; one that falls further behind claims at once
/// instead (and a claim that comes back short reads the next due time from the queue).
#[cfg_attr(not(any(feature = "sqlite", feature = "postgres")), allow(dead_code))] // as `new`
const UNREAD: usize = 64;

/// A worker's wake-ups for due times are at least this far apart: a due time that the
/// queue's clock does not reach when this one does (a clock that stands still, in a test)
/// costs a claim per 10 ms at most, never a busy loop, and retries that fall due together
/// start from one claim.
const SPACING: Duration = Duration::from_millis(10);

/// Tells every worker of a queue when events fall due. Cloning shares it.
#[derive(Clone, Debug)]
pub(crate) struct DueTimes(broadcast::Sender<Instant>);

// Only the SQL inbox tells (JetStream delivers a message when due itself).
#[cfg_attr(not(any(feature = "sqlite", feature = "postgres")), allow(dead_code))]
impl DueTimes {
    pub(crate) fn new() -> Self {
        Self(broadcast::channel(UNREAD).0)
    }

    /// An event falls due `after` from now (told once that is recorded: never early).
    pub(crate) fn after(&self, after: Duration) {
        // Past what an instant holds: no time to wake for, the poll covers it.
        if let Some(at) = Instant::now().checked_add(after) {
            let _ = self.0.send(at); // no worker listening: nobody to wake
        }
    }

    /// The due times told from now on.
    pub(super) fn listen(&self) -> broadcast::Receiver<Instant> {
        self.0.subscribe()
    }
}

/// The next due time told; `None` when some were missed (the worker fell behind). Never
/// ends where nothing tells (`None`).
pub(super) async fn told(due: &mut Option<broadcast::Receiver<Instant>>) -> Option<Instant> {
    let Some(due) = due else {
        return std::future::pending().await;
    };
    loop {
        match due.recv().await {
            Ok(at) => return Some(at),
            Err(broadcast::error::RecvError::Lagged(_)) => return None,
            // Its queue is gone with every clone: nothing more to tell.
            Err(broadcast::error::RecvError::Closed) => std::future::pending::<()>().await,
        }
    }
}

/// A worker's earliest known due time, and when it last woke for one.
#[derive(Debug, Default)]
pub(super) struct Earliest {
    at: Option<Instant>,
    woke: Option<Instant>,
}

impl Earliest {
    pub(super) fn learn(&mut self, at: Instant) {
        self.at = Some(self.at.map_or(at, |known| known.min(at)));
    }

    /// When to wake for it: at it, but no sooner than [`SPACING`] after the last time.
    pub(super) fn wake_at(&self) -> Option<Instant> {
        let at = self.at?;
        Some(self.woke.map_or(at, |woke| at.max(woke + SPACING)))
    }

    /// Woken for it: forgotten (the claim it sends takes what is due, and a short one
    /// reads the next due time from the queue, only times still to come).
    pub(super) fn woke(&mut self) {
        (self.at, self.woke) = (None, Some(Instant::now()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_earliest_is_kept_and_wake_ups_are_spaced() {
        let mut earliest = Earliest::default();
        assert_eq!(earliest.wake_at(), None);
        let now = Instant::now();
        let s = Duration::from_secs;
        earliest.learn(now + s(5));
        earliest.learn(now + s(2));
        earliest.learn(now + s(9));
        assert_eq!(earliest.wake_at(), Some(now + s(2)), "the earliest");
        earliest.woke();
        assert_eq!(earliest.wake_at(), None, "forgotten once woken for");
        earliest.learn(now - s(60));
        assert_eq!(
            earliest.wake_at(),
            Some(now + SPACING),
            "a time long past: no sooner than the spacing after the last wake-up"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn every_listener_is_told_and_one_that_falls_behind_hears_so() {
        let due = DueTimes::new();
        let (mut first, mut second) = (Some(due.listen()), Some(due.listen()));
        due.after(Duration::from_secs(1));
        let at = Instant::now() + Duration::from_secs(1);
        assert_eq!(told(&mut first).await, Some(at));
        assert_eq!(told(&mut second).await, Some(at));
        for _ in 0..=UNREAD {
            due.after(Duration::ZERO);
        }
        assert_eq!(told(&mut first).await, None, "missed some");
        due.after(Duration::MAX); // past what an instant holds: not told, no panic
        let none = tokio::time::timeout(Duration::from_secs(1), told(&mut None)).await;
        assert!(none.is_err(), "nothing tells: never ends");
    }
}
