//! The signed content: which bytes, in which order, go into the MAC.

use crate::error::{ConfigError, ConfigErrorKind};

/// The most pieces a signed content may have.
const MAX_PARTS: usize = 8;

/// One piece of the signed content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Part {
    Id,
    Timestamp,
    Body,
    /// The request method, upper case (HubSpot).
    Method,
    /// The public URL the provider sent to (Twilio, Square, HubSpot).
    Url,
    /// The form fields of the body, sorted by name then value, each as name + value
    /// (Twilio). Only presets use it.
    SortedForm,
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
        let parsed = Self::parse_adjacent(template)?;
        let placeholder = |p: &Part| !matches!(p, Part::Literal(_));
        if parsed
            .parts
            .windows(2)
            .any(|w| placeholder(&w[0]) && placeholder(&w[1]))
        {
            // `{id}{body}`: `evt_1` + `{…}` and `evt_` + `1{…}` would sign alike.
            return Err(ConfigError::new(
                ConfigErrorKind::InvalidTemplate,
                format!(
                    "signed-content template {template:?}: put literal text between \
                     placeholders, such as `.`"
                ),
            ));
        }
        Ok(parsed)
    }

    /// As [`Template::parse`], but placeholders may touch: for presets whose provider signs
    /// them so, where each preset says why the split is still unambiguous.
    pub(crate) fn parse_adjacent(template: &str) -> Result<Self, ConfigError> {
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
                        "method" => Part::Method,
                        "url" => Part::Url,
                        _ => {
                            return Err(err(
                                "placeholders are {id}, {timestamp}, {body}, {method} and {url}",
                            ))
                        }
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
        if parts.iter().any(|p| {
            *p != Part::Body
                && parts.iter().filter(|q| *q == p).count() > 1
                && !matches!(p, Part::Literal(_))
        }) {
            return Err(err("each placeholder may appear once"));
        }
        if parts.len() > MAX_PARTS {
            return Err(err("too many pieces"));
        }
        Ok(Self {
            parts: parts.into(),
        })
    }

    #[cfg(test)]
    pub(crate) fn parts(&self) -> &[Part] {
        &self.parts
    }

    /// A template of these parts, for presets whose signed content no text form can say
    /// (Twilio's sorted form fields).
    pub(crate) fn from_parts(parts: Vec<Part>) -> Self {
        Self {
            parts: parts.into(),
        }
    }

    /// The signed content as the pieces it is made of, in order: nothing is concatenated
    /// or copied, and the body may be any bytes.
    pub(crate) fn pieces<'a>(&'a self, input: &Input<'a>) -> Pieces<'a> {
        let mut pieces = Pieces {
            pieces: [&[]; MAX_PARTS],
            len: self.parts.len(),
        };
        for (piece, part) in pieces.pieces.iter_mut().zip(self.parts.iter()) {
            *piece = match part {
                Part::Id => input.id,
                Part::Timestamp => input.timestamp,
                Part::Body => input.body,
                Part::Method => input.method,
                Part::Url => input.url,
                Part::SortedForm => input.form,
                Part::Literal(bytes) => bytes,
            };
        }
        pieces
    }

    pub(crate) fn uses(&self, part: &Part) -> bool {
        self.parts.contains(part)
    }
}

/// What the placeholders stand for in one delivery.
#[derive(Default, Clone, Copy)]
pub(crate) struct Input<'a> {
    pub(crate) id: &'a [u8],
    pub(crate) timestamp: &'a [u8],
    pub(crate) body: &'a [u8],
    pub(crate) method: &'a [u8],
    pub(crate) url: &'a [u8],
    pub(crate) form: &'a [u8],
}

/// The signed content, piece by piece (see [`Template::pieces`]).
///
/// Its [`digest`](Pieces::digest) keys deliveries that carry no signed id.
pub(crate) struct Pieces<'a> {
    pieces: [&'a [u8]; MAX_PARTS],
    len: usize,
}

impl Pieces<'_> {
    /// The SHA-256 of the signed content.
    pub(crate) fn digest(&self) -> [u8; 32] {
        use sha2::Digest as _;
        let mut digest = sha2::Sha256::new();
        for piece in self.iter() {
            digest.update(piece);
        }
        digest.finalize().into()
    }
}

impl<'a> std::ops::Deref for Pieces<'a> {
    type Target = [&'a [u8]];

    fn deref(&self) -> &Self::Target {
        &self.pieces[..self.len]
    }
}

/// At most this many form fields are sorted (Twilio sends a few dozen); a body with more
/// is refused before any work, so `a&a&a…` cannot buy a large sort.
pub(crate) const MAX_FORM_FIELDS: usize = 1024;

/// A form body's fields, sorted by name then value (repeats once), each as name + value:
/// what Twilio appends to the URL it signs. `None` past [`MAX_FORM_FIELDS`].
pub(crate) fn sorted_form(body: &[u8]) -> Option<Vec<u8>> {
    if body.iter().filter(|b| **b == b'&').count() >= MAX_FORM_FIELDS {
        return None;
    }
    let mut fields: Vec<_> = form_urlencoded::parse(body).collect();
    fields.sort();
    fields.dedup();
    let sorted = fields
        .iter()
        .flat_map(|(k, v)| [k.as_bytes(), v.as_bytes()])
        .flatten()
        .copied()
        .collect();
    Some(sorted)
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
