//! The counts and pausing endpoints both routers share (the SQL inbox's and
//! JetStream's), and the fallbacks each ends with.

use std::collections::BTreeMap;
use std::future::Future;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::Value;

use super::AdminError;
use crate::inbox::{Counts, Pause};
use crate::store::StoreError;

/// What the shared endpoints call on a queue.
pub(super) trait Operated: Clone + Send + Sync + 'static {
    fn counts_by_processor(
        &self,
    ) -> impl Future<Output = Result<BTreeMap<String, Counts>, StoreError>> + Send;
    /// Whether the queue has the processor `name`.
    fn has_processor(&self, name: &str) -> bool;
    fn pause(
        &self,
        processor: Option<&str>,
        source: Option<&str>,
        event_type: Option<&str>,
        paused: bool,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;
    fn pauses(&self) -> impl Future<Output = Result<Vec<Pause>, StoreError>> + Send;
}

/// Implements [`Operated`] for a queue whose inherent methods have these names.
macro_rules! operated {
    ($queue:ty) => {
        impl Operated for $queue {
            async fn counts_by_processor(&self) -> Result<BTreeMap<String, Counts>, StoreError> {
                <$queue>::counts_by_processor(self).await
            }
            fn has_processor(&self, name: &str) -> bool {
                <$queue>::has_processor(self, name)
            }
            async fn pause(
                &self,
                processor: Option<&str>,
                source: Option<&str>,
                event_type: Option<&str>,
                paused: bool,
            ) -> Result<bool, StoreError> {
                match (processor, paused) {
                    (None, true) => <$queue>::pause(self, source, event_type).await,
                    (None, false) => <$queue>::resume(self, source, event_type).await,
                    (Some(p), true) => <$queue>::pause_processor(self, p, source, event_type).await,
                    (Some(p), false) => {
                        <$queue>::resume_processor(self, p, source, event_type).await
                    }
                }
            }
            async fn pauses(&self) -> Result<Vec<Pause>, StoreError> {
                <$queue>::pauses(self).await
            }
        }
    };
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
operated!(crate::inbox::Inbox);
#[cfg(feature = "nats")]
operated!(crate::inbox::jetstream::JetStream);

/// `routes` with `/pause`, `/resume` and `/pauses`, and the fallbacks.
pub(super) fn routes<Q: Operated>(routes: Router<Q>) -> Router<Q> {
    routes
        .route("/pause", post(pause::<Q>))
        .route("/resume", post(resume::<Q>))
        .route("/pauses", get(pauses::<Q>))
        .fallback(|| async { AdminError::not_found("no such endpoint") })
        .method_not_allowed_fallback(|| async { AdminError::method_not_allowed() })
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

pub(super) async fn counts<Q: Operated>(State(queue): State<Q>) -> Result<Json<Value>, AdminError> {
    let by = queue
        .counts_by_processor()
        .await
        .map_err(AdminError::store)?;
    let configured = |name: &str| queue.has_processor(name);
    Ok(Json(super::counts::answer(by, configured)))
}

async fn pause<Q: Operated>(
    State(queue): State<Q>,
    query: Result<Query<PauseQuery>, QueryRejection>,
) -> Result<Json<Changed>, AdminError> {
    set_paused(&queue, query, true).await
}

async fn resume<Q: Operated>(
    State(queue): State<Q>,
    query: Result<Query<PauseQuery>, QueryRejection>,
) -> Result<Json<Changed>, AdminError> {
    set_paused(&queue, query, false).await
}

/// Pauses (`true`) or resumes what the query names; a processor the queue does not have
/// is a 400.
async fn set_paused<Q: Operated>(
    queue: &Q,
    query: Result<Query<PauseQuery>, QueryRejection>,
    paused: bool,
) -> Result<Json<Changed>, AdminError> {
    let Query(query) = query.map_err(|_| {
        AdminError::bad_request(
            "the query takes source, type and processor, once each, all optional",
        )
    })?;
    let processor = query.processor.as_deref();
    if processor.is_some_and(|name| !queue.has_processor(name)) {
        return Err(AdminError::bad_request("no such processor"));
    }
    let (source, event_type) = (query.source.as_deref(), query.event_type.as_deref());
    let changed = queue.pause(processor, source, event_type, paused).await;
    Ok(Json(Changed {
        changed: changed.map_err(AdminError::store)?,
    }))
}

async fn pauses<Q: Operated>(State(queue): State<Q>) -> Result<Json<Vec<Pause>>, AdminError> {
    queue.pauses().await.map(Json).map_err(AdminError::store)
}
