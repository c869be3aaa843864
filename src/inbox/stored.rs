//! One event whole, as [`Inbox::event`](super::Inbox::event) reads it: its key, metadata,
//! body and headers, each processor's route with its state, and the attempts' history.

use std::fmt;
use std::time::SystemTime;

use bytes::Bytes;

use super::{AttemptRecord, EventSummary, State};

/// One event whole, as [`Inbox::event`](super::Inbox::event) reads it.
///
/// `summary` and `processed_at` are the most urgent of its [`routes`](Self::routes): a
/// dead one, else a failing one (queued again after a failed attempt), else one being
/// processed, else a queued one, else a processed one (ties by processor name). With one
/// processor they are its route's, as before fan-out. An event no processor took has no
/// route: its state is [`State::Unrouted`].
///
/// # Security
///
/// `body` is the provider's payload as received: customer data (names, addresses,
/// payment details). Show it only to whoever may read that. `Debug` prints its length,
/// not its bytes, so a log line of the value does not copy the payload, and the headers'
/// names, not their values. No credential is among the headers: the inbox never stores
/// them (see [`Accept`](super::Accept)).
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoredEvent {
    /// The event, as a listing shows its most urgent route.
    pub summary: EventSummary,
    /// The body's `livemode`, where the provider sends it.
    pub livemode: Option<bool>,
    /// When the most urgent route was processed.
    pub processed_at: Option<SystemTime>,
    /// The body exactly as received; empty unless [`body_state`](Self::body_state) is
    /// [`BodyState::Stored`].
    pub body: Bytes,
    /// Whether the body is kept, and if not why.
    pub body_state: BodyState,
    /// The id of the key the body and headers are sealed under (an inbox with encryption
    /// keys, feature `seal`); `None` when they are stored in clear or gone.
    pub key_id: Option<String>,
    /// The delivery's request headers as the inbox's [`Accept`](super::Accept) stored
    /// them, in the request's order (names in lower case; a name sent twice, twice):
    /// credentials left out (`Authorization`, `Proxy-Authorization`, `Cookie`,
    /// `Set-Cookie`, `X-Api-Key`, `X-Auth-Token`, values marked sensitive), at most 8 KiB
    /// (a header that would go over is left out), values that are not UTF-8 decoded with
    /// replacement characters. Empty when none were stored: an event
    /// [ingested](super::Inbox::ingest) or given to [`Inbox::accept`](super::Inbox::accept)
    /// directly, or accepted before this version.
    pub headers: Vec<(String, String)>,
    /// Its attempts, the oldest first, every route's (each names its processor): each one
    /// a worker finished (or that ended without an outcome), since it was received, across
    /// requeues — the newest 100 of each route at most. Not
    /// [`summary.attempts`](EventSummary::attempts), which counts the attempts since the
    /// last requeue, snoozes uncounted.
    pub attempts: Vec<AttemptRecord>,
    /// Each processor's route of the event, by processor name (a dead route deleted by
    /// [`prune_dead`](super::Inbox::prune_dead) left out); empty when no processor took
    /// it.
    pub routes: Vec<RouteState>,
    /// Why its type's JSON Schema refused its body, when its state is
    /// [`State::Invalid`]: at most ten, each a JSON pointer and a message that never
    /// quotes the body; empty otherwise.
    pub validation_errors: Vec<super::invalid::ValidationError>,
}

/// Whether an event's body is kept ([`StoredEvent::body_state`]). The event itself, its
/// key, outlives its body: a redelivery stays a duplicate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BodyState {
    /// Kept, and readable (in clear, or opened by a configured key).
    Stored,
    /// Deleted by the body retention after the event was processed.
    Expired,
    /// Erased on request.
    Erased,
    /// Kept, sealed under a key no configured key opens (removed, or the ciphertext
    /// altered): a route claimed so ends dead with the reason, and runs again once
    /// requeued after the key is configured again.
    Unreadable,
    /// Gone without a recorded reason: the body row was deleted outside the crate. A
    /// route claimed so ends dead ("the body is missing"), never run with an empty body.
    Missing,
}

