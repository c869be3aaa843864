//! Hidden, for the crate's own tests — not public API, not covered by semver, and it may
//! change or go in any release: the SQL inbox with chosen calls answered late. The
//! statement lands at once and its answer comes a set time later, as a slow or loaded
//! database answers. The reference model (`tests/model/inbox.rs`) runs the worker's paths
//! behind a claim, a renewal or an outcome answered past two thirds of the lease with it
//! in every run, where before only load reached them.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;

use super::backend::{Backend, Claimed, HeldRow, Outcome};
use super::worker::due::Dues;
use super::worker::ClaimDue;
use super::{Accepted, Counts, DeadRows, EventSummary, Inbox, Listing, Pause, Requeue};
use super::{Requeued, StoredEvent};
use crate::store::{Delivery, StoreFuture, Token};

/// Hidden, for tests (see [`LateAnswers`]): which of the worker's calls answers late.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LateCall {
    /// A claim that took at least one row.
    Claim,
    /// A lease's renewal.
    Renew,
    /// An attempt's outcome.
    Finish,
}

/// Hidden, for tests, not public API: delays to answer the inbox's next calls with, given
/// to [`Inbox::with_late_answers`]. Cloning shares them.
#[doc(hidden)]
#[derive(Debug, Clone, Default)]
pub struct LateAnswers(Arc<Mutex<Plans>>);

#[derive(Debug, Default)]
struct Plans {
    /// Per call, the delays of its next answers, in order.
    next: [VecDeque<Duration>; 3],
    /// Per call, how many answers were delayed.
    met: [usize; 3],
    /// How many of the next claims that take a row claim again and answer with both
    /// (more rows than asked, as a store's bug would).
    more: usize,
    /// Per processor, how many claims were sent (each wake-up of its workers that found
    /// room to claim).
    claims: std::collections::HashMap<String, usize>,
}

impl LateAnswers {
    /// None planned.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// The next answer of `call` comes `after` late (a claim's: the next that took a row).
    pub fn next(&self, call: LateCall, after: Duration) {
        self.plans().next[call as usize].push_back(after);
    }

    /// The next `n` claims that take a row claim once more and answer with both claims'
    /// rows: more than the worker asked for.
    pub fn answer_more(&self, n: usize) {
        self.plans().more += n;
    }

    /// How many answers of `call` came late so far.
    #[must_use]
    pub fn met(&self, call: LateCall) -> usize {
        self.plans().met[call as usize]
    }

    /// How many claims the workers of `processor` sent so far, empty ones included.
    #[must_use]
    pub fn claims(&self, processor: &str) -> usize {
        self.plans().claims.get(processor).copied().unwrap_or(0)
    }

    /// Waits out the next delay planned for `call`, if any.
    async fn answer(&self, call: LateCall) {
        let after = {
            let mut plans = self.plans();
            let after = plans.next[call as usize].pop_front();
            plans.met[call as usize] += usize::from(after.is_some());
            after
        };
        if let Some(after) = after {
            tokio::time::sleep(after).await;
        }
    }

    /// Whether this claim answers more (one of `answer_more`'s, spent).
    fn take_more(&self) -> bool {
        let mut plans = self.plans();
        let more = plans.more > 0;
        plans.more -= usize::from(more);
        more
    }

    fn plans(&self) -> MutexGuard<'_, Plans> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Inbox {
    /// Hidden, for tests, not public API: this inbox (the same database, wake-ups and due
    /// times) with the claims, renewals and outcomes `late` plans answered late.
    #[doc(hidden)]
    #[must_use]
    pub fn with_late_answers(&self, late: &LateAnswers) -> Self {
        let backend = Late {
            inner: self.backend.clone(),
            late: late.clone(),
        };
        Self {
            backend: Arc::new(backend),
            ..self.clone()
        }
    }
}

/// A backend whose claims, renewals and outcomes land at once and answer as planned.
struct Late {
    inner: Arc<dyn Backend>,
    late: LateAnswers,
}

impl Late {
    /// `answer`, polled at once, its result handed on after `call`'s planned delay (a
    /// claim's only when it took a row).
    fn delayed<T: Send + 'static>(
        &self,
        call: LateCall,
        answer: StoreFuture<T>,
        counts: fn(&T) -> bool,
    ) -> StoreFuture<T> {
        let late = self.late.clone();
        Box::pin(async move {
            let answer = answer.await;
            if answer.as_ref().is_ok_and(counts) {
                late.answer(call).await;
            }
            answer
        })
    }
}

