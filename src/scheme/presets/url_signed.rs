//! The providers whose signature covers the public URL the delivery was sent to
//! (Twilio, Square, HubSpot).

use std::time::Duration;

use super::{adjacent, header};
use crate::scheme::template::{Part, Template};
use crate::scheme::{Algorithm, Encoding, Format, Scheme, TimestampFormat, TimestampSource};

impl Scheme {
    /// Twilio: `X-Twilio-Signature: <base64>`, an HMAC over the public URL followed by the
    /// form fields sorted by name, each as name + value. A JSON delivery signs its URL
    /// only, which carries `bodySHA256=<hex>` of the body; that is checked too. The URL is
    /// signed with or without its default port (both are tried, as Twilio's SDKs do).
    /// Twilio signs no id and no timestamp: deliveries are deduplicated on a digest of the
    /// signed content, its URL in canonical form (lower-case scheme and host, no default
    /// port). Needs [`Verifier::with_public_url`](crate::Verifier::with_public_url).
    ///
    /// The hash is what the delivery declares in `X-Twilio-Webhooks-Signature-Settings`
    /// (`key=…,algorithm=HMAC_SHA256` for a SharedKey with SHA-256, as Twilio's SDKs read
    /// it): HMAC-SHA256 when it says so, HMAC-SHA1 (the auth token's signature) when the
    /// header is absent or says `HMAC_SHA1`; an unknown algorithm is refused. Give the
    /// auth token or the SharedKey secret (or both) as the secrets. Once every webhook
    /// signs with SHA-256, use [`Scheme::twilio_sha256`], which refuses SHA-1.
    ///
    /// # Security
    ///
    /// Twilio's signed string is ambiguous by Twilio's design: fields are concatenated as
    /// name + value with nothing between them, so `a=bc` and `ab=c` sign alike, and the
    /// URL's query is not separated from the fields. A delivery whose fields are split
    /// another way verifies under the same signature (and its digest is a new dedupe
    /// key). Read fields by the names you expect and treat what you act on with that in
    /// mind; the signature cannot tell more than Twilio put in it.
    #[must_use]
    pub fn twilio() -> Self {
        Self {
            template: Template::from_parts(vec![Part::Url, Part::SortedForm]),
            url_port_variants: true,
            body_sha256_param: Some("bodySHA256"),
            formats: vec![
                Format::new("", Encoding::Base64, Algorithm::HmacSha1),
                Format::new("", Encoding::Base64, Algorithm::HmacSha256),
            ],
            algorithm_header: Some(header("x-twilio-webhooks-signature-settings")),
            ..Self::hmac(header("x-twilio-signature")).with_name("twilio")
        }
    }

    /// Twilio with a SharedKey signing with HMAC-SHA256 only: as [`Scheme::twilio`], but a
    /// delivery must declare `algorithm=HMAC_SHA256` in
    /// `X-Twilio-Webhooks-Signature-Settings`; one that declares SHA-1 or nothing is
    /// refused, so a captured or forged request cannot fall back to the auth token's
    /// SHA-1 signature. The secret is the SharedKey's.
    #[must_use]
    pub fn twilio_sha256() -> Self {
        Self {
            formats: vec![Format::new("", Encoding::Base64, Algorithm::HmacSha256)],
            ..Self::twilio()
        }
    }

    /// Square: `x-square-hmacsha256-signature: <base64>` over the notification URL
    /// followed by the body, with the subscription's signature key (its bytes, not
    /// decoded). The id is the body's `event_id`. The signed body's `created_at` (RFC 3339)
    /// is the timestamp, checked within 48 hours: Square retries a delivery for up to
    /// 24 hours, and done keys are kept at least 4 days ([`Retention`]),
    /// so a replay after its key is pruned is refused as too old. A body without
    /// `created_at` has no signed time: its key is kept until pruned by name
    /// ([`DedupeStore::prune_once`]). Needs
    /// [`Verifier::with_public_url`](crate::Verifier::with_public_url) with the URL exactly
    /// as entered in the Developer Console.
    ///
    /// The URL and the body touch; with [`PublicUrl::exact`](crate::PublicUrl::exact) the
    /// URL's path is the verifier's own setting, so bytes cannot move between the two: use
    /// it for this scheme rather than an origin.
    ///
    #[cfg_attr(
        feature = "dedupe",
        doc = "
[`Retention`]: crate::store::Retention
[`DedupeStore::prune_once`]: crate::store::DedupeStore::prune_once"
    )]
    #[cfg_attr(
        not(feature = "dedupe"),
        doc = "
[`Retention`]: crate#features
[`DedupeStore::prune_once`]: crate#features"
    )]
    #[must_use]
    pub fn square() -> Self {
        Self {
            template: adjacent("{url}{body}"),
            timestamp: Some(TimestampSource::BodyFieldRfc3339IfPresent("created_at")),
            ..Self::hmac(header("x-square-hmacsha256-signature"))
                .with_name("square")
                .with_encoding(Encoding::Base64)
                .with_id_field("event_id")
                // Square retries for 24 hours: twice that, to spare a late retry.
                .with_tolerance(Duration::from_secs(48 * 3600))
        }
    }

    /// HubSpot, signature v3: `X-HubSpot-Signature-v3: <base64>` over
    /// `{method}{url}{body}{X-HubSpot-Request-Timestamp}` with the app's client secret; the
    /// timestamp is in milliseconds (HubSpot refuses past 5 minutes). A delivery is a JSON
    /// array of events, each with its `eventId`; there is no delivery id, so deliveries are
    /// deduplicated on a digest of the signed content. Needs
    /// [`Verifier::with_public_url`](crate::Verifier::with_public_url).
    ///
    /// The pieces touch: the method is upper-case letters and the timestamp digits after
    /// the body; with [`PublicUrl::exact`](crate::PublicUrl::exact) the URL's path is the
    /// verifier's own setting, so bytes cannot move between URL and body: use it for this
    /// scheme rather than an origin. HubSpot's retries carry a new `attemptNumber` in the
    /// body, so they are new digests: deduplicate on each event's `eventId` in the handler
    /// (for example with [`Once`]).
    ///
    #[cfg_attr(feature = "dedupe", doc = "[`Once`]: crate::once::Once")]
    #[cfg_attr(not(feature = "dedupe"), doc = "[`Once`]: crate#features")]
    #[must_use]
    pub fn hubspot() -> Self {
        Self {
            template: adjacent("{method}{url}{body}{timestamp}"),
            ..Self::hmac(header("x-hubspot-signature-v3"))
                .with_name("hubspot")
                .with_encoding(Encoding::Base64)
                .with_timestamp_header(
                    header("x-hubspot-request-timestamp"),
                    TimestampFormat::UnixMillis,
                )
        }
    }
}
