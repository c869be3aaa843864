//! What a dedupe store asks its dialect about its keys: one question, [`KeyOp`], written
//! once here and answered by each dialect its own way (`claims.rs` of each).

use std::time::Duration;

use crate::store::{Claim, Delivery, Token};

/// An operation on the table's keys, for `PgStore` and `SqliteStore`.
pub(crate) enum KeyOp {
    /// Claims the delivery for an attempt under the token for the lease: a new row, or one
    /// released or expired taken over; else done, or in flight (for how much longer).
    Claim(Delivery, Token, Duration),
    /// Extends the lease if the token still holds the claim (or, on SQLite, the inbox
    /// adopted it): [`Keyed::Held`], `false` when fenced out.
    Renew(Delivery, Token, Duration),
    /// Marks the row done if the token holds it (or already did this, or the inbox adopted
    /// it): [`Keyed::Held`], `false` when fenced.
    Complete(Delivery, Token),
    /// Gives the claim back, so the provider's retry runs.
    Release(Delivery, Token),
    /// Deletes event keys done, or released and never finished, before this long ago.
    Prune(Duration),
    /// Deletes the business and kept keys of a namespace done before this long ago.
    PruneOnce(String, Duration),
}

/// A [`KeyOp`]'s answer.
pub(crate) enum Keyed {
    Claim(Claim),
    /// Held, done or released (`false`: fenced out).
    Held(bool),
    /// How many rows a prune deleted.
    Count(u64),
}

impl Keyed {
    pub(crate) fn claim(self) -> Claim {
        match self {
            Keyed::Claim(claim) => claim,
            _ => unreachable!("a claim's answer"),
        }
    }

    pub(crate) fn held(self) -> bool {
        match self {
            Keyed::Held(held) => held,
            _ => unreachable!("a yes or no"),
        }
    }

    pub(crate) fn count(self) -> u64 {
        match self {
            Keyed::Count(n) => n,
            _ => unreachable!("a count"),
        }
    }
}