impl BodyState {
    /// The name the JSON and the CLI show: `stored`, `expired`, `erased`, `unreadable`,
    /// `missing`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            BodyState::Stored => "stored",
            BodyState::Expired => "expired",
            BodyState::Erased => "erased",
            BodyState::Unreadable => "unreadable",
            BodyState::Missing => "missing",
        }
    }

    /// The state a stored `body_state` column names (`NULL` with no body row: missing).
    pub(crate) fn gone(column: Option<&str>) -> Self {
        match column {
            Some("erased") => BodyState::Erased,
            Some("expired") => BodyState::Expired,
            _ => BodyState::Missing,
        }
    }

    /// Why a route of an event whose body is in this state is never run: the dead
    /// reason (crate text, naming no payload); `None` for a stored body.
    pub(crate) fn dead_reason(self) -> Option<&'static str> {
        match self {
            BodyState::Stored => None,
            BodyState::Expired => Some("the body expired before the event was processed"),
            BodyState::Erased => Some("the body was erased before the event was processed"),
            BodyState::Unreadable => Some("the body cannot be opened"),
            BodyState::Missing => Some("the body is missing"),
        }
    }
}

impl fmt::Display for BodyState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One processor's route of an event: its state, attempts and times.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RouteState {
    /// The processor's name.
    pub processor: String,
    /// Where the route is now.
    pub state: State,
    /// Attempts since it was made or last requeued.
    pub attempts: u32,
    /// The last failed attempt's error, kept until the route is processed or requeued.
    pub last_error: Option<String>,
    /// When its next attempt is due (for a route being processed, when the running
    /// attempt was); `None` once processed or dead.
    pub next_attempt_at: Option<SystemTime>,
    /// When it was processed.
    pub processed_at: Option<SystemTime>,
    /// When it went dead.
    pub dead_at: Option<SystemTime>,
    /// Of a processor the answering inbox does not have (removed from its
    /// [`with_processors`](super::Inbox::with_processors) since): kept, listed and
    /// requeued as any other, run by no worker of that inbox.
    pub orphaned: bool,
}

impl RouteState {
    /// The route as a listing shows it, and when it was processed.
    pub(crate) fn of(summary: &EventSummary, processed_at: Option<SystemTime>) -> Self {
        Self {
            processor: summary.processor.clone(),
            state: summary.state,
            attempts: summary.attempts,
            last_error: summary.last_error.clone(),
            next_attempt_at: summary.next_attempt_at,
            processed_at,
            dead_at: summary.dead_at,
            orphaned: false,
        }
    }

    /// How urgent an operator's look at it is, the most first: dead, failing, being
    /// processed, queued, processed.
    pub(crate) fn urgency(&self) -> u8 {
        match self.state {
            State::Dead => 0,
            State::Queued | State::Processing if self.last_error.is_some() => 1,
            State::Processing => 2,
            State::Queued => 3,
            _ => 4,
        }
    }
}

impl fmt::Debug for StoredEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.headers.iter().map(|(n, _)| n.as_str()).collect();
        f.debug_struct("StoredEvent")
            .field("summary", &self.summary)
            .field("livemode", &self.livemode)
            .field("processed_at", &self.processed_at)
            .field("body", &format_args!("<{} bytes>", self.body.len()))
            .field("body_state", &self.body_state)
            .field("key_id", &self.key_id)
            .field("headers", &names)
            .field("attempts", &self.attempts)
            .field("routes", &self.routes)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    #[test]
    fn debug_shows_a_bodys_length_and_its_headers_names_not_their_values() {
        let event = StoredEvent {
            summary: EventSummary {
                source: "stripe".into(),
                id: "evt_1".into(),
                processor: "default".into(),
                event_type: None,
                object_id: None,
                state: State::Queued,
                attempts: 0,
                received_at: UNIX_EPOCH,
                next_attempt_at: Some(UNIX_EPOCH),
                dead_at: None,
                last_error: None,
            },
            livemode: None,
            processed_at: None,
            body: Bytes::from_static(b"{\"email\":\"ada@example.com\"}"),
            body_state: BodyState::Stored,
            key_id: None,
            headers: vec![("x-customer".into(), "ada@example.com".into())],
            attempts: Vec::new(),
            routes: Vec::new(),
            validation_errors: Vec::new(),
        };
        let debug = format!("{event:?}");
        assert!(
            debug.contains("body: <27 bytes>") && debug.contains("evt_1"),
            "{debug}"
        );
        assert!(debug.contains("x-customer"), "{debug}");
        assert!(!debug.contains("ada@"), "{debug}");
    }
}
