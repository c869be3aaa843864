//! A few fields of a JSON body, read in one pass without serde's derive (which the default
//! build does not pull in): the envelope fields, the handshakes' challenges and the custom
//! schemes' signed fields.
//!
//! The readers behave as a derived struct would: unknown fields are skipped unread, a named
//! field given twice is an error (which one would the handler read?), and so are trailing
//! bytes after the value. Unlike a derived struct, they take objects only, never arrays.

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, DeserializeOwned, DeserializeSeed, IgnoredAny, MapAccess, Visitor};

/// Reads all of `body` with `seed`.
pub(crate) fn parse<'de, S: DeserializeSeed<'de>>(
    body: &'de [u8],
    seed: S,
) -> Result<S::Value, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let value = seed.deserialize(&mut de)?;
    de.end()?;
    Ok(value)
}

/// One field of an object, read with the seed (for a plain type `T`: [`of::<T>()`](of));
/// `None` when it is absent.
pub(crate) struct Field<'f, S>(pub(crate) &'f str, pub(crate) S);

/// The seed of a plain type.
pub(crate) fn of<T: DeserializeOwned>() -> PhantomData<T> {
    PhantomData
}

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for Field<'_, S> {
    type Value = Option<S::Value>;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de, S: DeserializeSeed<'de>> Visitor<'de> for Field<'_, S> {
    type Value = Option<S::Value>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a JSON object with at most one `{}`", self.0)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let (name, mut seed) = (self.0, Some(self.1));
        let mut found = None;
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            if key != name {
                map.next_value::<IgnoredAny>()?;
                continue;
            }
            // The seed is spent on the first occurrence: a second one is the error.
            let seed = seed
                .take()
                .ok_or_else(|| de::Error::custom("duplicate field"))?;
            found = Some(map.next_value_seed(seed)?);
        }
        Ok(found)
    }
}

/// The named fields of an object, each a string or `null`, in the order named: `None` for
/// an absent or `null` one. A named field of another type is an error.
#[derive(Clone, Copy)]
pub(crate) struct Strings<'n, const N: usize>(pub(crate) [&'n str; N]);

impl<'de, const N: usize> DeserializeSeed<'de> for Strings<'_, N> {
    type Value = [Option<String>; N];

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de, const N: usize> Visitor<'de> for Strings<'_, N> {
    type Value = [Option<String>; N];

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a JSON object with the string fields {:?}", self.0)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut values: [Option<String>; N] = std::array::from_fn(|_| None);
        let mut seen = [false; N];
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            match self.0.iter().position(|name| *name == key) {
                Some(i) if seen[i] => return Err(de::Error::custom("duplicate field")),
                Some(i) => {
                    seen[i] = true;
                    values[i] = map.next_value()?;
                }
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(values)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn challenge(body: &str) -> Option<String> {
        parse(body.as_bytes(), Field("challenge", of::<String>()))
            .ok()
            .flatten()
    }

    #[test]
    fn a_field_is_read_once_and_everything_else_is_skipped() {
        let cases: &[(&str, Option<&str>)] = &[
            (r#"{"challenge":"abc"}"#, Some("abc")),
            (
                r#"{"token":"x","challenge":"abc","more":{"challenge":1}}"#,
                Some("abc"),
            ),
            (r#"{"challenge":"a\"b"}"#, Some("a\"b")),
            (r#"{"token":"x"}"#, None),
            (r#"{"challenge":"a","challenge":"b"}"#, None),
            (r#"{"challenge":5}"#, None),
            (r#"{"challenge":null}"#, None),
            (r#"["abc"]"#, None),
            (r#""abc""#, None),
            (r#"{"challenge":"abc"} trailing"#, None),
            (r#"{"challenge":"abc""#, None),
            ("", None),
        ];
        for (body, expected) in cases {
            assert_eq!(challenge(body).as_deref(), *expected, "{body}");
        }
    }

    #[test]
    fn an_absent_field_is_none_but_a_duplicate_is_an_error() {
        let read = |body: &str| parse(body.as_bytes(), Field("a", of::<String>()));
        assert_eq!(read("{}").unwrap(), None);
        assert!(read(r#"{"a":"1","a":"1"}"#).is_err());
    }

    #[test]
    fn nested_fields_are_read_through_their_parents() {
        let token = |body: &str| {
            parse(
                body.as_bytes(),
                Field("payload", Field("plainToken", of::<String>())),
            )
            .ok()
            .flatten()
            .flatten()
        };
        assert_eq!(
            token(r#"{"payload":{"plainToken":"t"}}"#).as_deref(),
            Some("t")
        );
        assert_eq!(token(r#"{"payload":{}}"#), None);
        assert_eq!(token(r#"{"payload":"t"}"#), None);
        assert_eq!(
            token(r#"{"payload":{"plainToken":"t"},"payload":{}}"#),
            None
        );
        assert_eq!(
            token(r#"{"payload":{"plainToken":"t","plainToken":"u"}}"#),
            None
        );
    }

    #[test]
    fn strings_come_back_in_the_order_named() {
        let read = |body: &str| parse(body.as_bytes(), Strings(["b", "a", "c"]));
        let [b, a, c] = read(r#"{"a":"1","b":"2","x":[1,{"a":3}],"c":null}"#).unwrap();
        assert_eq!(
            (a.as_deref(), b.as_deref(), c),
            (Some("1"), Some("2"), None)
        );
        assert!(read(r#"{"a":"1","a":"2"}"#).is_err());
        assert!(read(r#"{"a":null,"a":"2"}"#).is_err());
        assert!(read(r#"{"a":1}"#).is_err());
        assert!(read(r#"["1","2","3"]"#).is_err());
    }
}
