//! The endpoints: each one inbox call, its answer as JSON.

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::routing::{get, post};
use axum::{Json, Router};

use super::input::{ListQuery, ProcessedQuery, RequeueBody};
use super::pause::{self, counts};
use super::AdminError;
use crate::inbox::json::PerMinute;
use crate::inbox::{Inbox, Page, StoredEvent};

pub(super) fn router(inbox: Inbox) -> Router {
    let routes = Router::new()
        .route("/counts", get(counts::<Inbox>))
        .route("/events", get(list))
        .route("/events/{source}/{id}", get(event))
        .route("/processed", get(processed))
        .route("/requeue", post(requeue));
    pause::routes(routes).with_state(inbox)
}

async fn list(
    State(inbox): State<Inbox>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<Page>, AdminError> {
    let Query(query) = query.map_err(|_| {
        AdminError::bad_request("the query takes state, order, limit and after, once each")
    })?;
    let listing = query.listing()?;
    inbox
        .list(&listing)
        .await
        .map(Json)
        .map_err(AdminError::store)
}

async fn event(
    State(inbox): State<Inbox>,
    key: Result<Path<(String, String)>, PathRejection>,
) -> Result<Json<StoredEvent>, AdminError> {
    let Path((source, id)) =
        key.map_err(|_| AdminError::bad_request("the path is /events/{source}/{id}, UTF-8"))?;
    match inbox.event(&source, &id).await {
        Ok(Some(event)) => Ok(Json(event)),
        Ok(None) => Err(AdminError::not_found("no such event")),
        Err(e) => Err(AdminError::store(e)),
    }
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

#[derive(serde::Serialize)]
struct Requeued {
    requeued: u64,
}

async fn requeue(
    State(inbox): State<Inbox>,
    body: Result<Json<RequeueBody>, JsonRejection>,
) -> Result<Json<Requeued>, AdminError> {
    let Json(body) = body.map_err(|rejection| match rejection {
        JsonRejection::MissingJsonContentType(_) => {
            AdminError::bad_request("the body is JSON, sent as Content-Type: application/json")
        }
        _ => AdminError::bad_request(
            "the body is a JSON object of source, id, dead, type, received_from, received_before, all",
        ),
    })?;
    let which = body.requeue()?;
    inbox
        .requeue(which)
        .await
        .map(|requeued| Json(Requeued { requeued }))
        .map_err(AdminError::store)
}
