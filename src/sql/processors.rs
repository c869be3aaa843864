//! What both dialects read for fan-out's processor operations (the registry, backfill):
//! the rows, as the SQL names and casts the columns.

use crate::event::{Event, Stored};
use crate::inbox::backfill::{Candidate, Position};

/// An inbox event a backfill may route: `at` its receipt time in the dialect's unit
/// (SQLite milliseconds, PostgreSQL microseconds since the epoch), the rest the event.
#[derive(sqlx::FromRow)]
pub(crate) struct CandidateRow {
    at: i64,
    source: String,
    event_id: String,
    event_type: Option<String>,
    object_id: Option<String>,
    livemode: Option<bool>,
    body: Option<Vec<u8>>,
    key_id: Option<String>,
    body_nonce: Option<Vec<u8>>,
}

impl CandidateRow {
    /// The candidate, its body opened with `ring` (one that does not open is empty: the
    /// route a backfill makes of it is refused at its claim, dead with the reason).
    pub(crate) fn opened(self, ring: &super::sealed::Ring) -> Candidate {
        let r = self;
        let body = r.body.unwrap_or_default();
        let (key, nonce) = (r.key_id.as_deref(), r.body_nonce.as_deref());
        let body = super::sealed::open_body(ring, &r.source, &r.event_id, key, nonce, body)
            .unwrap_or_default();
        let position = Position {
            at: r.at,
            source: r.source.clone(),
            id: r.event_id.clone(),
        };
        // As a worker's claim reads it: the filter's predicate sees what a worker will.
        let event = Event::stored(Stored {
            source: r.source,
            id: r.event_id,
            event_type: r.event_type,
            object_id: r.object_id,
            livemode: r.livemode,
            timestamp: None,
            body: body.into(),
        });
        Candidate { position, event }
    }
}

/// A registry row: name, types (a JSON array or NULL), whether it has a predicate, when
/// registered (milliseconds since the epoch).
pub(crate) type RegistryRow = (String, Option<String>, bool, i64);

/// The keys of a page's events to route, as the JSON array SQLite's statement reads.
#[cfg(feature = "sqlite")]
pub(crate) fn keys_json(keys: &[(String, String)]) -> String {
    serde_json::to_string(keys).expect("strings")
}
