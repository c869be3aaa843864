//! How long done event keys are kept.

use std::time::Duration;

use crate::ConfigError;

/// How long done event keys are kept: long enough that no redelivery of an event comes
/// after its key is gone (a redelivery then runs the handler again).
///
/// It is also longer than every preset's signed-time window (at most 48 hours, Square's),
/// so a capture replayed after its key is gone is refused as stale. Keys of schemes that
/// sign no time ([kept keys](super::Delivery::is_kept)) are not subject to it.
///
/// At least 4 days unless asked for less by name: the longest retry windows providers
/// document end within it (Stripe retries for 3 days, Standard Webhooks senders for about
/// 75 hours; GitHub does not retry on its own), with most of a day to spare for a retry
/// that runs late. The default is 7 days.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Retention(Duration);

impl Retention {
    /// The floor [`new`](Self::new) holds: 4 days, beyond the longest provider retry
    /// window (about 75 hours).
    pub const MIN: Duration = Duration::from_secs(4 * 24 * 3600);

    /// Keeps done keys for `keep`.
    ///
    /// # Errors
    ///
    /// When `keep` is shorter than [`MIN`](Self::MIN): use [`shorter`](Self::shorter)
    /// to mean it.
    pub fn new(keep: Duration) -> Result<Self, ConfigError> {
        if keep < Self::MIN {
            return Err(ConfigError::duration(
                "a retention",
                keep,
                "at least 4 days (beyond the longest provider retry window, about 75 \
                 hours; Retention::shorter to mean less)",
            ));
        }
        Ok(Self(keep))
    }

    /// Keeps done keys for `keep`, below the 4-day floor too: for tests, or a provider
    /// known to stop retrying sooner. A redelivery after it runs the handler again.
    #[must_use]
    pub fn shorter(keep: Duration) -> Self {
        Self(keep)
    }

    /// The length.
    #[must_use]
    pub fn get(self) -> Duration {
        self.0
    }
}

impl Default for Retention {
    fn default() -> Self {
        Self(Duration::from_secs(7 * 24 * 3600))
    }
}
