//! The fencing token that names one claim.

use std::fmt;

/// A fencing token: it names one claim, so a slow attempt whose lease ran out cannot
/// complete or release a newer attempt's claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Token(uuid::Uuid);

impl Token {
    /// A fresh random token.
    #[must_use]
    pub fn new() -> Self {
        Self(uuid::Uuid::new_v4())
    }

    /// The token's UUID, for stores of your own to keep.
    #[must_use]
    pub fn as_uuid(&self) -> uuid::Uuid {
        self.0
    }

    /// A token a store of your own kept as a UUID.
    #[must_use]
    pub fn from_uuid(uuid: uuid::Uuid) -> Self {
        Self(uuid)
    }
}

impl Default for Token {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}
