//! A paused event parked in `<queue>-paused` (its processor's: `<queue>-<name>-paused`
//! with fan-out), and the parked events moved back into its processor's queue when their
//! pause ended (see `amqp/pause.rs`).

use std::time::Duration;

use lapin::options::{BasicAckOptions, BasicGetOptions};
use lapin::types::ShortString;
use tokio::time::Instant;

use super::super::publish::header;
use super::super::Amqp;
use super::delivered::{number, text, Delivered, PRIOR_ATTEMPTS};
use super::{settle, Consumed};
use crate::metrics;
use crate::store::StoreError;

/// How long a parked event that could not be parked waits before it is pulled again.
const NOT_PARKED: Duration = Duration::from_secs(1);

/// Parks a paused event: a copy with the attempts it has had (this delivery was none)
/// to `<queue>-paused`, confirmed, then the delivery acknowledged. When the parked queue
/// does not take it, it waits a while in a delay queue instead, not counted.
pub(super) async fn park(queue: &Consumed, held: &Delivered, until: Instant) {
    let mut headers = settle::copied_headers(&held.delivery);
    let prior = held.prior(false).to_string();
    headers.insert(PRIOR_ATTEMPTS.into(), settle::text(&prior));
    let amqp = &queue.amqp;
    let parked = settle::publish(amqp, &held.delivery, &amqp.lane().paused_queue, headers).await;
    match parked {
        Ok(()) => {
            metrics::held_back(&queue.metrics, metrics::HeldBack::Paused);
            let _ = settle::ack(&held.delivery, until).await;
        }
        Err(_error) => {
            #[cfg(feature = "tracing")]
            tracing::error!(target: "tower_webhook", "amqp worker could not park a paused event (it waits and comes back): {_error}");
            settle::back(queue, held, NOT_PARKED, false, until).await;
        }
    }
}

/// Moves the parked events back whenever a pause ends (and once at the start, for what
/// a stopped worker left): a worker's task beside it.
pub(super) async fn unparking(amqp: Amqp) {
    let mut resumed = amqp.pause_log().resumed();
    loop {
        resumed.borrow_and_update();
        if let Err(_error) = unpark(&amqp).await {
            #[cfg(feature = "tracing")]
            tracing::warn!(target: "tower_webhook", "amqp worker could not move parked events back: {_error}");
            tokio::time::sleep(NOT_PARKED).await;
            continue;
        }
        if resumed.changed().await.is_err() {
            return;
        }
    }
}

/// Moves the parked events no pause holds any more back into the queue, in the order
/// they were parked: each a confirmed publish, then its acknowledgement. Those a pause
/// still holds go back to `<queue>-paused` when the channel closes.
async fn unpark(amqp: &Amqp) -> Result<u64, StoreError> {
    amqp.pause_log().sync(amqp).await?;
    let channel = amqp.channel().await?;
    let moved = async {
        let err = |e| StoreError::new("amqp unpark", e);
        let mut moved = 0;
        loop {
            let get = channel.basic_get(
                amqp.lane().paused_queue.as_str().into(),
                BasicGetOptions { no_ack: false },
            );
            let got = tokio::time::timeout(Duration::from_secs(5), get).await;
            let got = got.map_err(|_| StoreError::message("amqp unpark: no answer in time"))?;
            let Some(message) = got.map_err(err)? else {
                return Ok(moved);
            };
            let delivery = message.delivery;
            let headers = delivery.properties.headers().clone().unwrap_or_default();
            let source = text(&headers, header::SOURCE).unwrap_or_default();
            let event_type = text(&headers, header::TYPE);
            let processor = amqp.lane().name();
            if amqp
                .pause_log()
                .covers(processor, &source, event_type.as_deref())
            {
                continue; // held unacknowledged: back to the parked queue at the close
            }
            let prior = number(&headers, PRIOR_ATTEMPTS).to_string();
            let mut copied = settle::copied_headers(&delivery);
            copied.insert(PRIOR_ATTEMPTS.into(), settle::text(&prior));
            settle::publish(amqp, &delivery, &amqp.lane().queue, copied).await?;
            let ack = delivery.acker.ack(BasicAckOptions::default());
            let acked = tokio::time::timeout(Duration::from_secs(5), ack).await;
            acked
                .map_err(|_| StoreError::message("amqp unpark: no answer in time"))?
                .map_err(err)?;
            moved += 1;
        }
    };
    let moved = moved.await;
    let close = channel.close(200, ShortString::from("done"));
    let _ = tokio::time::timeout(Duration::from_secs(2), close).await;
    moved
}
