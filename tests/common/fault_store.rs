//! [`FaultStore`]: any [`DedupeStore`] with faults on a schedule, at the store's real
//! boundary — the call is made on the real store (memory, SQLite, PostgreSQL, Redis) or
//! not, and its answer is given, delayed or lost.
//!
//! Per operation (claim, renew, complete, release) a script says what the next calls
//! meet: pass, fail (the store untouched), refuse as invalid input, land but lose the
//! acknowledgement, land only once a [`Gate`] the test holds opens, land at once but
//! answer only once it opens, or answer after a delay. Every call is counted, and every
//! fault met is logged with its key, so a test can say which keys a fault touched.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tower_webhook::store::{
    Claim, Completed, DedupeStore, Delivery, MemoryStore, Renewed, Retention, StoreError,
    StoreErrorKind, StoreFuture, Token,
};

/// A door the test holds: calls that reach it wait until it opens; the test can wait for
/// the `n`th arrival.
#[derive(Clone)]
pub struct Gate(Arc<watch::Sender<GateState>>);

#[derive(Clone, Copy, Default)]
pub struct GateState {
    open: bool,
    arrived: usize,
}

impl Gate {
    pub fn closed() -> Self {
        Self(Arc::new(watch::Sender::new(GateState::default())))
    }

    pub fn opened() -> Self {
        let gate = Self::closed();
        gate.open();
        gate
    }

    pub fn open(&self) {
        self.0.send_modify(|s| s.open = true);
    }

    /// Arrives, then waits until the gate is open.
    pub async fn pass(&self) {
        self.0.send_modify(|s| s.arrived += 1);
        let mut state = self.0.subscribe();
        state.wait_for(|s| s.open).await.expect("the gate lives");
    }

    /// Resolves once `n` calls have arrived (whether or not they went through).
    pub async fn arrived(&self, n: usize) {
        let mut state = self.0.subscribe();
        state
            .wait_for(|s| s.arrived >= n)
            .await
            .expect("the gate lives");
    }

    pub fn arrivals(&self) -> usize {
        self.0.borrow().arrived
    }
}

/// A store operation that can be faulted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    Claim,
    Renew,
    Complete,
    Release,
}

impl Op {
    pub fn failure(self) -> &'static str {
        match self {
            Op::Claim => "injected fault: claim",
            Op::Renew => "injected fault: renew",
            Op::Complete => "injected fault: complete",
            Op::Release => "injected fault: release",
        }
    }
}

/// What one call meets.
#[derive(Clone)]
pub enum Fault {
    /// Applied and answered at once.
    Pass,
    /// Answered with a `StoreError`; the store is untouched.
    Fail,
    /// Answered with a `StoreError` of kind `InvalidInput`; the store is untouched.
    Refuse,
    /// Applied, then answered with a `StoreError`: the acknowledgement is lost.
    LoseAck,
    /// Applied and answered once the gate opens (a statement that lands late; dropped
    /// before that, it never lands).
    LandLate(Gate),
    /// Applied at once, answered once the gate opens (the answer comes late).
    AnswerLate(Gate),
    /// Applied at once, answered after this long (a slow acknowledgement).
    AnswerAfter(Duration),
}

impl std::fmt::Debug for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fault::Pass => f.write_str("Pass"),
            Fault::Fail => f.write_str("Fail"),
            Fault::Refuse => f.write_str("Refuse"),
            Fault::LoseAck => f.write_str("LoseAck"),
            Fault::LandLate(_) => f.write_str("LandLate"),
            Fault::AnswerLate(_) => f.write_str("AnswerLate"),
            Fault::AnswerAfter(d) => write!(f, "AnswerAfter({d:?})"),
        }
    }
}

#[derive(Default)]
struct Plan {
    /// What the next calls meet, in order.
    next: VecDeque<Fault>,
    /// What every call after those meets (`None`: `Pass`).
    then: Option<Fault>,
}

/// A fault that was met: which operation, on which key, and what it met.
#[derive(Clone, Debug)]
pub struct Met {
    pub op: Op,
    pub source: String,
    pub id: String,
    pub fault: Fault,
}

/// A store (by default a [`MemoryStore`]) with faults on a schedule, counting the calls
/// per operation. Cloning shares the store, the schedule and the counts.
pub struct FaultStore<S: ?Sized = MemoryStore> {
    inner: Arc<S>,
    plans: Arc<Mutex<HashMap<Op, Plan>>>,
    calls: Arc<Mutex<HashMap<Op, usize>>>,
    met: Arc<Mutex<Vec<Met>>>,
}

impl<S: ?Sized> Clone for FaultStore<S> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            plans: self.plans.clone(),
            calls: self.calls.clone(),
            met: self.met.clone(),
        }
    }
}

impl FaultStore<MemoryStore> {
    /// Faults around a fresh [`MemoryStore`].
    pub fn new() -> Self {
        Self::wrap(MemoryStore::new())
    }
}

impl<S: DedupeStore> FaultStore<S> {
    /// Faults around `inner`.
    pub fn wrap(inner: S) -> Self {
        Self::from_arc(Arc::new(inner))
    }
}

