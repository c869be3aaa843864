//! Payload schemas (feature `schemas`): a JSON Schema per event type, compiled once, and
//! the check of a verified [`Event`]'s body against its type's schema.
//!
//! ```
//! use tower_webhook::schemas::Schemas;
//!
//! let schemas = Schemas::new()
//!     .with_schema("invoice.paid", &serde_json::json!({
//!         "type": "object",
//!         "required": ["id", "data"],
//!         "properties": {"id": {"type": "string"}},
//!     }))
//!     .unwrap();
//! let checked = schemas.check(Some("stripe"), Some("invoice.paid"), br#"{"id": 7}"#);
//! let invalid = checked.unwrap_err();
//! assert_eq!(invalid.errors()[0].path(), "");
//! assert_eq!(invalid.errors()[1].path(), "/id");
//! ```
//!
//! Schemas come from a folder of `<event type>.json` files ([`Schemas::from_dir`], with
//! `<source>/<event type>.json` for one source's types), an OpenAPI 3.1 document's
//! `webhooks` section ([`Schemas::from_openapi`]) or one by one ([`Schemas::with_schema`]).
//! Drafts 2020-12 (the default, and OpenAPI 3.1's) and 07 are read from each schema's
//! `$schema`. Nothing is fetched: a `$ref` outside the schema (or the OpenAPI document) is
//! a [`ConfigError`] when it is loaded, as is a schema that does not compile, naming its
//! file.
//!
//! An [`Invalid`] body's errors are at most [`MAX_ERRORS`], each a JSON pointer into the
//! body and a message that never quotes the body's values (they are customers' data, and
//! the errors are stored beside the event).

mod load;

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use jsonschema::Validator;

use crate::{ConfigError, ConfigErrorKind, Event};

/// The most errors an [`Invalid`] keeps.
pub const MAX_ERRORS: usize = 10;

/// JSON Schemas keyed by event type (and optionally by source and type), compiled once.
/// Cheap to clone.
#[derive(Clone, Default)]
pub struct Schemas {
    inner: Arc<Inner>,
}

#[derive(Clone, Default)]
struct Inner {
    /// `(source, type)`: a source's own schema first, then the type's for every source.
    by_type: HashMap<(Option<String>, String), Validator>,
    /// Types without a schema are invalid too.
    strict: bool,
}

impl Schemas {
    /// No schemas: every event is valid (unless [`strict`](Self::strict)).
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// `schema` for events of `event_type` from every source.
    ///
    /// # Errors
    ///
    /// The schema does not compile, or refers outside itself.
    pub fn with_schema(
        self,
        event_type: &str,
        schema: &serde_json::Value,
    ) -> Result<Self, ConfigError> {
        let validator = load::compile(schema, None, event_type)?;
        Ok(self.insert(None, event_type, validator))
    }

    /// `schema` for events of `event_type` from `source` only (before the type's schema
    /// for every source).
    ///
    /// # Errors
    ///
    /// The schema does not compile, or refers outside itself.
    pub fn with_source_schema(
        self,
        source: &str,
        event_type: &str,
        schema: &serde_json::Value,
    ) -> Result<Self, ConfigError> {
        let validator = load::compile(schema, None, &format!("{source}/{event_type}"))?;
        Ok(self.insert(Some(source), event_type, validator))
    }

    /// Whether an event of a type without a schema is invalid (default: valid, as before
    /// there were schemas).
    #[must_use]
    pub fn strict(mut self, strict: bool) -> Self {
        self.inner_mut().strict = strict;
        self
    }

    /// How many schemas there are.
    #[must_use]
    pub fn len(&self) -> usize {
        self.inner.by_type.len()
    }

