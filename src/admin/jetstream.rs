//! A JetStream inbox's endpoints: its counts (per processor with fan-out) and pauses of
//! every processor or one, as the SQL inbox's (`pause.rs`), and a processor's backfill.

use super::backfill::{BackfillBody, Created};
use super::AdminError;
use crate::inbox::jetstream::JetStream;
use axum::extract::rejection::JsonRejection;
use axum::extract::State;
use axum::routing::{get, post};
use axum::{Json, Router};

pub(super) fn router(jetstream: JetStream) -> Router {
    let routes = Router::new()
        .route("/counts", get(super::pause::counts::<JetStream>))
        .route("/backfill", post(backfill));
    super::pause::routes(routes).with_state(jetstream)
}

/// `POST /backfill`: `{"processor": name, "received_from"?, "received_before"?}` (RFC 3339).
async fn backfill(
    State(jetstream): State<JetStream>,
    body: Result<Json<BackfillBody>, JsonRejection>,
) -> Result<Json<Created>, AdminError> {
    let (processor, from, before) = super::backfill::read(body)?;
    let created = jetstream.backfill(&processor, from, before).await;
    let created = created.map_err(AdminError::store)?;
    Ok(Json(Created { created }))
}
