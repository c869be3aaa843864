//! Signing: the sender's side of a scheme, to build valid deliveries in tests and demos.

use std::time::SystemTime;

use http::{HeaderMap, HeaderValue, Method};

use super::template::{self, Input, Part};
use super::{key, signature, IdSource, Scheme, TimestampFormat, TimestampSource};
use crate::error::{ConfigError, ConfigErrorKind};
use crate::timestamp::unix_seconds;

impl Scheme {
    /// The headers a provider would send with `body`: the signature header with one entry
    /// per secret (as senders do while a secret rotates), and the scheme's timestamp and id
    /// headers. `id` goes in the scheme's id header: signed where the scheme signs it
    /// (Standard Webhooks, Twitch), unsigned where it does not (GitHub, Shopify, whose
    /// deliveries are deduplicated on a digest of the signed content, not on `id`). For
    /// schemes that read the id from the body (Stripe, Slack) or have none (Meta, Zoom),
    /// `id` is unused: pass `""`.
    ///
    /// For public-key schemes, `secrets` are private keys: Ed25519 as `whsk_` + base64 or
    /// hex of the 32-byte seed (or the 64-byte seed ‖ public key); P-256 as PKCS#8 (PEM or
    /// base64 DER) or the 32-byte scalar in hex. A Standard Webhooks list may mix `whsec_`
    /// and `whsk_`, and gets `v1,` and `v1a,` entries.
    ///
    /// ```
    /// use std::time::{Duration, UNIX_EPOCH};
    /// use tower_webhook::Scheme;
    ///
    /// let at = UNIX_EPOCH + Duration::from_secs(1_614_265_330);
    /// let headers = Scheme::standard().sign(
    ///     ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"],
    ///     "msg_p5jXN8AQM9LWM0D4loKWxJek",
    ///     at,
    ///     br#"{"test": 2432232314}"#,
    /// )?;
    /// assert_eq!(headers["webhook-signature"], "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    /// assert_eq!(headers["webhook-timestamp"], "1614265330");
    /// # Ok::<(), tower_webhook::ConfigError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// When a secret is invalid for the scheme, the list is empty, several secrets are
    /// given to a scheme with one signature per header, or `id` cannot be a header value.
    pub fn sign<I, S>(
        &self,
        secrets: I,
        id: &str,
        timestamp: SystemTime,
        body: &[u8],
    ) -> Result<HeaderMap, ConfigError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        self.sign_request(secrets, &Method::POST, "", id, timestamp, body)
    }

    /// As [`sign`](Self::sign), for schemes that sign the method and URL too (Twilio,
    /// Square, HubSpot): `url` is the public URL the provider posts to, with its query.
    ///
    /// ```
    /// use std::time::SystemTime;
    /// use http::Method;
    /// use tower_webhook::Scheme;
    ///
    /// let scheme = Scheme::twilio();
    /// let url = "https://example.com/sms";
    /// let headers = scheme.sign_request(
    ///     ["0123456789abcdef0123456789abcdef"],
    ///     &Method::POST,
    ///     url,
    ///     "",
    ///     SystemTime::now(),
    ///     b"Body=hello&From=%2B14158675309",
    /// )?;
    /// assert!(headers.contains_key("x-twilio-signature"));
    /// # Ok::<(), tower_webhook::ConfigError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`sign`](Self::sign).
    pub fn sign_request<I, S>(
        &self,
        secrets: I,
        method: &Method,
        url: &str,
        id: &str,
        timestamp: SystemTime,
        body: &[u8],
    ) -> Result<HeaderMap, ConfigError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let invalid = |why: &str| ConfigError::new(ConfigErrorKind::InvalidValue, why);
        if self.custom.is_some() {
            return Err(invalid(
                "this scheme is not signed in headers with a shared key: sign it as its \
                 provider does",
            ));
        }
        let header_value =
            |v: String| HeaderValue::try_from(v).map_err(|_| invalid("not a valid header value"));

        let ts = match &self.timestamp {
            Some(TimestampSource::Header(_, TimestampFormat::Rfc3339)) => {
                time::OffsetDateTime::from(timestamp)
                    .format(&time::format_description::well_known::Rfc3339)
                    .map_err(|_| invalid("timestamp out of RFC 3339's range"))?
            }
            Some(TimestampSource::Header(_, TimestampFormat::UnixMillis)) => {
                let ms = timestamp
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_err(|_| invalid("timestamp before 1970"))?
                    .as_millis();
                ms.to_string()
            }
            _ => unix_seconds(timestamp).to_string(),
        };
        let mut entries = Vec::new();
        if let Some(TimestampSource::SignatureEntry(prefix)) = &self.timestamp {
            entries.push(format!("{prefix}{ts}"));
        }
        let form = match self
            .body_sha256_param
            .and_then(|p| crate::public_url::query_param(url, p))
        {
            None if self.template.uses(&Part::SortedForm) => template::sorted_form(body)
                .ok_or_else(|| invalid("more form fields than a delivery may have"))?,
            _ => Vec::new(),
        };
        let mut signatures = 0;
        for (i, s) in secrets.into_iter().enumerate() {
            signatures += 1;
            let (format, key) = key::signing(self, s.as_ref(), i)?;
            let tag = key.sign(&self.template.pieces(&Input {
                id: id.as_bytes(),
                timestamp: ts.as_bytes(),
                body,
                method: method.as_str().as_bytes(),
                url: url.as_bytes(),
                form: &form,
            }));
            entries.push(format!(
                "{}{}",
                format.prefix,
                signature::encode(format.encoding, &tag)
            ));
        }
        let separator = match (self.separator, signatures) {
            (_, 0) => {
                return Err(ConfigError::new(
                    ConfigErrorKind::NoSecrets,
                    "no secret to sign with",
                ))
            }
            (Some(sep), _) => sep.to_string(),
            (None, 1) if entries.len() == 1 => String::new(),
            (None, _) => return Err(invalid("this scheme carries one signature per header")),
        };

        let mut headers = HeaderMap::new();
        headers.insert(
            self.signature_headers[0].clone(),
            header_value(entries.join(&separator))?,
        );
        if let Some(TimestampSource::Header(names, _)) = &self.timestamp {
            headers.insert(names[0].clone(), header_value(ts)?);
        }
        if let IdSource::Header(names) = &self.id {
            headers.insert(names[0].clone(), header_value(id.to_owned())?);
        }
        if let Some(name) = &self.algorithm_header {
            // Declared only where it is not the default (HMAC-SHA1), as Twilio does.
            if self.formats[0].algorithm == crate::scheme::Algorithm::HmacSha256 {
                headers.insert(
                    name.clone(),
                    HeaderValue::from_static("algorithm=HMAC_SHA256"),
                );
            }
        }
        Ok(headers)
    }
}
