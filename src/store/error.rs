//! Why a store could not do what was asked.

use std::fmt;

/// A store that could not do what was asked: unreachable, timed out, refusing the input,
/// or failing otherwise; [`kind`](Self::kind) says which.
///
/// `Display` says which operation failed; the cause (a driver error) is the `source()`.
/// Neither goes into a response body.
///
/// A store of your own builds its errors with [`new`](Self::new) or
/// [`message`](Self::message), which mean [`StoreErrorKind::Unavailable`] (the layers
/// answer 503 and the provider retries), and [`with_kind`](Self::with_kind) for another
/// kind:
///
/// ```
/// use tower_webhook::store::{StoreError, StoreErrorKind};
///
/// let down = StoreError::new("claim", "connection refused");
/// assert_eq!(down.kind(), StoreErrorKind::Unavailable);
///
/// let refused = StoreError::message("claim: an id longer than 255 bytes")
///     .with_kind(StoreErrorKind::InvalidInput);
/// assert_eq!(refused.kind(), StoreErrorKind::InvalidInput);
/// ```
#[derive(Debug)]
pub struct StoreError {
    kind: StoreErrorKind,
    context: &'static str,
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

/// The kinds of [`StoreError`]: what a caller branches on.
///
/// A lost lease is not an error: it is an answer ([`Renewed::Fenced`](super::Renewed::Fenced),
/// [`Completed::Fenced`](super::Completed::Fenced)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StoreErrorKind {
    /// The store could not be reached, timed out, was busy, locked or full, or is shutting
    /// down: trying again later may work. `DedupeLayer` and the inbox's accept service
    /// answer 503 with `Retry-After`.
    Unavailable,
    /// The store refused the input before trying: an event id, a name or a URL that does
    /// not validate (the built-in stores refuse a source or an event id longer than
    /// 1 KiB, or holding a NUL byte). Trying again with the same input fails again. The layers answer 500
    /// (the delivery was verified: the fault is the receiver's); the admin router 400; the
    /// command exits 2.
    InvalidInput,
    /// The store answered, but the operation failed otherwise: a statement the database
    /// refused, a row that does not decode, a migration that does not apply, a server
    /// configured in a way the store refuses. Not known to pass by itself; the layers still
    /// answer 503 (the provider retries, perhaps after the operator fixed it).
    Other,
}

impl StoreError {
    /// An error of `context` (such as `"claim"`) caused by `source`, of kind
    /// [`Unavailable`](StoreErrorKind::Unavailable): for stores of your own.
    pub fn new(
        context: &'static str,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Self {
            kind: StoreErrorKind::Unavailable,
            context,
            source: Some(source.into()),
        }
    }

    /// An error of `context` with no underlying cause, of kind
    /// [`Unavailable`](StoreErrorKind::Unavailable): for stores of your own.
    #[must_use]
    pub fn message(context: &'static str) -> Self {
        Self {
            kind: StoreErrorKind::Unavailable,
            context,
            source: None,
        }
    }

    /// The same error, of kind `kind`.
    #[must_use]
    pub fn with_kind(mut self, kind: StoreErrorKind) -> Self {
        self.kind = kind;
        self
    }

    /// What kind of failure this is.
    #[must_use]
    pub fn kind(&self) -> StoreErrorKind {
        self.kind
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.context)
    }
}

impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}
