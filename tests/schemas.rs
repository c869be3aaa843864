//! Schemas in the SQL inbox (issue 36), on SQLite and PostgreSQL: signed deliveries of
//! three providers' real payload shapes (Stripe's `invoice.paid`, GitHub's `push`, a
//! Shopify-like order in a Standard Webhooks envelope; `tests/fixtures/schemas/`) checked
//! against a folder of schemas at accept. A valid one runs once; an invalid one is
//! answered 204, never runs and is never retried, kept `invalid` with its errors' JSON
//! pointers; a requeue after the schema is fixed runs it once.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::seed::{eventually, SECRET};
use common::{at, request, stores, verifier, NOW};
use http::StatusCode;
use http_body_util::Full;
use tower::{ServiceBuilder, ServiceExt};
use tower_webhook::inbox::{
    Accept, Accepted, Attempt, Inbox, ProcessorSpec, RevalidatedCounts, State, Worker,
};
use tower_webhook::schemas::Schemas;
use tower_webhook::{Event, Scheme, VerifyWebhookLayer};

use axum::body::Body;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower_webhook::admin;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/schemas")
}

fn payload(name: &str) -> String {
    let path = fixtures().join("payloads").join(format!("{name}.json"));
    std::fs::read_to_string(path).unwrap().trim().to_owned()
}

