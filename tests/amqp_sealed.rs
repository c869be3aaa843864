//! Sealed payloads and schemas on RabbitMQ, against a real broker (127.0.0.1:5672, or
//! `AMQP_URL`), as JetStream's (`tests/jetstream_sealed.rs`, `tests/schemas.rs`): with a
//! key ring the queue's messages hold no body in clear — read raw by a channel of the
//! test's own, and, where this process can read the broker's data folder, in its files —
//! while the worker runs the plaintext event; a processor's error on a dead message is
//! sealed; a message no key opens is buried at once with the reason, never run; an event
//! its schema refuses is kept in `<queue>-invalid` with its errors, never run. Each test
//! has an exchange and queues of its own, deleted when it ends well.

mod common;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::amqp::raw_channel;
use common::{amqp_url, eventually, signed_event};
use lapin::options::{BasicGetOptions, BasicNackOptions};
use lapin::types::AMQPValue;
use serde_json::json;
use tower_webhook::inbox::amqp::{Amqp, AmqpWorker};
use tower_webhook::inbox::{Attempt, Processor};
use tower_webhook::schemas::Schemas;
use tower_webhook::seal::{Key, KeyRing};
use tower_webhook::store::MemoryStore;
use tower_webhook::Event;

/// A ring of one key `id`, filled with `byte`.
fn ring(id: &str, byte: u8) -> KeyRing {
    KeyRing::new([Key::new(id, [byte; 32]).unwrap()]).unwrap()
}

/// A random value that appears in one body, and nowhere else.
fn canary() -> String {
    format!("canary-{}", uuid::Uuid::new_v4().simple())
}

/// A verified `payment_intent.succeeded` whose body holds `canary` (and an amount unless
/// `amount` is `None`).
fn event(id: &str, canary: &str, amount: Option<u64>) -> Event {
    let mut object = json!({"id": format!("pi_{id}"), "email": format!("{canary}@example.com")});
    if let Some(amount) = amount {
        object["amount"] = json!(amount);
    }
    let body = json!({"type": "payment_intent.succeeded", "data": {"object": object}});
    signed_event(id, body.to_string())
}

/// The test's exchange and queue, named `name`, sealing under `keys` (none: in clear).
async fn amqp(name: &str, keys: Option<KeyRing>, schemas: Option<Schemas>) -> Amqp {
    let mut builder = Amqp::builder(&amqp_url())
        .with_exchange(name)
        .unwrap()
        .with_queue(name)
        .unwrap();
    if let Some(keys) = keys {
        builder = builder.with_keys(keys);
    }
    if let Some(schemas) = schemas {
        builder = builder.with_schemas(schemas);
    }
    builder.build().await.unwrap()
}

/// A message of `queue` as the broker holds it (body and headers), read by the test's own
/// channel and handed back.
async fn peek(queue: &str) -> (Vec<u8>, Vec<(String, String)>) {
    let channel = raw_channel().await;
    let got = channel
        .basic_get(queue.into(), BasicGetOptions::default())
        .await
        .unwrap()
        .expect("a message");
    let headers = got
        .delivery
        .properties
        .headers()
        .clone()
        .unwrap_or_default();
    let headers = headers
        .inner()
        .iter()
        .filter_map(|(name, value)| match value {
            AMQPValue::LongString(s) => Some((
                name.to_string(),
                String::from_utf8_lossy(s.as_bytes()).into_owned(),
            )),
            _ => None,
        })
        .collect();
    let body = got.delivery.data.clone();
    let back = BasicNackOptions {
        requeue: true,
        ..Default::default()
    };
    got.delivery.nack(back).await.unwrap();
    (body, headers)
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    let found = headers.iter().find(|(n, _)| n == name);
    found.map(|(_, v)| v.as_str())
}

