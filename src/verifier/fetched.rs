//! The event a *fetched* body would have given as a delivery: a provider's events API
//! (catch-up after an outage) keyed as its deliveries were.

use bytes::Bytes;
use http::HeaderValue;

use super::Verifier;
use crate::event::{self, Event};
use crate::scheme::template::Part;
use crate::scheme::{Custom, IdSource, TimestampSource};

impl Verifier {
    /// The event a delivery of `body` to this verifier would give, for a body fetched from
    /// the provider's events API (authenticated by that API, not signed): keyed as its
    /// delivery was ([`Event::dedupe_id`]), so a delivery and its catch-up are one row.
    /// `id` is the delivery's signed id header, for schemes that have one; the others key
    /// on the body, as their deliveries do. `Err` says why the key cannot be the one its
    /// delivery had.
    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    pub(crate) fn fetched(
        &self,
        id: Option<HeaderValue>,
        body: Bytes,
    ) -> Result<Event, &'static str> {
        let scheme = &*self.scheme;
        let mut parts = event::Parts {
            source: self.source.clone(),
            metrics: self.metrics.clone(),
            header_id: None,
            header_type: None,
            id_field: None,
            type_field: scheme.type_field,
            unsigned_id: false,
            content_digest: None,
            timestamp: None,
            kept: false,
            body,
            secret_index: 0,
            scheme: self.scheme.clone(),
        };
        // Kept as its deliveries' keys are: where the scheme signs no time.
        parts.kept = match (&scheme.custom, &scheme.timestamp) {
            (Some(Custom::Graph), _) | (None, None) => true,
            (Some(_), _) => false,
            (None, Some(TimestampSource::Header(..))) => {
                scheme.unsigned_timestamp && !scheme.template.uses(&Part::Timestamp)
            }
            (None, Some(TimestampSource::BodyFieldRfc3339IfPresent(field))) => {
                event::string_field(&parts.body, field).is_none()
            }
            (None, Some(_)) => false,
        };
        let takes_id = match &scheme.custom {
            // The signed token in the body's `signature` object, as `verify_mailgun` reads it.
            Some(Custom::Mailgun) => {
                use crate::json::{parse, Field, Strings};
                let token = parse(&parts.body, Field("signature", Strings(["token"])))
                    .ok()
                    .flatten()
                    .and_then(|[token]| HeaderValue::from_str(&token?).ok())
                    .filter(|t| (1..=256).contains(&t.len()))
                    .ok_or("Mailgun's deliveries are keyed on the body's signature token")?;
                parts.header_id = Some(token);
                false
            }
            Some(Custom::Sns { .. }) => {
                parts.id_field = Some("MessageId");
                false
            }
            Some(Custom::PayPal { .. }) => {
                parts.id_field = Some("id");
                false
            }
            Some(Custom::Graph) => false,
            None => {
                let template = &scheme.template;
                let signs_request = [Part::Url, Part::Method, Part::SortedForm]
                    .iter()
                    .any(|p| template.uses(p));
                match &scheme.id {
                    IdSource::Header(_) if template.uses(&Part::Id) => true,
                    IdSource::BodyField(field) => {
                        parts.id_field = Some(field);
                        false
                    }
                    // Keyed on the signed content: the body alone, unless the scheme signs
                    // the request too (its URL and form are not in the body).
                    IdSource::Header(_) | IdSource::None if signs_request => {
                        return Err("this scheme's deliveries are keyed on the signed request \
                                    (URL and form), which a fetched body does not hold: have \
                                    the provider redeliver instead");
                    }
                    IdSource::Header(_) | IdSource::None => false,
                }
            }
        };
        match (takes_id, id) {
            (true, Some(id)) => parts.header_id = Some(id),
            (true, None) => {
                return Err("this scheme's deliveries are keyed on their signed id: give it")
            }
            (false, None) => {}
            (false, Some(id)) => {
                let event = Event::new(parts);
                // Where the id is in the body (Stripe's `id`), the same id is welcome.
                return match event.id() {
                    Some(own) if own.as_bytes() == id.as_bytes() && event.id_is_signed() => {
                        Ok(event)
                    }
                    _ => Err(
                        "this scheme's deliveries are keyed on their body, not on an id \
                              given beside it: give none",
                    ),
                };
            }
        }
        Ok(Event::new(parts))
    }
}
