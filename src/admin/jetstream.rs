//! A JetStream inbox's endpoints: its counts (per processor with fan-out) and pauses of
//! every processor or one, as the SQL inbox's (`pause.rs`), a processor's backfill, and
//! (feature `schemas`) its invalid events listed and checked again.

use super::backfill::{BackfillBody, Created};
use super::AdminError;
use crate::inbox::jetstream::JetStream;
use axum::extract::rejection::JsonRejection;
use axum::extract::State;
use axum::routing::{get, post};
use axum::{Json, Router};

pub(super) fn router(jetstream: JetStream) -> Router {
    let routes = Router::new()
        .route("/counts", get(counts))
        .route("/backfill", post(backfill));
    #[cfg(feature = "schemas")]
    let routes = routes
        .route("/events", get(invalid::list))
        .route("/requeue", post(invalid::requeue));
    super::pause::routes(routes).with_state(jetstream)
}

/// `GET /counts`, with `"invalid"` (feature `schemas`): the invalid stream's messages,
/// beside the processors' counts.
async fn counts(jetstream: State<JetStream>) -> Result<Json<serde_json::Value>, AdminError> {
    #[cfg(feature = "schemas")]
    let invalid = (jetstream.invalid_count().await).map_err(AdminError::store)?;
    let answer = super::pause::counts::<JetStream>(jetstream).await?;
    #[cfg(feature = "schemas")]
    let answer = {
        let Json(mut json) = answer;
        json["invalid"] = invalid.into();
        Json(json)
    };
    Ok(answer)
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

/// The invalid stream's endpoints, shaped as the SQL inbox's `state=invalid` listing and
/// `{"invalid": true}` requeue.
#[cfg(feature = "schemas")]
mod invalid {
    use axum::extract::rejection::{JsonRejection, QueryRejection};
    use axum::extract::{Query, State};
    use axum::Json;
    use serde::Deserialize;
    use serde_json::{json, Value};

    use super::AdminError;
    use crate::inbox::jetstream::{InvalidMessage, JetStream, MAX_INVALID_PAGE};

    /// A page's size unless told (the SQL listing's).
    const DEFAULT_LIMIT: usize = 50;

    /// `GET /events?state=invalid&limit=1..1000&after=<next>`.
    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub(super) struct ListQuery {
        state: Option<String>,
        limit: Option<String>,
        after: Option<String>,
    }

    /// `GET /events?state=invalid`: the invalid stream's messages, oldest first, each
    /// row as the SQL inbox's (`state: "invalid"`, `validation_errors`); `next` the
    /// cursor of the following page (`null` on the last).
    pub(super) async fn list(
        State(jetstream): State<JetStream>,
        query: Result<Query<ListQuery>, QueryRejection>,
    ) -> Result<Json<Value>, AdminError> {
        let Query(query) = query.map_err(|_| {
            AdminError::bad_request("the query takes state, limit and after, once each")
        })?;
        if query.state.as_deref() != Some("invalid") {
            return Err(AdminError::bad_request(
                "state must be invalid: a JetStream inbox lists its invalid events only",
            ));
        }
        let limit = match &query.limit {
            None => DEFAULT_LIMIT,
            Some(limit) => limit
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=MAX_INVALID_PAGE).contains(n))
                .ok_or(AdminError::bad_request("limit must be 1 to 1000"))?,
        };
        let after = match &query.after {
            None => None,
            Some(after) => Some(
                (after.parse::<u64>().ok())
                    .ok_or(AdminError::bad_request("after must be a next cursor"))?,
            ),
        };
        let page = jetstream.list_invalid(after, limit).await;
        let page = page.map_err(AdminError::store)?;
        let events: Vec<Value> = page.messages.iter().map(row).collect();
        let next = page.next.map(|n| n.to_string());
        Ok(Json(json!({"events": events, "next": next})))
    }

    /// The SQL listing's row of an invalid event: no attempts, nothing due, no error but
    /// its schema's.
    fn row(message: &InvalidMessage) -> Value {
        let errors: Vec<Value> = (message.validation_errors.iter())
            .map(|e| json!({"path": e.path(), "message": e.message()}))
            .collect();
        json!({
            "source": message.source,
            "id": message.id,
            "type": message.event_type,
            "object_id": message.object_id,
            "state": "invalid",
            "attempts": 0,
            "received_at": crate::inbox::json::rfc3339(message.received_at),
            "next_attempt_at": null,
            "dead_at": null,
            "last_error": null,
            "validation_errors": errors,
        })
    }

    /// `POST /requeue`: `{"invalid": true}` alone.
    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub(super) struct RequeueBody {
        #[serde(default)]
        invalid: bool,
    }

    /// `POST /requeue {"invalid": true}`: the invalid messages checked again against the
    /// schemas now ([`JetStream::requeue_invalid`]): `{"requeued": n, "still_invalid": m}`.
    pub(super) async fn requeue(
        State(jetstream): State<JetStream>,
        body: Result<Json<RequeueBody>, JsonRejection>,
    ) -> Result<Json<Value>, AdminError> {
        let Json(body) = body.map_err(|rejection| match rejection {
            JsonRejection::MissingJsonContentType(_) => {
                AdminError::bad_request("the body is JSON, sent as Content-Type: application/json")
            }
            _ => AdminError::bad_request(
                "a JetStream inbox requeues its invalid events only: {\"invalid\": true}",
            ),
        })?;
        if !body.invalid {
            return Err(AdminError::bad_request(
                "a JetStream inbox requeues its invalid events only: {\"invalid\": true}",
            ));
        }
        let done = jetstream.requeue_invalid().await;
        let done = done.map_err(AdminError::store)?;
        Ok(Json(
            json!({"requeued": done.queued, "still_invalid": done.still_invalid}),
        ))
    }
}
