//! Invalid events on RabbitMQ (feature `schemas`), as JetStream's
//! (`inbox/jetstream/invalid.rs`): an event its schema refused is kept in
//! `<queue>-invalid` with its errors (`Webhook-Validation-Errors`, JSON pointer and
//! message, never a value); [`Amqp::list_invalid`] reads them without removing any, and
//! [`Amqp::requeue_invalid`] publishes those that pass their schema now back to the
//! exchange (confirmed) before removing them.

use std::time::Duration;

use lapin::options::{BasicAckOptions, BasicGetOptions};
use lapin::types::FieldTable;

use super::connection::{answered, close};
use super::publish::{confirmed, header, routing_key};
use super::worker::text;
use super::{topology, Amqp};
use crate::inbox::message;
use crate::inbox::RevalidatedCounts;
use crate::schemas::SchemaError;
use crate::store::{StoreError, StoreErrorKind};

/// The most messages one [`Amqp::list_invalid`] reads.
pub const MAX_INVALID_LIST: usize = 1000;

/// One message of `<queue>-invalid`, as [`Amqp::list_invalid`] reads it: the event's key
/// and envelope from its headers, and the errors its schema found, never its body.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct InvalidMessage {
    /// Which endpoint or provider.
    pub source: String,
    /// The provider's event id (the dedupe id).
    pub id: String,
    /// The event type, where known.
    pub event_type: Option<String>,
    /// The object the event is about, where known.
    pub object_id: Option<String>,
    /// What its schema found at accept (`Webhook-Validation-Errors`).
    pub validation_errors: Vec<SchemaError>,
}

impl Amqp {
    /// Up to `limit` (cut to `1..=`[`MAX_INVALID_LIST`]) messages of the invalid queue,
    /// as the broker hands them out (oldest first, unless some were handed back), each
    /// read unacknowledged on a channel of its own and handed back when it closes:
    /// nothing is removed (the broker counts a delivery on each; the invalid queue's
    /// delivery limit is past any count, `topology.rs`). RabbitMQ's queue has no positions
    /// to page from: the first `limit`, and [`Counts::invalid`](crate::inbox::Counts::invalid) says how many
    /// there are. A message that is not an event of this crate's (no source or id) is
    /// skipped. Without schemas (no invalid queue), an empty list.
    ///
    /// # Errors
    ///
    /// When there is no connection, or the broker refuses.
    pub async fn list_invalid(&self, limit: usize) -> Result<Vec<InvalidMessage>, StoreError> {
        if !self.has_schemas() {
            return Ok(Vec::new());
        }
        let limit = limit.clamp(1, MAX_INVALID_LIST);
        let channel = self.channel().await?;
        let mut listed = Vec::new();
        let mut read: u64 = 0;
        while read < limit as u64 {
            let Some((_, headers)) = get(&channel, self.invalid_queue()).await? else {
                break;
            };
            read += 1;
            if let Some(message) = listed_of(&headers) {
                listed.push(message);
            }
        }
        self.hand_back(channel, read).await;
        Ok(listed)
    }

    /// Checks every message of the invalid queue again against the schemas this `Amqp`
    /// has now: each one that passes is published to the exchange (its routing key
    /// `<source>.<type>`, without its errors header and the broker's `x-` headers, its
    /// body as it was, sealed or not) and removed from the invalid queue once the broker
    /// confirmed it; the others stay, handed back at the end. A message no key opens, or
    /// not an event of this crate's, stays and counts as still invalid.
    ///
    /// # Errors
    ///
    /// When there is no connection, or a publish is not confirmed: what moved until then
    /// stays moved, the rest stays (a message published whose removal then failed is in
    /// both: its event runs once, the worker's claim acknowledging the second unrun).
    pub async fn requeue_invalid(&self) -> Result<RevalidatedCounts, StoreError> {
        let mut done = RevalidatedCounts::default();
        if !self.has_schemas() {
            return Ok(done);
        }
        let channel = self.channel().await?;
        let requeued = async {
            // What was read and not removed stays unacknowledged on this channel, so
            // each message is read once; the queue ends.
            while let Some((got, headers)) = get(&channel, self.invalid_queue()).await? {
                let payload = bytes::Bytes::copy_from_slice(&got.data);
                let read = message::read(|name| text(&headers, name), payload, self.keys());
                let Some(event) = read.event().filter(|event| self.passes(event)) else {
                    done.still_invalid += 1;
                    continue;
                };
                let mut kept = FieldTable::default();
                for (name, value) in headers.inner() {
                    let name_text = name.as_str();
                    if !name_text.starts_with("x-")
                        && !name_text.eq_ignore_ascii_case(header::VALIDATION_ERRORS)
                    {
                        kept.insert(name.clone(), value.clone());
                    }
                }
                let properties = got.properties.clone().with_headers(kept);
                let key = routing_key(&event);
                let to = (self.exchange(), key.as_str());
                confirmed(self, "amqp requeue invalid", to, &got.data, properties).await?;
                let acked = got.acker.ack(BasicAckOptions::default());
                let acked = answered("amqp requeue invalid", acked).await?;
                acked.map_err(|e| StoreError::new("amqp requeue invalid", e))?;
                done.queued += 1;
            }
            Ok::<_, StoreError>(())
        };
        let result = requeued.await;
        self.hand_back(channel, done.still_invalid).await;
        result.map(|()| done)
    }

    /// Closes `channel`, handing back the `read` messages it holds unacknowledged, and
    /// waits (up to 2 s) until the invalid queue counts them again: the quorum queue takes
    /// them back after the channel's close returned, and a count or listing right after
    /// would miss them.
    async fn hand_back(&self, channel: lapin::Channel, read: u64) {
        close(&channel, "handed back").await;
        if read == 0 {
            return;
        }
        let Ok(counting) = self.channel().await else {
            return;
        };
        let end = tokio::time::Instant::now() + Duration::from_secs(2);
        while tokio::time::Instant::now() < end {
            match topology::message_count(&counting, self.invalid_queue()).await {
                Ok(n) if u64::from(n) < read => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                _ => break,
            }
        }
        close(&counting, "counted").await;
    }

    /// Whether `event` passes the schemas this `Amqp` has now.
    fn passes(&self, event: &crate::Event) -> bool {
        (self.inner.schemas.as_ref()).is_none_or(|schemas| schemas.validate(event).is_ok())
    }
}

/// The next message of `queue`, unacknowledged, and its headers; `None` when it is empty.
async fn get(
    channel: &lapin::Channel,
    queue: &str,
) -> Result<Option<(lapin::message::Delivery, FieldTable)>, StoreError> {
    let got = channel.basic_get(queue.into(), BasicGetOptions { no_ack: false });
    let got = answered("amqp read invalid", got).await?;
    let got = got.map_err(|e| {
        StoreError::new("amqp read invalid", e).with_kind(StoreErrorKind::Unavailable)
    })?;
    Ok(got.map(|got| {
        let headers = got
            .delivery
            .properties
            .headers()
            .clone()
            .unwrap_or_default();
        (got.delivery, headers)
    }))
}

/// The listing's view of a message of the invalid queue; `None` when it is not an event
/// this crate published (no source or id).
fn listed_of(headers: &FieldTable) -> Option<InvalidMessage> {
    let get = |name: &str| text(headers, name);
    Some(InvalidMessage {
        source: get(header::SOURCE)?,
        id: get(header::ID)?,
        event_type: get(header::TYPE),
        object_id: get(header::OBJECT_ID),
        validation_errors: SchemaError::list_from_json(
            &get(header::VALIDATION_ERRORS).unwrap_or_default(),
        ),
    })
}
