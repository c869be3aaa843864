//! `POST /rekey` (feature `seal`): `{"batch"?: 1..10000}` → `{"rekeyed": n, "unreadable":
//! m}` ([`Inbox::rekey`]); 409 when the inbox has no keys, so a receiver started without
//! `WEBHOOK_ENCRYPTION_KEYS` says so rather than answering "nothing to do".

use axum::extract::rejection::JsonRejection;
use axum::extract::State;
use axum::Json;
use serde::Deserialize;

use super::AdminError;
use crate::inbox::{Inbox, Rekeyed, REKEY_BATCH};

/// The largest batch: rows read, sealed again and written in one transaction.
const MAX_BATCH: usize = 10_000;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RekeyBody {
    batch: Option<usize>,
}

#[derive(serde::Serialize)]
pub(super) struct Answer {
    rekeyed: u64,
    unreadable: u64,
}

pub(super) async fn rekey(
    State(inbox): State<Inbox>,
    body: Result<Json<RekeyBody>, JsonRejection>,
) -> Result<Json<Answer>, AdminError> {
    let Json(body) = body.map_err(|rejection| match rejection {
        JsonRejection::MissingJsonContentType(_) => {
            AdminError::bad_request("the body is JSON, sent as Content-Type: application/json")
        }
        _ => AdminError::bad_request("the body is a JSON object of batch, or {}"),
    })?;
    let batch = body.batch.unwrap_or(REKEY_BATCH);
    if !(1..=MAX_BATCH).contains(&batch) {
        return Err(AdminError::bad_request("batch must be 1 to 10000"));
    }
    if inbox.keys().is_none() {
        return Err(AdminError::conflict(
            "the inbox has no encryption keys: set WEBHOOK_ENCRYPTION_KEYS (Inbox::with_keys)",
        ));
    }
    let Rekeyed {
        rekeyed,
        unreadable,
        ..
    } = inbox.rekey(batch).await.map_err(AdminError::store)?;
    Ok(Json(Answer {
        rekeyed,
        unreadable,
    }))
}
