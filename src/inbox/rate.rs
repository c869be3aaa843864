//! [`Rate`]: how many events a worker starts per second or minute, and the pacing that
//! holds it to that (a start at most every `period / n`, none saved up for a burst).

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use tokio::time::Instant;

use crate::{ConfigError, ConfigErrorKind};

/// At most `n` events started per period, evenly spaced: one every `period / n`, so a
/// downstream API that allows `n` a second never sees a burst above it. An event held
/// back by the rate is not claimed: its attempt is not counted, it is not backed off and
/// never goes dead; it starts when its turn comes.
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
    next: Instant,
}

impl Pacing {
    pub(crate) fn new(rate: Rate) -> Self {
        Self {
            spacing: rate.spacing(),
            next: Instant::now(),
        }
    }

    /// How many may start now, at most `free`: one when its turn has come, else none.
    pub(crate) fn allowed(&self, free: usize) -> usize {
        usize::from(free > 0 && Instant::now() >= self.next)
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
        self.next
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
}
