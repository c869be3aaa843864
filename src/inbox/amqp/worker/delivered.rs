//! A delivery as the worker holds it: the event read from its headers and body, which
//! attempt it is (the attempts before its copy, in a header, and the quorum queue's count
//! of its deliveries that ended without an outcome), and its event's claim in the store.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use lapin::message::Delivery;
use lapin::types::{AMQPValue, FieldTable};
use tokio::sync::watch;
use tokio::time::Instant;

use super::super::publish::header;
use crate::inbox::message::{self, Keys, Read};
use crate::inbox::process::hurry_up;
use crate::store::{
    ClaimGuard, Claimed as Key, DedupeStore, Delivery as StoreKey, PendingClaim, Renewed,
    StoreError, Token,
};
use crate::Event;

pub(super) use header::{ATTEMPTS, ERROR, PRIOR_ATTEMPTS};
/// The quorum queue's count of a message's earlier deliveries (requeued, or its channel
/// closed before an outcome).
const DELIVERY_COUNT: &str = "x-delivery-count";

/// The longest a delivery waits here, holding a processor, for another attempt's claim to
/// end (one about to lapse, or just given up).
const WAIT_HERE: Duration = Duration::from_secs(1);

/// The accept's trace context, and whether this is the event's first run since.
pub(super) type Trace = (crate::span::TraceContext, bool);

/// A delivery the worker holds.
pub(crate) struct Delivered {
    pub(super) delivery: Delivery,
    /// Which attempt this is (from 1).
    pub(super) attempt: u32,
    /// The event's claim while this attempt holds it (taken out to record the outcome;
    /// dropped armed — the attempt stopped — it releases).
    claim: Mutex<Option<ClaimGuard>>,
    /// When the claim's lease ends, as far as this attempt knows.
    claim_ends: Mutex<Option<Instant>>,
}

/// What [`Delivered::claim_key`] came to.
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

impl Delivered {
    /// The delivery held, with what it carries (its body opened with `keys` when it was
    /// sealed) and its trace context.
    pub(super) fn read(delivery: Delivery, keys: Keys<'_>) -> (Self, Read, Trace) {
        let headers = delivery.properties.headers().clone().unwrap_or_default();
        let prior = number(&headers, PRIOR_ATTEMPTS);
        let delivered = number(&headers, DELIVERY_COUNT);
        let attempt = prior.saturating_add(delivered).saturating_add(1);
        let first = prior == 0 && delivered == 0 && !headers.contains_key(PRIOR_ATTEMPTS);
        let get = |name: &str| text(&headers, name);
        let read = message::read(get, Bytes::copy_from_slice(&delivery.data), keys);
        let held = Self {
            delivery,
            attempt,
            claim: Mutex::new(None),
            claim_ends: Mutex::new(None),
        };
        (held, read, trace_of(&headers, first))
    }

    /// A processor's error as the dead queue's `Webhook-Error` keeps it: one line, sealed
    /// with a ring (`inbox/message.rs`).
    pub(super) fn sealed_error(&self, keys: Keys<'_>, processor: &str, error: &str) -> String {
        let headers = self.delivery.properties.headers().as_ref();
        let get = |name| headers.and_then(|h| text(h, name)).unwrap_or_default();
        let id = (get(header::SOURCE), get(header::ID));
        message::error(keys, (&id.0, &id.1), processor, message::one_line(error))
    }

    /// The attempts before this one, once it is over: `counted`, it is one of them.
    pub(super) fn prior(&self, counted: bool) -> u32 {
        self.attempt - u32::from(!counted)
    }

