//! [`Later`]: a processor's "not now" — the event runs again at a later time, the attempt
//! not counted.

use std::error::Error as StdError;
use std::fmt;
use std::time::{Duration, SystemTime};

use http::HeaderValue;

/// A processor's answer that the event cannot run *now*: the API it calls answered 429 or
/// 503 with `Retry-After`, a maintenance window, a lock held elsewhere. Return it as the
/// processor's error and the worker snoozes the event until then: the attempt is not
/// counted (not backed off, never dead — the same attempt number comes again), on the SQL
/// inbox and on JetStream alike.
///
/// ```
/// use std::time::Duration;
/// use tower_webhook::inbox::{Attempt, Later};
/// use tower_webhook::Event;
///
/// async fn process(event: Event, _: Attempt) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
///     let status = 429; // what the downstream API answered
///     if status == 429 {
///         return Err(Later::after(Duration::from_secs(30)).into());
///     }
///     Ok(())
/// }
/// ```
///
/// It is found anywhere in the error's [`source`](StdError::source) chain, so a `Later`
/// wrapped by `anyhow` or another error type still snoozes. A snooze is at most
/// [`Later::MAX`]; a processor that says "later" forever keeps its event forever, so bound
/// it yourself where that matters (by the event's age, say).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Later {
    after: Duration,
}

impl Later {
    /// The longest snooze: one day. Longer ones are cut to it.
    pub const MAX: Duration = Duration::from_secs(24 * 3600);

    /// Run the event again `after` from now (at most [`MAX`](Self::MAX)).
    #[must_use]
    pub fn after(after: Duration) -> Self {
        Self {
            after: after.min(Self::MAX),
        }
    }

    /// Run the event again at `at` (at once when it has passed).
    #[must_use]
    pub fn until(at: SystemTime) -> Self {
        Self::after(at.duration_since(SystemTime::now()).unwrap_or_default())
    }

    /// The snooze a `Retry-After` header asks for: seconds (`120`) or an HTTP date
    /// (`Wed, 21 Oct 2026 07:28:00 GMT`); `None` when it is neither.
    #[must_use]
    pub fn retry_after(value: &HeaderValue) -> Option<Self> {
        let text = value.to_str().ok()?.trim();
        if let Ok(seconds) = text.parse::<u64>() {
            return Some(Self::after(Duration::from_secs(seconds)));
        }
        let at = time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc2822)
            .ok()?;
        Some(Self::until(at.into()))
    }

    /// How long from now the event waits.
    #[must_use]
    pub fn delay(&self) -> Duration {
        self.after
    }

    /// The first `Later` in `error`'s chain.
    pub(crate) fn find(error: &(dyn StdError + 'static)) -> Option<Self> {
        let mut at = Some(error);
        while let Some(error) = at {
            if let Some(later) = error.downcast_ref::<Self>() {
                return Some(*later);
            }
            at = error.source();
        }
        None
    }
}

impl fmt::Display for Later {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "not now: run again in {:?}", self.after)
    }
}

impl StdError for Later {}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Wrapped(Later);

    impl fmt::Display for Wrapped {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("the API is busy")
        }
    }

    impl StdError for Wrapped {
        fn source(&self) -> Option<&(dyn StdError + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn found_in_the_chain_and_cut_to_a_day() {
        let later = Later::after(Duration::from_secs(30));
        assert_eq!(Later::find(&Wrapped(later)), Some(later));
        assert_eq!(Later::find(&std::fmt::Error), None);
        let long = Later::after(Duration::from_secs(10 * 24 * 3600));
        assert_eq!(long.delay(), Later::MAX);
        assert_eq!(
            Later::until(SystemTime::now() - Duration::from_secs(5)).delay(),
            Duration::ZERO
        );
    }

    #[test]
    fn reads_retry_after_in_seconds_and_as_a_date() {
        let seconds = Later::retry_after(&HeaderValue::from_static("120")).unwrap();
        assert_eq!(seconds.delay(), Duration::from_secs(120));
        let in_an_hour = SystemTime::now() + Duration::from_secs(3600);
        let date = time::OffsetDateTime::from(in_an_hour)
            .format(&time::format_description::well_known::Rfc2822)
            .unwrap()
            .replace("+0000", "GMT");
        let dated = Later::retry_after(&HeaderValue::from_str(&date).unwrap()).unwrap();
        assert!(
            dated.delay() > Duration::from_secs(3590),
            "{date}: {dated:?}"
        );
        assert!(dated.delay() <= Duration::from_secs(3600));
        let past = Later::retry_after(&HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"));
        assert_eq!(past.map(|l| l.delay()), Some(Duration::ZERO));
        assert_eq!(Later::retry_after(&HeaderValue::from_static("soon")), None);
        assert_eq!(Later::retry_after(&HeaderValue::from_static("-3")), None);
    }
}
