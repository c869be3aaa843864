//! The inbox's accepts, a batch in one statement: each new event (or `DedupeLayer` claim
//! adopted) with its body and its routes, or nothing for a duplicate.

use std::collections::HashSet;

use sqlx::Row;

use super::group_commit::{all_failed, unavailable, Columns};
use super::kept::Runs;
use crate::inbox::Accepted;
use crate::store::{Delivery, StoreError};

/// Many accepts in one statement; the keys queued come back, and workers are notified
/// (once: PostgreSQL folds identical notifications of a transaction into one).
///
/// The events go in in key order (`insert_accepts`), each numbered in arrival order by
/// its place in the batch (`$9`) after the batch's number of the sequence: one `nextval`
/// a batch, and `received_at`, the statement's time, is the same for all. An event
/// `DedupeLayer` left unfinished (released, or claimed) is adopted instead: queued, its
/// claim's lock dropped and its inline body cleared (the body is `webhook_bodies`' from
/// now on; a `DedupeLayer` in front of this accept then finds it done), so a source
/// switched from dedupe to the inbox loses no event. A duplicate of an inbox event
/// matches neither and writes nothing (`DO NOTHING` takes no row lock).
///
/// Each event queued (inserted or adopted, once per key) gets, by its place (its
/// `arrival` less the batch's number: no join on the key), its body and headers (`$8`) in
/// `webhook_bodies`, and a route per processor `$11` names for its place `$10`, with the
/// event's own type, object, arrival and receipt, as `RETURNING` gives them (an adopted
/// claim's own). Sealed (an inbox with keys), `$6` holds the ciphertexts and `$8` NULLs,
/// and `$12`…`$15` each body's key id, its nonce, and the sealed headers with theirs,
/// `$16`…`$18` the sealed subject, its nonce and digest (NULLs in clear): the inbox's arrays alone, not `Columns`' (P10), bound in the same
/// order. `$19`, `$20`: each accept's trace context (feature `otel`; NULLs without it),
/// kept with the event. The adoption's probes only run for the places the insert left: none in
/// a batch of new events.
macro_rules! accept_many {
    ($leftovers:literal) => {
        concat!("
WITH input AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bool[], $6::bytea[],
                         $7::text[], $8::text[], $9::int8[], $12::text[], $13::bytea[],
                         $14::bytea[], $15::bytea[], $16::bytea[], $17::bytea[], $18::bytea[],
                         $19::text[], $20::text[])
        AS input(source, event_id, event_type, object_id, livemode, body, kind, headers, place,
                 key_id, body_nonce, sealed_headers, headers_nonce, sealed_subject,
                 subject_nonce, subject_digest, traceparent, tracestate)
), batch AS MATERIALIZED (SELECT nextval('webhook_events_arrival') * 1024 AS n
), inserted AS (
    INSERT INTO webhook_events
        (source, event_id, event_type, object_id, livemode, attempts, next_attempt_at, kind,
         arrival, traceparent, tracestate)
    SELECT source, event_id, event_type, object_id, livemode, 0, now(), kind, batch.n + place,
        traceparent, tracestate
    FROM input, batch
    ON CONFLICT (source, event_id) DO NOTHING
    RETURNING source, event_id, event_type, object_id, arrival, received_at
), adopted AS (
    UPDATE webhook_events w SET next_attempt_at = now(), attempts = 0,
        locked_until = NULL, lock_token = NULL, body = NULL,
        arrival = (SELECT n FROM batch) + first.place,
        traceparent = first.traceparent, tracestate = first.tracestate
    FROM (SELECT DISTINCT ON (source, event_id) * FROM input
          WHERE place NOT IN (SELECT inserted.arrival - (SELECT n FROM batch) FROM inserted)
          ORDER BY source, event_id, place) AS first
    WHERE w.source = first.source AND w.event_id = first.event_id
      AND w.next_attempt_at IS NULL AND w.processed_at IS NULL AND w.kind <> 'once'
    RETURNING w.source, w.event_id, w.event_type, w.object_id, w.arrival, w.received_at
), queued AS (
    SELECT q.*, q.arrival - batch.n AS place
    FROM (SELECT * FROM inserted UNION ALL SELECT * FROM adopted) q, batch
), bodies AS (
    INSERT INTO webhook_bodies
        (source, event_id, body, headers, key_id, body_nonce, sealed_headers, headers_nonce,
         sealed_subject, subject_nonce, subject_digest)
    SELECT input.source, input.event_id, input.body, input.headers, input.key_id,
        input.body_nonce, input.sealed_headers, input.headers_nonce, input.sealed_subject,
        input.subject_nonce, input.subject_digest
    FROM queued JOIN input USING (place)
    ", $leftovers, "
), routes AS (
    INSERT INTO webhook_routes
        (source, event_id, processor, event_type, object_id, arrival, received_at, attempts,
         next_attempt_at)
    SELECT queued.source, queued.event_id, r.processor, queued.event_type, queued.object_id,
        queued.arrival, queued.received_at, 0, now()
    FROM unnest($10::int8[], $11::text[]) AS r(place, processor)
    JOIN queued USING (place)
    ", $leftovers, "
)
SELECT source, event_id, pg_notify('webhook_events', '')::text FROM queued")
    };
}

/// A batch's statement: its events' bodies and routes are new rows (a plain insert: no
/// speculative insertion, a WAL record and an index probe fewer a row), as every event it
/// queues is new or an adopted claim, and neither has any. A row left by hand (a body or
/// route whose event was deleted outside the crate) fails the batch, which is then
/// retried one accept at a time with [`ACCEPT_ONE`].
pub(super) const ACCEPT_MANY: &str = accept_many!("");

