//! The operator's view of the inbox as JSON: what `admin::router` answers and the
//! `tower-webhook` command prints with `--json`, written once.
//!
//! Times are RFC 3339 in UTC; a body is its text when it is UTF-8
//! (`"body_encoding": "utf-8"`), else standard base64 (`"body_encoding": "base64"`).

use std::time::SystemTime;

#[cfg(any(feature = "sqlite", feature = "postgres"))]
use base64::Engine as _;
use serde::ser::{Error as _, Serialize, Serializer};

#[cfg(any(feature = "sqlite", feature = "postgres"))]
use super::listing::{Cursor, EventSummary, Page, State};
#[cfg(any(feature = "sqlite", feature = "postgres"))]
use super::{AttemptRecord, RouteState, StoredEvent};
use super::{Counts, Pause};

/// `t` as RFC 3339 in UTC, to the microsecond (what both databases keep).
pub(crate) fn rfc3339(t: SystemTime) -> Option<String> {
    let at = time::OffsetDateTime::from(t);
    let at = at.replace_nanosecond(at.nanosecond() / 1000 * 1000).ok()?;
    at.format(&time::format_description::well_known::Rfc3339)
        .ok()
}

/// A time as a JSON string.
struct Time(SystemTime);

impl Serialize for Time {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let text = rfc3339(self.0).ok_or_else(|| S::Error::custom("a time past year 9999"))?;
        s.serialize_str(&text)
    }
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
impl Serialize for State {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
impl Serialize for Cursor {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// `{"queued": 1, "processing": 0, "processed": 12, "dead": 1, "paused": 0,
/// "invalid": 0, "oldest_due_ms": 350}`
/// (`oldest_due_ms` is `null` when no row is due).
impl Serialize for Counts {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(serde::Serialize)]
        struct Wire {
            queued: u64,
            processing: u64,
            processed: u64,
            dead: u64,
            paused: u64,
            invalid: u64,
            oldest_due_ms: Option<u64>,
        }
        Wire {
            queued: self.queued,
            processing: self.processing,
            processed: self.processed,
            dead: self.dead,
            paused: self.paused,
            invalid: self.invalid,
            oldest_due_ms: self
                .oldest_due
                .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        }
        .serialize(s)
    }
}

/// `{"source": "stripe", "type": null, "paused_at": "2026-12-02T18:00:00Z"}` (`null`:
/// any).
impl Serialize for Pause {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(serde::Serialize)]
        struct Wire<'a> {
            #[serde(skip_serializing_if = "Option::is_none")]
            processor: Option<&'a str>,
            source: Option<&'a str>,
            #[serde(rename = "type")]
            event_type: Option<&'a str>,
            paused_at: Time,
        }
        Wire {
            processor: self.processor.as_deref(),
            source: self.source.as_deref(),
            event_type: self.event_type.as_deref(),
            paused_at: Time(self.paused_at),
        }
        .serialize(s)
    }
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
#[derive(serde::Serialize)]
struct SummaryWire<'a> {
    source: &'a str,
    id: &'a str,
    #[serde(rename = "type")]
    event_type: Option<&'a str>,
    object_id: Option<&'a str>,
    state: State,
    attempts: u32,
    received_at: Time,
    next_attempt_at: Option<Time>,
    dead_at: Option<Time>,
    last_error: Option<&'a str>,
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
impl<'a> From<&'a EventSummary> for SummaryWire<'a> {
    fn from(e: &'a EventSummary) -> Self {
        Self {
            source: &e.source,
            id: &e.id,
            event_type: e.event_type.as_deref(),
            object_id: e.object_id.as_deref(),
            state: e.state,
            attempts: e.attempts,
            received_at: Time(e.received_at),
            next_attempt_at: e.next_attempt_at.map(Time),
            dead_at: e.dead_at.map(Time),
            last_error: e.last_error.as_deref(),
        }
    }
}

/// `{"source", "id", "type", "object_id", "state", "attempts", "received_at",
/// "next_attempt_at", "dead_at", "last_error"}`, absent values `null`.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
impl Serialize for EventSummary {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        SummaryWire::from(self).serialize(s)
    }
}

/// `{"attempt": 2, "started_at": "…", "finished_at": "…", "duration_ms": 12.5,
/// "outcome": "failed", "error": "order not found"}` (`error` is `null` unless it failed,
/// went dead or was abandoned).
#[cfg(any(feature = "sqlite", feature = "postgres"))]
impl Serialize for AttemptRecord {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(serde::Serialize)]
        struct Wire<'a> {
            attempt: u32,
            started_at: Time,
            finished_at: Time,
            duration_ms: f64,
            outcome: &'static str,
            error: Option<&'a str>,
        }
        // To the microsecond, as the times.
        #[allow(clippy::cast_precision_loss)] // exact below 2^53 µs (285 years)
        let us = self.duration().as_micros() as f64;
        Wire {
            attempt: self.attempt,
            started_at: Time(self.started_at),
            finished_at: Time(self.finished_at),
            duration_ms: us / 1000.0,
            outcome: self.outcome.as_str(),
            error: self.error.as_deref(),
        }
        .serialize(s)
    }
}

