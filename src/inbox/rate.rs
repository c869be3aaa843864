//! [`Rate`]: how many events a worker starts per second or minute, and the pacing that
//! holds it to that (a start every `period / n`, at most 10 ms' worth at once).

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use tokio::time::Instant;

use crate::{ConfigError, ConfigErrorKind};

/// At most `n` events started per period, evenly spaced: one every `period / n`, so a
/// downstream API that allows `n` a second never sees a burst above it. Turns are not
/// saved up while the worker idles, except 10 ms' worth (one turn below 100 a second):
/// above that rate, starts go out in groups that one claim can take, so any window of
/// the period holds at most `n` starts plus that group. An event held back by the rate is
/// not claimed: its attempt is not counted, it is not backed off and never goes dead; it
/// starts when its turn comes.
///
/// The rate is per worker: with three replicas each running a worker, each starts its
/// own `n` (give each a third).
///
/// ```
/// use std::time::Duration;
/// use tower_webhook::inbox::Rate;
///
/// let rate: Rate = "120/min".parse()?;
/// assert_eq!(rate, Rate::per_minute(120)?);
/// assert_eq!(rate.spacing(), Duration::from_millis(500));
/// assert_eq!("10/s".parse::<Rate>()?.spacing(), Duration::from_millis(100));
/// assert!("10 per second".parse::<Rate>().is_err());
/// # Ok::<(), tower_webhook::ConfigError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rate {
    n: u32,
    period: Duration,
}

impl Rate {
    /// At most `n` events started a second.
    ///
    /// # Errors
    ///
    /// When `n` is 0.
    pub fn per_second(n: u32) -> Result<Self, ConfigError> {
        Self::new(n, Duration::from_secs(1))
    }

    /// At most `n` events started a minute.
    ///
    /// # Errors
    ///
    /// When `n` is 0.
    pub fn per_minute(n: u32) -> Result<Self, ConfigError> {
        Self::new(n, Duration::from_secs(60))
    }

    fn new(n: u32, period: Duration) -> Result<Self, ConfigError> {
        if n == 0 {
            return Err(ConfigError::new(
                ConfigErrorKind::InvalidValue,
                "a rate must allow at least 1 event per period",
            ));
        }
        Ok(Self { n, period })
    }

    /// The time between two starts: the period divided by `n`.
    #[must_use]
    pub fn spacing(self) -> Duration {
        self.period / self.n
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let unit = if self.period == Duration::from_secs(1) {
            "s"
        } else {
            "min"
        };
        write!(f, "{}/{unit}", self.n)
    }
}

/// `N/s` or `N/min` (also `N/sec`, `N/second`, `N/m`, `N/minute`).
impl FromStr for Rate {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let invalid = || {
            ConfigError::new(
                ConfigErrorKind::InvalidValue,
                "a rate is N/s or N/min (events started per second or minute)",
            )
        };
        let (n, unit) = s.trim().split_once('/').ok_or_else(invalid)?;
        let n: u32 = n.trim().parse().map_err(|_| invalid())?;
        match unit.trim() {
            "s" | "sec" | "second" => Self::per_second(n),
            "m" | "min" | "minute" => Self::per_minute(n),
            _ => Err(invalid()),
        }
    }
}

/// The worker's pacing under a [`Rate`]: the earliest time the next event may start.
/// Starts are taken when a claim is sent (two claims out at once must not both use one
/// turn) and the turns a claim did not use are given back when it returns.
#[derive(Debug)]
pub(crate) struct Pacing {
    spacing: Duration,
    /// How many turns may be taken at once: 10 ms' worth, at least 1.
    burst: u32,
    /// When the turn after the last one taken comes (the theoretical arrival time of the
    /// generic cell rate algorithm).
    next: Instant,
}

/// How far ahead of their spacing starts may go: what one claim round trip takes.
const BURST: Duration = Duration::from_millis(10);

impl Pacing {
    pub(crate) fn new(rate: Rate) -> Self {
        let spacing = rate.spacing();
        let burst = BURST.as_nanos() / spacing.as_nanos().max(1);
        Self {
            spacing,
            burst: u32::try_from(burst).unwrap_or(u32::MAX).max(1),
            next: Instant::now(),
        }
    }

    /// How many may start now, at most `free`: the turns come by now, counting up to
    /// `burst - 1` ahead.
    pub(crate) fn allowed(&self, free: usize) -> usize {
        let now = Instant::now();
        let ahead = self.spacing * (self.burst - 1);
        let Some(due) = (now + ahead).checked_duration_since(self.next) else {
            return 0;
        };
        let turns = due.as_nanos() / self.spacing.as_nanos().max(1) + 1;
        let turns = usize::try_from(turns.min(u128::from(self.burst))).unwrap_or(usize::MAX);
        turns.min(free)
    }