fn holds(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

/// Whether any file under the broker's data folder holds `needle`; `None` when this process
/// cannot read the folder (`RABBITMQ_MNESIA_BASE`, else `/var/lib/rabbitmq/mnesia`).
fn on_disk(needle: &str) -> Option<bool> {
    let base = std::env::var("RABBITMQ_MNESIA_BASE")
        .unwrap_or_else(|_| "/var/lib/rabbitmq/mnesia".to_owned());
    fn walk(dir: &Path, needle: &str) -> std::io::Result<bool> {
        for entry in std::fs::read_dir(dir)? {
            let path = entry?.path();
            if path.is_dir() {
                if walk(&path, needle)? {
                    return Ok(true);
                }
            } else if let Ok(bytes) = std::fs::read(&path) {
                if holds(&bytes, needle) {
                    return Ok(true);
                }
            }
        }
        Ok(false)
    }
    walk(Path::new(&base), needle).ok()
}

/// The bodies a processor saw, by event id.
type Bodies = Arc<Mutex<Vec<(String, Vec<u8>)>>>;

/// Records each body; fails the event `fail` with an error quoting its body.
fn recording(bodies: Bodies, fail: &'static str) -> impl Processor {
    move |e: Event, _: Attempt| {
        let bodies = bodies.clone();
        async move {
            let id = e.id().unwrap().to_owned();
            bodies.lock().unwrap().push((id.clone(), e.body().to_vec()));
            match id == fail {
                true => Err(format!("refused {}", String::from_utf8_lossy(e.body()))),
                false => Ok(()),
            }
        }
    }
}

#[tokio::test]
async fn sealed_payloads_hold_no_plaintext_on_the_broker_and_the_worker_runs_the_plaintext() {
    let (name, plain_name) = (common::amqp::name(), common::amqp::name());
    let sealed = amqp(&name, Some(ring("k1", 1)), None).await;
    let plain = amqp(&plain_name, None, None).await;
    let (secret, clear, failing) = (canary(), canary(), canary());
    sealed
        .accept(&event("evt_sealed", &secret, Some(1)))
        .await
        .unwrap();
    sealed
        .accept(&event("evt_fails", &failing, Some(2)))
        .await
        .unwrap();
    // The same read of a message published in clear finds its body: the test sees plaintext.
    plain
        .accept(&event("evt_clear", &clear, Some(3)))
        .await
        .unwrap();
    let (body, _) = peek(plain.queue()).await;
    assert!(holds(&body, &clear), "a body in clear is seen raw");
    let (body, headers) = peek(sealed.queue()).await;
    assert!(
        !holds(&body, &secret) && !holds(&body, &failing),
        "no plaintext body"
    );
    assert_eq!(header(&headers, "Webhook-Key-Id"), Some("k1"));
    assert!(header(&headers, "Webhook-Nonce").is_some());
    assert_eq!(
        header(&headers, "Webhook-Source"),
        Some("standard"),
        "headers in clear"
    );
    match (on_disk(&clear), on_disk(&secret)) {
        (Some(found_clear), Some(found_sealed)) => {
            assert!(
                found_clear,
                "the broker's files hold the body published in clear"
            );
            assert!(
                !found_sealed,
                "the broker's files hold no sealed body in clear"
            );
        }
        _ => eprintln!("the broker's data folder is not readable here: its files not scanned"),
    }

    let bodies: Bodies = Arc::default();
    let processor = recording(bodies.clone(), "evt_fails");
    // Two attempts: the peek above counted a delivery of the first message.
    let worker = AmqpWorker::new(&sealed, MemoryStore::new(), processor)
        .with_max_attempts(2)
        .unwrap()
        .with_backoff(Duration::from_millis(100), Duration::from_millis(200))
        .unwrap()
        .spawn();
    eventually("processed and buried", async || {
        let c = sealed.counts().await.unwrap();
        bodies.lock().unwrap().len() == 3 && (c.queued, c.processing, c.dead) == (0, 0, 1)
    })
    .await;
    worker.shutdown().await;
    let seen = bodies.lock().unwrap().clone();
    let of = |id: &str| seen.iter().find(|(i, _)| i == id).unwrap().1.clone();
    assert!(
        holds(&of("evt_sealed"), &secret),
        "the processor got the plaintext"
    );
    assert!(holds(&of("evt_fails"), &failing));
    // The processor's error quoted the body: sealed in the dead message, as its payload.
    let (body, headers) = peek(sealed.dead_queue()).await;
    let error = header(&headers, "Webhook-Error").unwrap();
    assert!(
        error.starts_with("sealed:v1:k1:"),
        "the error sealed: {error}"
    );
    assert!(!error.contains(&failing) && !holds(&body, &failing));
    sealed.delete().await.unwrap();
    plain.delete().await.unwrap();
}

#[tokio::test]
async fn a_message_no_key_opens_is_buried_at_once_with_the_reason_and_never_run() {
    let name = common::amqp::name();
    let old = amqp(&name, Some(ring("k-old", 1)), None).await;
    let secret = canary();
    old.accept(&event("evt_lost_key", &secret, Some(1)))
        .await
        .unwrap();
    let (published, _) = peek(old.queue()).await;
    // Another key only: the old one was removed from the ring.
    let new = amqp(&name, Some(ring("k-new", 2)), None).await;
    let bodies: Bodies = Arc::default();
    let worker = AmqpWorker::new(&new, MemoryStore::new(), recording(bodies.clone(), "")).spawn();
    eventually("buried", async || new.counts().await.unwrap().dead == 1).await;
    worker.shutdown().await;
    assert!(
        bodies.lock().unwrap().is_empty(),
        "never given to the processor"
    );
    let counts = new.counts().await.unwrap();
    assert_eq!((counts.queued, counts.processing), (0, 0), "never retried");
    let (body, headers) = peek(new.dead_queue()).await;
    let error = header(&headers, "Webhook-Error").unwrap();
    assert!(
        error.contains("cannot be opened") && error.contains("k-old"),
        "the reason, in clear: {error}"
    );
    assert_eq!(
        body, published,
        "its payload as it was, to open once the key is back"
    );
    assert_eq!(header(&headers, "Webhook-Key-Id"), Some("k-old"));
    new.delete().await.unwrap();
}

#[tokio::test]
async fn an_event_its_schema_refuses_is_kept_in_the_invalid_queue_and_never_run() {
    let schema = json!({
        "type": "object",
        "required": ["data"],
        "properties": {"data": {"properties": {"object": {"required": ["amount"]}}}}
    });
    let schemas = Schemas::new()
        .with_schema("payment_intent.succeeded", &schema)
        .unwrap();
    let name = common::amqp::name();
    let amqp = amqp(&name, None, Some(schemas)).await;
    assert_eq!(amqp.invalid_queue(), format!("{name}-invalid"));
    amqp.accept(&event("evt_valid", &canary(), Some(5)))
        .await
        .unwrap();
    amqp.accept(&event("evt_invalid", &canary(), None))
        .await
        .unwrap();
    let counts = amqp.counts().await.unwrap();
    assert_eq!(
        (counts.queued, counts.invalid),
        (1, 1),
        "the invalid one kept apart"
    );
    let (_, headers) = peek(amqp.invalid_queue()).await;
    assert_eq!(header(&headers, "Webhook-Id"), Some("evt_invalid"));
    let errors = header(&headers, "Webhook-Validation-Errors").unwrap();
    assert!(errors.contains("amount"), "its errors: {errors}");
    let bodies: Bodies = Arc::default();
    let worker = AmqpWorker::new(&amqp, MemoryStore::new(), recording(bodies.clone(), "")).spawn();
    eventually("the valid one processed", async || {
        bodies.lock().unwrap().len() == 1 && amqp.counts().await.unwrap().queued == 0
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    worker.shutdown().await;
    let ran: Vec<String> = bodies
        .lock()
        .unwrap()
        .iter()
        .map(|(i, _)| i.clone())
        .collect();
    assert_eq!(ran, ["evt_valid"], "the invalid one never ran");
    let counts = amqp.counts().await.unwrap();
    assert_eq!((counts.queued, counts.dead, counts.invalid), (0, 0, 1));
    amqp.delete().await.unwrap();
}

/// `list_invalid` reads `<queue>-invalid` without removing anything; `requeue_invalid`,
/// on an `Amqp` whose schemas changed, publishes the events that pass now back to the
/// exchange — sealed as they were, without their errors — and removes them, and keeps the
/// rest; the worker then runs the requeued ones once.
#[tokio::test]
async fn invalid_events_are_listed_with_their_errors_and_requeued_once_they_pass() {
    let amount =
        json!({"properties": {"data": {"properties": {"object": {"required": ["amount"]}}}}});
    let only_a_and_b = json!({"properties": {"data": {"properties": {"object": {
        "properties": {"id": {"pattern": "^pi_evt_(a|b)$"}}
    }}}}});
    let schemas = |schema: &serde_json::Value| {
        Schemas::new()
            .with_schema("payment_intent.succeeded", schema)
            .unwrap()
    };
    let name = common::amqp::name();
    let before = amqp(&name, Some(ring("k1", 7)), Some(schemas(&amount))).await;
    let canaries: Vec<(&str, String)> = ["evt_a", "evt_b", "evt_c"]
        .into_iter()
        .map(|id| (id, canary()))
        .collect();
    for (id, canary) in &canaries {
        before.accept(&event(id, canary, None)).await.unwrap();
    }
    let listed = before.list_invalid(10).await.unwrap();
    let mut ids: Vec<&str> = listed.iter().map(|m| m.id.as_str()).collect();
    ids.sort();
    assert_eq!(ids, ["evt_a", "evt_b", "evt_c"]);
    for message in &listed {
        assert_eq!(
            message.event_type.as_deref(),
            Some("payment_intent.succeeded")
        );
        assert!(
            message
                .validation_errors
                .iter()
                .any(|e| e.message().contains("amount")),
            "its errors: {:?}",
            message.validation_errors
        );
    }
    assert_eq!(before.list_invalid(2).await.unwrap().len(), 2, "a limit");
    assert_eq!(
        before.counts().await.unwrap().invalid,
        3,
        "listing removes nothing"
    );

    // The schema changed: a and b pass now, c does not.
    let after = amqp(&name, Some(ring("k1", 7)), Some(schemas(&only_a_and_b))).await;
    let done = after.requeue_invalid().await.unwrap();
    assert_eq!((done.queued, done.still_invalid), (2, 1));
    let counts = after.counts().await.unwrap();
    assert_eq!((counts.queued, counts.invalid), (2, 1));
    let (body, headers) = peek(after.queue()).await;
    assert_eq!(header(&headers, "Webhook-Validation-Errors"), None);
    assert!(header(&headers, "Webhook-Key-Id").is_some(), "still sealed");
    assert!(
        canaries.iter().all(|(_, c)| !holds(&body, c)),
        "no plaintext"
    );
    let left = after.list_invalid(10).await.unwrap();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].id, "evt_c");
    assert!(left[0]
        .validation_errors
        .iter()
        .any(|e| e.message().contains("amount")));
    let again = after.requeue_invalid().await.unwrap();
    assert_eq!((again.queued, again.still_invalid), (0, 1), "c stays");

    let bodies: Bodies = Arc::default();
    let worker = AmqpWorker::new(&after, MemoryStore::new(), recording(bodies.clone(), "")).spawn();
    eventually("the requeued ones processed", async || {
        bodies.lock().unwrap().len() == 2 && after.counts().await.unwrap().queued == 0
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    worker.shutdown().await;
    let mut ran: Vec<String> = bodies
        .lock()
        .unwrap()
        .iter()
        .map(|(i, _)| i.clone())
        .collect();
    ran.sort();
    assert_eq!(ran, ["evt_a", "evt_b"], "each requeued one once, c never");
    for (id, body) in bodies.lock().unwrap().iter() {
        let canary = &canaries.iter().find(|(i, _)| i == id).unwrap().1;
        assert!(holds(body, canary), "{id} ran in plaintext");
    }
    let counts = after.counts().await.unwrap();
    assert_eq!((counts.queued, counts.dead, counts.invalid), (0, 0, 1));
    after.delete().await.unwrap();
}

/// Without schemas there is no invalid queue: an empty list, nothing requeued.
#[tokio::test]
async fn without_schemas_nothing_is_invalid_to_list_or_requeue() {
    let amqp = amqp(&common::amqp::name(), None, None).await;
    assert!(amqp.list_invalid(10).await.unwrap().is_empty());
    let done = amqp.requeue_invalid().await.unwrap();
    assert_eq!((done.queued, done.still_invalid), (0, 0));
    amqp.delete().await.unwrap();
}
