//! Timestamps: a strict parse, and the check against separate past and future tolerances.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::error::{VerifyError, VerifyErrorKind};
use crate::scheme::TimestampFormat;

/// The clock a verifier reads; replace it in tests with
/// [`Verifier::with_clock`](crate::Verifier::with_clock).
pub(crate) type Clock = Arc<dyn Fn() -> SystemTime + Send + Sync>;

pub(crate) fn system_clock() -> Clock {
    Arc::new(SystemTime::now)
}

const MALFORMED: VerifyError =
    VerifyError::new(VerifyErrorKind::MalformedHeader, "timestamp is malformed");

/// Parses a timestamp into seconds since the Unix epoch.
///
/// Unix timestamps are ASCII digits only (no sign, space or `+`), and too many digits is
/// an error rather than a wrap-around.
pub(crate) fn parse(raw: &str, format: TimestampFormat) -> Result<i64, VerifyError> {
    match format {
        TimestampFormat::Unix | TimestampFormat::UnixMillis => {
            if raw.is_empty() || !raw.bytes().all(|b| b.is_ascii_digit()) {
                return Err(MALFORMED);
            }
            let n: i64 = raw.parse().map_err(|_| MALFORMED)?;
            Ok(match format {
                TimestampFormat::UnixMillis => n / 1000,
                _ => n,
            })
        }
        TimestampFormat::Rfc3339 => {
            time::OffsetDateTime::parse(raw, &time::format_description::well_known::Rfc3339)
                .map(|t| t.unix_timestamp())
                .map_err(|_| MALFORMED)
        }
    }
}

/// Seconds since the Unix epoch, negative before it.
pub(crate) fn unix_seconds(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => i64::try_from(e.duration().as_secs()).map_or(i64::MIN, |s| -s),
    }
}

/// The accepted window around now. `i128` arithmetic: no value of `i64` can overflow it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tolerance {
    pub(crate) past: Duration,
    pub(crate) future: Duration,
}

impl Default for Tolerance {
    fn default() -> Self {
        Self {
            past: Duration::from_secs(300),
            future: Duration::from_secs(300),
        }
    }
}

impl Tolerance {
    pub(crate) fn check(&self, timestamp: i64, now: i64) -> Result<(), VerifyError> {
        let age = i128::from(now) - i128::from(timestamp);
        if age > i128::from(self.past.as_secs()) {
            Err(VerifyError::new(
                VerifyErrorKind::TimestampTooOld,
                "timestamp is too old",
            ))
        } else if -age > i128::from(self.future.as_secs()) {
            Err(VerifyError::new(
                VerifyErrorKind::TimestampInFuture,
                "timestamp is in the future",
            ))
        } else {
            Ok(())
        }
    }
}

/// The time a signed timestamp stands for.
pub(crate) fn to_system_time(secs: i64) -> Option<SystemTime> {
    if secs >= 0 {
        UNIX_EPOCH.checked_add(Duration::from_secs(secs.unsigned_abs()))
    } else {
        UNIX_EPOCH.checked_sub(Duration::from_secs(secs.unsigned_abs()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unix_parse_is_strict() {
        assert_eq!(
            parse("1614265330", TimestampFormat::Unix),
            Ok(1_614_265_330)
        );
        assert_eq!(parse("0", TimestampFormat::Unix), Ok(0));
        for bad in [
            "",
            " 1",
            "1 ",
            "+1",
            "-1",
            "1.5",
            "1e9",
            "0x10",
            "١٢٣",
            "99999999999999999999",
            "9223372036854775808",
        ] {
            assert_eq!(
                parse(bad, TimestampFormat::Unix).unwrap_err().kind(),
                VerifyErrorKind::MalformedHeader,
                "{bad:?}"
            );
        }
        assert_eq!(
            parse("9223372036854775807", TimestampFormat::Unix),
            Ok(i64::MAX)
        );
    }

    #[test]
    fn rfc3339_parse_reads_offsets() {
        let f = TimestampFormat::Rfc3339;
        assert_eq!(parse("2021-02-25T15:02:10Z", f), Ok(1_614_265_330));
        assert_eq!(parse("2021-02-25T17:02:10+02:00", f), Ok(1_614_265_330));
        for bad in [
            "2021-02-25",
            "1614265330",
            "2021-02-25T15:02:10",
            "yesterday",
        ] {
            assert!(parse(bad, f).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn tolerance_boundaries_and_extremes() {
        let t = Tolerance {
            past: Duration::from_secs(300),
            future: Duration::from_secs(60),
        };
        let now = 1_000_000;
        assert!(t.check(now - 300, now).is_ok());
        assert_eq!(
            t.check(now - 301, now).unwrap_err().kind(),
            VerifyErrorKind::TimestampTooOld
        );
        assert!(t.check(now + 60, now).is_ok());
        assert_eq!(
            t.check(now + 61, now).unwrap_err().kind(),
            VerifyErrorKind::TimestampInFuture
        );
        assert_eq!(
            t.check(i64::MIN, now).unwrap_err().kind(),
            VerifyErrorKind::TimestampTooOld
        );
        assert_eq!(
            t.check(i64::MAX, now).unwrap_err().kind(),
            VerifyErrorKind::TimestampInFuture
        );
        assert_eq!(
            t.check(i64::MAX, i64::MIN).unwrap_err().kind(),
            VerifyErrorKind::TimestampInFuture
        );
        let huge = Tolerance {
            past: Duration::MAX,
            future: Duration::MAX,
        };
        assert!(huge.check(i64::MIN, i64::MAX).is_ok());
    }
}
