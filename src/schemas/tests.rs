use serde_json::json;

use super::*;

fn invoice_paid() -> serde_json::Value {
    json!({
        "type": "object",
        "required": ["id", "type", "data"],
        "properties": {
            "id": {"type": "string"},
            "type": {"const": "invoice.paid"},
            "data": {
                "type": "object",
                "required": ["object"],
                "properties": {"object": {"$ref": "#/$defs/invoice"}},
            },
        },
        "$defs": {
            "invoice": {
                "type": "object",
                "required": ["amount_paid"],
                "properties": {"amount_paid": {"type": "integer", "minimum": 0}},
            },
        },
    })
}

#[test]
fn a_body_that_matches_its_types_schema_is_valid() {
    let schemas = Schemas::new()
        .with_schema("invoice.paid", &invoice_paid())
        .unwrap();
    let body = br#"{"id":"evt_1","type":"invoice.paid","data":{"object":{"amount_paid":700}}}"#;
    assert_eq!(
        schemas.check(Some("stripe"), Some("invoice.paid"), body),
        Ok(())
    );
}

#[test]
fn a_body_that_does_not_match_says_where_and_what_without_its_values() {
    let schemas = Schemas::new()
        .with_schema("invoice.paid", &invoice_paid())
        .unwrap();
    let body =
        br#"{"id":"evt_1","type":"invoice.paid","data":{"object":{"amount_paid":"secret-ish"}}}"#;
    let invalid = schemas.check(None, Some("invoice.paid"), body).unwrap_err();
    assert_eq!(invalid.errors().len(), 1, "{invalid}");
    let error = &invalid.errors()[0];
    assert_eq!(error.path(), "/data/object/amount_paid");
    assert!(error.message().contains("integer"), "{error}");
    assert!(
        !error.message().contains("secret-ish"),
        "the value is masked: {error}"
    );
    assert!(!invalid.to_string().contains("secret-ish"));
}

#[test]
fn at_most_ten_errors_are_kept() {
    let schema = json!({"type": "object", "additionalProperties": {"type": "integer"}});
    let schemas = Schemas::new().with_schema("many", &schema).unwrap();
    let body: serde_json::Value = (0..25)
        .map(|i| (format!("k{i}"), json!("x")))
        .collect::<serde_json::Map<_, _>>()
        .into();
    let invalid = schemas
        .check(None, Some("many"), body.to_string().as_bytes())
        .unwrap_err();
    assert_eq!(invalid.errors().len(), MAX_ERRORS);
}

#[test]
fn a_body_that_is_not_json_is_invalid_when_its_type_has_a_schema() {
    let schemas = Schemas::new()
        .with_schema("invoice.paid", &invoice_paid())
        .unwrap();
    let invalid = schemas
        .check(None, Some("invoice.paid"), b"amount=7")
        .unwrap_err();
    assert_eq!(invalid.errors()[0].path(), "");
    assert!(
        invalid.errors()[0].message().starts_with("not JSON"),
        "{invalid}"
    );
    // Without a schema for its type, nothing is checked: as before there were schemas.
    assert_eq!(
        schemas.check(None, Some("charge.failed"), b"amount=7"),
        Ok(())
    );
    assert_eq!(schemas.check(None, None, b"amount=7"), Ok(()));
}

#[test]
fn strict_makes_types_without_a_schema_invalid() {
    let schemas = Schemas::new()
        .with_schema("invoice.paid", &invoice_paid())
        .unwrap()
        .strict(true);
    let invalid = schemas
        .check(None, Some("charge.failed"), b"{}")
        .unwrap_err();
    assert!(
        invalid.errors()[0].message().contains("no schema"),
        "{invalid}"
    );
    assert!(schemas.check(None, None, b"{}").is_err());
}

