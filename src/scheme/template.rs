//! The signed content: which bytes, in which order, go into the MAC.

use hmac::Mac;

use super::signature::MAC_LEN;
use crate::error::{ConfigError, ConfigErrorKind};
use crate::secret::HmacSha256;

/// One piece of the signed content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Part {
    Id,
    Timestamp,
    Body,
    Literal(Box<[u8]>),
}

/// A parsed signed-content template such as `{id}.{timestamp}.{body}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Template {
    parts: Box<[Part]>,
}

impl Template {
    /// Parses `{id}`, `{timestamp}` and `{body}` placeholders between literal text.
    /// `{body}` must appear exactly once: a signature that does not cover the body
    /// authenticates nothing.
    pub(crate) fn parse(template: &str) -> Result<Self, ConfigError> {
        let err = |why: &str| {
            ConfigError::new(
                ConfigErrorKind::InvalidTemplate,
                format!("signed-content template {template:?}: {why}"),
            )
        };
        let mut parts = Vec::new();
        let mut rest = template;
        while !rest.is_empty() {
            match rest.find('{') {
                Some(0) => {
                    let end = rest.find('}').ok_or_else(|| err("unclosed `{`"))?;
                    parts.push(match &rest[1..end] {
                        "id" => Part::Id,
                        "timestamp" => Part::Timestamp,
                        "body" => Part::Body,
                        _ => return Err(err("placeholders are {id}, {timestamp} and {body}")),
                    });
                    rest = &rest[end + 1..];
                }
                found => {
                    let end = found.unwrap_or(rest.len());
                    if rest[..end].contains('}') {
                        return Err(err("unmatched `}`"));
                    }
                    parts.push(Part::Literal(rest.as_bytes()[..end].into()));
                    rest = &rest[end..];
                }
            }
        }
        if parts.iter().filter(|p| **p == Part::Body).count() != 1 {
            return Err(err("{body} must appear exactly once"));
        }
        let placeholder = |p: &Part| !matches!(p, Part::Literal(_));
        if parts
            .windows(2)
            .any(|w| placeholder(&w[0]) && placeholder(&w[1]))
        {
            // `{id}{body}`: `evt_1` + `{…}` and `evt_` + `1{…}` would sign alike.
            return Err(err("put literal text between placeholders, such as `.`"));
        }
        Ok(Self {
            parts: parts.into(),
        })
    }

    #[cfg(test)]
    pub(crate) fn parts(&self) -> &[Part] {
        &self.parts
    }

    /// The MAC of the signed content, fed piece by piece from a clone of the precomputed
    /// keyed state: nothing is concatenated or copied, and the body may be any bytes.
    pub(crate) fn mac(
        &self,
        key: &HmacSha256,
        id: &[u8],
        timestamp: &[u8],
        body: &[u8],
    ) -> [u8; MAC_LEN] {
        let mut mac = key.clone();
        for part in self.parts.iter() {
            mac.update(match part {
                Part::Id => id,
                Part::Timestamp => timestamp,
                Part::Body => body,
                Part::Literal(bytes) => bytes,
            });
        }
        mac.finalize().into_bytes().into()
    }

    /// The SHA-256 of the signed content, fed as the MAC is.
    pub(crate) fn digest(&self, id: &[u8], timestamp: &[u8], body: &[u8]) -> [u8; 32] {
        use sha2::Digest;
        let mut digest = sha2::Sha256::new();
        for part in self.parts.iter() {
            digest.update(match part {
                Part::Id => id,
                Part::Timestamp => timestamp,
                Part::Body => body,
                Part::Literal(bytes) => bytes,
            });
        }
        digest.finalize().into()
    }

    pub(crate) fn uses(&self, part: &Part) -> bool {
        self.parts.contains(part)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_placeholders_between_literals() {
        let t = Template::parse("v0:{timestamp}:{body}").unwrap();
        assert_eq!(
            t.parts(),
            &[
                Part::Literal(b"v0:".as_slice().into()),
                Part::Timestamp,
                Part::Literal(b":".as_slice().into()),
                Part::Body,
            ]
        );
    }

    #[test]
    fn rejects_bad_templates() {
        for bad in [
            "{id}.{timestamp}",
            "{body}{body}",
            "{bdy}",
            "{body",
            "}{body}",
            "{body}}",
            "",
        ] {
            let err = Template::parse(bad).unwrap_err();
            assert_eq!(err.kind(), ConfigErrorKind::InvalidTemplate, "{bad}");
        }
    }
}
