//! A JetStream inbox's endpoints: its counts (per processor with fan-out) and pauses of
//! every processor or one, as the SQL inbox's (`pause.rs`), and a processor's backfill.

use std::time::SystemTime;

use axum::extract::rejection::JsonRejection;
use axum::extract::State;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;

use super::AdminError;
use crate::inbox::jetstream::JetStream;

pub(super) fn router(jetstream: JetStream) -> Router {
    let routes = Router::new()
        .route("/counts", get(super::pause::counts::<JetStream>))
        .route("/backfill", post(backfill));
    super::pause::routes(routes).with_state(jetstream)
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
