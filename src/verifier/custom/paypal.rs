//! PayPal: RSA over the transmission headers and a CRC32 of the body, under the
//! certificate the delivery names.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};

use super::{malformed, rsa_signature, NO_MATCH};
use crate::error::{VerifyError, VerifyErrorKind};
use crate::event::{self, Event};
use crate::scheme::{Algorithm, Custom, TimestampFormat};
use crate::timestamp;
use crate::Verifier;

/// PayPal's headers.
const TRANSMISSION_ID: HeaderName = HeaderName::from_static("paypal-transmission-id");
const TRANSMISSION_TIME: HeaderName = HeaderName::from_static("paypal-transmission-time");
const TRANSMISSION_SIG: HeaderName = HeaderName::from_static("paypal-transmission-sig");
pub(super) const CERT_URL: HeaderName = HeaderName::from_static("paypal-cert-url");
const AUTH_ALGO: HeaderName = HeaderName::from_static("paypal-auth-algo");

impl Verifier {
    /// PayPal's headers, checked: the transmission id, the time within the tolerance, the
    /// algorithm, and the signature decoded.
    pub(super) fn paypal_headers<'h>(
        &self,
        headers: &'h HeaderMap,
    ) -> Result<(&'h HeaderValue, &'h str, i64, Vec<u8>), VerifyError> {
        let required = |name: &HeaderName, missing: &'static str| {
            crate::verifier::one(headers, std::slice::from_ref(name))?
                .ok_or(VerifyError::new(VerifyErrorKind::MissingHeader, missing))
        };
        let id = required(&TRANSMISSION_ID, "PAYPAL-TRANSMISSION-ID is missing")?;
        let time = required(&TRANSMISSION_TIME, "PAYPAL-TRANSMISSION-TIME is missing")?;
        let time = time.to_str().expect("checked by `one`");
        let sig = required(&TRANSMISSION_SIG, "PAYPAL-TRANSMISSION-SIG is missing")?;
        required(&CERT_URL, "PAYPAL-CERT-URL is missing")?;
        let algo = required(&AUTH_ALGO, "PAYPAL-AUTH-ALGO is missing")?;
        if algo != "SHA256withRSA" {
            return Err(malformed("PAYPAL-AUTH-ALGO is not SHA256withRSA"));
        }
        let ts = timestamp::parse(time, TimestampFormat::Rfc3339)?;
        self.tolerance
            .check(ts, timestamp::unix_seconds((self.clock)()))?;
        let signature = rsa_signature(sig.to_str().expect("checked by `one`"))?;
        Ok((id, time, ts, signature))
    }

    /// PayPal: RSA-SHA256 over `transmission id|transmission time|webhook id|crc32(body)`,
    /// the CRC32 in decimal. The webhook id is ours, so a delivery meant for another
    /// webhook does not verify. The event id is the body's `id`.
    pub(super) fn verify_paypal(
        &self,
        webhook_id: &str,
        headers: &HeaderMap,
        body: Bytes,
    ) -> Result<Event, VerifyError> {
        let (id, time, ts, signature) = self.paypal_headers(headers)?;
        let crc = crc32fast::hash(&body).to_string();
        let pieces: [&[u8]; 7] = [
            id.as_bytes(),
            b"|",
            time.as_bytes(),
            b"|",
            webhook_id.as_bytes(),
            b"|",
            crc.as_bytes(),
        ];
        let secret_index = self
            .secrets
            .keys()
            .iter()
            .position(|key| key.verifies_as(Algorithm::RsaSha256, &pieces, &signature))
            .ok_or(NO_MATCH)?;
        // Keyed on the body's `id`: PayPal retries an event as new transmissions (new id
        // and time), which must dedupe as one event. A CRC-32 is forced with four bytes,
        // so a transmission id is accepted with one body only, remembered while its
        // headers could still pass the time check.
        if let Some(transmissions) = &self.transmissions {
            let keep = i64::try_from(self.transmission_keep().as_secs()).unwrap_or(i64::MAX);
            let id = id.to_str().expect("checked by `one`");
            let now = timestamp::unix_seconds((self.clock)());
            transmissions.admit(id, &body, now, keep)?;
        }
        Ok(Event::new(event::Parts {
            id_field: Some("id"),
            ..self.event(body, Some(ts), secret_index)
        }))
    }

    /// How long a PayPal transmission is remembered: twice the window (past + future),
    /// past which its headers fail the time check anyway.
    fn transmission_keep(&self) -> Duration {
        (self.tolerance.past + self.tolerance.future).saturating_mul(2)
    }

    /// A verified PayPal delivery's transmission id and how long to remember it; `None`
    /// for every other scheme. For `VerifyWebhookLayer::with_transmission_store`.
    #[cfg_attr(not(feature = "dedupe"), allow(dead_code))]
    pub(crate) fn transmission<'h>(&self, headers: &'h HeaderMap) -> Option<(&'h str, Duration)> {
        match &self.scheme.custom {
            Some(Custom::PayPal { .. }) => {
                let id = headers.get(&TRANSMISSION_ID)?.to_str().ok()?;
                Some((id, self.transmission_keep()))
            }
            _ => None,
        }
    }
}
