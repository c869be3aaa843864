//! Backfill by receipt time (fan-out): a processor added later runs the messages the
//! stream received in a window before its consumer's start.
//!
//! Each message of the window the processor's filter takes is published again, addressed
//! to it alone (`Webhook-Processor: <name>`, as a parked message published back): its
//! workers run the copy on its consumer, with the same claim keys, and every other
//! processor acknowledges it unrun. A message is copied once: a marker in `<stream>-held`
//! (`backfilled.<name>.<seq>`, set after the copy is stored, and the copy's `Nats-Msg-Id`
//! within the duplicate window) keeps a second backfill from copying it again, and a copy
//! of a message the processor ran already is acknowledged without running (its key is
//! done in the store).

use std::time::{Duration, SystemTime};

use async_nats::jetstream::consumer::{pull, DeliverPolicy};
use futures_util::StreamExt;

use super::processors::Lane;
use super::sealed::{may_take, Read};
use super::{event_of, header, settle, JetStream};
use crate::store::{StoreError, StoreErrorKind};

/// How long the window's next message may take to arrive before the backfill gives up.
const NEXT: Duration = Duration::from_secs(10);

impl JetStream {
    /// Runs `processor` on the messages the stream received from `from` (`None`: its
    /// first) until `before` (`None`: until the processor's consumer started), that its
    /// filter takes and its consumer never read: each is published again for it alone
    /// (see the [module docs](super), fan-out). Returns how many were published; a
    /// message backfilled before is not again (0 for the same window twice), and one the
    /// processor ran already is acknowledged without running by a worker with a claim
    /// store ([`JetStreamWorker::at_least_once`](super::JetStreamWorker::at_least_once)
    /// runs it again). `default` reads the stream from its start: nothing to backfill.
    ///
    /// # Errors
    ///
    /// [`StoreErrorKind::InvalidInput`] for a processor not configured; when NATS cannot
    /// answer (what was published stays published: run it again to finish).
    pub async fn backfill(
        &self,
        processor: &str,
        from: Option<SystemTime>,
        before: Option<SystemTime>,
    ) -> Result<u64, StoreError> {
        fn err(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> StoreError {
            StoreError::new("jetstream backfill", e).with_kind(StoreErrorKind::Unavailable)
        }
        // Simpler than the plan's second durable consumer read by the workers (issue 33
        // §5): copies on the processor's own consumer need no change to the workers' pulls.
        let lane = self.inner.lanes.iter().find(|l| l.name() == processor);
        let lane = lane.ok_or_else(|| {
            StoreError::new(
                "jetstream backfill",
                format!("no processor {processor:?} is configured"),
            )
            .with_kind(StoreErrorKind::InvalidInput)
        })?;
        let context = &self.inner.context;
        let stream = context.get_stream(&*self.inner.stream).await.map_err(err)?;
        let mut consumer = stream
            .get_consumer::<pull::Config>(&lane.consumer)
            .await
            .map_err(err)?;
        let info = consumer.info().await.map_err(err)?;
        // The first message its consumer reads; `before` stops earlier.
        let (end, before) = match info.config.deliver_policy {
            DeliverPolicy::ByStartSequence { start_sequence } => (start_sequence, before),
            DeliverPolicy::ByStartTime { start_time } => {
                let start = SystemTime::from(start_time);
                (u64::MAX, Some(before.map_or(start, |b| b.min(start))))
            }
            _ => return Ok(0), // it reads the stream from its start
        };
        let deliver_policy = match from {
            Some(from) => DeliverPolicy::ByStartTime {
                start_time: from.into(),
            },
            None => DeliverPolicy::All,
        };
        let reader = stream
            .create_consumer(pull::OrderedConfig {
                deliver_policy,
                ..Default::default()
            })
            .await
            .map_err(err)?;
        if reader.cached_info().num_pending == 0 {
            return Ok(0);
        }
        let mut messages = reader.messages().await.map_err(err)?;
        let mut created = 0;
        loop {
            let next = tokio::time::timeout(NEXT, messages.next()).await;
            let message = match next {
                Ok(Some(Ok(message))) => message,
                Ok(Some(Err(e))) => return Err(err(e)),
                Ok(None) => return Ok(created),
                Err(_) => return Err(err("the stream's next message did not come")),
            };
            let info = message.info().map_err(|e| err(e.to_string()))?;
            let (seq, pending) = (info.stream_sequence, info.pending);
            let published = SystemTime::from(info.published);
            if seq >= end || before.is_some_and(|b| published >= b) {
                return Ok(created);
            }
            if self.copy(lane, &message, seq).await? {
                created += 1;
            }
            if pending == 0 {
                return Ok(created);
            }
        }
    }

    /// Publishes `message` (at `seq`) again for `lane` alone, unless its filter does not
    /// take it or it was backfilled before; `true` when a copy was stored.
    async fn copy(
        &self,
        lane: &Lane,
        message: &async_nats::jetstream::Message,
        seq: u64,
    ) -> Result<bool, StoreError> {
        let headers = message.headers.as_ref();
        let takes = match event_of(self, headers, message.payload.clone()) {
            Read::Event(event) => lane.takes(headers, &event),
            Read::Foreign => false,
            // Copied as it is: the processor's worker buries it, where it shows.
            Read::Unreadable { .. } => may_take(lane, headers),
        };
        if !takes {
            return Ok(false); // another processor's, or a type it does not take
        }
        let marker = format!("backfilled.{}.{seq}", lane.name());
        if let Ok(Some(_)) = self.inner.held.get(&marker).await {
            return Ok(false);
        }
        let mut headers = message.headers.clone().unwrap_or_default();
        let id = headers
            .get(async_nats::header::NATS_MESSAGE_ID)
            .map(|id| id.as_str().to_owned())
            .unwrap_or_default();
        headers.insert(header::PROCESSOR, lane.name());
        let id = format!("{id}:backfill:{}:{seq}", lane.name());
        headers.insert(async_nats::header::NATS_MESSAGE_ID, id);
        let stream = &*self.inner.stream;
        let stored = settle::publish(self, message, (stream, stream), headers).await?;
        // Not kept: the copy's id still stops a second copy within the duplicate window.
        let _ = self.inner.held.put(&marker, "1".into()).await;
        Ok(stored)
    }
}
