//! The stream's messages as the worker holds them: the durable consumer, pulls, each
//! event's claim in the store, parking a paused one, and giving the claim up.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::consumer::PullConsumer;
use async_nats::jetstream::Message;
use futures_util::StreamExt;
use tokio::sync::watch;
use tokio::time::Instant;

use super::super::pause;
use super::super::sealed::{may_take, passed, Read, FOREIGN};
use super::super::settle::{bury, nak};
use super::super::{event_of, header, held, JetStream};
use super::{Pulled, Stream};
use crate::inbox::process::hurry_up;
use crate::inbox::worker::Claimed;
use crate::metrics::{self, Attempt};
use crate::store::{
    ClaimGuard, Claimed as Key, DedupeStore, Delivery, PendingClaim, StoreError, Token,
};

impl Stream {
    /// Parks a paused event's message (see `pause.rs`); when the parked stream does not
    /// take it, it is handed back for a while, the delivery not counted as an attempt.
    pub(super) async fn park(&self, pulled: &Pulled, until: Instant) {
        let message = &pulled.message;
        let attempts = pulled.attempt().saturating_sub(1); // this delivery was none
        match pause::park(&self.jetstream, message, attempts, until).await {
            Ok(()) => {
                metrics::held_back(self.jetstream.lane.metrics(), metrics::HeldBack::Paused);
                // Out of the stream: its object's later events go on (they may start before
                // it once the pause ends, as any event accepted meanwhile).
                self.leave_line(pulled, until).await;
                pulled.forget(&self.jetstream).await;
            }
            Err(_error) => {
                // Handed back for a while (`move_out`): that delivery is no attempt either.
                #[cfg(feature = "tracing")]
                tracing::error!(target: "tower_webhook", "jetstream worker could not park a paused event: {_error}");
                held::add(&self.jetstream, pulled.seq, pulled.held()).await;
            }
        }
    }

    /// The durable consumer, created with `ack_wait` if it does not exist, else set to it
    /// (`renew.rs`).
    pub(super) async fn create_consumer(
        &self,
        ack_wait: Duration,
    ) -> Result<PullConsumer, StoreError> {
        let err = |e| StoreError::new("jetstream consumer", e);
        let js = &self.jetstream;
        let stream = js
            .inner
            .context
            .get_stream(&*js.inner.stream)
            .await
            .map_err(err)?;
        // Made by `build` with fan-out; else from here (another processor: from now).
        let start = stream.cached_info().state.last_sequence + 1;
        let config = js.lane.consumer_config(ack_wait, start);
        let consumer = stream
            .get_or_create_consumer(js.consumer(), config)
            .await
            .map_err(|e| StoreError::new("jetstream consumer", e))?;
        Ok(Self::set_ack_wait(&stream, consumer, ack_wait).await)
    }

