//! `POST /backfill`'s body and answer, the SQL inbox's and JetStream's alike:
//! `{"processor": name, "received_from"?, "received_before"?}` (RFC 3339) → `{"created": n}`.

use std::time::SystemTime;

use axum::extract::rejection::JsonRejection;
use axum::Json;
use serde::Deserialize;

use super::AdminError;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct BackfillBody {
    processor: String,
    received_from: Option<String>,
    received_before: Option<String>,
}

#[derive(serde::Serialize)]
pub(super) struct Created {
    pub(super) created: u64,
}

/// The body, checked: the processor named, and the receipt window (`from` before `before`
/// when both are given).
pub(super) fn read(
    body: Result<Json<BackfillBody>, JsonRejection>,
) -> Result<(String, Option<SystemTime>, Option<SystemTime>), AdminError> {
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
    Ok((body.processor, from, before))
}

/// An RFC 3339 time (`2026-12-01T09:30:00Z`).
fn time(text: &str) -> Result<SystemTime, AdminError> {
    time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
        .map(SystemTime::from)
        .map_err(|_| {
            AdminError::bad_request("received_from and received_before are RFC 3339 times")
        })
}
