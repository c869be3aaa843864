//! [`Alert`]: what an [`Alerter`](super::Alerter) is handed, and its [`AlertKind`] — text
//! cleaned of control characters and bounded, so an alert never carries a processor's
//! whole output or a terminal escape into a chat channel.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Why an [`Alert`] was raised. Each kind is sent at most once per interval per source
/// (see [`Alerts`](super::Alerts)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AlertKind {
    /// A source's processor started failing: the first failed attempt after successes
    /// (or after a start). [`Alert::count`] is the attempt number of that event.
    Failing,
    /// A source's processor works again: the first success after a failing streak.
    /// [`Alert::count`] is how many attempts failed meanwhile.
    Recovered,
    /// An event gave up after its last attempt. [`Alert::count`] is 0.
    Dead,
    /// The queue's oldest due event has waited longer than the bound: the workers fell
    /// behind or stopped. [`Alert::lag`] is how long; the alert has no source.
    Lagging,
    /// More deliveries of a source were rejected (forged, stale, malformed…) within the
    /// window than the threshold: an attack, or a secret out of step with the provider's.
    /// [`Alert::count`] is how many.
    Rejections,
    /// An event of a source failed its type's JSON Schema at accept and was kept
    /// `invalid`, never processed: the provider's payload changed shape, or a schema is
    /// out of date. [`Alert::details`] is its errors (each a JSON pointer and a message,
    /// never a value of the body); the invalid events held back meanwhile are
    /// [`Alert::suppressed`].
    Invalid,
}

/// How many kinds there are: the throttle keeps one slot per kind.
pub(crate) const KINDS: usize = 6;

impl AlertKind {
    /// The kind in `snake_case`, as the JSON of [`JsonPost`](super::JsonPost) names it.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Failing => "failing",
            Self::Recovered => "recovered",
            Self::Dead => "dead",
            Self::Lagging => "lagging",
            Self::Rejections => "rejections",
            Self::Invalid => "invalid",
        }
    }

    /// Its slot in the throttle's per-source array.
    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for AlertKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One alert: what happened, to which source and event where known, a one-line
/// [`summary`](Self::summary) for humans, and how many alerts of its kind and source were
/// held back since the last one sent.
///
/// Every text in it has its control characters removed; [`details`](Self::details) holds
/// at most 1 KiB, the other texts at most 200 bytes (longer ones end with `…`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Alert {
    kind: AlertKind,
    source: Option<String>,
    event_id: Option<String>,
    event_type: Option<String>,
    summary: String,
    details: Option<String>,
    count: u64,
    lag: Option<Duration>,
    suppressed: u64,
    dropped: u64,
    at_ms: u64,
}

/// The most bytes [`Alert::details`] holds.
pub(crate) const MAX_DETAILS: usize = 1024;
/// The most bytes a source, an id, a type or a rejection kind holds in an alert.
pub(crate) const MAX_NAME: usize = 200;

impl Alert {
    /// An alert of `kind` raised now, whose summary is `summary` (cleaned here).
    pub(crate) fn new(kind: AlertKind, source: Option<&str>, summary: &str) -> Self {
        let at_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        Self {
            kind,
            source: source.map(|s| clean(s, MAX_NAME)),
            event_id: None,
            event_type: None,
            summary: clean(summary, MAX_DETAILS),
            details: None,
            count: 0,
            lag: None,
            suppressed: 0,
            dropped: 0,
            at_ms,
        }
    }

    pub(crate) fn with_event(mut self, id: Option<&str>, event_type: Option<&str>) -> Self {
        self.event_id = id.map(|s| clean(s, MAX_NAME));
        self.event_type = event_type.map(|s| clean(s, MAX_NAME));
        self
    }

    pub(crate) fn with_details(mut self, details: &str) -> Self {
        self.details = Some(clean(details, MAX_DETAILS));
        self
    }

    pub(crate) fn with_count(mut self, count: u64) -> Self {
        self.count = count;
        self
    }

    pub(crate) fn with_lag(mut self, lag: Duration) -> Self {
        self.lag = Some(lag);
        self
    }

    /// Records the alerts held back before this one; they are named in the summary.
    pub(crate) fn held_back(mut self, suppressed: u64, dropped: u64) -> Self {
        self.suppressed = suppressed;
        self.dropped = dropped;
        if suppressed > 0 {
            self.summary
                .push_str(&format!(" (+{suppressed} more since the last alert)"));
        }
        if dropped > 0 {
            self.summary.push_str(&format!(
                " ({dropped} alerts dropped: the alerter was busy)"
            ));
        }
        self
    }

    /// Why it was raised.
    #[must_use]
    pub fn kind(&self) -> AlertKind {
        self.kind
    }