impl<S: DedupeStore + ?Sized> FaultStore<S> {
    /// Faults around a shared store (`Arc<dyn DedupeStore>`: any store).
    pub fn from_arc(inner: Arc<S>) -> Self {
        Self {
            inner,
            plans: Arc::default(),
            calls: Arc::default(),
            met: Arc::default(),
        }
    }

    /// The store underneath, to look at it without faults.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// The next calls of `op` meet `faults`, in order; later ones meet what they met before.
    pub fn script(&self, op: Op, faults: impl IntoIterator<Item = Fault>) {
        let mut plans = self.plans.lock().unwrap();
        plans.entry(op).or_default().next.extend(faults);
    }

    /// Every call of `op` after its script meets `fault`.
    pub fn always(&self, op: Op, fault: Fault) {
        self.plans.lock().unwrap().entry(op).or_default().then = Some(fault);
    }

    /// Calls of `op` pass from now on.
    pub fn heal(&self, op: Op) {
        self.plans.lock().unwrap().remove(&op);
    }

    /// Every call passes from now on.
    pub fn heal_all(&self) {
        self.plans.lock().unwrap().clear();
    }

    /// How many calls of `op` were made.
    pub fn calls(&self, op: Op) -> usize {
        self.calls.lock().unwrap().get(&op).copied().unwrap_or(0)
    }

    /// Every fault (anything but `Pass`) met so far.
    pub fn met(&self) -> Vec<Met> {
        self.met.lock().unwrap().clone()
    }

    /// Counts a call of `op` on `d` and picks the fault it meets.
    fn fault(&self, op: Op, d: &Delivery) -> Fault {
        *self.calls.lock().unwrap().entry(op).or_default() += 1;
        let fault = {
            let mut plans = self.plans.lock().unwrap();
            match plans.get_mut(&op) {
                None => Fault::Pass,
                Some(plan) => plan
                    .next
                    .pop_front()
                    .or_else(|| plan.then.clone())
                    .unwrap_or(Fault::Pass),
            }
        };
        if !matches!(fault, Fault::Pass) {
            self.met.lock().unwrap().push(Met {
                op,
                source: d.source().to_owned(),
                id: d.id().to_owned(),
                fault: fault.clone(),
            });
        }
        fault
    }

    /// Runs `call` on the store underneath (a store applies it once the returned future
    /// is polled, or at once) as the fault says.
    fn inject<T: Send + 'static>(
        &self,
        op: Op,
        d: &Delivery,
        call: impl FnOnce(&S) -> StoreFuture<T> + Send + 'static,
    ) -> StoreFuture<T> {
        let inner = self.inner.clone();
        match self.fault(op, d) {
            Fault::Pass => call(&inner),
            Fault::Fail => Box::pin(std::future::ready(Err(StoreError::message(op.failure())))),
            Fault::Refuse => Box::pin(std::future::ready(Err(
                StoreError::message(op.failure()).with_kind(StoreErrorKind::InvalidInput)
            ))),
            Fault::LoseAck => {
                let landed = call(&inner);
                Box::pin(async move {
                    let _ = landed.await;
                    Err(StoreError::message(op.failure()))
                })
            }
            Fault::LandLate(gate) => Box::pin(async move {
                gate.pass().await;
                call(&inner).await
            }),
            Fault::AnswerLate(gate) => {
                let landed = call(&inner);
                Box::pin(async move {
                    let answer = landed.await;
                    gate.pass().await;
                    answer
                })
            }
            Fault::AnswerAfter(after) => {
                let landed = call(&inner);
                Box::pin(async move {
                    let answer = landed.await;
                    tokio::time::sleep(after).await;
                    answer
                })
            }
        }
    }
}

impl<S: DedupeStore + ?Sized> DedupeStore for FaultStore<S> {
    fn min_lease(&self) -> Duration {
        self.inner.min_lease()
    }
    fn claim(&self, delivery: Delivery, token: Token, lease: Duration) -> StoreFuture<Claim> {
        let d = delivery.clone();
        self.inject(Op::Claim, &d, move |s| s.claim(delivery, token, lease))
    }
    fn renew(&self, delivery: Delivery, token: Token, lease: Duration) -> StoreFuture<Renewed> {
        let d = delivery.clone();
        self.inject(Op::Renew, &d, move |s| s.renew(delivery, token, lease))
    }
    fn complete(&self, delivery: Delivery, token: Token) -> StoreFuture<Completed> {
        let d = delivery.clone();
        self.inject(Op::Complete, &d, move |s| s.complete(delivery, token))
    }
    fn release(&self, delivery: Delivery, token: Token) -> StoreFuture<()> {
        let d = delivery.clone();
        self.inject(Op::Release, &d, move |s| s.release(delivery, token))
    }
    fn prune(&self, older_than: Retention) -> StoreFuture<u64> {
        self.inner.prune(older_than)
    }
    fn prune_once(&self, namespace: &str, older_than: Duration) -> StoreFuture<u64> {
        self.inner.prune_once(namespace, older_than)
    }
}
