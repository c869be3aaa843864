//! Mailgun: the signature, its timestamp and token in the JSON body.

use bytes::Bytes;
use http::HeaderValue;

use super::{malformed, NO_MATCH};
use crate::error::VerifyError;
use crate::event::{self, Event};
use crate::json::{parse, Field, Strings};
use crate::scheme::template::Input;
use crate::scheme::{signature, TimestampFormat};
use crate::timestamp;
use crate::Verifier;

impl Verifier {
    /// Mailgun: the signature, its timestamp and token are in the JSON body; the HMAC
    /// covers the timestamp and token only. The body is parsed before the MAC (it is
    /// where the signature is), under the layer's body limit.
    pub(super) fn verify_mailgun(&self, body: Bytes) -> Result<Event, VerifyError> {
        struct Signed {
            timestamp: String,
            token: String,
            signature: String,
        }
        // `{"signature":{"timestamp":…,"token":…,"signature":…},…}`
        let fields = Field("signature", Strings(["timestamp", "token", "signature"]));
        let Ok(Some([Some(timestamp), Some(token), Some(signature)])) = parse(&body, fields) else {
            return Err(malformed("the body has no signature object"));
        };
        let signed = Signed {
            timestamp,
            token,
            signature,
        };
        let ts = timestamp::parse(&signed.timestamp, TimestampFormat::Unix)?;
        self.tolerance
            .check(ts, timestamp::unix_seconds((self.clock)()))?;
        let token = HeaderValue::from_str(&signed.token)
            .ok()
            .filter(|t| (1..=256).contains(&t.len()))
            .ok_or(malformed("the signature token is not a short ASCII string"))?;
        let scheme = &*self.scheme;
        let parsed = signature::parse(scheme, &signed.signature)?;
        let pieces = scheme.template.pieces(&Input {
            timestamp: signed.timestamp.as_bytes(),
            id: token.as_bytes(),
            ..Input::default()
        });
        let secret_index = self
            .secrets
            .keys()
            .iter()
            .position(|key| parsed.candidates.matches(&scheme.formats, key, &pieces))
            .ok_or(NO_MATCH)?;
        Ok(Event::new(event::Parts {
            header_id: Some(token),
            ..self.event(body, Some(ts), secret_index)
        }))
    }
}
