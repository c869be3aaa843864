//! [`hold`]: run claimed work to its end while renewing the claim, then record how it went.
//!
//! Shared by `DedupeLayer` and `Once` (the inbox's worker runs the same heartbeat on its
//! rows). The caller drives it on a spawned task, so a dropped request never stops work
//! that has started, and its outcome is always recorded:
//!
//! - while the work runs, the lease is renewed every third of its length (fenced by the
//!   token), up to [`Lease::max_run`]; a renewal that is refused means the claim was lost;
//! - success: the key is completed, retried until the lease would end (completing is
//!   idempotent under the token, so a lost acknowledgement is not mistaken for fencing);
//! - failure: the claim is released so the next attempt runs;
//! - a panic unwinds through here: the guard releases the claim as it drops.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use super::{ClaimGuard, Completed, Renewed, StoreError};

/// How long a claim holds, and for how long a running attempt keeps renewing it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Lease {
    /// Each claim or renewal holds the key this long.
    pub(crate) length: Duration,
    /// Renewals stop once the work has run this long: the lease then runs out, and a
    /// retry may take the key over (the run is reported as having lost its claim).
    pub(crate) max_run: Duration,
}

/// How the claim ended.
#[derive(Debug)]
pub(crate) enum Held {
    /// The work succeeded and the key is done.
    Done,
    /// The work failed; the claim was released (or will free itself with its lease).
    Released,
    /// The work succeeded, but the claim was no longer this attempt's when it was
    /// recorded (its lease ran out: the store was out of reach longer than the lease, or
    /// the work ran past `max_run`). Another attempt may have run too.
    Lost,
    /// The work succeeded, but the store could not hear it before the lease would end:
    /// the key frees itself when the lease runs out.
    Unrecorded(StoreError),
}

/// Runs `work` while renewing `guard`'s claim, then completes the key if `succeeded`
/// says so, or releases it.
pub(crate) async fn hold<F: Future>(
    guard: ClaimGuard,
    lease: Lease,
    work: F,
    succeeded: impl FnOnce(&F::Output) -> bool,
) -> (F::Output, Held) {
    // The lease counts from when the claim was sent, not from when it was answered.
    let started = Instant::from_std(guard.sent());
    // The end of the lease as far as this attempt knows (ms after `started`).
    let lease_ends_ms = AtomicU64::new(millis(lease.length));
    let lost = AtomicBool::new(false);
    let heartbeat = async {
        let every = lease.length / 3;
        // Each beat a third of a lease after the previous claim or renewal was sent.
        let mut last_sent = started;
        loop {
            tokio::time::sleep_until(last_sent + every).await;
            if started.elapsed() >= lease.max_run || lost.load(Ordering::Relaxed) {
                std::future::pending::<()>().await;
            }
            last_sent = Instant::now();
            let sent = last_sent - started;
            match guard.renew(lease.length).await {
                Ok(Renewed::Held) => {
                    lease_ends_ms.store(millis(sent + lease.length), Ordering::Relaxed);
                }
                Ok(Renewed::Fenced) => lost.store(true, Ordering::Relaxed),
                // Unreachable for now: try again at the next beat, while the lease lasts.
                Err(_error) => {
                    #[cfg(feature = "tracing")]
                    tracing::warn!(target: "tower_webhook", "could not renew a claim's lease: {_error}");
                }
            }
        }
    };
    let output = tokio::select! {
        biased;
        output = work => output,
        () = heartbeat => unreachable!("the heartbeat never ends"),
    };
    if !succeeded(&output) {
        // A failed release is not the work's outcome: the lease frees the key instead.
        let _ = guard.release().await;
        return (output, Held::Released);
    }
    let lease_ends = started + Duration::from_millis(lease_ends_ms.load(Ordering::Relaxed));
    let held = match complete_until(guard, lease_ends).await {
        Ok(Completed::Done) => Held::Done,
        Ok(Completed::Fenced) => Held::Lost,
        Err(error) => Held::Unrecorded(error),
    };
    (output, held)
}

/// Completes the claim, retrying a store that does not answer until `lease_ends` (at
/// least once): after that another attempt may hold the key, and the answer would be
/// `Fenced` anyway.
async fn complete_until(guard: ClaimGuard, lease_ends: Instant) -> Result<Completed, StoreError> {
    let (store, delivery, token) = guard.into_parts();
    let mut wait = Duration::from_millis(50);
    loop {
        match store.complete(delivery.clone(), token).await {
            Ok(completed) => return Ok(completed),
            Err(error) if Instant::now() + wait >= lease_ends => return Err(error),
            Err(_) => {
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(1));
            }
        }
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
