//! Invalid events on JetStream (issue 36): an event its type's JSON Schema refuses is
//! published, at accept, to `<stream>-invalid` instead of the stream — kept (the provider
//! got its 2xx) but never given to a processor, as the dead and parked streams keep
//! theirs — with its errors in `Webhook-Validation-Errors` (a JSON list of `{path,
//! message}`, never a value of the body); `Counts::invalid` counts them.

use async_nats::HeaderMap;

use super::JetStream;
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
        let errors: Vec<serde_json::Value> = (invalid.errors().iter())
            .map(|e| serde_json::json!({"path": e.path(), "message": e.message()}))
            .collect();
        let errors = serde_json::Value::from(errors).to_string();
        headers.insert(ERRORS, errors.as_str());
        let rest = subject
            .strip_prefix(self.inner.stream.as_str())
            .unwrap_or("");
        (format!("{}{rest}", self.invalid_stream()), true)
    }
}
