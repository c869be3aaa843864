//! Invalid events on JetStream (issue 36): an event its type's JSON Schema refuses is
//! published, at accept, to `<stream>-invalid` instead of the stream — kept (the provider
//! got its 2xx) but never given to a processor, as the dead and parked streams keep
//! theirs — with its errors in `Webhook-Validation-Errors` (a JSON list of `{path,
//! message}`, never a value of the body); `Counts::invalid` counts them;
//! [`JetStream::list_invalid`] reads them a page at a time.

use std::time::{Duration, SystemTime};

use async_nats::jetstream::consumer::{pull, DeliverPolicy};
use async_nats::HeaderMap;
use futures_util::StreamExt;

use super::{header, JetStream};
use crate::inbox::RevalidatedCounts;
use crate::schemas::SchemaError;
use crate::store::{StoreError, StoreErrorKind};
use crate::Event;

/// How long a listing waits for the invalid stream's next message before it gives up.
const NEXT: Duration = Duration::from_secs(5);

/// The most messages one page of [`JetStream::list_invalid`] holds.
pub const MAX_INVALID_PAGE: usize = 1000;

/// One message of the invalid stream (`<stream>-invalid`), as
/// [`JetStream::list_invalid`] reads it: the event's key and envelope from its headers,
/// and the errors its schema found, never its body.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct InvalidMessage {
    /// Its sequence in the invalid stream: a page's [`next`](InvalidPage::next).
    pub sequence: u64,
    /// Which endpoint or provider.
    pub source: String,
    /// The provider's event id (the dedupe id).
    pub id: String,
    /// The event type, where known.
    pub event_type: Option<String>,
    /// The object the event is about, where known.
    pub object_id: Option<String>,
    /// When it was published to the invalid stream: at accept (a requeue that finds it
    /// invalid again leaves it where it is).
    pub received_at: SystemTime,
    /// What its schema found at accept (`Webhook-Validation-Errors`): JSON pointer and
    /// message, never a value.
    pub validation_errors: Vec<SchemaError>,
}

/// One page of [`JetStream::list_invalid`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct InvalidPage {
    /// The messages, oldest first (by their sequence in the invalid stream).
    pub messages: Vec<InvalidMessage>,
    /// The sequence after which the next page starts, when there are more messages.
    pub next: Option<u64>,
}

/// The header holding an invalid message's errors.
pub(super) use header::VALIDATION_ERRORS as ERRORS;

impl JetStream {
    /// The stream invalid messages are published to: `<stream>-invalid`.
    #[must_use]
    pub fn invalid_stream(&self) -> String {
        format!("{}-invalid", self.inner.stream)
    }

    /// `subject` (`<stream>.…`), or its twin under the invalid stream with the errors
    /// added to `headers` when the schemas refuse `event`. Checked here, once per event
    /// before any processor's consumer sees it (fan-out included).
    pub(super) fn route_valid(
        &self,
        event: &Event,
        subject: String,
        headers: &mut HeaderMap,
    ) -> (String, Option<crate::schemas::Invalid>) {
        let Some(invalid) = (self.inner.schemas.as_ref()).and_then(|s| s.validate(event).err())
        else {
            return (subject, None);
        };
        headers.insert(ERRORS, invalid.to_json().as_str());
        let rest = subject
            .strip_prefix(self.inner.stream.as_str())
            .unwrap_or("");
        (format!("{}{rest}", self.invalid_stream()), Some(invalid))
    }

    /// How many events are invalid: the invalid stream's messages (0 for a `JetStream`
    /// without schemas).
    ///
    /// # Errors
    ///
    /// When NATS cannot answer.
    pub async fn invalid_count(&self) -> Result<u64, StoreError> {
        if self.inner.schemas.is_none() {
            return Ok(0);
        }
        fn err(e: impl std::error::Error + Send + Sync + 'static) -> StoreError {
            StoreError::new("jetstream counts", e)
        }
        let stream = self.inner.context.get_stream(self.invalid_stream()).await;
        let mut stream = stream.map_err(err)?;
        let info = stream.info().await.map_err(err)?;
        Ok(info.state.messages)
    }