#[test]
fn a_sources_own_schema_comes_before_the_types_for_every_source() {
    let schemas = Schemas::new()
        .with_schema("ping", &json!({"required": ["zen"]}))
        .unwrap()
        .with_source_schema("github", "ping", &json!({"required": ["hook_id"]}))
        .unwrap();
    assert_eq!(schemas.len(), 2);
    assert!(schemas
        .check(Some("github"), Some("ping"), br#"{"hook_id":1}"#)
        .is_ok());
    assert!(schemas
        .check(Some("github"), Some("ping"), br#"{"zen":"x"}"#)
        .is_err());
    assert!(schemas
        .check(Some("other"), Some("ping"), br#"{"zen":"x"}"#)
        .is_ok());
    assert!(schemas
        .check(Some("other"), Some("ping"), br#"{"hook_id":1}"#)
        .is_err());
}

#[test]
fn draft_07_is_read_from_the_schemas_own_dialect() {
    // `dependencies` is draft 07's (2020-12 split it in two and ignores the old keyword).
    let schema = json!({
        "$schema": "http://json-schema.org/draft-07/schema#",
        "dependencies": {"refunded": ["refund_id"]},
    });
    let schemas = Schemas::new().with_schema("charge", &schema).unwrap();
    assert!(schemas
        .check(None, Some("charge"), br#"{"refunded":true}"#)
        .is_err());
    assert!(schemas
        .check(
            None,
            Some("charge"),
            br#"{"refunded":true,"refund_id":"r"}"#
        )
        .is_ok());
}

#[test]
fn a_schema_that_does_not_compile_or_refers_outside_is_a_config_error() {
    let bad = Schemas::new()
        .with_schema("x", &json!({"type": 5}))
        .unwrap_err();
    assert_eq!(bad.kind(), crate::ConfigErrorKind::InvalidSchema);
    assert!(bad.to_string().contains("schema x"), "{bad}");
    let remote = json!({"$ref": "https://example.com/schema.json"});
    let err = Schemas::new().with_schema("y", &remote).unwrap_err();
    assert_eq!(err.kind(), crate::ConfigErrorKind::InvalidSchema, "{err}");
}

fn folder(files: &[(&str, &str)]) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "tower-webhook-schemas-{}-{}",
        std::process::id(),
        next_name()
    ));
    for (name, text) in files {
        let path = dir.join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    dir
}

fn next_name() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

#[test]
fn a_folder_gives_a_schema_per_type_and_per_source_and_type() {
    let dir = folder(&[
        ("invoice.paid.json", &invoice_paid().to_string()),
        ("github/ping.json", r#"{"required": ["hook_id"]}"#),
        ("README.md", "not a schema"),
    ]);
    let schemas = Schemas::from_dir(&dir).unwrap();
    assert_eq!(schemas.len(), 2, "{schemas:?}");
    assert!(schemas.check(None, Some("invoice.paid"), b"{}").is_err());
    assert!(schemas.check(Some("github"), Some("ping"), b"{}").is_err());
    assert!(schemas.check(Some("stripe"), Some("ping"), b"{}").is_ok());
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_folders_schema_that_does_not_compile_names_its_file() {
    let dir = folder(&[
        ("ok.json", "{}"),
        ("broken.type.json", r#"{"minimum": "x"}"#),
    ]);
    let err = Schemas::from_dir(&dir).unwrap_err();
    assert_eq!(err.kind(), crate::ConfigErrorKind::InvalidSchema);
    assert!(err.to_string().contains("broken.type.json"), "{err}");
    std::fs::write(dir.join("broken.type.json"), "{not json").unwrap();
    let err = Schemas::from_dir(&dir).unwrap_err();
    assert!(
        err.to_string().contains("broken.type.json: not JSON"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
    let err = Schemas::from_dir(&dir).unwrap_err();
    assert!(err.to_string().contains("schemas folder"), "{err}");
}

#[test]
fn an_openapi_documents_webhooks_give_a_schema_each_with_components_resolved() {
    let document = json!({
        "openapi": "3.1.0",
        "info": {"title": "t", "version": "1"},
        "webhooks": {
            "ping": {"post": {"requestBody": {"content": {"application/json": {
                "schema": {"$ref": "#/components/schemas/ping"}}}}}},
            "issues/opened": {"post": {"requestBody": {"$ref": "#/components/requestBodies/issue"}}},
        },
        "components": {
            "schemas": {
                "ping": {"type": "object", "required": ["zen"], "discriminator": {"propertyName": "zen"}},
                "issue": {"type": "object", "required": ["issue"]},
            },
            "requestBodies": {
                "issue": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/issue"}}}},
            },
        },
    });
    let schemas = Schemas::from_openapi(&document).unwrap();
    assert_eq!(schemas.len(), 2);
    assert!(schemas.check(None, Some("ping"), br#"{"zen":"z"}"#).is_ok());
    assert!(schemas.check(None, Some("ping"), b"{}").is_err());
    assert!(schemas
        .check(None, Some("issues/opened"), br#"{"issue":{}}"#)
        .is_ok());
    assert!(schemas.check(None, Some("issues/opened"), b"{}").is_err());
    let none = Schemas::from_openapi(&json!({"openapi": "3.1.0"})).unwrap_err();
    assert!(none.to_string().contains("webhooks"), "{none}");
    let bodiless = json!({"webhooks": {"ping": {"post": {}}}});
    let err = Schemas::from_openapi(&bodiless).unwrap_err();
    assert!(err.to_string().contains("webhook ping"), "{err}");
}

#[test]
fn debug_lists_the_types_only() {
    let schemas = Schemas::new()
        .with_schema("invoice.paid", &invoice_paid())
        .unwrap();
    assert_eq!(
        format!("{schemas:?}"),
        r#"Schemas { types: ["invoice.paid"], strict: false }"#
    );
}
