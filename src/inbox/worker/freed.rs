//! An event's hold on one of the worker's processors: given back when its processor ends,
//! lent out while it waits for its turns under the caps (within the lookahead), taken
//! again before it runs.

use std::sync::Arc;

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

/// What an event's processor goes back to: the worker's processors, and the claim loop to
/// tell.
#[derive(Clone)]
pub(super) struct Freeing {
    pub(super) processors: Arc<Semaphore>,
    pub(super) told: Arc<Notify>,
}

/// An event's hold on a processor, given back (and the claim loop told) when its processor
/// ends — or when its task is stopped; and, where the queue cannot leave a capped event,
/// its place in the lookahead, reserved by its claim.
pub(super) struct Freed {
    pub(super) processor: Option<OwnedSemaphorePermit>,
    pub(super) place: Option<OwnedSemaphorePermit>,
    pub(super) freeing: Freeing,
}

impl Freed {
    pub(super) fn free(&mut self) {
        if self.processor.take().is_some() {
            self.freeing.told.notify_one();
        }
    }

    /// Gives the processor back while the event waits for its turns, where its claim
    /// reserved it a place in the lookahead (else it keeps the processor). A place per
    /// claimed event means no event ever waits for its turns holding a processor: the
    /// processors are the running events', which end.
    pub(super) fn lend(&mut self) -> bool {
        let lent = self.place.is_some();
        if lent {
            self.free();
        }
        lent
    }

    /// Takes a processor again (before the claims the loop would send: the semaphore is
    /// fair), then leaves the lookahead.
    pub(super) async fn take_back(&mut self) {
        let processors = self.freeing.processors.clone();
        self.processor = Some(processors.acquire_owned().await.expect("never closed"));
        self.place = None;
    }

    /// Leaves the lookahead: the event has its turns.
    pub(super) fn placed(&mut self) {
        self.place = None;
    }
}

impl Drop for Freed {
    fn drop(&mut self) {
        self.free();
    }
}
