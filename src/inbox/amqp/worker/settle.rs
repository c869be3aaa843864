//! How a delivery ends beside being processed: acknowledged, requeued, sent back as a copy
//! (to wait out a delay, or at once) with the attempts it had had, or buried in
//! `<queue>-dead` with its error. Every copy is published on the confirm-mode channel and
//! counts only on an `Ack` with nothing returned; the delivery is acknowledged after it.

use std::time::Duration;

use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicNackOptions};
use lapin::types::{AMQPValue, FieldTable, LongString};
use tokio::time::Instant;

use super::super::Amqp;
use super::delivered::{Delivered, ATTEMPTS, ERROR, PRIOR_ATTEMPTS};
use super::Consumed;
use crate::inbox::message::one_line;
use crate::store::{retry_until, StoreError};

/// How long an acknowledgement or a nack may wait for the broker (copies wait the
/// confirm timeout, `publish::confirmed`).
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(5);

/// Acknowledges the delivery, tried again until `until` while the call fails. AMQP does
/// not answer an acknowledgement: one lost with the connection is a delivery again, which
/// the store's done key acknowledges unrun.
pub(super) async fn ack(delivery: &Delivery, until: Instant) -> Result<(), StoreError> {
    retry_until(until, || async {
        // Bounded: on a connection the broker's restart killed, lapin may never answer.
        let ack = delivery.acker.ack(BasicAckOptions::default());
        match tokio::time::timeout(CONFIRM_TIMEOUT, ack).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(StoreError::new("amqp ack", e)),
            Err(_) => Err(StoreError::message("amqp ack: no answer in time")),
        }
    })
    .await
}

/// Hands the delivery back at once: the broker counts it (`x-delivery-count`), so the
/// next delivery is one attempt later.
pub(super) async fn requeue(delivery: &Delivery) {
    let requeue = BasicNackOptions {
        requeue: true,
        ..BasicNackOptions::default()
    };
    // Not sent (the channel died): the broker requeues it anyway, counted the same.
    let _ = tokio::time::timeout(CONFIRM_TIMEOUT, delivery.acker.nack(requeue)).await;
}

/// Sends the event back to run after `after` (at once: zero) — its attempt `counted` or
/// not — as a copy carrying the attempts before it, to its delay queue or the queue, then
/// acknowledges the delivery. When the copy is not confirmed by `until`, the delivery is
/// requeued instead: delivered again at once, its attempt counted by the broker.
pub(super) async fn back(
    queue: &Consumed,
    held: &Delivered,
    after: Duration,
    counted: bool,
    until: Instant,
) {
    let prior = held.prior(counted);
    let copied = retry_until(until, || async {
        let to = queue.delays.queue_for(&queue.amqp, after);
        let to = tokio::time::timeout(CONFIRM_TIMEOUT, to)
            .await
            .map_err(|_| {
                StoreError::message("amqp delay queue: no answer from the broker in time")
            })??;
        let mut headers = copied_headers(&held.delivery);
        headers.insert(PRIOR_ATTEMPTS.into(), text(&prior.to_string()));
        let published = publish(&queue.amqp, &held.delivery, &to, headers).await;
        if published.is_err() {
            queue.delays.forget(after);
        }
        published
    });
    match copied.await {
        Ok(()) => {
            let _ = ack(&held.delivery, until).await;
        }
        Err(_error) => {
            #[cfg(feature = "tracing")]
            tracing::error!(target: "tower_webhook", "amqp worker could not send an event back to wait (requeued at once instead): {_error}");
            requeue(&held.delivery).await;
        }
    }
}

/// Publishes the event to the worker's processor's dead queue (`<queue>-dead` for
/// `default`) with `error` (one line) and its `attempts`,
/// then acknowledges the delivery. When the dead queue does not take it by `until`, the
/// delivery is requeued (and buried at a later delivery).
pub(super) async fn bury(
    amqp: &Amqp,
    held: &Delivered,
    error: &str,
    attempts: u32,
    until: Instant,
) -> Result<(), StoreError> {
    let mut headers = copied_headers(&held.delivery);
    headers.insert(ERROR.into(), text(&one_line(error)));
    headers.insert(ATTEMPTS.into(), text(&attempts.to_string()));
    let buried = retry_until(until, || {
        publish(
            amqp,
            &held.delivery,
            &amqp.lane().dead_queue,
            headers.clone(),
        )
    });
    match buried.await {
        Ok(()) => ack(&held.delivery, until).await,
        Err(error) => {
            #[cfg(feature = "tracing")]
            tracing::error!(target: "tower_webhook", "amqp worker could not move a dead event to the dead queue: {error}");
            requeue(&held.delivery).await;
            Err(error)
        }
    }
}

/// The delivery's headers without the broker's own (`x-delivery-count`, `x-death`, …),
/// which describe the delivery, not the event.
pub(super) fn copied_headers(delivery: &Delivery) -> FieldTable {
    let mut headers = FieldTable::default();
    if let Some(original) = delivery.properties.headers() {
        for (name, value) in original.inner() {
            let name_text = name.as_str();
            if !name_text.starts_with("x-") && name_text != PRIOR_ATTEMPTS {
                headers.insert(name.clone(), value.clone());
            }
        }
    }
    headers
}

pub(super) fn text(value: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(value))
}

/// Publishes a copy of the delivery's message (body and properties, with `headers`) to
/// `queue` through the default exchange — never the topic exchange, whose other queues
/// had it already — persistent and `mandatory`; `Ok` only once the broker acknowledged it
/// with nothing returned.
pub(super) async fn publish(
    amqp: &Amqp,
    delivery: &Delivery,
    queue: &str,
    headers: FieldTable,
) -> Result<(), StoreError> {
    let properties = delivery.properties.clone().with_headers(headers);
    let to = ("", queue);
    super::super::publish::confirmed(amqp, "amqp publish", to, &delivery.data, properties).await
}
