//! `DELETE /events/{source}/{id}/body` → `{"erased": true}` ([`Inbox::erase`]; 404 for no
//! such event).

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::Json;

use super::AdminError;
use crate::inbox::Inbox;

#[derive(serde::Serialize)]
pub(super) struct Erased {
    erased: bool,
}

pub(super) async fn erase_body(
    State(inbox): State<Inbox>,
    key: Result<Path<(String, String)>, PathRejection>,
) -> Result<Json<Erased>, AdminError> {
    let Path((source, id)) =
        key.map_err(|_| AdminError::bad_request("the path is /events/{source}/{id}/body, UTF-8"))?;
    match inbox.erase(source, id).await {
        Ok(true) => Ok(Json(Erased { erased: true })),
        Ok(false) => Err(AdminError::not_found("no such event")),
        Err(e) => Err(AdminError::store(e)),
    }
}

/// `POST /erase`'s body: whose events to erase.
#[cfg(feature = "seal")]
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SubjectBody {
    subject: String,
}

/// `{"erased": n}`: how many events of the subject were erased.
#[cfg(feature = "seal")]
#[derive(serde::Serialize)]
pub(super) struct ErasedSubject {
    erased: u64,
}

/// `POST /erase` `{"subject": "…"}` → `{"erased": n}` ([`Inbox::erase_subject`]); 409
/// when the inbox has no keys (no subject is stored without them).
#[cfg(feature = "seal")]
pub(super) async fn erase_subject(
    State(inbox): State<Inbox>,
    body: Result<Json<SubjectBody>, axum::extract::rejection::JsonRejection>,
) -> Result<Json<ErasedSubject>, AdminError> {
    use axum::extract::rejection::JsonRejection;
    let Json(body) = body.map_err(|rejection| match rejection {
        JsonRejection::MissingJsonContentType(_) => {
            AdminError::bad_request("the body is JSON, sent as Content-Type: application/json")
        }
        _ => AdminError::bad_request("the body is a JSON object of subject"),
    })?;
    if body.subject.is_empty() {
        return Err(AdminError::bad_request("subject must not be empty"));
    }
    if inbox.keys().is_none() {
        return Err(AdminError::conflict(
            "the inbox has no encryption keys: subjects are stored only with them (Inbox::with_keys)",
        ));
    }
    let erased = inbox
        .erase_subject(&body.subject)
        .await
        .map_err(AdminError::store)?;
    Ok(Json(ErasedSubject { erased }))
}
