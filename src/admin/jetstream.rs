//! A JetStream inbox's endpoints: its counts (per processor with fan-out), pauses of
//! every processor or one, and a processor's backfill.

use std::time::SystemTime;

use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{Query, State};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::Value;

use super::AdminError;
use crate::inbox::jetstream::JetStream;
use crate::inbox::Pause;

pub(super) fn router(jetstream: JetStream) -> Router {
    Router::new()
        .route("/counts", get(counts))
        .route("/pause", post(pause))
        .route("/resume", post(resume))
        .route("/pauses", get(pauses))
        .route("/backfill", post(backfill))
        .fallback(|| async { AdminError::not_found("no such endpoint") })
        .method_not_allowed_fallback(|| async { AdminError::method_not_allowed() })
        .with_state(jetstream)
}

/// `GET /counts`: the sum over the processors, and with more than one, `"processors"`:
/// each one's counts by name.
async fn counts(State(jetstream): State<JetStream>) -> Result<Json<Value>, AdminError> {
    let by = jetstream.counts_by_processor();
    Ok(Json(super::counts::answer(
        by.await.map_err(AdminError::store)?,
    )))
}

/// `POST /pause` and `POST /resume`: `?source=…&type=…&processor=…`, each optional
/// (absent: any source, any type, every processor).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PauseQuery {
    source: Option<String>,
    #[serde(rename = "type")]
    event_type: Option<String>,
    processor: Option<String>,
}

#[derive(serde::Serialize)]
struct Changed {
    changed: bool,
}

async fn pause(
    State(jetstream): State<JetStream>,
    query: Result<Query<PauseQuery>, QueryRejection>,
) -> Result<Json<Changed>, AdminError> {
    set_paused(&jetstream, query, true).await
}

async fn resume(
    State(jetstream): State<JetStream>,
    query: Result<Query<PauseQuery>, QueryRejection>,
) -> Result<Json<Changed>, AdminError> {
    set_paused(&jetstream, query, false).await
}

/// Pauses (`true`) or resumes what the query names; a processor not configured is a 400.
async fn set_paused(
    jetstream: &JetStream,
    query: Result<Query<PauseQuery>, QueryRejection>,
    paused: bool,
) -> Result<Json<Changed>, AdminError> {
    let Query(query) = query.map_err(|_| {
        AdminError::bad_request(
            "the query takes source, type and processor, once each, all optional",
        )
    })?;
    let (source, event_type) = (query.source.as_deref(), query.event_type.as_deref());
    let changed = match (query.processor.as_deref(), paused) {
        (None, true) => jetstream.pause(source, event_type).await,
        (None, false) => jetstream.resume(source, event_type).await,
        (Some(p), true) => jetstream.pause_processor(p, source, event_type).await,
        (Some(p), false) => jetstream.resume_processor(p, source, event_type).await,
    };
    Ok(Json(Changed {
        changed: changed.map_err(AdminError::store)?,
    }))
}

async fn pauses(State(jetstream): State<JetStream>) -> Result<Json<Vec<Pause>>, AdminError> {
    jetstream
        .pauses()
        .await
        .map(Json)
        .map_err(AdminError::store)
}

/// `POST /backfill`: `{"processor": name, "received_from"?, "received_before"?}` (RFC 3339).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BackfillBody {
    processor: String,
    received_from: Option<String>,
    received_before: Option<String>,
}

#[derive(serde::Serialize)]
struct Created {
    created: u64,
}

async fn backfill(
    State(jetstream): State<JetStream>,
    body: Result<Json<BackfillBody>, JsonRejection>,
) -> Result<Json<Created>, AdminError> {
    let Json(body) = body.map_err(|rejection| match rejection {
        JsonRejection::MissingJsonContentType(_) => {
            AdminError::bad_request("the body is JSON, sent as Content-Type: application/json")
        }
        _ => AdminError::bad_request(
            "the body is a JSON object of processor, received_from, received_before",
        ),
    })?;
    let from = body.received_from.as_deref().map(time).transpose()?;
    let before = body.received_before.as_deref().map(time).transpose()?;
    if let (Some(from), Some(before)) = (from, before) {
        if from >= before {
            return Err(AdminError::bad_request(
                "received_from must be before received_before",
            ));
        }
    }
    let created = jetstream.backfill(&body.processor, from, before).await;
    let created = created.map_err(AdminError::store)?;
    Ok(Json(Created { created }))
}

/// An RFC 3339 time (`2026-12-01T09:30:00Z`).
fn time(text: &str) -> Result<SystemTime, AdminError> {
    time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
        .map(SystemTime::from)
        .map_err(|_| {
            AdminError::bad_request("received_from and received_before are RFC 3339 times")
        })
}
