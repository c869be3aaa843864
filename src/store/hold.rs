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
//! - the renewals go on until the outcome has landed;
//! - stopped by a drain past its bound: the work is dropped and the claim released;
//! - a panic unwinds through here: the guard releases the claim as it drops.

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use super::{ClaimGuard, Completed, Renewed, StoreError};
use crate::drain::{Stopped, RELEASE_WAIT};
use crate::metrics::{self, Operation};
use crate::ConfigError;

/// How long a claim holds, and for how long a running attempt keeps renewing it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Lease {
    /// Each claim or renewal holds the key this long.
    pub(crate) length: Duration,
    /// Renewals stop once the work has run this long: the lease then runs out, and a
    /// retry may take the key over (the run is reported as having lost its claim).
    pub(crate) max_run: Duration,
}

impl Lease {
    /// 60 s, renewed for up to `max_run`.
    pub(crate) fn renewed_for(max_run: Duration) -> Self {
        Self {
            length: Duration::from_secs(60),
            max_run,
        }
    }

    /// `length`, if every store can hold it with room for a renewal's round trip.
    pub(crate) fn checked_length(length: Duration) -> Result<Duration, ConfigError> {
        if (Duration::from_millis(100)..=Duration::from_secs(24 * 3600)).contains(&length) {
            Ok(length)
        } else {
            Err(ConfigError::duration(
                "a lease",
                length,
                "between 100 ms and 1 day",
            ))
        }
    }

    /// `max_run`, if it is at least 1 s.
    pub(crate) fn checked_max_run(max_run: Duration) -> Result<Duration, ConfigError> {
        if max_run < Duration::from_secs(1) {
            return Err(ConfigError::duration(
                "max run time",
                max_run,
                "at least 1 s",
            ));
        }
        Ok(max_run)
    }
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

/// Renews a claim every third of its lease while work runs, up to the max run time.
pub(crate) struct Heartbeat {
    /// When the claim was sent: the lease counts from then, not from its answer.
    started: Instant,
    lease: Lease,
    /// The end of the lease as far as this attempt knows (ms after `started`).
    lease_ends_ms: AtomicU64,
    /// A renewal was refused: the claim is another's.
    lost: AtomicBool,
}

impl Heartbeat {
    pub(crate) fn new(started: Instant, lease: Lease) -> Self {
        Self {
            started,
            lease,
            lease_ends_ms: AtomicU64::new(millis(lease.length)),
            lost: AtomicBool::new(false),
        }
    }

    /// Renews through `renew` (`Ok(true)`: still held) a third of a lease after the
    /// claim or the last renewal that held; a renewal the store did not answer is tried
    /// again at once with a short backoff while the lease lasts (an outage much shorter
    /// than the lease must not cost the claim). Stops renewing past the max run time or
    /// once refused. Never returns: race it against the work.
    pub(crate) async fn beat<F, Fut>(&self, renew: F)
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<bool, StoreError>>,
    {
        let mut next = self.started + self.lease.length / 3;
        let mut retry = Duration::from_millis(50);
        loop {
            tokio::time::sleep_until(next).await;
            if self.started.elapsed() >= self.lease.max_run || self.lost.load(Ordering::Relaxed) {
                std::future::pending::<()>().await;
            }
            let sent = Instant::now();
            match renew().await {
                Ok(true) => {
                    let ends = sent - self.started + self.lease.length;
                    self.lease_ends_ms.store(millis(ends), Ordering::Relaxed);
                    next = sent + self.lease.length / 3;
                    retry = Duration::from_millis(50);
                }
                Ok(false) => self.lost.store(true, Ordering::Relaxed),
                Err(_error) => {
                    #[cfg(feature = "tracing")]
                    tracing::warn!(target: "tower_webhook", "could not renew a claim's lease: {_error}");
                    next = Instant::now() + retry;
                    retry = (retry * 2).min(Duration::from_secs(1));
                }
            }
        }
    }

    /// When the lease ends, as far as this attempt knows.
    pub(crate) fn lease_ends(&self) -> Instant {
        self.started + Duration::from_millis(self.lease_ends_ms.load(Ordering::Relaxed))
    }
}

/// Runs `work` while renewing `guard`'s claim, then completes the key if `succeeded`
/// says so, or releases it; the renewals go on until that outcome has landed (a slow
/// "done" must not cost a lease that renewals would still have kept). When `stop`
/// resolves first (a [`Drain`](crate::Drain) past its bound), the work is dropped where
/// it stands and the claim released, so the next attempt runs at once.
pub(crate) async fn hold<F: Future>(
    guard: ClaimGuard,
    lease: Lease,
    work: F,
    succeeded: impl FnOnce(&F::Output) -> bool,
    stop: impl Future<Output = ()>,
) -> Result<(F::Output, Held), Stopped> {
    let heartbeat = Heartbeat::new(Instant::from_std(guard.sent()), lease);
    // Owned parts, not the guard: it stays armed (a panic releases) and moves on to the
    // outcome while the heartbeat still runs.
    let (store, delivery, token) = guard.parts();
    let renew = move || {
        let renewal = store.renew(delivery.clone(), token, lease.length);
        let renewal = metrics::timed(Operation::Renew, renewal);
        async move { renewal.await.map(|r| r == Renewed::Held) }
    };
    let beat = heartbeat.beat(renew);
    let mut beat = pin!(beat);
    // `work` is moved into the select: stopped, it is dropped as the select ends.
    let output = tokio::select! {
        biased;
        output = work => Some(output),
        () = stop => None,
        () = &mut beat => unreachable!("the heartbeat never ends"),
    };
    let Some(output) = output else {
        let (store, delivery, token) = guard.into_parts();
        let release = metrics::timed(Operation::Release, store.release(delivery, token));
        let released = tokio::time::timeout(RELEASE_WAIT, release).await;
        return Err(Stopped {
            released: matches!(released, Ok(Ok(()))),
        });
    };
    let ok = succeeded(&output);
    let record = async {
        if !ok {
            // A failed release is not the work's outcome: it is retried in the background
            // while the (renewed) lease lasts.
            guard.release_until(heartbeat.lease_ends().into_std()).await;
            return Held::Released;
        }
        match guard.complete_until(heartbeat.lease_ends()).await {
            Ok(Completed::Done) => Held::Done,
            Ok(Completed::Fenced) => Held::Lost,
            Err(error) => Held::Unrecorded(error),
        }
    };
    let held = tokio::select! {
        biased;
        held = record => held,
        () = &mut beat => unreachable!("the heartbeat never ends"),
    };
    Ok((output, held))
}

/// Runs `operation`, retrying while it fails until `until` (at least once): an outcome
/// recorded after the lease ends may be another attempt's to record.
pub(crate) async fn retry_until<T, F, Fut>(
    until: Instant,
    mut operation: F,
) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let mut wait = Duration::from_millis(50);
    loop {
        match operation().await {
            Ok(done) => return Ok(done),
            Err(error) if Instant::now() + wait >= until => return Err(error),
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
