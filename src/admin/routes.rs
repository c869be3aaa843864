//! The endpoints: each one inbox call, its answer as JSON.

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use serde_json::Value;

use super::backfill::{BackfillBody, Created};
use super::input::{invalid_next, InvalidListing, ListQuery, ProcessedQuery, RequeueBody};
use super::pause::{self, counts};
use super::AdminError;
use crate::inbox::json::PerMinute;
use crate::inbox::{Backfill, Inbox, StoredEvent};

pub(super) fn router(inbox: Inbox) -> Router {
    let routes = Router::new()
        .route("/counts", get(inbox_counts))
        .route("/events", get(list))
        .route("/events/{source}/{id}", get(event))
        .route(
            "/events/{source}/{id}/body",
            delete(super::erasure::erase_body),
        )
        .route("/processed", get(processed))
        .route("/requeue", post(requeue))
        .route("/backfill", post(backfill));
    #[cfg(feature = "seal")]
    let routes = routes
        .route("/rekey", post(super::rekey::rekey))
        .route("/erase", post(super::erasure::erase_subject));
    pause::routes(routes).with_state(inbox)
}

/// `GET /counts`, with `"invalid"`: the events kept invalid (per event, beside the
/// routes' states).
async fn inbox_counts(inbox: State<Inbox>) -> Result<Json<Value>, AdminError> {
    let invalid = inbox.invalid_count().await.map_err(AdminError::store)?;
    let Json(mut json) = counts::<Inbox>(inbox).await?;
    json["invalid"] = invalid.into();
    Ok(Json(json))
}

async fn list(
    State(inbox): State<Inbox>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<Value>, AdminError> {
    let Query(query) = query.map_err(|_| {
        AdminError::bad_request(
            "the query takes state, order, limit, after and processor, once each",
        )
    })?;
    if let Some(invalid) = query.invalid()? {
        return list_invalid(&inbox, invalid).await;
    }
    let listing = query.listing(&inbox)?;
    let page = inbox.list(&listing).await.map_err(AdminError::store)?;
    let mut json = to_json(&page)?;
    if fanned_out(&inbox) {
        // Each row is one processor's route: say whose.
        let rows = json["events"].as_array_mut().into_iter().flatten();
        for (row, event) in rows.zip(&page.events) {
            row["processor"] = event.processor.clone().into();
        }
    }
    Ok(Json(json))
}

/// `GET /events?state=invalid`: each invalid event's row with its `validation_errors`,
/// by source and id; `next` the cursor of the following page (`null` on the last).
async fn list_invalid(inbox: &Inbox, page: InvalidListing) -> Result<Json<Value>, AdminError> {
    let after = page.after.as_ref().map(|(s, i)| (s.as_str(), i.as_str()));
    let mut events =
        (inbox.list_invalid(after, page.limit + 1).await).map_err(AdminError::store)?;
    let next = (events.len() > page.limit).then(|| {
        events.truncate(page.limit);
        let last = &events[page.limit - 1].summary;
        invalid_next(&last.source, &last.id)
    });
    let mut rows = Vec::with_capacity(events.len());
    for event in &events {
        let mut row = to_json(&event.summary)?;
        row["validation_errors"] = to_json(&event.validation_errors)?;
        rows.push(row);
    }
    Ok(Json(serde_json::json!({"events": rows, "next": next})))
}

/// With more than one processor, answers name them (with one, they are as before fan-out).
fn fanned_out(inbox: &Inbox) -> bool {
    inbox.processors().nth(1).is_some()
}

fn to_json(answer: &impl serde::Serialize) -> Result<Value, AdminError> {
    serde_json::to_value(answer).map_err(|_| AdminError::internal("the answer did not serialize"))
}

async fn event(
    State(inbox): State<Inbox>,
    key: Result<Path<(String, String)>, PathRejection>,
) -> Result<Json<Value>, AdminError> {
    let Path((source, id)) =
        key.map_err(|_| AdminError::bad_request("the path is /events/{source}/{id}, UTF-8"))?;
    let event = match inbox.event(&source, &id).await {
        Ok(Some(event)) => event,
        Ok(None) => return Err(AdminError::not_found("no such event")),
        Err(e) => return Err(AdminError::store(e)),
    };
    let mut json = to_json(&event)?;
    if fanned_out(&inbox) {
        with_routes(&mut json, &event)?;
    }
    Ok(Json(json))
}

/// Adds `"routes"` (each processor's route) and each attempt's `"processor"`.
fn with_routes(json: &mut Value, event: &StoredEvent) -> Result<(), AdminError> {
    json["routes"] = to_json(&event.routes)?;
    let history = json["history"].as_array_mut().into_iter().flatten();
    for (entry, attempt) in history.zip(&event.attempts) {
        entry["processor"] = attempt.processor.clone().into();
    }
    Ok(())
}

async fn processed(
    State(inbox): State<Inbox>,
    query: Result<Query<ProcessedQuery>, QueryRejection>,
) -> Result<Json<PerMinute>, AdminError> {
    let Query(query) =
        query.map_err(|_| AdminError::bad_request("the query takes minutes, once"))?;
    let minutes = query.minutes()?;
    inbox
        .processed_per_minute(minutes)
        .await
        .map(|counts| Json(PerMinute(counts)))
        .map_err(AdminError::store)
}

/// `{"requeued": n, "without_body": m}`: `m` matching rows left out, their event's body
/// gone (expired, erased).
#[derive(serde::Serialize)]
struct Requeued {
    requeued: u64,
    without_body: u64,
}

async fn requeue(
    State(inbox): State<Inbox>,
    body: Result<Json<RequeueBody>, JsonRejection>,
) -> Result<Json<Value>, AdminError> {
    let Json(body) = body.map_err(|rejection| match rejection {
        JsonRejection::MissingJsonContentType(_) => {
            AdminError::bad_request("the body is JSON, sent as Content-Type: application/json")
        }
        _ => AdminError::bad_request(
            "the body is a JSON object of source, id, dead, type, received_from, received_before, all, processor, invalid",
        ),
    })?;
    if body.invalid()? {
        // Checked again against the schemas the inbox has now.
        let done = inbox.requeue_invalid().await.map_err(AdminError::store)?;
        let answer =
            serde_json::json!({"requeued": done.queued, "still_invalid": done.still_invalid});
        return Ok(Json(answer));
    }
    let which = body.requeue(&inbox)?;
    let done = inbox
        .requeue_counted(which)
        .await
        .map_err(AdminError::store)?;
    to_json(&Requeued {
        requeued: done.requeued,
        without_body: done.without_body,
    })
    .map(Json)
}

/// `POST /backfill`: routes for a processor added later (see [`Inbox::backfill`]); a
/// processor this inbox lacks is a 400.
async fn backfill(
    State(inbox): State<Inbox>,
    body: Result<Json<BackfillBody>, JsonRejection>,
) -> Result<Json<Created>, AdminError> {
    let (processor, from, before) = super::backfill::read(body)?;
    let processor = super::input::processor(&inbox, &processor)?;
    let window = match (from, before) {
        (Some(from), Some(before)) => Backfill::received_between(from, before),
        (Some(from), None) => Backfill::received_since(from),
        (None, Some(before)) => Backfill::received_before(before),
        (None, None) => Backfill::all(),
    };
    let created = inbox.backfill(processor, window).await;
    Ok(Json(Created {
        created: created.map_err(AdminError::store)?,
    }))
}