impl Backend for Late {
    fn accept(&self, d: Delivery) -> StoreFuture<Accepted> {
        self.inner.accept(d)
    }
    fn claim(&self, processor: Arc<str>, due: ClaimDue) -> StoreFuture<Vec<Claimed>> {
        *self
            .late
            .plans()
            .claims
            .entry(processor.to_string())
            .or_default() += 1;
        let (inner, late) = (self.inner.clone(), self.late.clone());
        let rows = Box::pin(async move {
            let mut rows = inner.claim(processor.clone(), due.clone()).await?;
            if !rows.is_empty() && late.take_more() {
                rows.extend(inner.claim(processor, due).await?);
            }
            Ok(rows)
        });
        self.delayed(LateCall::Claim, rows, |rows| !rows.is_empty())
    }
    fn give_back(
        &self,
        processor: Arc<str>,
        keys: Vec<(String, String)>,
        token: Token,
    ) -> StoreFuture<u64> {
        self.inner.give_back(processor, keys, token)
    }
    fn min_lease(&self) -> Duration {
        self.inner.min_lease()
    }
    fn renew(&self, row: HeldRow, lease: Duration) -> StoreFuture<bool> {
        self.delayed(LateCall::Renew, self.inner.renew(row, lease), |_| true)
    }
    fn finish(&self, row: HeldRow, outcome: Outcome) -> StoreFuture<bool> {
        self.delayed(LateCall::Finish, self.inner.finish(row, outcome), |_| true)
    }
    fn requeue(&self, which: &Requeue) -> StoreFuture<Requeued> {
        self.inner.requeue(which)
    }
    fn object_index(&self) -> StoreFuture<()> {
        self.inner.object_index()
    }
    fn pause(&self, rule: super::pause::Rule, pause: bool) -> StoreFuture<bool> {
        self.inner.pause(rule, pause)
    }
    fn pauses(&self) -> StoreFuture<Vec<Pause>> {
        self.inner.pauses()
    }
    fn prune(&self, older_than: Duration, dead: Option<&DeadRows>) -> StoreFuture<u64> {
        self.inner.prune(older_than, dead)
    }
    fn expire_bodies(&self, retention: Duration, batch: usize) -> StoreFuture<Option<u64>> {
        self.inner.expire_bodies(retention, batch)
    }
    fn erase(&self, keys: Vec<(String, String)>) -> StoreFuture<u64> {
        self.inner.erase(keys)
    }
    #[cfg(feature = "seal")]
    fn by_subject(
        &self,
        digests: Vec<Vec<u8>>,
        limit: usize,
    ) -> StoreFuture<Vec<(String, String)>> {
        self.inner.by_subject(digests, limit)
    }
    fn counts(&self, processor: Arc<str>) -> StoreFuture<Counts> {
        self.inner.counts(processor)
    }
    fn list(&self, listing: &Listing) -> StoreFuture<Vec<EventSummary>> {
        self.inner.list(listing)
    }
    fn processed_per_minute(&self, minutes: u32) -> StoreFuture<(i64, Vec<(i64, i64)>)> {
        self.inner.processed_per_minute(minutes)
    }
    fn event(&self, source: String, id: String) -> StoreFuture<Option<StoredEvent>> {
        self.inner.event(source, id)
    }
    fn next_due(&self, processor: Arc<str>) -> StoreFuture<Option<Duration>> {
        self.inner.next_due(processor)
    }
    fn listen(&self, wake: Arc<Notify>, due: Dues) -> Option<tokio::task::JoinHandle<()>> {
        self.inner.listen(wake, due)
    }
    fn registry(&self) -> &dyn super::backfill::Registry {
        self.inner.registry()
    }
    fn invalids(&self) -> &dyn super::invalid::Invalids {
        self.inner.invalids()
    }

    #[cfg(feature = "seal")]
    fn rekeying(&self) -> &dyn super::rekey::Rekeying {
        self.inner.rekeying()
    }

    #[cfg(feature = "seal")]
    fn with_keys(&self, keys: crate::seal::KeyRing) -> Arc<dyn Backend> {
        Arc::new(Late {
            inner: self.inner.with_keys(keys),
            late: self.late.clone(),
        })
    }
}
