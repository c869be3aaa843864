//! The delay queues a retry or a snooze waits in: `<queue>-retry-<ms>`, one per step of a
//! ladder doubling from 100 ms to about 29 h, each a quorum queue whose message TTL is its
//! step and which dead-letters (at least once) back to the queue through the default
//! exchange. Declared when first needed (only the steps used exist); counted and deleted
//! with the queue.
//!
//! One queue per step, not one queue with a TTL per message: RabbitMQ expires a message
//! only at the head of its queue, so a short delay queued behind a long one would wait
//! out the long one too; within a queue of one TTL, the head is always the first due.

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Duration;

use lapin::options::{QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::{AMQPValue, FieldTable, LongString};

use super::super::connection::{answered, close};
use super::super::Amqp;
use crate::store::StoreError;

/// The first step, in milliseconds; each next one doubles it.
const FIRST_MS: u64 = 100;
/// How many steps: the last is 100 ms × 2²⁰, about 29 h.
const STEPS: u32 = 21;

/// The step nearest `after` (in the ratio of their lengths: within ×1.41 of it); `None`
/// for no delay.
pub(super) fn step(after: Duration) -> Option<u32> {
    if after.is_zero() {
        return None;
    }
    #[allow(clippy::cast_precision_loss)] // milliseconds far below 2⁵²
    let ratio = after.as_millis() as f64 / FIRST_MS as f64;
    let k = ratio.log2().round().clamp(0.0, f64::from(STEPS - 1));
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // 0..=20
    Some(k as u32)
}

/// How long step `k` waits.
#[cfg(test)]
fn delay(k: u32) -> Duration {
    Duration::from_millis(FIRST_MS << k)
}

/// How much a delay queue's name adds to its queue's, at most (the last step's).
pub(crate) fn longest_suffix() -> usize {
    name("", STEPS - 1).len()
}

/// Every step's queue for `queue`.
pub(crate) fn names(queue: &str) -> impl Iterator<Item = String> + '_ {
    (0..STEPS).map(move |k| name(queue, k))
}

/// Step `k`'s queue for `queue`.
pub(crate) fn name(queue: &str, k: u32) -> String {
    format!("{queue}-retry-{}", FIRST_MS << k)
}

/// A delay queue's arguments: the quorum type, its TTL, and at-least-once dead-lettering
/// back to `queue` (which RabbitMQ takes only with `reject-publish` overflow).
fn arguments(queue: &str, k: u32) -> FieldTable {
    let text = |s: &str| AMQPValue::LongString(LongString::from(s));
    let mut args = FieldTable::default();
    args.insert("x-queue-type".into(), text("quorum"));
    let ttl = i64::try_from(FIRST_MS << k).unwrap_or(i64::MAX);
    args.insert("x-message-ttl".into(), AMQPValue::LongLongInt(ttl));
    args.insert("x-dead-letter-exchange".into(), text(""));
    args.insert("x-dead-letter-routing-key".into(), text(queue));
    args.insert("x-dead-letter-strategy".into(), text("at-least-once"));
    args.insert("x-overflow".into(), text("reject-publish"));
    args
}

async fn declare_on(channel: &lapin::Channel, queue: &str, k: u32) -> Result<(), StoreError> {
    let name = name(queue, k);
    let options = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    let declared = channel.queue_declare(name.as_str().into(), options, arguments(queue, k));
    answered("amqp delay queue", declared).await?.map_err(|e| {
        StoreError::new("amqp delay queue", format!("cannot declare '{name}': {e}"))
    })?;
    Ok(())
}

/// The steps this process declared (each is declared again after a publish to it failed:
/// it may have been deleted).
#[derive(Default)]
pub(super) struct Declared(Mutex<HashSet<u32>>);