/// The key of a delivery keyed on its body (GitHub's): `sha256:` and the hex digest.
fn digest_of(fixture: &str) -> String {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(payload(fixture).as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

fn schemas() -> Schemas {
    Schemas::from_dir(fixtures().join("schemas")).unwrap()
}

/// The folder's schemas, Stripe's fixed for its new version (an amount as a decimal
/// string too).
fn fixed_schemas() -> Schemas {
    let relaxed = json!({
        "type": "object",
        "required": ["data"],
        "properties": {"data": {"properties": {"object": {"properties": {
            "amount_paid": {"type": ["integer", "string"]}
        }}}}}
    });
    schemas().with_schema("invoice.paid", &relaxed).unwrap()
}

/// Posts `payload` signed as `scheme` would, through `VerifyWebhookLayer` and the
/// inbox's accept: the answer's status.
async fn deliver(inbox: &Inbox, scheme: Scheme, id: &str, payload: &str) -> StatusCode {
    deliver_to(inbox.accept_service(), scheme, id, payload).await
}

/// [`deliver`] to any queue's accept service.
async fn deliver_to(accept: Accept, scheme: Scheme, id: &str, payload: &str) -> StatusCode {
    let svc = ServiceBuilder::new()
        .layer(VerifyWebhookLayer::new(verifier(scheme.clone(), &[SECRET])))
        .service(accept);
    let mut headers = scheme
        .sign([SECRET], id, at(NOW), payload.as_bytes())
        .unwrap();
    if scheme.name() == "github" {
        headers.insert("x-github-event", "push".parse().unwrap());
    }
    let req: http::Request<Full<Bytes>> = request(headers, payload.to_owned());
    svc.oneshot(req).await.unwrap().status()
}

/// The six deliveries: (source, id as stored, scheme, id to sign with, fixture).
fn deliveries() -> Vec<(
    &'static str,
    &'static str,
    Scheme,
    &'static str,
    &'static str,
)> {
    vec![
        (
            "stripe",
            "evt_1PkValid0001",
            Scheme::stripe(),
            "",
            "stripe_invoice_paid",
        ),
        (
            "stripe",
            "evt_1PkInvalid001",
            Scheme::stripe(),
            "",
            "stripe_invoice_paid_renamed",
        ),
        ("github", "", Scheme::github(), "gh-push-1", "github_push"),
        (
            "github",
            "",
            Scheme::github(),
            "gh-push-2",
            "github_push_no_commit_id",
        ),
        (
            "standard",
            "msg_order_1",
            Scheme::standard(),
            "msg_order_1",
            "shop_order_created",
        ),
        (
            "standard",
            "msg_order_2",
            Scheme::standard(),
            "msg_order_2",
            "shop_order_created_bad_quantity",
        ),
    ]
}

/// Each event id a processor ran, with how many times.
#[derive(Clone, Default)]
struct Runs(Arc<Mutex<BTreeMap<String, u32>>>);

impl Runs {
    fn worker(&self, inbox: &Inbox, processor: &'static str) -> Worker {
        let runs = self.clone();
        let process = move |event: Event, _: Attempt| {
            let runs = runs.clone();
            async move {
                let id = format!("{processor}:{}", event.id().unwrap_or_default());
                *runs.0.lock().unwrap().entry(id).or_default() += 1;
                Ok::<_, std::io::Error>(())
            }
        };
        Worker::processor(inbox, processor, process)
            .unwrap()
            .with_max_attempts(3)
            .unwrap()
            .with_backoff(Duration::from_millis(10), Duration::from_millis(20))
            .unwrap()
            .with_poll_interval(Duration::from_millis(50))
            .unwrap()
    }

    fn get(&self) -> BTreeMap<String, u32> {
        self.0.lock().unwrap().clone()
    }
}

fn fan_out(inbox: Inbox) -> Inbox {
    inbox
        .with_processors([
            ProcessorSpec::new("billing").unwrap(),
            ProcessorSpec::new("audit").unwrap(),
        ])
        .unwrap()
}

/// The whole path: valid ones run once on each processor, invalid ones never (no route:
/// not a retry, not a dead row), listed and counted with the right JSON pointers; fixed
/// schemas and a requeue run the one now valid once, the others stay.
async fn invalid_events_never_run_and_a_requeue_after_a_fix_runs_them_once(plain: Inbox) {
    let inbox = fan_out(plain.clone()).with_schemas(schemas());
    for (_, id, scheme, sign_id, fixture) in deliveries() {
        let status = deliver(&inbox, scheme, sign_id, &payload(fixture)).await;
        assert_eq!(status, StatusCode::NO_CONTENT, "{id}: 2xx, valid or not");
    }
    let runs = Runs::default();
    let workers = [
        runs.worker(&inbox, "billing").spawn(),
        runs.worker(&inbox, "audit").spawn(),
    ];
    eventually("the valid ones processed", async || {
        inbox.counts().await.unwrap().processed == 6
    })
    .await;
    // Long enough for three retries at most 20 ms apart, were there any.
    tokio::time::sleep(Duration::from_millis(400)).await;
    // GitHub's deliveries are keyed on their body's digest: the ids as stored.
    let listed = inbox.list_invalid(None, 10).await.unwrap();
    let invalid_id = |source: &str| -> String {
        let event = listed.iter().find(|e| e.summary.source == source).unwrap();
        event.summary.id.clone()
    };
    let github_valid = (inbox
        .event("github", &digest_of("github_push"))
        .await
        .unwrap())
    .expect("the valid push stored under its digest");
    let valid = [
        "evt_1PkValid0001".to_owned(),
        github_valid.summary.id,
        "msg_order_1".to_owned(),
    ];
    let once: BTreeMap<String, u32> = ["billing", "audit"]
        .iter()
        .flat_map(|p| valid.iter().map(move |id| (format!("{p}:{id}"), 1)))
        .collect();
    assert_eq!(
        runs.get(),
        once,
        "each valid one once per processor, no invalid one"
    );
    let counts = inbox.counts().await.unwrap();
    assert_eq!(
        (
            counts.invalid,
            counts.queued,
            counts.dead,
            counts.processing
        ),
        (3, 0, 0, 0),
        "invalid, never queued nor dead"
    );

    // Each invalid event: its state, its errors' paths, no route, no attempt.
    let expected = [
        ("stripe", "/data/object/amount_paid"),
        ("github", "/commits/1"),
        ("standard", "/data/line_items/1/quantity"),
    ];
    assert_eq!(invalid_id("stripe"), "evt_1PkInvalid001");
    assert_eq!(invalid_id("github"), digest_of("github_push_no_commit_id"));
    for (source, path) in expected {
        let id = invalid_id(source);
        let event = inbox.event(source, &id).await.unwrap().expect("stored");
        assert_eq!(event.summary.state, State::Invalid, "{id}");
        assert!(event.routes.is_empty() && event.attempts.is_empty(), "{id}");
        let paths: Vec<&str> = event
            .validation_errors
            .iter()
            .map(|e| e.path.as_str())
            .collect();
        assert_eq!(paths, [path], "{id}");
        let json = serde_json::to_value(&event).unwrap();
        assert_eq!(json["state"], "invalid", "{id}");
        assert_eq!(json["validation_errors"][0]["path"], path, "{id}");
    }
    // The messages never quote the payload's values.
    let stripe = inbox
        .event("stripe", "evt_1PkInvalid001")
        .await
        .unwrap()
        .unwrap();
    let message = &stripe.validation_errors[0].message;
    assert!(
        message.contains("integer") && !message.contains("20.00"),
        "{message}"
    );
    // The valid ones carry none.
    let fine = inbox
        .event("stripe", "evt_1PkValid0001")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(fine.summary.state, State::Processed);
    assert!(fine.validation_errors.is_empty());

    // Listed, in (source, id) order, a page at a time.
    let listed = inbox.list_invalid(None, 2).await.unwrap();
    let ids: Vec<&str> = listed.iter().map(|e| e.summary.source.as_str()).collect();
    assert_eq!(ids, ["github", "standard"]);
    let rest = inbox
        .list_invalid(Some(("standard", "msg_order_2")), 2)
        .await
        .unwrap();
    assert_eq!(rest.len(), 1);
    assert_eq!(rest[0].summary.id, "evt_1PkInvalid001");

    // A redelivery of an invalid one is a duplicate: still invalid, still not run.
    let (_, _, scheme, sign_id, fixture) = deliveries().remove(3);
    assert_eq!(
        deliver(&inbox, scheme, sign_id, &payload(fixture)).await,
        StatusCode::NO_CONTENT
    );
    assert_eq!(inbox.counts().await.unwrap().invalid, 3);

    // The schemas fixed for Stripe's new version (an amount as a decimal string too): a
    // requeue queues that one, and keeps the other two.
    let now = fan_out(plain).with_schemas(fixed_schemas());
    let done = now.requeue_invalid().await.unwrap();
    assert_eq!((done.queued, done.still_invalid), (1, 2), "{done:?}");
    assert_ne!(done, RevalidatedCounts::default());
    let mut once = once;
    once.insert("billing:evt_1PkInvalid001".into(), 1);
    once.insert("audit:evt_1PkInvalid001".into(), 1);
    eventually("the fixed one processed on both", async || {
        runs.get() == once
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    for worker in workers {
        worker.shutdown().await;
    }
    assert_eq!(runs.get(), once, "run once each, no other");
    assert_eq!(now.counts().await.unwrap().invalid, 2);
    let event = now
        .event("stripe", "evt_1PkInvalid001")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(event.summary.state, State::Processed);
    assert!(event.validation_errors.is_empty());
    // A second requeue changes nothing more.
    let again = now.requeue_invalid().await.unwrap();
    assert_eq!((again.queued, again.still_invalid), (0, 2));
}

#[tokio::test]
async fn sqlite_invalid_events_never_run_and_a_requeue_after_a_fix_runs_them_once() {
    let store = stores::sqlite().await;
    invalid_events_never_run_and_a_requeue_after_a_fix_runs_them_once(Inbox::sqlite(&store)).await;
}

#[tokio::test]
async fn postgres_invalid_events_never_run_and_a_requeue_after_a_fix_runs_them_once() {
    let store = stores::postgres().await;
    invalid_events_never_run_and_a_requeue_after_a_fix_runs_them_once(Inbox::postgres(&store))
        .await;
}

/// A type without a schema goes on as before; strict schemas keep it invalid, its error
/// at the root.
async fn types_without_a_schema_run_unless_strict(inbox: Inbox) {
    let source = common::seed::standard("shop");
    let loose = inbox.clone().with_schemas(schemas());
    let other = r#"{"type":"customer.created","data":{}}"#;
    assert_eq!(
        loose.ingest(&source, Some("c1"), other).await.unwrap(),
        Accepted::New
    );
    let strict = inbox.with_schemas(schemas().strict(true));
    // Counted once as stored invalid (`tower_webhook_inbox_invalid_total`), not again
    // when delivered again.
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    {
        let _local = metrics::set_default_local_recorder(&recorder);
        for _ in 0..2 {
            strict.ingest(&source, Some("c2"), other).await.unwrap();
        }
    }
    let invalid_total: Vec<u64> = (snapshotter.snapshot().into_vec().into_iter())
        .filter(|(key, ..)| key.key().name() == "tower_webhook_inbox_invalid_total")
        .map(|(key, _, _, value)| {
            let labels: Vec<String> = key
                .key()
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            assert_eq!(labels, ["source=shop"]);
            match value {
                metrics_util::debugging::DebugValue::Counter(n) => n,
                other => panic!("{other:?}"),
            }
        })
        .collect();
    assert_eq!(invalid_total, [1], "the new one, not its duplicate");
    let loose_event = strict.event("shop", "c1").await.unwrap().unwrap();
    assert_eq!(loose_event.summary.state, State::Queued);
    let strict_event = strict.event("shop", "c2").await.unwrap().unwrap();
    assert_eq!(strict_event.summary.state, State::Invalid);
    assert_eq!(strict_event.validation_errors[0].path, "");
    let counts = strict.counts().await.unwrap();
    assert_eq!((counts.queued, counts.invalid), (1, 1));
}

#[tokio::test]
async fn sqlite_types_without_a_schema_run_unless_strict() {
    let store = stores::sqlite().await;
    types_without_a_schema_run_unless_strict(Inbox::sqlite(&store)).await;
}

#[tokio::test]
async fn postgres_types_without_a_schema_run_unless_strict() {
    let store = stores::postgres().await;
    types_without_a_schema_run_unless_strict(Inbox::postgres(&store)).await;
}

/// The operator's endpoints: `GET /counts` has `invalid`; `GET /events?state=invalid`
/// lists them a page at a time with their errors; one event's row says `invalid` with
/// `validation_errors`; `POST /requeue {"invalid": true}` checks them again (alone).
async fn the_admin_counts_lists_shows_and_requeues_invalid_events(plain: Inbox) {
    let inbox = plain.clone().with_schemas(schemas());
    for (_, _, scheme, sign_id, fixture) in deliveries() {
        let status = deliver(&inbox, scheme, sign_id, &payload(fixture)).await;
        assert_eq!(status, StatusCode::NO_CONTENT);
    }
    let counts = admin_get(&inbox, "/counts").await;
    assert_eq!(
        (counts["invalid"].as_u64(), counts["queued"].as_u64()),
        (Some(3), Some(3))
    );

    let first = admin_get(&inbox, "/events?state=invalid&limit=2").await;
    let rows = first["events"].as_array().unwrap();
    let sources: Vec<&str> = rows.iter().map(|r| r["source"].as_str().unwrap()).collect();
    assert_eq!(sources, ["github", "standard"]);
    assert!(rows.iter().all(|r| r["state"] == "invalid"));
    assert_eq!(
        rows[1]["validation_errors"][0]["path"],
        "/data/line_items/1/quantity"
    );
    let next = first["next"].as_str().expect("a next page");
    let second = admin_get(
        &inbox,
        &format!("/events?state=invalid&limit=2&after={next}"),
    )
    .await;
    assert_eq!(second["events"][0]["id"], "evt_1PkInvalid001");
    assert_eq!(second["next"], Value::Null);

    let one = admin_get(&inbox, "/events/stripe/evt_1PkInvalid001").await;
    assert_eq!(one["state"], "invalid");
    assert_eq!(
        one["validation_errors"][0]["path"],
        "/data/object/amount_paid"
    );
    let errors = one["validation_errors"].to_string();
    assert!(
        !errors.contains("20.00"),
        "no payload value in the errors: {errors}"
    );

    let (status, _) = admin_post(&inbox, "/requeue", r#"{"invalid": true, "dead": true}"#).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "invalid stands alone");
    let fixed = plain.with_schemas(fixed_schemas());
    let (status, done) = admin_post(&fixed, "/requeue", r#"{"invalid": true}"#).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(done, json!({"requeued": 1, "still_invalid": 2}));
    let counts = admin_get(&fixed, "/counts").await;
    assert_eq!(
        (counts["invalid"].as_u64(), counts["queued"].as_u64()),
        (Some(2), Some(4))
    );
    let one = admin_get(&fixed, "/events/stripe/evt_1PkInvalid001").await;
    assert_eq!(
        (one["state"].as_str(), one["validation_errors"].clone()),
        (Some("queued"), json!([]))
    );
}

async fn admin_get(inbox: &Inbox, uri: &str) -> Value {
    let request = http::Request::get(uri).body(Body::empty()).unwrap();
    let response = admin::router(inbox.clone()).oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK, "{uri}");
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&bytes).unwrap()
}

async fn admin_post(inbox: &Inbox, uri: &str, body: &str) -> (StatusCode, Value) {
    let request = http::Request::post(uri)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_owned()))
        .unwrap();
    let response = admin::router(inbox.clone()).oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap())
}

#[tokio::test]
async fn sqlite_the_admin_counts_lists_shows_and_requeues_invalid_events() {
    let store = stores::sqlite().await;
    the_admin_counts_lists_shows_and_requeues_invalid_events(Inbox::sqlite(&store)).await;
}

#[tokio::test]
async fn postgres_the_admin_counts_lists_shows_and_requeues_invalid_events() {
    let store = stores::postgres().await;
    the_admin_counts_lists_shows_and_requeues_invalid_events(Inbox::postgres(&store)).await;
}

/// JetStream (a stream of its own): the invalid deliveries are answered 204 and kept in
/// `<stream>-invalid` with their errors, never in the stream, so the worker runs the valid
/// ones once and the invalid ones never; `counts` has them as `invalid`.
#[tokio::test]
async fn jetstream_keeps_invalid_events_apart_and_never_runs_them() {
    use tower_webhook::inbox::jetstream::{JetStream, JetStreamWorker};
    let url = common::nats_url();
    let name = format!("tw_test_{}", uuid::Uuid::new_v4().simple());
    let client = async_nats::connect(&url)
        .await
        .expect("NATS with JetStream");
    let jetstream = JetStream::builder(client.clone(), &name)
        .with_memory_storage()
        .with_schemas(schemas())
        .build()
        .await
        .unwrap();
    for (_, _, scheme, sign_id, fixture) in deliveries() {
        let status = deliver_to(
            jetstream.accept_service(),
            scheme,
            sign_id,
            &payload(fixture),
        )
        .await;
        assert_eq!(status, StatusCode::NO_CONTENT, "{fixture}");
    }
    let ran: Arc<Mutex<Vec<String>>> = Arc::default();
    let seen = ran.clone();
    let run = |jetstream: &JetStream| {
        let seen = seen.clone();
        JetStreamWorker::at_least_once(jetstream, move |event: Event, _: Attempt| {
            let seen = seen.clone();
            async move {
                seen.lock()
                    .unwrap()
                    .push(event.id().unwrap_or_default().to_owned());
                Ok::<_, std::io::Error>(())
            }
        })
        .spawn()
    };
    let worker = run(&jetstream);
    eventually("the valid ones processed", async || {
        jetstream.counts().await.is_ok_and(|c| c.processed == 3)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    worker.shutdown().await;
    let mut ids = ran_ids(&ran);
    ids.sort();
    let github = digest_of("github_push");
    let mut valid = vec![
        "evt_1PkValid0001".to_owned(),
        github,
        "msg_order_1".to_owned(),
    ];
    valid.sort();
    assert_eq!(ids, valid, "each valid one once, no invalid one");
    let counts = jetstream.counts().await.unwrap();
    assert_eq!(
        (counts.invalid, counts.dead, counts.queued),
        (3, 0, 0),
        "{counts:?}"
    );

    // Kept in the invalid stream, each with its errors' JSON pointers.
    let js = async_nats::jetstream::new(client);
    let mut invalid = js.get_stream(jetstream.invalid_stream()).await.unwrap();
    let last = invalid.info().await.unwrap().state.last_sequence;
    let mut paths = Vec::new();
    for seq in 1..=last {
        let message = invalid.get_raw_message(seq).await.unwrap();
        let errors = message.headers.get("Webhook-Validation-Errors").unwrap();
        let errors: Value = serde_json::from_str(errors.as_str()).unwrap();
        paths.push(errors[0]["path"].as_str().unwrap().to_owned());
        assert!(
            !errors.to_string().contains("20.00"),
            "no payload value: {errors}"
        );
    }
    paths.sort();
    assert_eq!(
        paths,
        [
            "/commits/1",
            "/data/line_items/1/quantity",
            "/data/object/amount_paid"
        ]
    );

    // Stripe's schema fixed: a requeue publishes that one to the stream, where it runs
    // once; the other two stay in the invalid stream.
    let client = async_nats::connect(&url).await.unwrap();
    let fixed = JetStream::builder(client, &name)
        .with_memory_storage()
        .with_schemas(fixed_schemas())
        .build()
        .await
        .unwrap();
    let done = fixed.requeue_invalid().await.unwrap();
    assert_eq!((done.queued, done.still_invalid), (1, 2), "{done:?}");
    let worker = run(&fixed);
    eventually("the fixed one processed", async || {
        fixed.counts().await.is_ok_and(|c| c.processed == 4)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    worker.shutdown().await;
    let stripe_runs = ran_ids(&ran)
        .iter()
        .filter(|id| *id == "evt_1PkInvalid001")
        .count();
    assert_eq!(stripe_runs, 1, "run once");
    assert_eq!(ran_ids(&ran).len(), 4, "nothing else ran");
    assert_eq!(fixed.counts().await.unwrap().invalid, 2);
    let again = fixed.requeue_invalid().await.unwrap();
    assert_eq!((again.queued, again.still_invalid), (0, 2));
    fixed.delete().await.unwrap();
}

fn ran_ids(ran: &Mutex<Vec<String>>) -> Vec<String> {
    ran.lock().unwrap().clone()
}

/// JetStream's operator endpoints over its invalid stream, as the SQL inbox's:
/// `GET /events?state=invalid` lists the invalid messages a page at a time (oldest
/// first), each row `invalid` with its `validation_errors` and never a payload value;
/// `POST /requeue {"invalid": true}` checks them again against the schemas the stream
/// has now (alone); another state or requeue is a 400. `list_invalid` pages the same.
#[tokio::test]
async fn jetstream_the_admin_lists_and_requeues_invalid_events() {
    use tower_webhook::inbox::jetstream::JetStream;
    let url = common::nats_url();
    let name = format!("tw_test_{}", uuid::Uuid::new_v4().simple());
    let connect = async || {
        async_nats::connect(&url)
            .await
            .expect("NATS with JetStream")
    };
    let jetstream = JetStream::builder(connect().await, &name)
        .with_memory_storage()
        .with_schemas(schemas())
        .build()
        .await
        .unwrap();
    let empty = jetstream_get(&jetstream, "/events?state=invalid").await;
    assert_eq!(empty, json!({"events": [], "next": null}));
    for (_, _, scheme, sign_id, fixture) in deliveries() {
        let status = deliver_to(
            jetstream.accept_service(),
            scheme,
            sign_id,
            &payload(fixture),
        )
        .await;
        assert_eq!(status, StatusCode::NO_CONTENT, "{fixture}");
    }
    let counts = jetstream_get(&jetstream, "/counts").await;
    assert_eq!(counts["invalid"], 3, "{counts}");

    // Oldest first: in the order they were delivered.
    let first = jetstream_get(&jetstream, "/events?state=invalid&limit=2").await;
    let rows = first["events"].as_array().unwrap();
    let ids: Vec<&str> = rows.iter().map(|r| r["id"].as_str().unwrap()).collect();
    assert_eq!(
        ids,
        [
            "evt_1PkInvalid001",
            digest_of("github_push_no_commit_id").as_str()
        ]
    );
    let row = &rows[0];
    assert_eq!(
        (
            &row["source"],
            &row["type"],
            &row["state"],
            &row["attempts"]
        ),
        (
            &json!("stripe"),
            &json!("invoice.paid"),
            &json!("invalid"),
            &json!(0)
        ),
        "{row}"
    );
    assert!(
        row["received_at"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z')),
        "{row}"
    );
    assert_eq!(
        row["validation_errors"][0]["path"],
        "/data/object/amount_paid"
    );
    assert!(row["validation_errors"][0]["message"]
        .as_str()
        .is_some_and(|m| !m.is_empty()));
    let listed = first.to_string();
    assert!(!listed.contains("20.00"), "no payload value: {listed}");
    let next = first["next"].as_str().expect("a next page");
    let second = jetstream_get(
        &jetstream,
        &format!("/events?state=invalid&limit=2&after={next}"),
    )
    .await;
    assert_eq!(second["events"].as_array().unwrap().len(), 1, "{second}");
    assert_eq!(second["events"][0]["id"], "msg_order_2");
    assert_eq!(
        second["events"][0]["validation_errors"][0]["path"],
        "/data/line_items/1/quantity"
    );
    assert_eq!(second["next"], Value::Null);

    // The library's listing, the same pages.
    let page = jetstream.list_invalid(None, 2).await.unwrap();
    assert_eq!(page.messages.len(), 2);
    let rest = jetstream.list_invalid(page.next, 2).await.unwrap();
    let ids: Vec<&str> = rest.messages.iter().map(|m| m.id.as_str()).collect();
    assert_eq!((ids, rest.next), (vec!["msg_order_2"], None));
    let errors = &rest.messages[0].validation_errors;
    assert_eq!(errors[0].path(), "/data/line_items/1/quantity");

    for bad in [
        "/events?state=dead",
        "/events",
        "/events?state=invalid&limit=0",
        "/events?state=invalid&after=x",
        "/events?state=invalid&order=oldest",
    ] {
        let (status, _) = jetstream_ask(&jetstream, http::Method::GET, bad, "").await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}");
    }
    for bad in [r#"{"dead": true}"#, r#"{"invalid": false}"#, "{}"] {
        let (status, _) = jetstream_ask(&jetstream, http::Method::POST, "/requeue", bad).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}");
    }

    // Stripe's schema fixed: that one goes to the stream, the other two stay listed.
    let fixed = JetStream::builder(connect().await, &name)
        .with_memory_storage()
        .with_schemas(fixed_schemas())
        .build()
        .await
        .unwrap();
    let body = r#"{"invalid": true}"#;
    let (status, done) = jetstream_ask(&fixed, http::Method::POST, "/requeue", body).await;
    assert_eq!(status, StatusCode::OK, "{done}");
    assert_eq!(done, json!({"requeued": 1, "still_invalid": 2}));
    let listed = jetstream_get(&fixed, "/events?state=invalid").await;
    let ids: Vec<&str> = listed["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    let github = digest_of("github_push_no_commit_id");
    assert_eq!(ids, [github.as_str(), "msg_order_2"], "{listed}");
    let counts = jetstream_get(&fixed, "/counts").await;
    assert_eq!(
        (&counts["invalid"], &counts["queued"]),
        (&json!(2), &json!(4))
    );
    fixed.delete().await.unwrap();
}

async fn jetstream_get(jetstream: &tower_webhook::inbox::jetstream::JetStream, uri: &str) -> Value {
    let (status, json) = jetstream_ask(jetstream, http::Method::GET, uri, "").await;
    assert_eq!(status, StatusCode::OK, "{uri}: {json}");
    json
}

async fn jetstream_ask(
    jetstream: &tower_webhook::inbox::jetstream::JetStream,
    method: http::Method,
    uri: &str,
    body: &str,
) -> (StatusCode, Value) {
    let request = http::Request::builder()
        .method(method)
        .uri(uri)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_owned()))
        .unwrap();
    let router = admin::jetstream_router(jetstream.clone());
    let response = router.oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

/// Alerts that record what they raise, each at once (a 1 ms interval).
fn recorded_alerts() -> (
    tower_webhook::alerts::Alerts,
    Arc<Mutex<Vec<tower_webhook::alerts::Alert>>>,
) {
    let raised: Arc<Mutex<Vec<_>>> = Arc::default();
    let sink = raised.clone();
    let alerts = tower_webhook::alerts::Alerts::new(move |alert| {
        sink.lock().unwrap().push(alert);
        std::future::ready(())
    })
    .with_interval(Duration::from_millis(1))
    .unwrap();
    (alerts, raised)
}

/// Each new invalid event raises one `Invalid` alert naming it and its errors' paths,
/// never a value of its body; a valid event and a duplicate of an invalid one raise none.
async fn alerted(
    deliver: impl AsyncFn(Scheme, &str, &str) -> StatusCode,
    raised: &Mutex<Vec<tower_webhook::alerts::Alert>>,
) {
    use tower_webhook::alerts::AlertKind;
    for (_, _, scheme, sign_id, fixture) in deliveries() {
        let status = deliver(scheme, sign_id, &payload(fixture)).await;
        assert_eq!(status, StatusCode::NO_CONTENT, "{fixture}");
    }
    let invalid = |a: &tower_webhook::alerts::Alert| {
        (
            a.source().unwrap().to_owned(),
            a.event_id().unwrap().to_owned(),
        )
    };
    eventually("three alerts", async || raised.lock().unwrap().len() >= 3).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut alerts = raised.lock().unwrap().clone();
    assert!(alerts.iter().all(|a| a.kind() == AlertKind::Invalid));
    alerts.sort_by_key(invalid);
    let github = digest_of("github_push_no_commit_id");
    assert_eq!(
        alerts.iter().map(invalid).collect::<Vec<_>>(),
        [
            ("github".to_owned(), github),
            ("standard".to_owned(), "msg_order_2".to_owned()),
            ("stripe".to_owned(), "evt_1PkInvalid001".to_owned()),
        ]
    );
    let stripe = &alerts[2];
    assert_eq!(stripe.event_type(), Some("invoice.paid"));
    let details = stripe.details().unwrap();
    assert!(details.contains("/data/object"), "{details}");
    // The fixture's values never appear: only paths and messages.
    assert!(!details.contains("20.00"), "{details}");
    tokio::time::sleep(Duration::from_millis(5)).await; // past the interval
    let (_, _, scheme, sign_id, fixture) = deliveries().swap_remove(1);
    assert_eq!(
        deliver(scheme, sign_id, &payload(fixture)).await,
        StatusCode::NO_CONTENT
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        raised.lock().unwrap().len(),
        3,
        "a duplicate raises nothing"
    );
}

#[tokio::test]
async fn sqlite_each_new_invalid_event_raises_one_alert() {
    let (alerts, raised) = recorded_alerts();
    let store = stores::sqlite().await;
    let inbox = Inbox::sqlite(&store)
        .with_schemas(schemas())
        .with_alerts(alerts);
    alerted(async |s, id, p| deliver(&inbox, s, id, p).await, &raised).await;
}

#[tokio::test]
async fn postgres_each_new_invalid_event_raises_one_alert() {
    let (alerts, raised) = recorded_alerts();
    let store = stores::postgres().await;
    let inbox = Inbox::postgres(&store)
        .with_schemas(schemas())
        .with_alerts(alerts);
    alerted(async |s, id, p| deliver(&inbox, s, id, p).await, &raised).await;
}

#[tokio::test]
async fn jetstream_each_new_invalid_event_raises_one_alert() {
    use tower_webhook::inbox::jetstream::JetStream;
    let (alerts, raised) = recorded_alerts();
    let name = format!("tw_test_{}", uuid::Uuid::new_v4().simple());
    let client = async_nats::connect(&common::nats_url())
        .await
        .expect("NATS");
    let jetstream = JetStream::builder(client, &name)
        .with_memory_storage()
        .with_schemas(schemas())
        .with_alerts(alerts)
        .build()
        .await
        .unwrap();
    alerted(
        async |s, id, p| deliver_to(jetstream.accept_service(), s, id, p).await,
        &raised,
    )
    .await;
    jetstream.delete().await.unwrap();
}
