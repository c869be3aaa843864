//! The envelope of a JSON body — its id, type, livemode and object id — read in one pass
//! without building a tree, and the single top-level fields other parts of the crate ask
//! for (a tenant's account, SNS's certificate URL, a timestamp in the body).

use std::fmt;

use serde::de::{self, DeserializeOwned, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use crate::json;

/// A top-level string field of a JSON object body; `None` when the body is not an
/// object, the field is absent, twice, or not a string.
pub(crate) fn string_field(body: &[u8], field: &str) -> Option<String> {
    top_level::<Scalar>(body, field)?.into_string()
}

/// A top-level number of a JSON object body, whole or with a fraction (floored); `None`
/// when the body is not an object, the field is absent, twice, or not a number.
pub(crate) fn number_field(body: &[u8], field: &str) -> Option<i64> {
    match top_level::<serde_json::Number>(body, field)? {
        n if n.is_i64() => n.as_i64(),
        n => n
            .as_f64()
            .filter(|f| f.is_finite())
            .map(|f| f.floor() as i64),
    }
}

/// One top-level field of a JSON object body, every other skipped unread. Twice the
/// field is ambiguous (which one does the handler read?), and trailing bytes make the
/// body not JSON: both give `None`.
fn top_level<T: DeserializeOwned>(body: &[u8], field: &str) -> Option<T> {
    json::parse(body, json::Field(field, json::of::<T>()))
        .ok()
        .flatten()
}

/// The envelope fields of a JSON body; every field is optional and of lenient type.
#[derive(Default)]
pub(super) struct Envelope {
    pub(super) id: Option<String>,
    pub(super) event_id: Option<String>,
    pub(super) other_id: Option<String>,
    pub(super) ty: Option<String>,
    pub(super) livemode: Option<bool>,
    pub(super) object_id: Option<String>,
}

impl Envelope {
    pub(super) fn parse(
        body: &[u8],
        id_field: Option<&'static str>,
        type_field: &'static str,
    ) -> Self {
        let mut de = serde_json::Deserializer::from_slice(body);
        let visitor = EnvelopeVisitor {
            id_field,
            type_field,
        };
        let env = de::Deserializer::deserialize_map(&mut de, visitor);
        // Trailing bytes after the object make the whole body not JSON.
        match (env, de.end()) {
            (Ok(env), Ok(())) => env,
            _ => Self::default(),
        }
    }
}

struct EnvelopeVisitor {
    id_field: Option<&'static str>,
    type_field: &'static str,
}

impl<'de> Visitor<'de> for EnvelopeVisitor {
    type Value = Envelope;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Envelope, A::Error> {
        let mut env = Envelope::default();
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            match key.as_ref() {
                k if k == self.type_field => env.ty = map.next_value::<Scalar>()?.into_string(),
                "id" => env.id = map.next_value::<Scalar>()?.into_string(),
                "event_id" => env.event_id = map.next_value::<Scalar>()?.into_string(),
                "livemode" => env.livemode = map.next_value::<Scalar>()?.into_bool(),
                "data" => env.object_id = map.next_value::<Data>()?.0,
                k if Some(k) == self.id_field => {
                    env.other_id = map.next_value::<Scalar>()?.into_string();
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(env)
    }
}

/// A leaf value of any JSON type; strings and numbers become text, objects and arrays are
/// skipped without being stored.
enum Scalar {
    Text(String),
    Bool(bool),
    Other,
}

impl Scalar {
    fn into_string(self) -> Option<String> {
        match self {
            Scalar::Text(s) => Some(s),
            _ => None,
        }
    }

    fn into_bool(self) -> Option<bool> {
        match self {
            Scalar::Bool(b) => Some(b),
            _ => None,
        }
    }
}

impl<'de> Deserialize<'de> for Scalar {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Scalar;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_str<E>(self, v: &str) -> Result<Scalar, E> {
                Ok(Scalar::Text(v.to_owned()))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Scalar, E> {
                Ok(Scalar::Text(v.to_string()))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Scalar, E> {
                Ok(Scalar::Text(v.to_string()))
            }
            fn visit_f64<E>(self, _: f64) -> Result<Scalar, E> {
                Ok(Scalar::Other)
            }
            fn visit_bool<E>(self, v: bool) -> Result<Scalar, E> {
                Ok(Scalar::Bool(v))
            }
            fn visit_unit<E>(self) -> Result<Scalar, E> {
                Ok(Scalar::Other)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Scalar, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Scalar::Other)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Scalar, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Scalar::Other)
            }
        }
        d.deserialize_any(V)
    }
}

/// `data`: its `object.id`, else its `id`; anything that is not an object yields `None`.
struct Data(Option<String>);

impl<'de> Deserialize<'de> for Data {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Data;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Data, A::Error> {
                let (mut object_id, mut id) = (None, None);
                while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                    match key.as_ref() {
                        "object" => object_id = map.next_value::<Object>()?.0,
                        "id" => id = map.next_value::<Scalar>()?.into_string(),
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(Data(object_id.or(id)))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Data, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Data(None))
            }
            fn visit_str<E>(self, _: &str) -> Result<Data, E> {
                Ok(Data(None))
            }
            fn visit_u64<E>(self, _: u64) -> Result<Data, E> {
                Ok(Data(None))
            }
            fn visit_i64<E>(self, _: i64) -> Result<Data, E> {
                Ok(Data(None))
            }
            fn visit_f64<E>(self, _: f64) -> Result<Data, E> {
                Ok(Data(None))
            }
            fn visit_bool<E>(self, _: bool) -> Result<Data, E> {
                Ok(Data(None))
            }
            fn visit_unit<E>(self) -> Result<Data, E> {
                Ok(Data(None))
            }
        }
        d.deserialize_any(V)
    }
}

/// `data.object`: its `id`.
struct Object(Option<String>);

impl<'de> Deserialize<'de> for Object {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Reuse `Data`'s walk: an object's `id` is what we want; a nested `object` key
        // inside it is not expected and falls back to `id` too.
        Data::deserialize(d).map(|Data(id)| Object(id))
    }
}