/// `{"processor": "billing", "state": "dead", "attempts": 2, "last_error": "…",
/// "next_attempt_at": null, "processed_at": null}` (absent values `null`), and
/// `"orphaned": true` for a processor the inbox no longer has.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
impl Serialize for RouteState {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(serde::Serialize)]
        struct Wire<'a> {
            processor: &'a str,
            state: State,
            attempts: u32,
            last_error: Option<&'a str>,
            next_attempt_at: Option<Time>,
            processed_at: Option<Time>,
            dead_at: Option<Time>,
            #[serde(skip_serializing_if = "std::ops::Not::not")]
            orphaned: bool,
        }
        Wire {
            processor: &self.processor,
            state: self.state,
            attempts: self.attempts,
            last_error: self.last_error.as_deref(),
            next_attempt_at: self.next_attempt_at.map(Time),
            processed_at: self.processed_at.map(Time),
            dead_at: self.dead_at.map(Time),
            orphaned: self.orphaned,
        }
        .serialize(s)
    }
}

/// The summary's fields, and `"livemode"`, `"processed_at"`, `"body"`, `"body_encoding"`,
/// `"body_state"` (`stored`, `expired`, `erased`, `unreadable`, `missing`; `"body"` is
/// `""` unless `stored`), `"key_id"` (the key the body is sealed under, null in clear),
/// `"headers"` (`[["content-type", "application/json"], …]`, in the request's order) and
/// `"history"` (its [`AttemptRecord`]s, oldest first: `"attempts"` is the summary's count)
/// and `"validation_errors"` (`[{"path": "/data/object/id", "message": "…"}]`, empty unless
/// its state is `invalid`).
#[cfg(any(feature = "sqlite", feature = "postgres"))]
impl Serialize for StoredEvent {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(serde::Serialize)]
        struct Wire<'a> {
            #[serde(flatten)]
            summary: SummaryWire<'a>,
            livemode: Option<bool>,
            processed_at: Option<Time>,
            body: std::borrow::Cow<'a, str>,
            body_encoding: &'static str,
            body_state: &'static str,
            key_id: Option<&'a str>,
            headers: &'a [(String, String)],
            history: &'a [AttemptRecord],
            validation_errors: &'a [super::ValidationError],
        }
        let (body, body_encoding) = match std::str::from_utf8(&self.body) {
            Ok(text) => (text.into(), "utf-8"),
            Err(_) => (
                base64::engine::general_purpose::STANDARD
                    .encode(&self.body)
                    .into(),
                "base64",
            ),
        };
        Wire {
            summary: SummaryWire::from(&self.summary),
            livemode: self.livemode,
            processed_at: self.processed_at.map(Time),
            body,
            body_encoding,
            body_state: self.body_state.as_str(),
            key_id: self.key_id.as_deref(),
            headers: &self.headers,
            history: &self.attempts,
            validation_errors: &self.validation_errors,
        }
        .serialize(s)
    }
}

/// [`Inbox::processed_per_minute`](super::Inbox::processed_per_minute)'s counts as
/// `{"minutes": [{"start": "2026-12-03T15:04:00Z", "processed": 12}, …]}`, the oldest
/// first, the last the current minute.
#[cfg(all(feature = "admin", any(feature = "sqlite", feature = "postgres")))]
pub(crate) struct PerMinute(pub(crate) Vec<(SystemTime, u64)>);

#[cfg(all(feature = "admin", any(feature = "sqlite", feature = "postgres")))]
impl Serialize for PerMinute {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(serde::Serialize)]
        struct Minute {
            start: Time,
            processed: u64,
        }
        #[derive(serde::Serialize)]
        struct Wire {
            minutes: Vec<Minute>,
        }
        let minutes = self.0.iter().map(|&(start, processed)| Minute {
            start: Time(start),
            processed,
        });
        Wire {
            minutes: minutes.collect(),
        }
        .serialize(s)
    }
}

/// `{"events": [...], "next": "<cursor>"}` (`next` is `null` on the last page).
#[cfg(any(feature = "sqlite", feature = "postgres"))]
impl Serialize for Page {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(serde::Serialize)]
        struct Wire<'a> {
            events: &'a [EventSummary],
            next: Option<&'a Cursor>,
        }
        Wire {
            events: &self.events,
            next: self.next.as_ref(),
        }
        .serialize(s)
    }
}