    /// Up to `limit` (cut to `1..=`[`MAX_INVALID_PAGE`]) messages of the invalid stream
    /// after the sequence `after` (`None`: from its first), oldest first, read by an
    /// ephemeral ordered consumer (nothing is acknowledged or changed); `next` is the
    /// sequence to pass as `after` for the following page, `None` on the last. A message
    /// that is not an event of this crate's (no source or id) is skipped. Without
    /// schemas (no invalid stream), an empty page.
    ///
    /// # Errors
    ///
    /// When NATS cannot answer, or the stream's next message does not come within 5 s.
    pub async fn list_invalid(
        &self,
        after: Option<u64>,
        limit: usize,
    ) -> Result<InvalidPage, StoreError> {
        fn err(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> StoreError {
            StoreError::new("jetstream list invalid", e).with_kind(StoreErrorKind::Unavailable)
        }
        let limit = limit.clamp(1, MAX_INVALID_PAGE);
        let context = &self.inner.context;
        let Ok(stream) = context.get_stream(self.invalid_stream()).await else {
            return Ok(InvalidPage::default()); // none was ever invalid
        };
        let deliver_policy = match after {
            Some(after) => DeliverPolicy::ByStartSequence {
                start_sequence: after.saturating_add(1),
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
        let mut page = InvalidPage::default();
        if reader.cached_info().num_pending == 0 {
            return Ok(page);
        }
        let mut messages = reader.messages().await.map_err(err)?;
        loop {
            let message = match tokio::time::timeout(NEXT, messages.next()).await {
                Ok(Some(Ok(message))) => message,
                Ok(Some(Err(e))) => return Err(err(e)),
                Ok(None) => return Ok(page),
                Err(_) => return Err(err("the invalid stream's next message did not come")),
            };
            let info = message.info().map_err(|e| err(e.to_string()))?;
            let (sequence, pending) = (info.stream_sequence, info.pending);
            let received_at = SystemTime::from(info.published);
            if let Some(listed) = listed(message.headers.as_ref(), sequence, received_at) {
                page.messages.push(listed);
            }
            if pending == 0 {
                return Ok(page);
            }
            if page.messages.len() >= limit {
                page.next = Some(sequence);
                return Ok(page);
            }
        }
    }

    /// Checks every message of the invalid stream again against the schemas this
    /// `JetStream` has now: each one that passes is published to the stream (without its
    /// errors header), for every processor's workers, and deleted from the invalid stream;
    /// the others stay. Without schemas every one passes.
    ///
    /// # Errors
    ///
    /// When NATS cannot answer (the messages moved until then stay moved: call it again).
    pub async fn requeue_invalid(&self) -> Result<RevalidatedCounts, StoreError> {
        fn err(e: impl std::error::Error + Send + Sync + 'static) -> StoreError {
            StoreError::new("jetstream requeue invalid", e)
        }
        let context = &self.inner.context;
        let Ok(mut stream) = context.get_stream(self.invalid_stream()).await else {
            return Ok(RevalidatedCounts::default()); // none was ever invalid
        };
        let state = &stream.info().await.map_err(err)?.state;
        let (first, last) = (state.first_sequence, state.last_sequence);
        let mut done = RevalidatedCounts::default();
        for sequence in first..=last {
            let Ok(message) = stream.get_raw_message(sequence).await else {
                continue; // deleted: requeued already
            };
            let read =
                super::sealed::event_of(self, Some(&message.headers), message.payload.clone());
            let valid = read.event().is_some_and(|event| {
                (self.inner.schemas.as_ref()).is_none_or(|s| s.validate(&event).is_ok())
            });
            if !valid {
                done.still_invalid += 1;
                continue;
            }
            let mut headers = HeaderMap::new();
            for (name, values) in message.headers.iter() {
                if !AsRef::<str>::as_ref(name).eq_ignore_ascii_case(ERRORS) {
                    for value in values {
                        headers.append(name.clone(), value.clone());
                    }
                }
            }
            let invalid = self.invalid_stream();
            let rest = message.subject.strip_prefix(invalid.as_str()).unwrap_or("");
            let subject = format!("{}{rest}", self.inner.stream);
            let publish = context.publish_with_headers(subject, headers, message.payload);
            publish.await.map_err(err)?.await.map_err(err)?;
            stream.delete_message(sequence).await.map_err(err)?;
            done.queued += 1;
        }
        Ok(done)
    }
}

/// The listing's view of a message of the invalid stream; `None` when it is not an event
/// this crate published (no source or id).
fn listed(
    headers: Option<&HeaderMap>,
    sequence: u64,
    received_at: SystemTime,
) -> Option<InvalidMessage> {
    let headers = headers?;
    let get = |name: &str| headers.get(name).map(|v| v.as_str().to_owned());
    let errors = get(ERRORS).unwrap_or_default();
    Some(InvalidMessage {
        sequence,
        source: get(header::SOURCE)?,
        id: get(header::ID)?,
        event_type: get(header::TYPE),
        object_id: get(header::OBJECT_ID),
        received_at,
        validation_errors: SchemaError::list_from_json(&errors),
    })
}
