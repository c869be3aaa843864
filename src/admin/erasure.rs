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
