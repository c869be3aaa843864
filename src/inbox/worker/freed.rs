//! An event's hold on one of the worker's processors: given back when its processor ends,
//! lent out while it waits for its turns under the caps (within the lookahead), taken
//! again before it runs.

use std::sync::Arc;

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

/// What an event's processor goes back to: the worker's processors, the lookahead's
/// places, and the claim loop to tell.
#[derive(Clone)]
pub(super) struct Freeing {
    pub(super) processors: Arc<Semaphore>,
    pub(super) waiting: Arc<Semaphore>,
    pub(super) told: Arc<Notify>,
}

/// An event's hold on a processor, given back (and the claim loop told) when its processor
/// ends — or when its task is stopped.
pub(super) struct Freed(pub(super) Option<OwnedSemaphorePermit>, pub(super) Freeing);

impl Freed {
    pub(super) fn free(&mut self) {
        if self.0.take().is_some() {
            self.1.told.notify_one();
        }
    }

    /// Gives the processor back while the event waits for its turns, if the lookahead has
    /// a place for it (else it keeps the processor): the place, held until it has one again.
    pub(super) fn lend(&mut self) -> Option<OwnedSemaphorePermit> {
        let place = self.1.waiting.clone().try_acquire_owned().ok()?;
        self.free();
        Some(place)
    }

    /// Takes a processor again (before the claims the loop would send: the semaphore is
    /// fair), then leaves the lookahead's place.
    pub(super) async fn take_back(&mut self, place: OwnedSemaphorePermit) {
        let processors = self.1.processors.clone();
        self.0 = Some(processors.acquire_owned().await.expect("never closed"));
        drop(place);
    }
}

impl Drop for Freed {
    fn drop(&mut self) {
        self.free();
    }
}