impl Declared {
    /// The queue for a wait of `after`: the worker's processor's queue itself for none,
    /// else its step's delay queue, declared first if this process has not yet.
    pub(super) async fn queue_for(
        &self,
        amqp: &Amqp,
        after: Duration,
    ) -> Result<String, StoreError> {
        let queue = amqp.lane().queue.as_str();
        let Some(k) = step(after) else {
            return Ok(queue.to_owned());
        };
        let name = name(queue, k);
        if self.steps().contains(&k) {
            return Ok(name);
        }
        let channel = amqp.channel().await?;
        let declared = declare_on(&channel, queue, k).await;
        close(&channel, "done").await;
        declared?;
        self.steps().insert(k);
        Ok(name)
    }

    /// A publish to step `k`'s queue failed: declare it again next time.
    pub(super) fn forget(&self, after: Duration) {
        if let Some(k) = step(after) {
            self.steps().remove(&k);
        }
    }

    fn steps(&self) -> std::sync::MutexGuard<'_, HashSet<u32>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// How many messages wait in each of `queues`' delay queues: a passive declare of each
/// step, on a connection of its own — a step never used does not exist, and its 404
/// closes the channel asked on (lapin then keeps that channel number's error: not on the
/// shared connection).
pub(crate) async fn waiting_in(amqp: &Amqp, queues: &[&str]) -> Result<Vec<u64>, StoreError> {
    let connection = amqp.connection().apart().await?;
    let mut counted = Vec::new();
    for queue in queues {
        match count(&connection, queue).await {
            Ok(n) => counted.push(n),
            Err(error) => {
                let _ = answered("amqp close", connection.close(200, "done".into())).await;
                return Err(error);
            }
        }
    }
    let _ = answered("amqp close", connection.close(200, "done".into())).await;
    Ok(counted)
}

async fn count(connection: &lapin::Connection, queue: &str) -> Result<u64, StoreError> {
    let err = |e| StoreError::new("amqp counts", e);
    let passive = QueueDeclareOptions {
        passive: true,
        ..QueueDeclareOptions::default()
    };
    let open = || async {
        answered("amqp counts", connection.create_channel())
            .await?
            .map_err(err)
    };
    let mut channel = open().await?;
    let mut total = 0u64;
    for k in 0..STEPS {
        let name = name(queue, k);
        let declared = channel.queue_declare(name.as_str().into(), passive, FieldTable::default());
        match answered("amqp counts", declared).await? {
            Ok(queue) => total += u64::from(queue.message_count()),
            // Missing (404: the broker closed the channel): none there; a new channel.
            Err(_) => channel = open().await?,
        }
    }
    Ok(total)
}

/// Deletes `queue`'s delay queues (a missing one is no error).
pub(crate) async fn delete(amqp: &Amqp, queue: &str) -> Result<(), StoreError> {
    let channel = amqp.channel().await?;
    for k in 0..STEPS {
        let name = name(queue, k);
        let deleted = channel.queue_delete(name.as_str().into(), QueueDeleteOptions::default());
        answered("amqp delete", deleted)
            .await?
            .map_err(|e| StoreError::new("amqp delete", e))?;
    }
    close(&channel, "done").await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delay_waits_the_nearest_step() {
        let ms = Duration::from_millis;
        assert_eq!(step(Duration::ZERO), None);
        assert_eq!(step(ms(1)), Some(0));
        assert_eq!(step(ms(100)), Some(0));
        assert_eq!(step(ms(140)), Some(0));
        assert_eq!(step(ms(150)), Some(1));
        assert_eq!(step(ms(1000)), Some(3)); // 800 ms: 1 s is nearer 800 than 1 600
        assert_eq!(step(Duration::from_secs(600)), Some(13)); // 819.2 s
        assert_eq!(step(Duration::from_secs(365 * 86_400)), Some(20));
        assert_eq!(delay(20), ms(104_857_600));
        assert_eq!(name("webhooks", 3), "webhooks-retry-800");
    }

    #[test]
    fn every_delay_is_within_its_steps_ratio() {
        for ms in [100u64, 333, 1_000, 7_777, 60_000, 600_000, 3_600_000] {
            let after = Duration::from_millis(ms);
            let waited = delay(step(after).expect("a delay"));
            let ratio = waited.as_secs_f64() / after.as_secs_f64();
            assert!((0.70..=1.42).contains(&ratio), "{ms} ms waits {waited:?}");
        }
    }
}
