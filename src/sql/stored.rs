//! One inbox event whole, as both dialects read it (`Inbox::event`): its row and body,
//! its routes, and its attempts' history, three statements by its key.

use sqlx::query::QueryAs;
use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, Pool, Type};

use super::sealed::{self, Ring};
use super::{store_error, ListedRow, MAX_ATTEMPT_RECORDS};
use crate::inbox::listing::from_micros;
use crate::inbox::{AttemptOutcome, AttemptRecord, EventSummary, RouteState, State};
use crate::inbox::{BodyState, StoredEvent};
use crate::store::StoreFuture;

/// An inbox event's row and body as both databases return them (times in microseconds
/// since the epoch).
#[derive(sqlx::FromRow)]
pub(super) struct EventRow {
    source: String,
    event_id: String,
    event_type: Option<String>,
    object_id: Option<String>,
    received_us: i64,
    livemode: Option<bool>,
    /// Whether the event has a body row (its body may still be NULL: a delivery without
    /// one).
    has_body: bool,
    body: Option<Vec<u8>>,
    headers: Option<String>,
    /// The key the body row is sealed under (NULL: in clear), the body's nonce, and the
    /// sealed headers with theirs.
    key_id: Option<String>,
    body_nonce: Option<Vec<u8>>,
    sealed_headers: Option<Vec<u8>>,
    headers_nonce: Option<Vec<u8>>,
    /// Why the body row is gone (`expired`, `erased`).
    body_state: Option<String>,
}

/// One of `webhook_attempts`' rows as both databases return it: times in microseconds
/// since the epoch.
#[derive(sqlx::FromRow)]
pub(super) struct AttemptRow {
    processor: String,
    attempt: i64,
    started_us: i64,
    finished_us: i64,
    outcome: String,
    error: Option<String>,
}

/// The event, its routes (by processor name) and its attempts (oldest first; a record of
/// an outcome this version does not know is left out); the summary is the most urgent
/// route's, or the event's own, unrouted, when it has none.
/// The body, headers and every error text opened with `ring`.
fn into_event(
    row: EventRow,
    routes: Vec<ListedRow>,
    attempts: Vec<AttemptRow>,
    ring: &Ring,
) -> StoredEvent {
    let (source, id) = (row.source.clone(), row.event_id.clone());
    let attempts = attempts
        .into_iter()
        .filter_map(|a| {
            let error = a
                .error
                .map(|text| sealed::open_error(ring, &source, &id, &a.processor, text));
            Some(AttemptRecord {
                processor: a.processor,
                attempt: u32::try_from(a.attempt).unwrap_or(0),
                started_at: from_micros(a.started_us),
                finished_at: from_micros(a.finished_us.max(a.started_us)),
                outcome: AttemptOutcome::from_column(&a.outcome)?,
                error,
            })
        })
        .collect();
    let routes: Vec<(EventSummary, Option<std::time::SystemTime>)> = routes
        .into_iter()
        .map(|r| {
            let processed_at = r.processed_us.map(from_micros);
            (EventSummary::from(r.opened(ring)), processed_at)
        })
        .collect();
    let states: Vec<RouteState> = routes
        .iter()
        .map(|(summary, processed_at)| RouteState::of(summary, *processed_at))
        .collect();
    // The first of the most urgent: routes come by processor name.
    let urgent = (0..states.len()).min_by_key(|&i| states[i].urgency());
    let (summary, processed_at) = match urgent {
        Some(i) => routes.into_iter().nth(i).expect("an index of the routes"),
        None => (
            EventSummary {
                source: row.source,
                id: row.event_id,
                processor: String::new(),
                event_type: row.event_type,
                object_id: row.object_id,
                state: State::Unrouted,
                attempts: 0,
                received_at: from_micros(row.received_us),
                next_attempt_at: None,
                dead_at: None,
                last_error: None,
            },
            None,
        ),
    };
    let key = row.key_id.as_deref();
    let (body, body_state) = match (row.has_body, row.body) {
        (false, _) => (Vec::new(), BodyState::gone(row.body_state.as_deref())),
        (true, body) => {
            let nonce = row.body_nonce.as_deref();
            let body = body.unwrap_or_default();
            match sealed::open_body(ring, &source, &id, key, nonce, body) {
                Ok(body) => (body, BodyState::Stored),
                Err(_) => (Vec::new(), BodyState::Unreadable),
            }
        }
    };
    let headers = match body_state {
        BodyState::Stored => {
            let parts = row
                .sealed_headers
                .as_deref()
                .zip(row.headers_nonce.as_deref());
            let sealed = parts.map(|(ciphertext, nonce)| (nonce, ciphertext));
            sealed::open_headers(ring, &source, &id, key, row.headers, sealed)
        }
        _ => None,
    };
    StoredEvent {
        summary,
        livemode: row.livemode,
        processed_at,
        body: body.into(),
        body_state,
        key_id: row.key_id,
        headers: headers
            .as_deref()
            .map(crate::inbox::headers::parse)
            .unwrap_or_default(),
        attempts,
        routes: states,
        validation_errors: Vec::new(),
    }
}

/// The statements [`event`] runs, each with what the dialect binds first: the event's
/// row and body (the row alone once its body is gone; `None` once every route of it is
/// a tombstone), its routes, and its newest attempts
/// (bound after the key to the most records read, [`MAX_ATTEMPT_RECORDS`]).
pub(super) struct EventStatements<DB: Database> {
    pub(super) event: QueryAs<'static, DB, EventRow, DB::Arguments>,
    pub(super) routes: QueryAs<'static, DB, ListedRow, DB::Arguments>,
    pub(super) attempts: QueryAs<'static, DB, AttemptRow, DB::Arguments>,
}

/// One event of the inbox, its body, headers, routes and attempts included: each of
/// `statements` bound to the event's key.
pub(super) fn event<DB>(
    pool: &Pool<DB>,
    statements: EventStatements<DB>,
    source: String,
    id: String,
    ring: &Ring,
) -> StoreFuture<Option<StoredEvent>>
where
    DB: Database,
    DB::Arguments: IntoArguments<DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    EventRow: for<'r> FromRow<'r, DB::Row>,
    ListedRow: for<'r> FromRow<'r, DB::Row>,
    AttemptRow: for<'r> FromRow<'r, DB::Row>,
    String: Encode<'static, DB> + Type<DB>,
    i64: Encode<'static, DB> + Type<DB>,
{
    let pool = pool.clone();
    let ring = ring.clone();
    let EventStatements {
        event,
        routes,
        attempts,
    } = statements;
    Box::pin(async move {
        let err = |e| store_error("inbox event", e);
        let row = event
            .bind(source.clone())
            .bind(id.clone())
            .fetch_optional(&pool)
            .await
            .map_err(err)?;
        let Some(row) = row else { return Ok(None) };
        let routes = routes
            .bind(source.clone())
            .bind(id.clone())
            .fetch_all(&pool)
            .await
            .map_err(err)?;
        let limit = i64::try_from(MAX_ATTEMPT_RECORDS).unwrap_or(i64::MAX);
        let attempts = attempts
            .bind(source)
            .bind(id)
            .bind(limit)
            .fetch_all(&pool)
            .await
            .map_err(err)?;
        Ok(Some(into_event(row, routes, attempts, &ring)))
    })
}
