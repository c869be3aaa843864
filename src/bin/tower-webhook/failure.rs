//! Why the command stopped, and with which exit status.

use std::fmt::Write as _;

use tower_webhook::store::{StoreError, StoreErrorKind};

/// Why the command stopped.
pub(crate) enum Failure {
    /// Usage clap could not check: exit 2.
    Usage(String),
    /// The database could not be opened or failed: exit 1.
    Store(String),
    /// The store refused the input (a database URL that does not parse): exit 2, as
    /// usage, but with the URL's password redacted like a store's error.
    Refused(String),
    /// `show` of an event the inbox does not have: exit 3.
    NotFound,
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        let mut text = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(cause) = source {
            // sqlx's errors repeat their cause in their own text.
            let cause_text = cause.to_string();
            if !text.contains(&cause_text) {
                let _ = write!(text, ": {cause_text}");
            }
            source = cause.source();
        }
        if e.kind() == StoreErrorKind::InvalidInput {
            Failure::Refused(text)
        } else {
            Failure::Store(text)
        }
    }
}