#[cfg(all(test, any(feature = "sqlite", feature = "postgres")))]
mod tests {
    use super::*;
    use crate::inbox::listing::from_micros;
    use std::time::Duration;

    fn summary() -> EventSummary {
        EventSummary {
            source: "stripe".into(),
            id: "evt_1".into(),
            processor: "default".into(),
            event_type: Some("invoice.paid".into()),
            object_id: None,
            state: State::Dead,
            attempts: 8,
            received_at: from_micros(1_700_000_000_123_456),
            next_attempt_at: None,
            dead_at: Some(from_micros(1_700_000_060_000_000)),
            last_error: Some("order not found".into()),
        }
    }

    #[test]
    fn a_summary_is_flat_json_with_rfc3339_times() {
        let json = serde_json::to_value(summary()).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "source": "stripe", "id": "evt_1", "type": "invoice.paid", "object_id": null,
                "state": "dead", "attempts": 8,
                "received_at": "2023-11-14T22:13:20.123456Z", "next_attempt_at": null,
                "dead_at": "2023-11-14T22:14:20Z", "last_error": "order not found",
            })
        );
    }

    #[test]
    fn a_body_is_text_when_it_is_utf8_else_base64() {
        let event = |body: &'static [u8]| StoredEvent {
            summary: summary(),
            livemode: Some(false),
            processed_at: None,
            body: body.into(),
            body_state: crate::inbox::BodyState::Stored,
            key_id: None,
            headers: Vec::new(),
            attempts: Vec::new(),
            routes: Vec::new(),
            validation_errors: Vec::new(),
        };
        let json = serde_json::to_value(event(b"{\"id\":\"evt_1\"}")).unwrap();
        assert_eq!(json["body"], "{\"id\":\"evt_1\"}");
        assert_eq!(json["body_encoding"], "utf-8");
        assert_eq!(json["source"], "stripe", "the summary's fields, flat");
        assert_eq!(json["livemode"], false);
        let json = serde_json::to_value(event(b"\xff\x00a")).unwrap();
        assert_eq!(json["body"], "/wBh");
        assert_eq!(json["body_encoding"], "base64");
        assert_eq!(json["body_state"], "stored");
        assert_eq!(json["key_id"], serde_json::Value::Null, "in clear");
    }

    #[test]
    fn headers_are_pairs_and_attempts_a_history_beside_the_count() {
        use crate::inbox::{AttemptOutcome, AttemptRecord};
        let attempt = |n, outcome, error: Option<&str>| AttemptRecord {
            processor: "default".into(),
            attempt: n,
            started_at: from_micros(1_700_000_000_000_000),
            finished_at: from_micros(1_700_000_000_012_500),
            outcome,
            error: error.map(Into::into),
        };
        let event = StoredEvent {
            summary: summary(),
            livemode: None,
            processed_at: None,
            body: "{}".into(),
            body_state: crate::inbox::BodyState::Stored,
            key_id: Some("k1".into()),
            headers: vec![
                ("content-type".into(), "application/json".into()),
                ("webhook-id".into(), "msg_1".into()),
            ],
            attempts: vec![
                attempt(1, AttemptOutcome::Failed, Some("order not found")),
                attempt(2, AttemptOutcome::Dead, Some("order not found")),
            ],
            routes: Vec::new(),
            validation_errors: Vec::new(),
        };
        let json = serde_json::to_value(event).unwrap();
        assert_eq!(
            json["headers"],
            serde_json::json!([
                ["content-type", "application/json"],
                ["webhook-id", "msg_1"]
            ])
        );
        assert_eq!(json["attempts"], 8, "the summary's count stays");
        assert_eq!(
            json["history"][0],
            serde_json::json!({
                "attempt": 1, "started_at": "2023-11-14T22:13:20Z",
                "finished_at": "2023-11-14T22:13:20.0125Z", "duration_ms": 12.5,
                "outcome": "failed", "error": "order not found",
            })
        );
        assert_eq!(json["history"][1]["outcome"], "dead");
        assert_eq!(
            (&json["body_state"], &json["key_id"]),
            (&"stored".into(), &"k1".into())
        );
    }

    #[test]
    fn counts_give_the_lag_in_milliseconds() {
        let counts = Counts {
            queued: 3,
            oldest_due: Some(Duration::from_micros(2_500_900)),
            ..Counts::default()
        };
        assert_eq!(
            serde_json::to_value(counts).unwrap(),
            serde_json::json!({"queued": 3, "processing": 0, "processed": 0, "dead": 0, "paused": 0, "invalid": 0, "oldest_due_ms": 2500})
        );
    }
}
