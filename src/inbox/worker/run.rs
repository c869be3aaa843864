//! The worker's loop: claim due rows, run the processor on each under a renewed lease,
//! record the outcome, and stop within the grace period.

use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{watch, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::super::process::{hurry_up, AbortOnDrop};
use super::super::rate::Pacing;
use super::super::Attempt;
use super::caps::{Caps, Place, Skip, Turn};
use super::due::{self, Earliest};
use super::freed::{Freed, Freeing};
use super::{ClaimDue, Claimed, Engine, Outcome, Queue};
use crate::metrics::{self, Operation};
use crate::span;
use crate::store::{Heartbeat, Token};

/// Rows whose processor has ended may wait for their outcome to be written, at most this
/// many per processor: the outcomes go out together (group commit) while the processors
/// go on with the next rows, and a database slower than the processors still bounds how
/// many rows this worker holds.
const RECORDING_PER_PROCESSOR: usize = 8;

/// At most this many claims are out at once: a processor freed while one is out need not
/// wait for it to come back, and more would spread the free processors over more
/// claims (a commit each) for no more rows.
const CLAIMS_IN_FLIGHT: usize = 2;

/// A claim's answer: its events, how many it asked for, and the processors and slots
/// held for them.
struct Batch<H> {
    /// Each event, with its turns under the caps where it took them at once, else its
    /// place in line.
    rows: Vec<(Claimed<H>, Result<Turn, Place>)>,
    asked: usize,
    /// How many the queue answered with (some may have been handed back since: their
    /// caps were full).
    answered: usize,
    /// The worker's count of signals (wake-ups, due times, polls, processors ending) when
    /// it was sent.
    sent_at: u64,
    /// It failed: the next claim waits for a signal.
    failed: bool,
    token: Token,
    /// The rate's turns it took (to give back the unused ones with).
    turns: Option<Instant>,
    processors: OwnedSemaphorePermit,
    slots: OwnedSemaphorePermit,
    /// Its events' places in the lookahead (where the queue cannot leave capped events).
    places: Option<OwnedSemaphorePermit>,
}

impl<Q: Queue> Engine<Q> {
    pub(super) async fn run(mut self, mut stopped: watch::Receiver<bool>) {
        let opening = (self.lease.length, self.per_object);
        let Some(lease) = self.queue.open(opening, &mut stopped).await else {
            return;
        };
        self.lease.length = lease;
        // A claim that caps objects itself (across workers), or a queue that keeps their
        // turns, leaves them; otherwise they wait for their turns here, as over the others.
        let turns = self.queue.holds_turns();
        let per_object = self.per_object.filter(|_| !Q::CAPS_OBJECTS && !turns);
        let caps = (self.per_source, self.per_type, per_object);
        self.caps = Caps::new(caps, self.rate_per_source);
        let this = Arc::new(self);
        // An event holds a processor from its claim until its processor ends, and a slot
        // until its outcome is written.
        let processors = Arc::new(Semaphore::new(this.concurrency));
        // Where the queue cannot leave a capped event (JetStream), each claimed event has a
        // place in the lookahead: it waits there for its turns without a processor.
        let places = (!Q::GIVES_BACK && (this.caps.any() || turns))
            .then(|| Arc::new(Semaphore::new(this.concurrency + this.lookahead)));
        let slots = this.concurrency * RECORDING_PER_PROCESSOR + this.lookahead;
        let slots = Arc::new(Semaphore::new(slots));
        let freed = Freeing {
            processors: processors.clone(),
            told: Arc::new(Notify::new()),
        };
        let mut claims: JoinSet<Batch<Q::Held>> = JoinSet::new();
        // One claim at a time where objects are lined up, here or by the queue: JetStream
        // deals a stream's messages out in turn to the pulls it holds, and batches lined up
        // (or written down) as each came back would put an object's events out of order.
        let in_flight = match this.caps.lines_up_objects() || turns {
            true => 1,
            false => CLAIMS_IN_FLIGHT,
        };
        let mut running: JoinSet<()> = JoinSet::new();
        // Set when the grace period is over: each running event stops and hands itself
        // back, so its hand-back can never race its own "processed".
        let (hurry, hurried) = watch::channel(false);
        // `signals` counts what says there may be due events (a wake-up, a due time, a
        // poll, a processor ending); `drained_at`, the count when the last claim that came
        // back short was sent. No claim goes out while they are equal: a short claim says
        // nothing of a signal after it was sent (an event accepted meanwhile may be one it
        // did not see).
        let (mut signals, mut drained_at) = (0u64, None);
        let mut pacing = this.rate.map(Pacing::new);
        // When events fall due later (retries, snoozes: this worker's and others'), the
        // earliest is a signal at its time, not at the next poll.
        let mut told = this.queue.due().map(|due| due.listen());
        let mut earliest = Earliest::default();
        let wake = this.queue.wake();
        let mut woken = pin!(wake.notified());
        woken.as_mut().enable(); // an accept while a claim is out is not missed
        loop {
            if *stopped.borrow() {
                break;
            }
            while running.try_join_next().is_some() {}
            let idle = processors
                .available_permits()
                .min(slots.available_permits())
                .min(
                    places
                        .as_ref()
                        .map_or(usize::MAX, |p| p.available_permits()),
                );
            let free = pacing.as_ref().map_or(idle, |pacing| pacing.allowed(idle));
            let due = drained_at != Some(signals) && claims.len() < in_flight;
            if due && free > 0 {
                let n = u32::try_from(free).unwrap_or(u32::MAX);
                // Events in the lookahead, not counting this claim's.
                let waiting = places
                    .as_ref()
                    .is_some_and(|p| p.available_permits() < this.concurrency + this.lookahead);
                let held = (
                    processors.clone().try_acquire_many_owned(n),
                    slots.clone().try_acquire_many_owned(n),
                    places
                        .as_ref()
                        .map(|p| p.clone().try_acquire_many_owned(n))
                        .transpose(),
                );
                if let (Ok(processors), Ok(slots), Ok(places)) = held {
                    let turns = pacing.as_mut().map(|pacing| pacing.take(free));
                    let claim = this.clone().claim(
                        (free, waiting),
                        signals,
                        turns,
                        (processors, slots, places),
                    );
                    claims.spawn(claim);
                    continue;
                }
            }
            // Held back by the rate only: woken when its next turn comes.
            let paced = due && idle > free;
            let turn = pacing.as_ref().map_or_else(Instant::now, Pacing::next);
            // A source out of turns under its own rate: a signal when its next turn comes
            // (a claim skipped its events).
            let source_turn = this.caps.next_turn();
            let due_at = earliest.wake_at();
            let freed_meanwhile = freed.told.notified();
            tokio::select! {
                Some(batch) = claims.join_next(), if !claims.is_empty() => {
                    let Ok(mut batch) = batch else { continue }; // a panic: its events come back with their lease
                    let short = !Q::CLAIM_WAITS && batch.answered < batch.asked;
                    drained_at = (short || batch.failed).then_some(batch.sent_at);
                    if let (Some(pacing), Some(turns)) = (&mut pacing, batch.turns) {
                        pacing.give_back(turns, batch.asked - batch.rows.len());
                    }
                    this.run_batch(&mut batch, &mut running, (&freed, &stopped), &hurried);
                    // What the claim did not use is free again as `batch` drops.
                }
                () = &mut woken => {
                    signals += 1;
                    woken.set(wake.notified());
                    woken.as_mut().enable();
                }
                () = freed_meanwhile => signals += 1,
                () = tokio::time::sleep(this.poll) => signals += 1,
                at = due::told(&mut told) => match at {
                    Some(at) => earliest.learn(at),
                    None => signals += 1, // some missed: claim now (a short claim reads the next)
                },
                () = tokio::time::sleep_until(due_at.unwrap_or(turn)), if due_at.is_some() => {
                    earliest.woke();
                    signals += 1;
                }
                () = tokio::time::sleep_until(turn), if paced => {}
                () = tokio::time::sleep_until(source_turn.unwrap_or(turn)), if source_turn.is_some() => {
                    signals += 1;
                }
                _ = stopped.changed() => {}
                Some(_) = running.join_next(), if !running.is_empty() => {}
            }
        }
        // Claims still out: their events go back uncounted, as a claim answered too late —
        // or, where the queue cannot hand them back so, they run (delivered already).
        while let Some(batch) = claims.join_next().await {
            let Ok(mut batch) = batch else { continue };
            if Q::GIVES_BACK {
                let held = batch.rows.drain(..).map(|(row, _)| row.held).collect();
                this.queue.give_back(held).await;
            } else {
                this.run_batch(&mut batch, &mut running, (&freed, &stopped), &hurried);
            }
        }
        // Graceful: let running events finish; past a grace period, stop the rest, which
        // hand themselves back as a crash would (the attempt counted).
        let finish = async { while running.join_next().await.is_some() {} };
        match this.grace {
            None => finish.await,
            Some(grace) => {
                let _ = tokio::time::timeout(grace, finish).await;
            }
        }
        let _ = hurry.send(true);
        while running.join_next().await.is_some() {}
        this.queue.stop().await;
    }

    /// Starts a task for each of the batch's events, each with one of its processors and
    /// slots.
    fn run_batch(
        self: &Arc<Self>,
        batch: &mut Batch<Q::Held>,
        running: &mut JoinSet<()>,
        (freeing, stopped): (&Freeing, &watch::Receiver<bool>),
        hurried: &watch::Receiver<bool>,
    ) {
        for (claimed, turn) in std::mem::take(&mut batch.rows) {
            let processor = batch.processors.split(1).expect("one held per event");
            let slot = batch.slots.split(1).expect("one held per event");
            let (worker, hurried, token) = (self.clone(), hurried.clone(), batch.token);
            let place = batch
                .places
                .as_mut()
                .map(|p| p.split(1).expect("one held per event"));
            let freed = Freed {
                processor: Some(processor),
                place,
                freeing: freeing.clone(),
            };
            let stopped = stopped.clone();
            let span = self.attempt_span(&claimed.event, claimed.attempt, (&claimed.trace, false));
            running.spawn(span::instrument(span, async move {
                let _slot = slot;
                worker
                    .process((claimed, turn), token, freed, (stopped, hurried))
                    .await;
            }));
        }
    }

    /// An attempt's span, the one place both queues' attempts get theirs: with `otel`, a
    /// child of the accept's stored span on the event's first run since the accept
    /// (`trace.1`, as the queue read it), unless `rerun` (run again here after a failure
    /// or a snooze) or links only; else a new trace linked to it.
    fn attempt_span(
        &self,
        event: &crate::Event,
        attempt: u32,
        (trace, rerun): (&(span::TraceContext, bool), bool),
    ) -> span::Span {
        #[cfg(feature = "otel")]
        let parent = trace.1 && !rerun && !self.trace_links_only;
        #[cfg(not(feature = "otel"))]
        let parent = trace.1 && !rerun;
        let number = Attempt::new(attempt, &self.retry);
        span::attempt(event, number, self.queue.processor(), (&trace.0, parent))
    }

    /// Claims up to `n` due events, for which it holds `processors` and `slots` (and the
    /// rate's `turns`); sent when the worker had counted `sent_at` signals.
    async fn claim(
        self: Arc<Self>,
        (n, waiting): (usize, bool),
        sent_at: u64,
        turns: Option<Instant>,
        (processors, slots, places): (
            OwnedSemaphorePermit,
            OwnedSemaphorePermit,
            Option<OwnedSemaphorePermit>,
        ),
    ) -> Batch<Q::Held> {
        let (token, sent) = (Token::new(), Instant::now());
        let claim = self.queue.claim(ClaimDue {
            limit: n,
            lease: self.lease.length,
            token,
            max_attempts: self.retry.max_attempts(),
            per_object: self.per_object,
            skip: Skip {
                waiting,
                held: self.holding.held(),
                ..self.caps.skip()
            },
        });
        let (rows, failed) = match metrics::timed(Operation::InboxClaim, claim).await {
            // Answered so late that the lease may run out before the first renewal: hand
            // the events back uncounted (fenced on the token: events another worker took
            // over meanwhile stay its own) rather than run beside a takeover. Not handed
            // back, they come back with their lease.
            Ok(rows) if Q::GIVES_BACK && sent.elapsed() >= self.lease.length * 2 / 3 => {
                let held = rows.into_iter().map(|row| row.held).collect();
                self.queue.give_back(held).await;
                (Vec::new(), false)
            }
            Ok(mut rows) => {
                // More than asked (a store's bug) holds no processor: the rest go back
                // uncounted, or come back with their lease — never a panic in `run_batch`.
                if rows.len() > n {
                    let extra = rows.split_off(n);
                    #[cfg(feature = "tracing")]
                    tracing::error!(target: "tower_webhook", "inbox worker's claim of {n} answered {}: the rest handed back", n + extra.len());
                    if Q::GIVES_BACK {
                        let held = extra.into_iter().map(|row| row.held).collect();
                        self.queue.give_back(held).await;
                    }
                }
                (rows, false)
            }
            Err(_error) => {
                #[cfg(feature = "tracing")]
                tracing::error!(target: "tower_webhook", "inbox worker could not claim: {_error}");
                (Vec::new(), true)
            }
        };
        let answered = rows.len();
        let rows = self.take_turns(rows).await;
        Batch {
            rows,
            asked: n,
            answered,
            sent_at,
            failed,
            token,
            turns,
            processors,
            slots,
            places,
        }
    }

    /// Takes each event's turns under the caps where they are free; where they are not,
    /// hands the event back uncounted — or, where the queue cannot, keeps it to wait for
    /// its turns in `process`.
    async fn take_turns(
        &self,
        rows: Vec<Claimed<Q::Held>>,
    ) -> Vec<(Claimed<Q::Held>, Result<Turn, Place>)> {
        let turns = self.queue.holds_turns();
        if !self.caps.any() && !turns {
            return rows.into_iter().map(|row| (row, Ok(Turn::new()))).collect();
        }
        let (mut taken, mut back) = (Vec::new(), Vec::new());
        for row in rows {
            // Its object's turn first, from the queue; then the others (`process`).
            let turn = match turns && row.event.object_id().is_some() {
                true => Err(Place::default()),
                false => self.caps.try_turn(&row.event, self.queue.metrics()),
            };
            match turn {
                Err(_) if Q::GIVES_BACK => back.push(row.held),
                turn => taken.push((row, turn)),
            }
        }
        if !back.is_empty() {
            self.queue.give_back(back).await;
        }
        taken
    }

    async fn process(
        &self,
        (claimed, turn): (Claimed<Q::Held>, Result<Turn, Place>),
        token: Token,
        mut freed: Freed,
        (mut stopped, mut hurried): (watch::Receiver<bool>, watch::Receiver<bool>),
    ) {
        let Claimed {
            event,
            attempt,
            held,
            at,
            trace,
        } = claimed;
        // Held until its outcome is written: this worker's claims leave it meanwhile.
        let _hold = self.holding.hold(&event);
        // Its outcome frees its object's next event (a claim that caps objects): the
        // worker is woken for it, not left to its next poll.
        let frees_turn =
            Q::CAPS_OBJECTS && self.per_object.is_some() && event.object_id().is_some();
        let heartbeat = Heartbeat::new(at, self.lease);
        let renew = || {
            let renewal = self.queue.renew(&held, self.lease.length);
            metrics::timed(Operation::InboxRenew, renewal)
        };
        let beat = heartbeat.beat(renew);
        let mut beat = pin!(beat);
        // Its turns under the caps, held until its processor ends; waited for (renewed
        // meanwhile) where the claim could not leave it — without a processor, within
        // the lookahead, so the worker reads on and other sources' events start meanwhile
        // (the fair share a queue read in order can give).
        let turn = match turn {
            Ok(turn) => {
                freed.placed();
                turn
            }
            Err(place) => {
                let lent = freed.lend();
                let wait = async {
                    let queued = self.queue.holds_turns() && event.object_id().is_some();
                    if queued && !self.queue.object_turn(&held).await {
                        return None;
                    }
                    let turn = self.caps.turn(&event, place).await;
                    if lent {
                        freed.take_back().await;
                    }
                    Some(turn)
                };
                let turn = tokio::select! {
                    biased;
                    turn = wait => turn,
                    () = hurry_up(&mut stopped) => None,
                    () = &mut beat => unreachable!("the heartbeat never ends"),
                };
                // Never started (stopping, or no turn in sight): back, no attempt counted.
                let Some(turn) = turn else {
                    let later = Outcome::Later(Duration::ZERO);
                    let _ = self.finish(&held, later, &heartbeat).await;
                    return;
                };
                turn
            }
        };
        let max_attempts = self.retry.max_attempts();
        let (source, id) = (event.source().to_owned(), event.stored_id().to_owned());
        let ty = event.event_type().map(str::to_owned);
        let mut attempt = attempt;
        // Run again here (after a failure or a snooze): its own span, never the accept's child.
        let mut rerun = false;
        loop {
            let start = self.queue.start(
                &held,
                (&event, attempt),
                max_attempts,
                &heartbeat,
                &mut hurried,
            );
            let go = tokio::select! {
                biased;
                go = start => go,
                () = &mut beat => unreachable!("the heartbeat never ends"),
            };
            if !go {
                return; // settled by the queue
            }
            let number = Attempt::new(attempt, &self.retry);
            // Its own task: a panicking processor is a failed attempt, not a dead worker.
            // The guard stops it too when this task is stopped (a simulated crash). In
            // this attempt's span, so the processor's logs carry the event.
            let run = self.runner.run(event.clone(), number, token);
            let span = match rerun {
                false => span::current(),
                true => self.attempt_span(&event, attempt, (&trace, true)),
            };
            let mut task = AbortOnDrop(tokio::spawn(span::instrument(span, run)));
            let joined = tokio::select! {
                biased;
                joined = &mut task.0 => joined,
                () = hurry_up(&mut hurried) => {
                    // Shut down past the grace period: stop it and wait until it has
                    // stopped. Finished meanwhile: its outcome stands, as below.
                    task.0.abort();
                    (&mut task.0).await
                }
                () = &mut beat => unreachable!("the heartbeat never ends"),
            };
            // The processor is free for the next event while this one's outcome is
            // written, or while it waits here to run again.
            freed.free();
            if let Some(outcome) = self.waits_here(&event, &joined, number, at) {
                let (after, counted) = self.told(&outcome, (&source, &id, &ty), number);
                let waited = tokio::select! {
                    biased;
                    () = hurry_up(&mut stopped) => false,
                    () = tokio::time::sleep(after) => true,
                    () = &mut beat => unreachable!("the heartbeat never ends"),
                };
                let again = async {
                    waited
                        && self
                            .queue
                            .again(&held, counted, heartbeat.lease_ends())
                            .await
                };
                let again = tokio::select! {
                    biased;
                    again = again => again,
                    () = &mut beat => unreachable!("the heartbeat never ends"),
                };
                if again {
                    freed.take_back().await;
                    attempt += u32::from(counted);
                    rerun = true;
                    continue;
                }
                // Stopped meanwhile, or the queue could not keep it: handed back at once,
                // a failed attempt counted, a snooze not; its turn kept until then.
                let back = match counted {
                    true => Outcome::Abandoned,
                    false => Outcome::Later(Duration::ZERO),
                };
                tokio::select! {
                    biased;
                    _ = self.finish(&held, back, &heartbeat) => {}
                    () = &mut beat => unreachable!("the heartbeat never ends"),
                }
                return;
            }
            // Its turns are free for the next event while its outcome is written.
            drop(turn);
            // The renewals go on until the outcome has landed: a slow "processed" must
            // not cost the lease that renewals would still have kept.
            let record = self.record(
                joined,
                &held,
                (&source, &id, &ty),
                (number, frees_turn),
                &heartbeat,
            );
            tokio::select! {
                biased;
                () = record => {}
                () = &mut beat => unreachable!("the heartbeat never ends"),
            }
            return;
        }
    }
}
