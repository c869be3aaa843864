//! Invalid events on JetStream (issue 36): an event its type's JSON Schema refuses is
//! published, at accept, to `<stream>-invalid` instead of the stream — kept (the provider
//! got its 2xx) but never given to a processor, as the dead and parked streams keep
//! theirs — with its errors in `Webhook-Validation-Errors` (a JSON list of `{path,
//! message}`, never a value of the body); `Counts::invalid` counts them.

use async_nats::HeaderMap;

use super::JetStream;
use crate::inbox::RevalidatedCounts;
use crate::store::StoreError;
use crate::Event;

/// The header holding an invalid message's errors.
pub(super) const ERRORS: &str = "Webhook-Validation-Errors";

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
    ) -> (String, bool) {
        let Some(invalid) = (self.inner.schemas.as_ref()).and_then(|s| s.validate(event).err())
        else {
            return (subject, false);
        };
        headers.insert(ERRORS, invalid.to_json().as_str());
        let rest = subject
            .strip_prefix(self.inner.stream.as_str())
            .unwrap_or("");
        (format!("{}{rest}", self.invalid_stream()), true)
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