    /// Takes `n` turns (sent in a claim); returns what to give back unused ones with.
    pub(crate) fn take(&mut self, n: usize) -> Instant {
        let n = u32::try_from(n).unwrap_or(u32::MAX);
        self.next = self.next.max(Instant::now()) + self.spacing * n;
        self.next
    }

    /// Gives back `n` turns a claim did not use — unless another was taken since (its
    /// start must keep its distance from the ones before).
    pub(crate) fn give_back(&mut self, taken: Instant, n: usize) {
        if self.next != taken {
            return;
        }
        let n = u32::try_from(n).unwrap_or(u32::MAX);
        self.next = self
            .next
            .checked_sub(self.spacing * n)
            .unwrap_or(self.next)
            .max(Instant::now());
    }

    /// When the next turn comes.
    pub(crate) fn next(&self) -> Instant {
        let ahead = self.spacing * (self.burst - 1);
        self.next.checked_sub(ahead).unwrap_or(self.next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse_and_print() {
        let cases = [
            ("5/s", 5, 1),
            (" 7 / sec ", 7, 1),
            ("100/min", 100, 60),
            ("3/m", 3, 60),
        ];
        for (text, n, secs) in cases {
            let rate: Rate = text.parse().unwrap();
            assert_eq!(rate.n, n, "{text}");
            assert_eq!(rate.period, Duration::from_secs(secs), "{text}");
        }
        assert_eq!(Rate::per_minute(100).unwrap().to_string(), "100/min");
        for bad in ["", "5", "0/s", "-1/s", "5/h", "five/s", "5/s/s"] {
            assert!(bad.parse::<Rate>().is_err(), "{bad:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn pacing_spaces_starts_and_takes_back_unused_turns() {
        let mut pacing = Pacing::new(Rate::per_second(10).unwrap());
        assert_eq!(pacing.allowed(4), 1);
        assert_eq!(pacing.allowed(0), 0, "no free processor");
        pacing.take(1);
        assert_eq!(pacing.allowed(4), 0, "the next turn is 100 ms away");
        tokio::time::advance(Duration::from_millis(99)).await;
        assert_eq!(pacing.allowed(4), 0);
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(pacing.allowed(4), 1);
        // A claim sent and answered empty gives its turn back: the next may go at once.
        let taken = pacing.take(1);
        assert_eq!(pacing.allowed(4), 0);
        pacing.give_back(taken, 1);
        assert_eq!(pacing.allowed(4), 1);
        // Not once another turn was taken after it.
        let first = pacing.take(1);
        tokio::time::advance(Duration::from_millis(100)).await;
        pacing.take(1);
        pacing.give_back(first, 1);
        assert_eq!(pacing.allowed(4), 0, "the second start keeps its distance");
        tokio::time::advance(Duration::from_millis(100)).await;
        // Idle time is not saved up: after a long pause, still one turn at a time.
        tokio::time::advance(Duration::from_secs(10)).await;
        pacing.take(1);
        assert_eq!(pacing.allowed(4), 0);
        assert_eq!(pacing.next() - Instant::now(), Duration::from_millis(100));
    }

    #[tokio::test(start_paused = true)]
    async fn a_high_rate_lets_a_claim_take_10_ms_worth_at_once() {
        // 10 000 a second: a turn every 100 µs, 100 at once.
        let mut pacing = Pacing::new(Rate::per_second(10_000).unwrap());
        assert_eq!(pacing.allowed(500), 100, "a claim takes 10 ms' worth");
        assert_eq!(pacing.allowed(8), 8, "no more than there are processors");
        pacing.take(100);
        assert_eq!(pacing.allowed(500), 0, "the next 10 ms are taken");
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(pacing.allowed(500), 10, "1 ms later, 1 ms' worth");
        // Idle for a second: still 10 ms' worth, not a second's.
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(pacing.allowed(50_000), 100);
        // Over a second at full speed, 10 000 starts (and the first group ahead).
        let mut started = 0;
        let end = Instant::now() + Duration::from_secs(1);
        while Instant::now() < end {
            let n = pacing.allowed(1000);
            pacing.take(n);
            started += n;
            tokio::time::advance(Duration::from_millis(2)).await;
        }
        assert!((10_000..=10_100).contains(&started), "{started}");
    }
}
