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

    /// The signed content as the pieces it is made of, in order: nothing is concatenated
    /// or copied, and the body may be any bytes.
    pub(crate) fn pieces<'a>(
        &'a self,
        id: &'a [u8],
        timestamp: &'a [u8],
        body: &'a [u8],
    ) -> Pieces<'a> {
        let mut pieces = Pieces {
            pieces: [&[]; MAX_PARTS],
            len: self.parts.len(),
        };
        for (piece, part) in pieces.pieces.iter_mut().zip(self.parts.iter()) {
            *piece = match part {
                Part::Id => id,
                Part::Timestamp => timestamp,
                Part::Body => body,
                Part::Literal(bytes) => bytes,
            };
        }
        pieces
    }

    pub(crate) fn uses(&self, part: &Part) -> bool {
        self.parts.contains(part)
    }
}

/// The signed content, piece by piece (see [`Template::pieces`]).
pub(crate) struct Pieces<'a> {
    pieces: [&'a [u8]; MAX_PARTS],
    len: usize,
}

impl<'a> std::ops::Deref for Pieces<'a> {
    type Target = [&'a [u8]];

    fn deref(&self) -> &Self::Target {
        &self.pieces[..self.len]
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