    /// Pulls up to `n` messages: those there now, or the first to arrive within `wait`
    /// (`in_line`: as many as arrive within it, waiting behind the consumer's other pulls).
    /// The whole pull is read: its messages are delivered already, and one left unread
    /// would count an attempt it never had. But not a pull the connection lost: left to
    /// itself it waits 5 s past its expiry.
    // Never a pull without an expiry: while a redelivery is due the server keeps even a
    // no-wait pull until a message comes, and when another pull took that one, it waited
    // for the next accept — forever on a quiet stream, holding its processors and a
    // shutdown with them.
    pub(super) async fn pull(
        &self,
        consumer: &PullConsumer,
        (n, wait, in_line): (usize, Duration, bool),
        lease: Duration,
    ) -> Result<Vec<Claimed<Pulled>>, StoreError> {
        let err = |e| StoreError::new("jetstream pull", e);
        let mut batch = match in_line {
            false => {
                consumer
                    .fetch()
                    .max_messages(n)
                    .expires(wait)
                    .messages()
                    .await
            }
            true => {
                consumer
                    .batch()
                    .max_messages(n)
                    .expires(wait)
                    .messages()
                    .await
            }
        }
        .map_err(err)?;
        let client = self.jetstream.inner.context.client();
        let mut lost = std::pin::pin!(reconnected(client, wait));
        let mut rows = Vec::new();
        loop {
            let message = tokio::select! {
                message = batch.next() => message,
                () = &mut lost => break,
            };
            let Some(Ok(message)) = message else { break };
            let at = Instant::now();
            let (seq, delivered) = message.info().map_or((0, 1), |info| {
                let delivered = u32::try_from(info.delivered.max(1)).unwrap_or(u32::MAX);
                (info.stream_sequence, delivered)
            });
            // Only a redelivery may have been snoozed.
            let held = match delivered {
                1 => 0,
                _ => held::count(&self.jetstream, seq).await,
            };
            let prior = message
                .headers
                .as_ref()
                .and_then(|h| h.get(header::PRIOR_ATTEMPTS))
                .and_then(|n| n.as_str().parse::<u32>().ok())
                .unwrap_or(0);
            let attempt = i64::from(prior) + i64::from(delivered) - held;
            let attempt = u32::try_from(attempt.max(1)).unwrap_or(u32::MAX);
            let js = &self.jetstream;
            let event = match event_of(js, message.headers.as_ref(), message.payload.clone()) {
                Read::Event(event) => event,
                // Not an event this crate published: dead at once, never run.
                Read::Foreign => {
                    self.bury_now(message, FOREIGN.to_owned(), attempt, at + lease);
                    continue;
                }
                // Sealed, and no key opens it: the same, where this processor may run it.
                Read::Unreadable { .. } if !may_take(&js.lane, message.headers.as_ref()) => {
                    let js = js.clone();
                    tokio::spawn(async move { passed(&js, &message, at + lease).await });
                    continue;
                }
                Read::Unreadable { reason, why, about } => {
                    metrics::unreadable(about.source(), why);
                    self.bury_now(message, reason, attempt, at + lease);
                    continue;
                }
            };
            // A message this processor does not run is in no line (`processor.rs`).
            let taken = self.jetstream.lane.takes(message.headers.as_ref(), &event);
            let line = taken.then(|| self.line_of(&event)).flatten();
            let trace = trace_of(message.headers.as_ref(), delivered == 1 && attempt == 1);
            rows.push(Claimed {
                event,
                attempt,
                trace,
                held: Pulled {
                    message,
                    taken,
                    attempt: AtomicU32::new(attempt),
                    seq,
                    held: AtomicI64::new(held),
                    claim: Mutex::new(None),
                    claimed: Mutex::default(),
                    delayed: AtomicBool::new(false),
                    line,
                    written: AtomicBool::new(false),
                    first: AtomicBool::new(false),
                    _holding: self.holding.hold(seq),
                },
                at,
            });
        }
        Ok(rows)
    }

    /// Buries a message that cannot run (`error` says why) in the background: dead at
    /// once, counted as a dead attempt.
    fn bury_now(&self, message: Message, error: String, attempt: u32, until: Instant) {
        metrics::attempt(self.jetstream.lane.metrics(), Attempt::Dead);
        let js = self.jetstream.clone();
        tokio::spawn(async move {
            let _ = bury(&js, &message, &error, attempt, until).await;
        });
    }

    /// Another attempt holds the event for `after` more (this is a redelivery while it
    /// runs, or its worker died): back until then, holding no processor meanwhile; no
    /// attempt, so not counted. The holder's renewals and outcome settle a redelivery of
    /// its own message.
    pub(super) async fn give_way(&self, pulled: &Pulled, after: Duration, until: Instant) {
        held::add(&self.jetstream, pulled.seq, pulled.held()).await;
        pulled.delayed.store(true, Ordering::Relaxed);
        let _ = nak(&pulled.message, Some(after), until).await;
    }

