//! When queued events fall due (a retry's backoff, a snooze): the times told to every
//! worker of a processor, and each worker's earliest, which it wakes for rather than
//! waiting for its next poll.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
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

/// Tells every worker of a processor when its events fall due. Cloning shares it.
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

/// Every processor's [`DueTimes`] of an inbox: a retry or snooze wakes only its own
/// processor's workers. Cloning shares them.
#[cfg_attr(not(any(feature = "sqlite", feature = "postgres")), allow(dead_code))]
#[derive(Clone, Debug, Default)]
pub(crate) struct Dues(Arc<Mutex<HashMap<Arc<str>, DueTimes>>>);

/// Reads a notification's payload: `Some((processor, after))` for `<processor> <seconds>`
/// (a retry, a snooze; `0` for an object's freed turn), `Some((None, after))` for a bare
/// `<seconds>` (an older replica's, any processor's); `None` for anything else (an accept,
/// a requeue, a resume: every worker claims now). A name is the text before the last
/// space, so one that reads as a number ("7") is still a name.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))] // only PostgreSQL notifies
pub(crate) fn heard(payload: &str) -> Option<(Option<&str>, Duration)> {
    let secs = |s: &str| {
        s.parse()
            .ok()
            .and_then(|s| Duration::try_from_secs_f64(s).ok())
    };
    match payload.rsplit_once(' ') {
        Some((processor, after)) => Some((Some(processor), secs(after)?)),
        None => Some((None, secs(payload)?)),
    }
}

#[cfg_attr(not(any(feature = "sqlite", feature = "postgres")), allow(dead_code))]
impl Dues {
    /// The due times of `processor`, made on first use.
    pub(crate) fn of(&self, processor: &str) -> DueTimes {
        let mut by = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(due) = by.get(processor) {
            return due.clone();
        }
        by.entry(Arc::from(processor))
            .or_insert_with(DueTimes::new)
            .clone()
    }

    /// `processor`'s routes fall due `after` from now: its workers are told; a processor
    /// this process does not know (a replica configured otherwise) tells every one.
    // Told by PostgreSQL's notifications from other replicas; SQLite has one process.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn after(&self, processor: Option<&str>, after: Duration) {
        let by = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match processor.and_then(|name| by.get(name)) {
            Some(due) => due.after(after),
            None => by.values().for_each(|due| due.after(after)),
        }
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

    #[tokio::test(start_paused = true)]
    async fn a_due_time_tells_only_its_processors_workers_and_an_unknown_one_tells_all() {
        let dues = Dues::default();
        let (mut a, mut b) = (Some(dues.of("a").listen()), Some(dues.of("b").listen()));
        let quiet = async |rx: &mut Option<broadcast::Receiver<Instant>>| {
            let wait = tokio::time::timeout(Duration::from_millis(1), told(rx));
            wait.await.is_err()
        };
        let s = Duration::from_secs;
        dues.after(Some("a"), s(3));
        assert_eq!(told(&mut a).await, Some(Instant::now() + s(3)));
        assert!(quiet(&mut b).await, "b's workers are not told of a's");
        for unknown in [None, Some("c")] {
            dues.after(unknown, s(2));
            let at = Instant::now() + s(2);
            assert_eq!(told(&mut a).await, Some(at), "{unknown:?}");
            assert_eq!(told(&mut b).await, Some(at), "{unknown:?}");
        }
        assert!(quiet(&mut a).await && quiet(&mut b).await);
    }

    #[test]
    fn a_notification_says_whose_due_time_it_is() {
        let ms = Duration::from_millis;
        assert_eq!(heard("billing 1.5"), Some((Some("billing"), ms(1500))));
        assert_eq!(
            heard("7 0"),
            Some((Some("7"), ms(0))),
            "a name that is a number"
        );
        assert_eq!(heard("email 1e-3"), Some((Some("email"), ms(1))));
        assert_eq!(heard("2.25"), Some((None, ms(2250))), "an older replica's");
        for wakes_all in [
            "",
            "billing",
            "billing soon",
            "-1",
            "billing -1",
            "NaN",
            "a inf",
        ] {
            assert_eq!(heard(wakes_all), None, "{wakes_all:?}");
        }
    }
}
