//! Where schemas come from: a folder of `<type>.json` files, an OpenAPI 3.1 document's
//! `webhooks`, one value; each compiled offline.

use std::path::Path;

use jsonschema::{Draft, Registry, Validator};
use serde_json::Value;

use super::{config_error, Schemas};
use crate::ConfigError;

/// The OpenAPI document's URI in the registry its webhooks' schemas resolve in.
const OPENAPI: &str = "urn:tower-webhook:openapi";

/// `schema` compiled without fetching anything (`registry`: the document it refers into);
/// `name` says which in an error.
pub(super) fn compile(
    schema: &Value,
    registry: Option<&Registry<'_>>,
    name: &str,
) -> Result<Validator, ConfigError> {
    let mut options = jsonschema::options().offline();
    if let Some(registry) = registry {
        // OpenAPI 3.1's schemas are 2020-12 (its own keywords are ignored as unknown).
        options = options
            .with_registry(registry)
            .with_draft(Draft::Draft202012);
    }
    options
        .build(schema)
        .map_err(|e| config_error(format!("schema {name}: {e}")))
}

impl Schemas {
    /// The schemas of a folder: each `<event type>.json` for that type from every source,
    /// and each `<source>/<event type>.json` for that source's events of the type. Other
    /// files are ignored.
    ///
    /// # Errors
    ///
    /// The folder cannot be read, or a file is not JSON or does not compile: the error
    /// names the file.
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Self, ConfigError> {
        let dir = dir.as_ref();
        let mut schemas = Self::new();
        for (path, source) in json_files(dir, None)? {
            let name = path.display().to_string();
            let event_type = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_suffix(".json"))
                .ok_or_else(|| config_error(format!("schema {name}: not a UTF-8 name")))?;
            let text =
                std::fs::read(&path).map_err(|e| config_error(format!("schema {name}: {e}")))?;
            let schema: Value = serde_json::from_slice(&text)
                .map_err(|e| config_error(format!("schema {name}: not JSON: {e}")))?;
            let validator = compile(&schema, None, &name)?;
            schemas = schemas.insert(source.as_deref(), event_type, validator);
        }
        Ok(schemas)
    }

    /// The schemas of an OpenAPI 3.1 document's `webhooks` (JSON): for each webhook, its
    /// operation's `application/json` request body schema, for the event type of the
    /// webhook's name. `$ref`s resolve inside the document (its `components`).
    ///
    /// # Errors
    ///
    /// The document has no `webhooks`, a webhook has no JSON request body schema, or a
    /// schema does not compile: the error names the webhook.
    pub fn from_openapi(document: &Value) -> Result<Self, ConfigError> {
        let webhooks = document
            .get("webhooks")
            .and_then(Value::as_object)
            .ok_or_else(|| config_error("OpenAPI document: no `webhooks` object".into()))?;
        let registry = Registry::new()
            .add(OPENAPI, document.clone())
            .and_then(|r| r.prepare())
            .map_err(|e| config_error(format!("OpenAPI document: {e}")))?;
        let mut schemas = Self::new();
        for (name, item) in webhooks {
            let (method, body) = request_body(document, item)
                .ok_or_else(|| config_error(format!("webhook {name}: no request body")))?;
            if body.pointer("/content/application~1json/schema").is_none() {
                return Err(config_error(format!(
                    "webhook {name}: no application/json request body schema"
                )));
            }
            // Where the schema is in the document: under the webhook, or under the
            // `components` its request body refers to.
            let reference = item[method]["requestBody"]
                .get("$ref")
                .and_then(Value::as_str);
            let pointer = match reference {
                Some(r) => format!("{r}/content/application~1json/schema"),
                None => format!(
                    "#/webhooks/{}/{method}/requestBody/content/application~1json/schema",
                    escape(name)
                ),
            };
            let reference = serde_json::json!({ "$ref": format!("{OPENAPI}{pointer}") });
            let validator = compile(&reference, Some(&registry), &format!("webhook {name}"))?;
            schemas = schemas.insert(None, name, validator);
        }
        Ok(schemas)
    }
}

/// A webhook's first operation with a request body: its method and the body (its `$ref`
/// into `components` followed).
fn request_body<'a>(document: &'a Value, item: &'a Value) -> Option<(&'static str, &'a Value)> {
    ["post", "put", "patch"].into_iter().find_map(|method| {
        let body = item.get(method)?.get("requestBody")?;
        match body.get("$ref").and_then(Value::as_str) {
            Some(r) => Some((method, document.pointer(r.strip_prefix('#')?)?)),
            None => Some((method, body)),
        }
    })
}

/// A JSON pointer's token for `name` (RFC 6901).
fn escape(name: &str) -> String {
    name.replace('~', "~0").replace('/', "~1")
}

/// The `*.json` files of `dir`, and of each folder in it (a source's), sorted.
fn json_files(
    dir: &Path,
    source: Option<&str>,
) -> Result<Vec<(std::path::PathBuf, Option<String>)>, ConfigError> {
    let read = std::fs::read_dir(dir)
        .map_err(|e| config_error(format!("schemas folder {}: {e}", dir.display())))?;
    let mut entries: Vec<_> = read.filter_map(Result::ok).map(|e| e.path()).collect();
    entries.sort();
    let mut files = Vec::new();
    for path in entries {
        if path.is_dir() && source.is_none() {
            let name = path.file_name().and_then(|n| n.to_str()).map(str::to_owned);
            let Some(name) = name else { continue };
            files.extend(json_files(&path, Some(&name))?);
        } else if path.extension().is_some_and(|e| e == "json") && path.is_file() {
            files.push((path, source.map(str::to_owned)));
        }
    }
    Ok(files)
}