    /// Claims the event's key, asking again while the store does not answer, or while
    /// another attempt holds it for at most [`WAIT_HERE`] (or a third of `ack_wait`) more:
    /// a message waits here, renewed, rather than spend one of its attempts. Held longer
    /// (a redelivery while the first delivery still runs, or its worker died), it goes
    /// back until then.
    pub(super) async fn claim_key(
        &self,
        store: &Arc<dyn DedupeStore>,
        delivery: Delivery,
        hurried: &mut watch::Receiver<bool>,
    ) -> Claim {
        let mut backoff = Duration::from_millis(50);
        loop {
            let pending =
                PendingClaim::new(store.clone(), delivery.clone(), Token::new(), self.lease);
            let claimed = tokio::select! {
                claimed = pending => claimed,
                () = hurry_up(hurried) => return Claim::Stopped,
            };
            let pause = match claimed {
                Key::Granted(guard) => return Claim::Granted(guard),
                Key::Done => return Claim::Done,
                Key::InFlight(after) if after > WAIT_HERE.min(self.ack_wait / 3) => {
                    return Claim::Elsewhere(after)
                }
                Key::InFlight(after) => after,
                Key::Failed(_error) => {
                    #[cfg(feature = "tracing")]
                    tracing::warn!(target: "tower_webhook", "jetstream worker could not claim an event in its store: {_error}");
                    let pause = backoff;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                    pause
                }
            };
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                () = hurry_up(hurried) => return Claim::Stopped,
            }
        }
    }
}

impl Pulled {
    /// Forgets its count of deliveries that were not attempts, once it is done.
    pub(super) async fn forget(&self, js: &JetStream) {
        if self.held() != 0 {
            held::forget(js, self.seq).await;
        }
    }

    pub(super) fn attempt(&self) -> u32 {
        self.attempt.load(Ordering::Relaxed)
    }

    pub(super) fn held(&self) -> i64 {
        self.held.load(Ordering::Relaxed)
    }

    /// The claim, to record the outcome with; `None` once another attempt took it over.
    pub(super) fn take(&self) -> Option<ClaimGuard> {
        self.claim.lock().expect("not poisoned").take()
    }

    /// Gives the claim up (a failed or stopped attempt), so the next delivery runs; tried
    /// again in the background while the claim's lease lasts.
    pub(super) async fn release(&self, until: Instant) {
        let until = self.claim_ends().map_or(until, |ends| ends.max(until));
        if let Some(guard) = self.take() {
            guard.release_until(until.into_std()).await;
        }
    }
}

/// What [`Stream::claim_key`] came to.
pub(super) enum Claim {
    /// This attempt holds the event's key.
    Granted(ClaimGuard),
    /// The event was processed already.
    Done,
    /// The worker is stopping past its grace.
    Stopped,
    /// Another attempt holds the event's key for this long more.
    Elsewhere(Duration),
}

/// The longest a message waits here, holding a processor, for another attempt's claim to
/// end (one about to lapse, or just given up).
const WAIT_HERE: Duration = Duration::from_secs(1);

/// Ends once `client` lost its connection and has it again, plus `poll`: a pull request
/// sent before survives the server at most that long, so none of its messages comes later.
async fn reconnected(client: async_nats::Client, poll: Duration) {
    let connected = || client.connection_state() == async_nats::connection::State::Connected;
    while connected() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    while !connected() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(poll).await;
}

/// The accept's trace context a message carries (feature `otel`), and whether this is its
/// event's first run since the accept: its first delivery (a snooze or a crash redelivers),
/// of the message the accept published — a message published again (parked and back,
/// backfilled, replayed from the dead stream) carries the crate's headers saying so.
fn trace_of(
    headers: Option<&async_nats::HeaderMap>,
    first_delivery: bool,
) -> (crate::span::TraceContext, bool) {
    #[cfg(feature = "otel")]
    {
        let text = |name| {
            headers
                .and_then(|h| h.get(name))
                .map(|v| v.as_str().to_owned())
        };
        let republished = [header::PRIOR_ATTEMPTS, header::PROCESSOR, header::ATTEMPTS]
            .into_iter()
            .any(|name| headers.is_some_and(|h| h.get(name).is_some()));
        let trace =
            crate::span::TraceContext::stored(text(header::TRACEPARENT), text(header::TRACESTATE));
        (trace, first_delivery && !republished)
    }
    #[cfg(not(feature = "otel"))]
    {
        let _ = (headers, first_delivery);
        (crate::span::TraceContext::default(), false)
    }
}
