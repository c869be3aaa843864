//! [`AdminError`]: what an admin endpoint answers when it cannot do what was asked.

use std::fmt;
use std::sync::Arc;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::store::{StoreError, StoreErrorKind};

/// Why an admin request failed. The response is `{"error": "<a fixed short message>"}`
/// with the kind's status; this value rides in its extensions (for an outer layer's
/// logs), with the store's error as its `source()` when the database failed. Nothing of
/// the database's own text reaches the body.
#[derive(Clone)]
pub struct AdminError {
    kind: AdminErrorKind,
    message: &'static str,
    source: Option<Arc<StoreError>>,
}

/// The kinds of [`AdminError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AdminErrorKind {
    /// A query parameter, path segment or body that does not parse or is out of range:
    /// 400.
    BadRequest,
    /// No operator token, or a wrong one (the [`OperatorDoor`](super::OperatorDoor)'s
    /// bearer check): 401.
    Unauthorized,
    /// Too many wrong tokens from this client lately: 429, with `Retry-After`.
    TooManyRequests,
    /// A form posted from another site (the operator's page refuses cross-site
    /// requests): 403.
    Forbidden,
    /// No such event, or no such endpoint: 404.
    NotFound,
    /// The inbox is not in a state to do it (a rekey of an inbox without keys): 409.
    Conflict,
    /// An endpoint asked with a method it does not answer: 405.
    MethodNotAllowed,
    /// The database did not answer: 503 (try again).
    Unavailable,
    /// The database answered with a failure that trying again is not known to fix (a
    /// statement it refused, a row that does not decode): 500.
    Internal,
}

impl AdminError {
    pub(super) fn bad_request(message: &'static str) -> Self {
        Self {
            kind: AdminErrorKind::BadRequest,
            message,
            source: None,
        }
    }

    /// A failure of the router's own, not the database's: 500.
    #[cfg_attr(not(any(feature = "sqlite", feature = "postgres")), allow(dead_code))] // the SQL router's
    pub(super) fn internal(message: &'static str) -> Self {
        Self {
            kind: AdminErrorKind::Internal,
            message,
            source: None,
        }
    }

    pub(super) fn not_found(message: &'static str) -> Self {
        Self {
            kind: AdminErrorKind::NotFound,
            message,
            source: None,
        }
    }

    #[cfg(feature = "admin-ui")]
    pub(super) fn forbidden(message: &'static str) -> Self {
        Self {
            kind: AdminErrorKind::Forbidden,
            message,
            source: None,
        }
    }

    #[cfg(all(feature = "seal", any(feature = "sqlite", feature = "postgres")))]
    pub(super) fn conflict(message: &'static str) -> Self {
        Self {
            kind: AdminErrorKind::Conflict,
            message,
            source: None,
        }
    }

    pub(super) fn unauthorized(message: &'static str) -> Self {
        Self {
            kind: AdminErrorKind::Unauthorized,
            message,
            source: None,
        }
    }

    pub(super) fn too_many_requests() -> Self {
        Self {
            kind: AdminErrorKind::TooManyRequests,
            message: "too many wrong tokens from this address: try again after Retry-After seconds",
            source: None,
        }
    }

    pub(super) fn method_not_allowed() -> Self {
        Self {
            kind: AdminErrorKind::MethodNotAllowed,
            message: "method not allowed",
            source: None,
        }
    }

    /// The database failed: logged (feature `tracing`) with its cause, answered by its
    /// kind — 503 when it could not be used now, 400 when it refused the input, else 500.
    pub(super) fn store(error: StoreError) -> Self {
        #[cfg(feature = "tracing")]
        tracing::error!(
            target: "tower_webhook",
            "admin: the inbox's database failed: {error}: {:?}",
            std::error::Error::source(&error)
        );
        let (kind, message) = match error.kind() {
            StoreErrorKind::InvalidInput => (
                AdminErrorKind::BadRequest,
                "the inbox's database refused the input",
            ),
            StoreErrorKind::Unavailable => (
                AdminErrorKind::Unavailable,
                "the inbox's database is unavailable",
            ),
            _ => (AdminErrorKind::Internal, "the inbox's database failed"),
        };
        Self {
            kind,
            message,
            source: Some(Arc::new(error)),
        }
    }

    /// What kind of failure this is.
    #[must_use]
    pub fn kind(&self) -> AdminErrorKind {
        self.kind
    }

    /// The response's status.
    #[must_use]
    pub fn status(&self) -> StatusCode {
        match self.kind {
            AdminErrorKind::BadRequest => StatusCode::BAD_REQUEST,
            AdminErrorKind::Unauthorized => StatusCode::UNAUTHORIZED,
            AdminErrorKind::TooManyRequests => StatusCode::TOO_MANY_REQUESTS,
            AdminErrorKind::Forbidden => StatusCode::FORBIDDEN,
            AdminErrorKind::NotFound => StatusCode::NOT_FOUND,
            AdminErrorKind::Conflict => StatusCode::CONFLICT,
            AdminErrorKind::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            AdminErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            AdminErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl fmt::Display for AdminError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message)
    }
}

impl fmt::Debug for AdminError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdminError")
            .field("kind", &self.kind)
            .field("message", &self.message)
            .field("source", &self.source)
            .finish()
    }
}

impl std::error::Error for AdminError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

impl IntoResponse for AdminError {
    fn into_response(self) -> Response {
        #[derive(serde::Serialize)]
        struct Body {
            error: &'static str,
        }
        let mut response = (
            self.status(),
            Json(Body {
                error: self.message,
            }),
        )
            .into_response();
        response.extensions_mut().insert(self);
        response
    }
}