    /// The source (endpoint) it is about; `None` for [`AlertKind::Lagging`].
    #[must_use]
    pub fn source(&self) -> Option<&str> {
        self.source.as_deref()
    }

    /// The event's id, for [`AlertKind::Failing`] and [`AlertKind::Dead`].
    #[must_use]
    pub fn event_id(&self) -> Option<&str> {
        self.event_id.as_deref()
    }

    /// The event's type, when the event has one.
    #[must_use]
    pub fn event_type(&self) -> Option<&str> {
        self.event_type.as_deref()
    }

    /// One line for humans: what happened, where, and what was held back.
    #[must_use]
    pub fn summary(&self) -> &str {
        &self.summary
    }

    /// The processor's error (failing, dead), or the rejections' kinds with their counts.
    #[must_use]
    pub fn details(&self) -> Option<&str> {
        self.details.as_deref()
    }

    /// A number whose meaning depends on the kind: see [`AlertKind`].
    #[must_use]
    pub fn count(&self) -> u64 {
        self.count
    }

    /// How long the oldest due event had waited, for [`AlertKind::Lagging`].
    #[must_use]
    pub fn lag(&self) -> Option<Duration> {
        self.lag
    }

    /// How many alerts of this kind and source were held back since the last one sent
    /// (at most one goes out per interval).
    #[must_use]
    pub fn suppressed(&self) -> u64 {
        self.suppressed
    }

    /// How many alerts of any kind were dropped since the last one sent, because too
    /// many were still being sent.
    #[must_use]
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// When it was raised, in milliseconds since the Unix epoch.
    #[must_use]
    pub fn at_ms(&self) -> u64 {
        self.at_ms
    }

    /// The alert as a JSON object: `text` (the summary, `&`, `<` and `>` escaped as Slack
    /// asks, so an error text cannot mention `@channel`), then each field.
    pub(crate) fn to_json(&self) -> serde_json::Value {
        let lag_ms = self
            .lag
            .map(|lag| u64::try_from(lag.as_millis()).unwrap_or(u64::MAX));
        serde_json::json!({
            "text": slack_escape(&self.summary),
            "kind": self.kind.as_str(),
            "source": self.source,
            "event_id": self.event_id,
            "event_type": self.event_type,
            "summary": self.summary,
            "details": self.details,
            "count": self.count,
            "lag_ms": lag_ms,
            "suppressed": self.suppressed,
            "dropped": self.dropped,
            "at_ms": self.at_ms,
        })
    }
}

/// `text` without control characters (line breaks and tabs become spaces), cut to at
/// most `max` bytes on a character boundary, ending with `…` when cut.
pub(crate) fn clean(text: &str, max: usize) -> String {
    const CUT: &str = "…";
    let mut out = String::with_capacity(text.len().min(max));
    for c in text.chars() {
        let c = match c {
            '\n' | '\r' | '\t' => ' ',
            c if c.is_control() => continue,
            c => c,
        };
        if out.len() + c.len_utf8() > max {
            // Make room for the mark.
            while out.len() + CUT.len() > max {
                out.pop();
            }
            out.push_str(CUT);
            break;
        }
        out.push(c);
    }
    out
}

/// Slack's three escapes for message text.
fn slack_escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_loses_control_characters_and_is_cut_on_a_character_boundary() {
        assert_eq!(clean("a\nb\tc\u{1b}[31md\0", 100), "a b c[31md");
        let long = "é".repeat(600); // 1200 bytes
        let cut = clean(&long, MAX_DETAILS);
        assert!(cut.len() <= MAX_DETAILS, "{}", cut.len());
        assert!(cut.ends_with('…'));
        assert_eq!(clean("short", 5), "short");
        assert_eq!(clean("toolong", 5), "to…");
    }

    #[test]
    fn details_hold_at_most_1_kib_and_the_json_escapes_mentions_in_text() {
        let alert = Alert::new(AlertKind::Dead, Some("stripe"), "boom <!channel> & co")
            .with_event(Some("evt_1"), Some("invoice.paid"))
            .with_details(&"x".repeat(5000))
            .held_back(2, 0);
        assert_eq!(alert.details().unwrap().len(), MAX_DETAILS);
        let json = alert.to_json();
        assert_eq!(
            json["text"],
            "boom &lt;!channel&gt; &amp; co (+2 more since the last alert)"
        );
        assert_eq!(json["summary"], alert.summary());
        assert_eq!(json["kind"], "dead");
        assert_eq!(json["event_id"], "evt_1");
        assert_eq!(json["suppressed"], 2);
        assert!(json["lag_ms"].is_null());
    }
}
