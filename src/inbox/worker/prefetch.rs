//! How many rows a worker claims ahead of its processors (where the queue
//! [prefetches](super::Queue::PREFETCHES)): as many as its processors free during one
//! claim's round trip, from the recent claims' and processors' times.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Moving averages (weight 1/8) of a claim's round trip and of the time an event holds a
/// processor, in microseconds; 0 until the first sample.
#[derive(Debug, Default)]
pub(crate) struct Prefetch {
    claim_us: AtomicU64,
    held_us: AtomicU64,
}

impl Prefetch {
    /// A claim came back after `took`.
    pub(super) fn claimed(&self, took: Duration) {
        learn(&self.claim_us, took);
    }

    /// An event held its processor for `took` (its start, then its run).
    pub(super) fn held(&self, took: Duration) {
        learn(&self.held_us, took);
    }

    /// The rows to hold ahead of `concurrency` processors: those they free during a
    /// claim's round trip (so a freed processor finds one while the next claim is out),
    /// at least 1 and at most `concurrency` (that many until both times are known: the
    /// first claims of a worker starting on a backlog). A slow processor so holds about
    /// one row ahead, not one for each processor, and leaves the rest to other workers.
    pub(super) fn rows(&self, concurrency: usize) -> usize {
        let claim = self.claim_us.load(Ordering::Relaxed);
        let held = self.held_us.load(Ordering::Relaxed);
        if claim == 0 || held == 0 {
            return concurrency;
        }
        let n = u64::try_from(concurrency).unwrap_or(u64::MAX);
        let freed = n.saturating_mul(claim).div_ceil(held);
        usize::try_from(freed).map_or(concurrency, |rows| rows.clamp(1, concurrency))
    }
}

fn learn(average: &AtomicU64, took: Duration) {
    let sample = u64::try_from(took.as_micros()).unwrap_or(u64::MAX).max(1);
    let old = average.load(Ordering::Relaxed);
    // A race between two samples loses one of them: an average, not a count.
    let new = match old {
        0 => sample,
        old => old - old / 8 + sample / 8,
    };
    average.store(new.max(1), Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_what_the_processors_free_during_a_claim() {
        let ms = Duration::from_millis;
        let prefetch = Prefetch::default();
        assert_eq!(prefetch.rows(8), 8, "nothing known yet");
        prefetch.claimed(ms(4));
        assert_eq!(prefetch.rows(8), 8, "no processor time yet");
        // A quick processor: all of its 8 processors free up during a claim, and more.
        prefetch.held(ms(1));
        assert_eq!(prefetch.rows(8), 8);
        // Each processor held twice a claim's time: half of them free during one.
        let prefetch = Prefetch::default();
        prefetch.claimed(ms(4));
        prefetch.held(ms(8));
        assert_eq!(prefetch.rows(8), 4);
        // A slow one: one row, not eight.
        let slow = Prefetch::default();
        slow.claimed(ms(4));
        slow.held(Duration::from_secs(3));
        assert_eq!(slow.rows(8), 1);
        // The averages move an eighth of the way toward each new sample.
        slow.held(Duration::from_secs(3) + ms(8 * 1000));
        assert_eq!(slow.held_us.load(Ordering::Relaxed), 4_000_000);
    }
}
