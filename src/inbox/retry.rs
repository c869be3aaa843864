//! [`RetryPolicy`]: how often a worker tries an event, and how long it waits between tries.

use std::time::Duration;

use crate::store::Token;
use crate::{ConfigError, ConfigErrorKind};

/// How a worker retries a failed event: at most `max_attempts` attempts; after attempt `n`
/// fails it waits `first × 2ⁿ⁻¹`, at most `cap`, drawn between half and all of that
/// ([`Jitter::Half`], so retries of a burst spread out) or exactly that ([`Jitter::None`]).
/// The last attempt's failure makes the event dead.
///
/// The default: 8 attempts, from 1 s up to 10 min. A value: share one between workers,
/// and test its arithmetic without a database.
///
/// A retry runs at its due time, not at the worker's next poll: the worker wakes for it
/// (on PostgreSQL, any replica's worker of its processor does, and only those). What can
/// still wait for a poll (on SQLite, a retry another process recorded) is said at
/// `Worker::with_backoff`.
///
/// ```
/// use std::time::Duration;
/// use tower_webhook::inbox::{Jitter, RetryPolicy};
///
/// let retry = RetryPolicy::default()
///     .with_max_attempts(5)?
///     .with_backoff(Duration::from_secs(2), Duration::from_secs(60))?
///     .with_jitter(Jitter::None);
/// assert_eq!(retry.delay(1), Duration::from_secs(2));
/// assert_eq!(retry.delay(3), Duration::from_secs(8));
/// assert_eq!(retry.delay(10), Duration::from_secs(60), "capped");
/// assert!(!retry.gives_up_after(4));
/// assert!(retry.gives_up_after(5));
/// # Ok::<(), tower_webhook::ConfigError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub struct RetryPolicy {
    max_attempts: u32,
    first: Duration,
    cap: Duration,
    jitter: Jitter,
}

/// How much of each backoff wait is left to chance.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Jitter {
    /// Between half and all of the wait (the default).
    #[default]
    Half,
    /// The whole wait, always.
    None,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 8,
            first: Duration::from_secs(1),
            cap: Duration::from_secs(600),
            jitter: Jitter::Half,
        }
    }
}

impl RetryPolicy {
    /// Replaces how many attempts an event gets before it is dead (default 8).
    ///
    /// # Errors
    ///
    /// When `n` is 0.
    pub fn with_max_attempts(mut self, n: u32) -> Result<Self, ConfigError> {
        if n == 0 {
            return Err(ConfigError::new(
                ConfigErrorKind::InvalidValue,
                "max attempts must be at least 1",
            ));
        }
        self.max_attempts = n;
        Ok(self)
    }

    /// Replaces the backoff: `first` after the first failure, doubling up to `cap`
    /// (default 1 s up to 10 min). Each retry starts when its wait is over, whatever the
    /// worker's poll interval (see [`RetryPolicy`]).
    ///
    /// # Errors
    ///
    /// When `first` is zero, or `cap` is shorter than `first`.
    pub fn with_backoff(mut self, first: Duration, cap: Duration) -> Result<Self, ConfigError> {
        if first.is_zero() || cap < first {
            return Err(ConfigError::new(
                ConfigErrorKind::InvalidDuration,
                format!("a backoff starts above zero and its cap is no shorter than its start, not {first:?} up to {cap:?}"),
            ));
        }
        (self.first, self.cap) = (first, cap);
        Ok(self)
    }

    /// Replaces the jitter (default [`Jitter::Half`]).
    pub fn with_jitter(mut self, jitter: Jitter) -> Self {
        self.jitter = jitter;
        self
    }

    /// How many attempts an event gets.
    #[must_use]
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// Whether the failure of attempt `attempt` (from 1) is the last: the event is dead.
    #[must_use]
    pub fn gives_up_after(&self, attempt: u32) -> bool {
        attempt >= self.max_attempts
    }

    /// The wait after attempt `attempt` (from 1) failed, with this policy's jitter drawn
    /// at random.
    #[must_use]
    pub fn delay(&self, attempt: u32) -> Duration {
        // A fresh random token's top half, in 0..=1.
        let unit = (Token::new().as_uuid().as_u128() >> 64) as f64 / u64::MAX as f64;
        self.delay_with(attempt, unit)
    }

    /// [`delay`](Self::delay) with the jitter's chance given: `unit` in 0..=1 picks where
    /// in the jitter's range the wait falls (0: the shortest, 1: the whole wait).
    #[must_use]
    pub fn delay_with(&self, attempt: u32, unit: f64) -> Duration {
        let full = self
            .first
            .checked_mul(1 << attempt.saturating_sub(1).min(30))
            .unwrap_or(self.cap)
            .min(self.cap);
        match self.jitter {
            Jitter::Half => full.mul_f64(0.5 + unit.clamp(0.0, 1.0) / 2.0),
            Jitter::None => full,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(first: u64, cap: u64) -> RetryPolicy {
        RetryPolicy::default()
            .with_backoff(Duration::from_secs(first), Duration::from_secs(cap))
            .unwrap()
    }

    #[test]
    fn backoff_doubles_from_first_to_the_cap_with_jitter_between_half_and_all() {
        let retry = policy(1, 10);
        let secs = |attempt, unit| retry.delay_with(attempt, unit).as_secs_f64();
        let full: Vec<f64> = (1..=6).map(|a| secs(a, 1.0)).collect();
        assert_eq!(full, [1.0, 2.0, 4.0, 8.0, 10.0, 10.0], "doubling, capped");
        let least: Vec<f64> = (1..=6).map(|a| secs(a, 0.0)).collect();
        assert_eq!(
            least,
            [0.5, 1.0, 2.0, 4.0, 5.0, 5.0],
            "jitter takes off at most half"
        );
        assert_eq!(secs(3, 0.5), 3.0);
        assert_eq!(secs(0, 1.0), 1.0, "attempt 0 waits as attempt 1");
        assert_eq!(
            secs(u32::MAX, 1.0),
            10.0,
            "no overflow on a huge attempt count"
        );
        for _ in 0..1000 {
            let d = retry.delay(4).as_secs_f64();
            assert!((4.0..=8.0).contains(&d), "{d}");
        }
    }

    #[test]
    fn without_jitter_every_wait_is_whole() {
        let retry = policy(1, 10).with_jitter(Jitter::None);
        for _ in 0..100 {
            assert_eq!(retry.delay(2), Duration::from_secs(2));
        }
        assert_eq!(retry.delay_with(4, 0.0), Duration::from_secs(8));
    }

    #[test]
    fn the_last_attempt_gives_up() {
        let retry = RetryPolicy::default().with_max_attempts(3).unwrap();
        let gave_up: Vec<bool> = (1..=4).map(|a| retry.gives_up_after(a)).collect();
        assert_eq!(gave_up, [false, false, true, true]);
        assert_eq!(retry.max_attempts(), 3);
        let once = RetryPolicy::default().with_max_attempts(1).unwrap();
        assert!(once.gives_up_after(1));
    }

    #[test]
    fn invalid_settings_are_errors_not_clamped() {
        assert!(RetryPolicy::default().with_max_attempts(0).is_err());
        let d = Duration::from_secs;
        assert!(RetryPolicy::default().with_backoff(d(0), d(1)).is_err());
        let err = RetryPolicy::default()
            .with_backoff(d(10), d(5))
            .unwrap_err();
        assert!(err.to_string().contains("cap"), "{err}");
        assert!(RetryPolicy::default().with_backoff(d(5), d(5)).is_ok());
    }
}
