//! The cost of checking a body against its type's schema (issue 36): a Stripe-shaped
//! `invoice.paid` of 10 KiB (an invoice with its line items) against a schema that
//! checks every field's type, the ids' patterns, the amounts' minimums, the statuses'
//! enums and the required fields, through `$defs`.
//!
//! - `parse/10KiB`: `serde_json::from_slice` of the body into a `Value` — the baseline a
//!   check cannot go under (it parses first).
//! - `check/10KiB`: `Schemas::check`, the parse included.
//!
//! After criterion's figures, 20 000 checks timed one by one print their p50, p99 and
//! max (issue 36's bar: p99 ≤ 200 µs).
//!
//! `cargo bench --features schemas --bench schemas`; figures in BENCHMARKS.md.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput};
use serde_json::{json, Value};
use tower_webhook::schemas::Schemas;

fn line(n: usize) -> Value {
    json!({
        "id": format!("il_1N{n:020}"),
        "object": "line_item",
        "amount": 1999 + n as i64,
        "currency": "usd",
        "description": format!("1 × Widget tier {n} (at $19.99 / month)"),
        "livemode": false,
        "period": {"start": 1_700_000_000 + n as i64, "end": 1_702_592_000 + n as i64},
        "price": {"id": format!("price_1N{n:018}"), "unit_amount": 1999, "recurring": {"interval": "month"}},
        "proration": false,
        "quantity": 1,
        "type": "subscription",
    })
}

/// An `invoice.paid` event of about `size` bytes: lines until it is.
fn body(size: usize) -> Vec<u8> {
    let mut lines = Vec::new();
    loop {
        let event = json!({
            "id": "evt_1NbenchAbCdEf0123456789",
            "object": "event",
            "api_version": "2024-06-20",
            "created": 1_700_000_000,
            "livemode": false,
            "type": "invoice.paid",
            "data": {"object": {
                "id": "in_1NbenchAbCdEf0123456789",
                "object": "invoice",
                "amount_due": 1999 * lines.len() as i64,
                "amount_paid": 1999 * lines.len() as i64,
                "currency": "usd",
                "customer": "cus_Nbench0123456789",
                "customer_email": "jenny.rosen@example.com",
                "status": "paid",
                "lines": {"object": "list", "data": lines, "has_more": false},
            }},
        });
        let text = serde_json::to_vec(&event).unwrap();
        if text.len() >= size {
            return text;
        }
        let Value::Array(lines_now) = &event["data"]["object"]["lines"]["data"] else {
            unreachable!()
        };
        lines = lines_now.clone();
        lines.push(line(lines.len()));
    }
}

fn schema() -> Value {
    json!({
        "type": "object",
        "required": ["id", "object", "type", "created", "livemode", "data"],
        "properties": {
            "id": {"type": "string", "pattern": "^evt_[A-Za-z0-9]+$"},
            "object": {"const": "event"},
            "api_version": {"type": "string"},
            "created": {"type": "integer", "minimum": 0},
            "livemode": {"type": "boolean"},
            "type": {"const": "invoice.paid"},
            "data": {
                "type": "object",
                "required": ["object"],
                "properties": {"object": {"$ref": "#/$defs/invoice"}},
            },
        },
        "$defs": {
            "amount": {"type": "integer", "minimum": 0},
            "invoice": {
                "type": "object",
                "required": ["id", "object", "amount_paid", "currency", "customer", "status", "lines"],
                "properties": {
                    "id": {"type": "string", "pattern": "^in_[A-Za-z0-9]+$"},
                    "object": {"const": "invoice"},
                    "amount_due": {"$ref": "#/$defs/amount"},
                    "amount_paid": {"$ref": "#/$defs/amount"},
                    "currency": {"type": "string", "minLength": 3, "maxLength": 3},
                    "customer": {"type": "string", "pattern": "^cus_[A-Za-z0-9]+$"},
                    "customer_email": {"type": ["string", "null"]},
                    "status": {"enum": ["draft", "open", "paid", "uncollectible", "void"]},
                    "lines": {
                        "type": "object",
                        "required": ["data", "has_more"],
                        "properties": {
                            "data": {"type": "array", "items": {"$ref": "#/$defs/line"}},
                            "has_more": {"type": "boolean"},
                        },
                    },
                },
            },
            "line": {
                "type": "object",
                "required": ["id", "amount", "currency", "period", "quantity", "type"],
                "properties": {
                    "id": {"type": "string", "pattern": "^il_[A-Za-z0-9]+$"},
                    "amount": {"$ref": "#/$defs/amount"},
                    "currency": {"type": "string", "minLength": 3, "maxLength": 3},
                    "description": {"type": ["string", "null"]},
                    "livemode": {"type": "boolean"},
                    "period": {
                        "type": "object",
                        "required": ["start", "end"],
                        "properties": {"start": {"type": "integer"}, "end": {"type": "integer"}},
                    },
                    "price": {"type": "object", "required": ["id"]},
                    "proration": {"type": "boolean"},
                    "quantity": {"type": "integer", "minimum": 0},
                    "type": {"enum": ["invoiceitem", "subscription"]},
                },
            },
        },
    })
}

fn main() {
    let schemas = Schemas::new()
        .with_schema("invoice.paid", &schema())
        .expect("the schema compiles");
    let body = body(10 * 1024);
    assert_eq!(
        schemas.check(Some("stripe"), Some("invoice.paid"), &body),
        Ok(()),
        "the bench body is valid"
    );

    let mut c = Criterion::default().configure_from_args();
    let mut group = c.benchmark_group("schemas");
    group.throughput(Throughput::Bytes(body.len() as u64));
    group.bench_with_input(BenchmarkId::new("parse", "10KiB"), &body, |b, body| {
        b.iter(|| serde_json::from_slice::<Value>(black_box(body)).unwrap());
    });
    group.bench_with_input(BenchmarkId::new("check", "10KiB"), &body, |b, body| {
        b.iter(|| schemas.check(Some("stripe"), Some("invoice.paid"), black_box(body)));
    });
    group.finish();
    c.final_summary();

    // Each check timed alone, after a warm-up: the tail criterion's means hide.
    let mut took: Vec<Duration> = Vec::with_capacity(20_000);
    for _ in 0..2_000 {
        let _ = black_box(schemas.check(Some("stripe"), Some("invoice.paid"), &body));
    }
    for _ in 0..20_000 {
        let started = Instant::now();
        let _ = black_box(schemas.check(Some("stripe"), Some("invoice.paid"), &body));
        took.push(started.elapsed());
    }
    took.sort();
    let at = |q: f64| took[((took.len() as f64 * q) as usize).min(took.len() - 1)];
    println!(
        "schemas/check/10KiB ({} bytes) one by one: p50 {:?}, p99 {:?}, max {:?} (20000 checks)",
        body.len(),
        at(0.50),
        at(0.99),
        took[took.len() - 1]
    );
}