    /// Claims the event's key, asking again while the store does not answer, or while
    /// another attempt holds it for at most [`WAIT_HERE`] more: a delivery waits here
    /// rather than go back. Held longer (a delivery again while the first still runs, or
    /// its worker died), it goes back until then.
    pub(super) async fn claim_key(
        &self,
        store: &Arc<dyn DedupeStore>,
        source: String,
        event: &Event,
        lease: Duration,
        hurried: &mut watch::Receiver<bool>,
    ) -> Claim {
        let key = StoreKey::new(source, event.stored_id().to_owned());
        let mut backoff = Duration::from_millis(50);
        loop {
            let pending = PendingClaim::new(store.clone(), key.clone(), Token::new(), lease);
            let claimed = tokio::select! {
                claimed = pending => claimed,
                () = hurry_up(hurried) => return Claim::Stopped,
            };
            let pause = match claimed {
                Key::Granted(guard) => return Claim::Granted(guard),
                Key::Done => return Claim::Done,
                Key::InFlight(after) if after > WAIT_HERE => return Claim::Elsewhere(after),
                Key::InFlight(after) => after,
                Key::Failed(_error) => {
                    #[cfg(feature = "tracing")]
                    tracing::warn!(target: "tower_webhook", "amqp worker could not claim an event in its store: {_error}");
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

    /// Holds the event's claim, renewed from here on its lease.
    pub(super) fn hold_claim(&self, guard: ClaimGuard, lease: Duration) {
        let ends = Instant::from_std(guard.sent()) + lease;
        *self.claim_ends.lock().expect("not poisoned") = Some(ends);
        *self.claim.lock().expect("not poisoned") = Some(guard);
    }

    /// The claim's renewal, if it holds one.
    pub(super) fn renewal(
        &self,
        lease: Duration,
    ) -> Option<impl Future<Output = Result<Renewed, StoreError>>> {
        let claim = self.claim.lock().expect("not poisoned");
        claim.as_ref().map(|guard| guard.renew(lease))
    }

    /// Renewed: its lease ends at `ends`.
    pub(super) fn renewed(&self, ends: Instant) {
        *self.claim_ends.lock().expect("not poisoned") = Some(ends);
    }

    /// Another attempt took the claim over: nothing to release.
    pub(super) fn lost(&self) {
        if let Some(lost) = self.take() {
            let _ = lost.into_parts();
        }
    }

    /// The claim, to record the outcome with; `None` once another attempt took it over.
    pub(super) fn take(&self) -> Option<ClaimGuard> {
        self.claim.lock().expect("not poisoned").take()
    }

    /// When the claim's lease ends, as far as this attempt knows.
    pub(super) fn claim_ends(&self) -> Option<Instant> {
        *self.claim_ends.lock().expect("not poisoned")
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

/// A header's text: a long or short string as sent, a number written out.
pub(in crate::inbox::amqp) fn text(headers: &FieldTable, name: &str) -> Option<String> {
    match headers.inner().get(name)? {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.as_str().to_owned()),
        other => integer(other).map(|n| n.to_string()),
    }
}

/// A header's whole number (0 when missing or not one).
pub(super) fn number(headers: &FieldTable, name: &str) -> u32 {
    let n = match headers.inner().get(name) {
        Some(AMQPValue::LongString(_) | AMQPValue::ShortString(_)) => {
            text(headers, name).and_then(|t| t.trim().parse::<i64>().ok())
        }
        Some(other) => integer(other),
        None => None,
    };
    n.map_or(0, |n| u32::try_from(n.max(0)).unwrap_or(u32::MAX))
}

fn integer(value: &AMQPValue) -> Option<i64> {
    Some(match *value {
        AMQPValue::ShortShortInt(n) => n.into(),
        AMQPValue::ShortShortUInt(n) => n.into(),
        AMQPValue::ShortInt(n) => n.into(),
        AMQPValue::ShortUInt(n) => n.into(),
        AMQPValue::LongInt(n) => n.into(),
        AMQPValue::LongUInt(n) => n.into(),
        AMQPValue::LongLongInt(n) => n,
        _ => return None,
    })
}

/// The accept's trace context a message carries (feature `otel`), and whether this is its
/// event's first run since the accept: its first delivery of the message the accept
/// published (a copy carries the attempts before it).
fn trace_of(headers: &FieldTable, first: bool) -> Trace {
    #[cfg(feature = "otel")]
    {
        let trace = crate::span::TraceContext::stored(
            text(headers, header::TRACEPARENT),
            text(headers, header::TRACESTATE),
        );
        (trace, first)
    }
    #[cfg(not(feature = "otel"))]
    {
        let _ = (headers, first);
        (crate::span::TraceContext::default(), false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lapin::types::{LongString, ShortString};

    #[test]
    fn counts_are_read_whatever_their_type_and_missing_is_zero() {
        let mut headers = FieldTable::default();
        headers.insert(ShortString::from("a"), AMQPValue::LongLongInt(3));
        headers.insert(
            ShortString::from("b"),
            AMQPValue::LongString(LongString::from("7")),
        );
        headers.insert(ShortString::from("c"), AMQPValue::LongLongInt(-2));
        headers.insert(
            ShortString::from("d"),
            AMQPValue::LongString(LongString::from("x")),
        );
        assert_eq!(number(&headers, "a"), 3);
        assert_eq!(number(&headers, "b"), 7);
        assert_eq!(number(&headers, "c"), 0);
        assert_eq!(number(&headers, "d"), 0);
        assert_eq!(number(&headers, "missing"), 0);
    }
}