    /// Whether there are none.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.inner.by_type.is_empty()
    }

    /// Checks `event`'s body against its type's schema.
    ///
    /// # Errors
    ///
    /// [`Invalid`], with the body's errors.
    pub fn validate(&self, event: &Event) -> Result<(), Invalid> {
        self.check(Some(event.source()), event.event_type(), event.body())
    }

    /// Checks `body`, of `event_type` from `source`, against the schema that applies.
    ///
    /// # Errors
    ///
    /// [`Invalid`]: the body is not JSON, does not match, or (strict) its type has no
    /// schema.
    pub fn check(
        &self,
        source: Option<&str>,
        event_type: Option<&str>,
        body: &[u8],
    ) -> Result<(), Invalid> {
        let Some(validator) = event_type.and_then(|t| self.schema_of(source, t)) else {
            return match self.inner.strict {
                false => Ok(()),
                true => Err(Invalid::one(
                    "",
                    match event_type {
                        Some(_) => "no schema for this event type (strict)",
                        None => "no event type to find a schema by (strict)",
                    },
                )),
            };
        };
        let body: serde_json::Value = match serde_json::from_slice(body) {
            Ok(body) => body,
            // The parser's message says where, never what.
            Err(e) => return Err(Invalid::one("", format!("not JSON: {e}"))),
        };
        let errors: Vec<SchemaError> = validator
            .iter_errors(&body)
            .take(MAX_ERRORS)
            .map(|e| SchemaError {
                path: e.instance_path().as_str().to_owned(),
                // Masked: "value is not of type ..." rather than the value itself.
                message: e.masked().to_string(),
            })
            .collect();
        match errors.is_empty() {
            true => Ok(()),
            false => Err(Invalid { errors }),
        }
    }

    fn schema_of(&self, source: Option<&str>, event_type: &str) -> Option<&Validator> {
        let by_type = &self.inner.by_type;
        let own = source.and_then(|s| by_type.get(&(Some(s.to_owned()), event_type.to_owned())));
        own.or_else(|| by_type.get(&(None, event_type.to_owned())))
    }

    fn insert(mut self, source: Option<&str>, event_type: &str, validator: Validator) -> Self {
        let key = (source.map(str::to_owned), event_type.to_owned());
        self.inner_mut().by_type.insert(key, validator);
        self
    }

    fn inner_mut(&mut self) -> &mut Inner {
        // A clone taken mid-build keeps what it had (validators are cheap to clone).
        Arc::make_mut(&mut self.inner)
    }
}

impl fmt::Debug for Schemas {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut types: Vec<String> = (self.inner.by_type.keys())
            .map(|(source, t)| match source {
                Some(s) => format!("{s}/{t}"),
                None => t.clone(),
            })
            .collect();
        types.sort();
        f.debug_struct("Schemas")
            .field("types", &types)
            .field("strict", &self.inner.strict)
            .finish()
    }
}

/// A body its schema refuses: at most [`MAX_ERRORS`] errors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    errors: Vec<SchemaError>,
}

impl Invalid {
    fn one(path: &str, message: impl Into<String>) -> Self {
        Self {
            errors: vec![SchemaError {
                path: path.to_owned(),
                message: message.into(),
            }],
        }
    }

    /// The errors, in the order the validator found them.
    #[must_use]
    pub fn errors(&self) -> &[SchemaError] {
        &self.errors
    }

    /// The errors as the queues keep them: a JSON list of `{"path", "message"}`.
    #[cfg_attr(
        not(any(
            feature = "sqlite",
            feature = "postgres",
            feature = "nats",
            feature = "amqp"
        )),
        allow(dead_code)
    )]
    pub(crate) fn to_json(&self) -> String {
        let errors: Vec<serde_json::Value> = (self.errors.iter())
            .map(|e| serde_json::json!({"path": e.path, "message": e.message}))
            .collect();
        serde_json::Value::from(errors).to_string()
    }
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (n, e) in self.errors.iter().enumerate() {
            if n > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Invalid {}

/// One error: where in the body (a JSON pointer, `""` for the whole body) and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaError {
    path: String,
    message: String,
}

impl SchemaError {
    /// The errors of [`Invalid::to_json`]'s text, as a queue kept them; what does not
    /// read as one is left out.
    #[cfg(any(feature = "nats", feature = "amqp"))]
    pub(crate) fn list_from_json(json: &str) -> Vec<Self> {
        let Ok(serde_json::Value::Array(errors)) = serde_json::from_str(json) else {
            return Vec::new();
        };
        (errors.iter())
            .filter_map(|e| {
                Some(Self {
                    path: e.get("path")?.as_str()?.to_owned(),
                    message: e.get("message")?.as_str()?.to_owned(),
                })
            })
            .collect()
    }

    /// The JSON pointer (RFC 6901) to the value in the body, `""` for the body itself.
    #[must_use]
    pub fn path(&self) -> &str {
        &self.path
    }

    /// What is wrong, without the value.
    #[must_use]
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for SchemaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.path.is_empty() {
            true => f.write_str(&self.message),
            false => write!(f, "{}: {}", self.path, self.message),
        }
    }
}

fn config_error(detail: String) -> ConfigError {
    ConfigError::new(ConfigErrorKind::InvalidSchema, detail)
}

#[cfg(test)]
mod tests;