/// [`ACCEPT_MANY`] for one accept, and for a batch's accepts one by one: a body or route
/// already there is left as it is.
pub(super) const ACCEPT_ONE: &str = accept_many!("ON CONFLICT DO NOTHING");

/// The inbox accepts: for a key given twice in a batch, the first is new. One accept
/// alone, and each of a batch the server refused (a value one of them carries, or a row
/// left by hand), runs [`ACCEPT_ONE`] by itself.
pub(super) async fn accept_many(
    db: &impl Runs,
    accepts: Vec<&Delivery>,
) -> Vec<Result<Accepted, StoreError>> {
    if accepts.len() > 1 {
        match insert_accepts(db, &accepts, ACCEPT_MANY).await {
            Ok(queued) => return answers(&accepts, queued),
            Err(e) if unavailable(&e) => return all_failed(accepts.len(), "inbox accept", &e),
            Err(_) => {}
        }
    }
    let mut results = Vec::with_capacity(accepts.len());
    for d in accepts {
        let queued = insert_accepts(db, &[d], ACCEPT_ONE).await;
        let queued = queued.map_err(|e| super::super::store_error("inbox accept", e));
        results.push(queued.map(|queued| match queued.is_empty() {
            true => Accepted::Duplicate,
            false => Accepted::New,
        }));
    }
    results
}

/// Each accept's answer from the keys queued: the first of a key is new.
fn answers(
    accepts: &[&Delivery],
    mut queued: HashSet<(String, String)>,
) -> Vec<Result<Accepted, StoreError>> {
    accepts
        .iter()
        .map(|d| {
            let key = (d.source().to_owned(), d.id().to_owned());
            Ok(match queued.remove(&key) {
                true => Accepted::New,
                false => Accepted::Duplicate,
            })
        })
        .collect()
}

/// The accepts' one statement (`sql`: [`ACCEPT_MANY`] or [`ACCEPT_ONE`]): the keys queued.
pub(super) async fn insert_accepts(
    db: &impl Runs,
    accepts: &[&Delivery],
    sql: &'static str,
) -> Result<HashSet<(String, String)>, sqlx::Error> {
    // Each with its place in the batch, the order it came in.
    let mut sorted: Vec<(i64, &Delivery)> = (0..).zip(accepts.iter().copied()).collect();
    sorted.sort_by_key(|(_, d)| (d.source(), d.id()));
    let kinds: Vec<&str> = sorted.iter().map(|(_, d)| d.kind()).collect();
    let headers: Vec<Option<&str>> = sorted.iter().map(|(_, d)| d.audit().headers).collect();
    let places: Vec<i64> = sorted.iter().map(|(place, _)| *place).collect();
    // A route per processor each names, by its place.
    let (route_places, processors): (Vec<i64>, Vec<&str>) = sorted
        .iter()
        .flat_map(|(place, d)| d.routes().iter().map(move |p| (*place, &**p)))
        .unzip();
    let sealed = Sealed::of(sorted.iter().map(|(_, d)| *d));
    let (traceparents, tracestates): (Vec<Option<&str>>, Vec<Option<&str>>) = sorted
        .iter()
        .map(|(_, d)| (d.trace().traceparent(), d.trace().tracestate()))
        .unzip();
    let query = Columns::of(sorted.iter().map(|(_, d)| *d))
        .bind(sqlx::query(sql))
        .bind(kinds)
        .bind(headers)
        .bind(places)
        .bind(route_places)
        .bind(processors)
        .bind(sealed.key_ids)
        .bind(sealed.body_nonces)
        .bind(sealed.headers)
        .bind(sealed.headers_nonces)
        .bind(sealed.subjects)
        .bind(sealed.subject_nonces)
        .bind(sealed.subject_digests)
        .bind(traceparents)
        .bind(tracestates);
    let rows = db.fetch_all(query).await?;
    rows.iter()
        .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
        .collect()
}

/// The sealed parts of a batch's bodies, each array in the batch's order (NULLs for a
/// body in clear).
#[derive(Default)]
struct Sealed<'a> {
    key_ids: Vec<Option<&'a str>>,
    body_nonces: Vec<Option<&'a [u8]>>,
    headers: Vec<Option<&'a [u8]>>,
    headers_nonces: Vec<Option<&'a [u8]>>,
    subjects: Vec<Option<&'a [u8]>>,
    subject_nonces: Vec<Option<&'a [u8]>>,
    subject_digests: Vec<Option<&'a [u8]>>,
}

impl<'a> Sealed<'a> {
    fn of(accepts: impl Iterator<Item = &'a Delivery>) -> Self {
        let mut arrays = Self::default();
        for d in accepts {
            let sealed = d.sealed();
            let headers = sealed.and_then(|s| s.headers.as_ref());
            arrays.key_ids.push(sealed.map(|s| s.key_id.as_str()));
            arrays
                .body_nonces
                .push(sealed.map(|s| s.body_nonce.as_slice()));
            arrays.headers.push(headers.map(|(h, _)| h.as_slice()));
            arrays
                .headers_nonces
                .push(headers.map(|(_, n)| n.as_slice()));
            let subject = sealed.and_then(|s| s.subject.as_ref());
            arrays.subjects.push(subject.map(|(s, _, _)| s.as_slice()));
            let nonce = subject.map(|(_, n, _)| n.as_slice());
            arrays.subject_nonces.push(nonce);
            let digest = subject.map(|(_, _, d)| d.as_slice());
            arrays.subject_digests.push(digest);
        }
        arrays
    }
}
