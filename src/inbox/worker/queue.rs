//! What the worker needs of where events wait: claim a batch of due events, renew one's
//! lease, record how its attempt ended, hand unrun ones back. Implemented by the SQL
//! inbox (`sql.rs`) and JetStream (`inbox/jetstream/worker.rs`); the loop in `run.rs`
//! is written once against it.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use super::caps::Skip;
use super::due::DueTimes;
use crate::store::{Heartbeat, StoreError, Token};
use crate::Event;

/// A claim's question: up to `limit` due events for `lease` under `token`, each an
/// attempt. An event whose `max_attempts` attempts all ended without an outcome (each
/// crashed its worker) is dead instead, never returned; with `per_object`, see
/// [`Engine::per_object`](super::Engine::per_object). Events of the sources and types in
/// `skip` (their caps reached) are left, where the queue can leave them.
#[derive(Debug, Clone)]
#[cfg_attr(not(any(feature = "sqlite", feature = "postgres")), allow(dead_code))] // JetStream counts in its claims store
pub(crate) struct ClaimDue {
    pub(crate) limit: usize,
    pub(crate) lease: Duration,
    pub(crate) token: Token,
    pub(crate) max_attempts: u32,
    pub(crate) per_object: Option<u32>,
    pub(crate) skip: Skip,
}

#[cfg(test)]
impl ClaimDue {
    /// Up to `limit` due events: 8 attempts, no cap.
    pub(crate) fn plain(limit: usize, lease: Duration, token: Token) -> Self {
        Self {
            limit,
            lease,
            token,
            max_attempts: 8,
            per_object: None,
            skip: Skip::default(),
        }
    }
}

/// How an attempt ended, as the queue records it.
#[derive(Debug, Clone)]
pub(crate) enum Outcome {
    Processed,
    /// Failed; try again this much later. (JetStream keeps no error on a message: with
    /// neither SQL nor `tracing`, nothing reads it.)
    #[cfg_attr(
        not(any(feature = "sqlite", feature = "postgres", feature = "tracing")),
        allow(dead_code)
    )]
    Retry(String, Duration),
    /// Failed for the last time.
    Dead(String),
    /// Not now ([`Later`](crate::inbox::Later)): due again this much later, the attempt
    /// not counted.
    Later(Duration),
    /// Stopped mid-attempt (shutdown past its grace period): back to the queue at once,
    /// the attempt counted, as a crash's would be.
    Abandoned,
}

/// A claimed event: the event, which attempt at it this is (from 1), and the queue's hold
/// on it.
pub(crate) struct Claimed<H> {
    pub(crate) event: Event,
    pub(crate) attempt: u32,
    pub(crate) held: H,
    /// When its lease began, or earlier: renewals count from here.
    pub(crate) at: Instant,
    /// The accept's trace context (feature `otel`), and whether this is the event's first
    /// run since the accept: then its parent, else a link (`span::attempt`).
    pub(crate) trace: (crate::span::TraceContext, bool),
}

pub(crate) trait Queue: Send + Sync + 'static {
    /// A claimed event's hold on the queue: what renews it and records its outcome.
    type Held: Send + Sync + 'static;

    /// Whether [`claim`](Self::claim) waits for events itself (a long poll): then a claim
    /// that came back short says nothing of what is due, and the worker claims again at
    /// once. Otherwise it waits for a signal (a wake-up, a due time, a poll, a processor
    /// ending).
    const CLAIM_WAITS: bool;

    /// Whether [`give_back`](Self::give_back) hands events back with their attempt
    /// uncounted. Where it cannot, the events of a claim still out at shutdown are run.
    const GIVES_BACK: bool;

    /// Whether [`claim`](Self::claim) holds the per-object cap itself (leaving an event
    /// over it unclaimed). Otherwise the worker holds it, as its other caps.
    const CAPS_OBJECTS: bool;

    /// Notified when an event may have been queued (an accept in this process).
    fn wake(&self) -> Arc<Notify>;

    /// The metrics of the processor whose events it holds (`processor` label).
    fn metrics(&self) -> &crate::metrics::Processor;

    /// The name of the processor whose events it holds (an attempt's span says it).
    fn processor(&self) -> &str;

    /// Tells when events fall due later (retries, snoozes), for the worker to claim then
    /// rather than at its next poll; `None` where the queue hands them over when due
    /// itself (a long poll).
    fn due(&self) -> Option<DueTimes> {
        None
    }

    /// Tasks that run beside the worker and stop with it (a `LISTEN`, the gauges).
    fn beside(&self, poll: Duration) -> Vec<tokio::task::JoinHandle<()>>;

    /// Gets ready before the first claim (`opening`: the lease asked for, and the
    /// per-object cap, if any), and says the lease to keep (the one asked for, or one the queue holds to); `None` when
    /// `stopped` changed first.
    fn open(
        &mut self,
        opening: (Duration, Option<u32>),
        stopped: &mut watch::Receiver<bool>,
    ) -> impl Future<Output = Option<Duration>> + Send;

    /// Claims what `due` asks for.
    fn claim(
        &self,
        due: ClaimDue,
    ) -> impl Future<Output = Result<Vec<Claimed<Self::Held>>, StoreError>> + Send;

    /// Hands claimed events back unrun.
    fn give_back(&self, held: Vec<Self::Held>) -> impl Future<Output = ()> + Send;

    /// Whether the claimed event is to run: `false` when the queue settled it itself (it
    /// was processed already, or the worker is stopping); renewed meanwhile by
    /// `heartbeat`. `max_attempts`: as for [`ClaimDue`].
    fn start(
        &self,
        held: &Self::Held,
        claimed: (&Event, u32),
        max_attempts: u32,
        heartbeat: &Heartbeat,
        hurried: &mut watch::Receiver<bool>,
    ) -> impl Future<Output = bool> + Send;

    /// Extends the lease; `Ok(false)` once another attempt holds the event.
    fn renew(
        &self,
        held: &Self::Held,
        lease: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Whether the event, failed (`counted`) or snoozed, may run again in this worker
    /// without going back to the queue: asked once it has waited out its backoff here,
    /// holding its object's turn. Only a queue that leaves per-object caps to the worker
    /// (`CAPS_OBJECTS` false) is asked. `false`: it is handed back instead.
    fn again(
        &self,
        _held: &Self::Held,
        _counted: bool,
        _until: Instant,
    ) -> impl Future<Output = bool> + Send {
        std::future::ready(false)
    }

    /// Whether the queue keeps its objects' turns itself, across workers, once open
    /// (JetStream with a per-object cap of 1): then the worker keeps no line of objects,
    /// and each event with an object waits in [`object_turn`](Self::object_turn) instead.
    fn holds_turns(&self) -> bool {
        false
    }

    /// Waits for the event's object's turn (renewed meanwhile); `false`: hand it back
    /// uncounted instead.
    fn object_turn(&self, _held: &Self::Held) -> impl Future<Output = bool> + Send {
        std::future::ready(true)
    }

    /// Called once the worker has stopped and its running events have ended: lets go of
    /// what the queue still holds that no claim took (a consumer's prefetched messages).
    fn stop(&self) -> impl Future<Output = ()> + Send {
        std::future::ready(())
    }

    /// Records `outcome`, trying again while the queue does not answer until `until` (the
    /// lease's end: after it the event may be another attempt's); `Ok(false)` when
    /// another attempt holds the event.
    fn finish(
        &self,
        held: &Self::Held,
        outcome: Outcome,
        until: Instant,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;
}
