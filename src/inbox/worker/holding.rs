//! The events a worker holds, from the start of their run until their outcome is written:
//! its own claims leave them (a lease that ran out while an outcome waited, or past the
//! max run time, must not start the event a second time in the worker still holding it).

use std::collections::HashSet;
use std::sync::Mutex;

use crate::Event;

/// The keys (source, stored id) of the events held.
#[derive(Default)]
pub(crate) struct Holding(Mutex<HashSet<(String, String)>>);

/// One event held: let go as it drops (its outcome written, or its task stopped).
pub(super) struct Hold<'a> {
    holding: &'a Holding,
    key: (String, String),
}

impl Holding {
    pub(super) fn hold(&self, event: &Event) -> Hold<'_> {
        let key = (event.source().to_owned(), event.stored_id().to_owned());
        self.keys().insert(key.clone());
        Hold { holding: self, key }
    }

    /// The keys held now, for a claim to leave.
    pub(super) fn held(&self) -> Vec<(String, String)> {
        self.keys().iter().cloned().collect()
    }

    fn keys(&self) -> std::sync::MutexGuard<'_, HashSet<(String, String)>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for Hold<'_> {
    fn drop(&mut self) {
        self.holding.keys().remove(&self.key);
    }
}
