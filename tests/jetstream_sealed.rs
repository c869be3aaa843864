//! Sealed payloads on JetStream (issue 34, `docs/design/payload-protection.md` §6) against
//! a real NATS server with JetStream (127.0.0.1:4222, or `NATS_URL`): with a key ring the
//! stream's messages — and the dead and parked streams' — hold no body in clear, read raw
//! by a consumer of the test's own (without keys the same read finds it: the test sees
//! plaintext), and every processor still gets the plaintext event; a message sealed under
//! an old key opens while that key is in the ring; one no key opens is buried at once,
//! never run, its payload untouched, and opens in the dead stream once its key is back.
//! Each test has streams of its own, deleted at its end.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::consumer::{pull, AckPolicy, DeliverPolicy, PullConsumer};
use async_nats::HeaderMap;
use base64::Engine as _;
use bytes::Bytes;
use common::{at, verifier, NOW};
use futures_util::StreamExt;
use tower_webhook::inbox::jetstream::{JetStream, JetStreamWorker};
use tower_webhook::inbox::{Accepted, Attempt, Processor, ProcessorSpec};
use tower_webhook::seal::{Aad, Column, Key, KeyRing};
use tower_webhook::store::MemoryStore;
use tower_webhook::{Event, Scheme};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const KEY_ID: &str = "Webhook-Key-Id";
const NONCE: &str = "Webhook-Nonce";

async fn client() -> async_nats::Client {
    async_nats::connect(common::nats_url())
        .await
        .expect("NATS with JetStream must be running (.ci/services starts it)")
}

/// A ring of keys `(id, fill byte)`, the first current.
fn ring(keys: &[(&str, u8)]) -> KeyRing {
    KeyRing::new(keys.iter().map(|&(id, b)| Key::new(id, [b; 32]).unwrap())).unwrap()
}

/// A random value that appears in each body, and nowhere else.
fn canary() -> String {
    format!("canary-{}", uuid::Uuid::new_v4().simple())
}

/// A verified event of `event_type` whose body holds `canary`.
/// An event whose body holds `canary` and repeats itself (order lines), as JSON does: the
/// crate compresses it before sealing.
fn event(id: &str, event_type: &str, canary: &str) -> Event {
    let lines = [r#"{"sku":"tea","qty":1}"#; 20].join(",");
    let body = format!(
        r#"{{"type":"{event_type}","data":{{"object":{{"id":"obj_{id}","email":"{canary}@example.com","lines":[{lines}]}}}}}}"#
    );
    let headers = Scheme::standard()
        .sign([SECRET], id, at(NOW), body.as_bytes())
        .unwrap();
    verifier(Scheme::standard(), &[SECRET])
        .verify(&headers, body.into())
        .unwrap()
}

fn paid(id: &str, canary: &str) -> Event {
    event(id, "payment_intent.succeeded", canary)
}

/// The test's stream name. Each test ends with [`JetStream::delete`] (the stream and
/// everything beside it); whatever a failed test left is deleted when this is dropped.
struct Streams {
    name: String,
}

impl Drop for Streams {
    fn drop(&mut self) {
        let name = self.name.clone();
        // A runtime of its own: the test's may be gone or blocked in a panic.
        let swept = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let js = async_nats::jetstream::new(client().await);
                let names = js.stream_names().filter_map(|n| async { n.ok() });
                let names: Vec<String> = names.collect().await;
                for left in names.into_iter().filter(|n| n.contains(&name)) {
                    let _ = js.delete_stream(left).await;
                }
            });
        });
        let _ = swept.join();
    }
}

impl Streams {
    fn new() -> Self {
        Self {
            name: format!("tw_test_sealed_{}", uuid::Uuid::new_v4().simple()),
        }
    }

    /// The stream, sealing under `keys` (none: in clear), fanned out to `processors`.
    async fn jetstream(
        &self,
        keys: Option<KeyRing>,
        processors: Option<Vec<ProcessorSpec>>,
    ) -> JetStream {
        let mut builder = JetStream::builder(client().await, &self.name).with_memory_storage();
        if let Some(keys) = keys {
            builder = builder.with_keys(keys);
        }
        if let Some(processors) = processors {
            builder = builder.with_processors(processors).unwrap();
        }
        builder.build().await.unwrap()
    }

    /// Every message of the stream `name`, as stored: read by a consumer of the test's own
    /// (not the crate's), unacknowledged and without opening anything.
    async fn raw(&self, name: &str) -> Vec<(HeaderMap, Bytes)> {
        let js = async_nats::jetstream::new(client().await);
        let mut stream = js.get_stream(name).await.unwrap();
        let n = stream.info().await.unwrap().state.messages as usize;
        let consumer: PullConsumer = stream
            .create_consumer(pull::Config {
                deliver_policy: DeliverPolicy::All,
                ack_policy: AckPolicy::None,
                inactive_threshold: Duration::from_secs(30),
                ..Default::default()
            })
            .await
            .unwrap();
        let mut out = Vec::new();
        while out.len() < n {
            let mut batch = consumer
                .fetch()
                .max_messages(n - out.len())
                .expires(Duration::from_secs(1))
                .messages()
                .await
                .unwrap();
            while let Some(message) = batch.next().await {
                let message = message.unwrap();
                out.push((
                    message.headers.clone().unwrap_or_default(),
                    message.payload.clone(),
                ));
            }
        }
        out
    }

    /// The raw message of event `id` in the stream `name`.
    async fn raw_of(&self, name: &str, id: &str) -> (HeaderMap, Bytes) {
        let all = self.raw(name).await;
        let found = all
            .into_iter()
            .find(|(h, _)| header(h, "Webhook-Id") == Some(id));
        found.unwrap_or_else(|| panic!("{id} is not in {name}"))
    }

    async fn size(&self, name: &str) -> u64 {
        let js = async_nats::jetstream::new(client().await);
        let mut stream = js.get_stream(name).await.unwrap();
        stream.info().await.unwrap().state.messages
    }
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).map(|v| v.as_str())
}

fn holds(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

/// Whether `canary` appears in a message: its payload or any header's name or value.
fn shows(message: &(HeaderMap, Bytes), canary: &str) -> bool {
    let (headers, payload) = message;
    holds(payload, canary)
        || headers.iter().any(|(name, values)| {
            holds(AsRef::<[u8]>::as_ref(name), canary)
                || values.iter().any(|v| holds(v.as_str().as_bytes(), canary))
        })
}

/// Opens a raw message as a reader outside the crate would, with `keys`: the associated
/// data is the event's source, its id and the column `message` — no stream in it.
fn open(keys: &KeyRing, (headers, payload): &(HeaderMap, Bytes)) -> Vec<u8> {
    let source = header(headers, "Webhook-Source").unwrap();
    let id = header(headers, "Webhook-Id").unwrap();
    let key_id = header(headers, KEY_ID).expect("sealed");
    let nonce = base64::engine::general_purpose::STANDARD
        .decode(header(headers, NONCE).expect("a nonce"))
        .unwrap();
    let aad = Aad::new(source, id, Column::Message);
    keys.open_parts(&aad, key_id, &nonce, payload).unwrap()
}

/// The bodies each processor got, by event id.
#[derive(Clone, Default)]
struct Bodies(Arc<Mutex<HashMap<String, Vec<Bytes>>>>);

impl Bodies {
    /// Records each event's body; fails those whose id starts with `fail`, quoting it.
    fn processor(&self) -> impl Processor {
        let seen = self.clone();
        move |e: Event, _: Attempt| {
            let seen = seen.clone();
            async move {
                let id = e.id().unwrap().to_owned();
                seen.0
                    .lock()
                    .unwrap()
                    .entry(id.clone())
                    .or_default()
                    .push(e.body().clone());
                // An error quoting the body, as serde's do.
                match id.starts_with("fail") {
                    true => Err(format!("declined: {}", String::from_utf8_lossy(e.body()))),
                    false => Ok(()),
                }
            }
        }
    }

    fn of(&self, id: &str) -> Vec<Bytes> {
        self.0.lock().unwrap().get(id).cloned().unwrap_or_default()
    }

    fn ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.0.lock().unwrap().keys().cloned().collect();
        ids.sort();
        ids
    }
}

fn worker(jetstream: &JetStream, bodies: &Bodies) -> JetStreamWorker {
    JetStreamWorker::new(jetstream, MemoryStore::new(), bodies.processor())
        .with_max_attempts(1)
        .unwrap()
        .with_poll_interval(Duration::from_millis(100))
        .unwrap()
}

async fn eventually(what: &str, mut check: impl AsyncFnMut() -> bool) {
    for _ in 0..750 {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for: {what}");
}

/// (processed, dead) of the stream's one processor; `None` before its worker made its
/// consumer.
async fn settled(jetstream: &JetStream) -> Option<(u64, u64)> {
    let c = jetstream.counts().await.ok()?;
    Some((c.processed, c.dead))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_keys_no_stream_holds_the_canary_and_the_processor_gets_the_plaintext() {
    let (canary, streams) = (canary(), Streams::new());
    let keys = ring(&[("k1", 1)]);
    let jetstream = streams.jetstream(Some(keys.clone()), None).await;
    let events = [
        paid("evt_1", &canary),
        paid("evt_2", &canary),
        paid("fail_3", &canary),
    ];
    for e in &events {
        assert_eq!(jetstream.accept(e).await.unwrap(), Accepted::New);
    }
    let stored = streams.raw(&streams.name).await;
    assert_eq!(stored.len(), events.len());
    for (message, event) in stored.iter().zip(&events) {
        assert!(!shows(message, &canary), "the canary in a stored message");
        let (headers, payload) = message;
        assert_eq!(header(headers, KEY_ID), Some("k1"));
        assert!(
            payload.len() < event.body().len() / 2,
            "compressed, then sealed: {} of {}",
            payload.len(),
            event.body().len()
        );
        assert_eq!(open(&keys, message), event.body().as_ref());
    }
    // A second publish of an id is still JetStream's duplicate: the id is in clear.
    assert_eq!(
        jetstream.accept(&events[0]).await.unwrap(),
        Accepted::Duplicate
    );

    let bodies = Bodies::default();
    let worker = worker(&jetstream, &bodies).spawn();
    eventually("two processed, one dead", async || {
        settled(&jetstream).await == Some((2, 1))
    })
    .await;
    worker.shutdown().await;
    for event in &events {
        let id = event.id().unwrap();
        assert_eq!(
            bodies.of(id),
            [event.body().clone()],
            "{id}: the plaintext, once"
        );
        assert!(holds(event.body(), &canary));
    }
    // The dead message is the sealed one, moved as it was.
    let dead = streams.raw(&jetstream.dead_stream()).await;
    assert_eq!(dead.len(), 1);
    assert!(!shows(&dead[0], &canary), "the canary in the dead stream");
    // So is the processor's error, which quoted the body.
    let error = header(&dead[0].0, "Webhook-Error").unwrap();
    let sealed = error
        .strip_prefix("sealed:v1:k1:")
        .expect("sealed under k1");
    let sealed = base64::engine::general_purpose::STANDARD
        .decode(sealed)
        .unwrap();
    let aad = Aad::new(
        "standard",
        "fail_3",
        Column::Error {
            processor: "default",
        },
    );
    let opened = keys
        .open_parts(&aad, "k1", &sealed[..24], &sealed[24..])
        .unwrap();
    let body = String::from_utf8_lossy(events[2].body());
    assert_eq!(
        String::from_utf8(opened).unwrap(),
        format!("declined: {body}")
    );
    assert_eq!(open(&keys, &dead[0]), events[2].body().as_ref());
    jetstream.delete().await.unwrap();
}

/// A panicking processor's message is buried with the crate's own text in clear, a ring
/// or not: it names no payload, and an operator reads it without any key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_is_buried_with_its_text_in_clear() {
    let streams = Streams::new();
    let jetstream = streams.jetstream(Some(ring(&[("k1", 1)])), None).await;
    jetstream.accept(&paid("evt_panic", "x")).await.unwrap();
    let worker = JetStreamWorker::new(
        &jetstream,
        MemoryStore::new(),
        |_: Event, _: Attempt| async move {
            if true {
                panic!("ada@example.com");
            }
            Ok::<(), std::convert::Infallible>(())
        },
    )
    .with_max_attempts(1)
    .unwrap()
    .with_poll_interval(Duration::from_millis(100))
    .unwrap()
    .spawn();
    eventually("dead", async || settled(&jetstream).await == Some((0, 1))).await;
    worker.shutdown().await;
    let (headers, _) = streams.raw_of(&jetstream.dead_stream(), "evt_panic").await;
    assert_eq!(
        header(&headers, "Webhook-Error"),
        Some("the processor panicked")
    );
    jetstream.delete().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_keys_the_stream_holds_the_canary_which_the_test_can_see() {
    let (canary, streams) = (canary(), Streams::new());
    let jetstream = streams.jetstream(None, None).await;
    let (event, failing) = (paid("evt_1", &canary), paid("fail_2", &canary));
    jetstream.accept(&event).await.unwrap();
    jetstream.accept(&failing).await.unwrap();
    let stored = streams.raw(&streams.name).await;
    assert_eq!(stored.len(), 2);
    assert!(shows(&stored[0], &canary), "the same read finds plaintext");
    assert_eq!(header(&stored[0].0, KEY_ID), None);
    assert_eq!(stored[0].1, event.body());
    let bodies = Bodies::default();
    let first = worker(&jetstream, &bodies).spawn();
    eventually("processed and dead", async || {
        settled(&jetstream).await == Some((1, 1))
    })
    .await;
    first.shutdown().await;
    assert_eq!(bodies.of("evt_1"), [event.body().clone()]);
    let (headers, payload) = streams.raw_of(&jetstream.dead_stream(), "fail_2").await;
    assert!(holds(&payload, &canary));
    let error = header(&headers, "Webhook-Error").unwrap();
    assert!(
        holds(error.as_bytes(), &canary),
        "the error in clear: {error}"
    );
    // A worker with keys reads a message published in clear as it is.
    let later = streams.jetstream(Some(ring(&[("k1", 1)])), None).await;
    let again = paid("evt_3", &canary);
    jetstream.accept(&again).await.unwrap(); // before `later`'s keys: in clear
    let worker = worker(&later, &bodies).spawn();
    eventually("processed", async || settled(&later).await == Some((2, 1))).await;
    worker.shutdown().await;
    assert_eq!(bodies.of("evt_3"), [again.body().clone()]);
    later.delete().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_sealed_under_an_old_key_opens_while_that_key_is_in_the_ring() {
    let (canary, streams) = (canary(), Streams::new());
    let before = streams.jetstream(Some(ring(&[("k1", 1)])), None).await;
    let old = paid("evt_old", &canary);
    before.accept(&old).await.unwrap();
    // Rotated: k2 seals, k1 still opens.
    let jetstream = streams
        .jetstream(Some(ring(&[("k2", 2), ("k1", 1)])), None)
        .await;
    let new = paid("evt_new", &canary);
    jetstream.accept(&new).await.unwrap();
    let key_of =
        async |id| header(&streams.raw_of(&streams.name, id).await.0, KEY_ID).map(str::to_owned);
    assert_eq!(key_of("evt_old").await.as_deref(), Some("k1"));
    assert_eq!(key_of("evt_new").await.as_deref(), Some("k2"));
    let bodies = Bodies::default();
    let worker = worker(&jetstream, &bodies).spawn();
    eventually("both processed", async || {
        settled(&jetstream).await == Some((2, 0))
    })
    .await;
    worker.shutdown().await;
    assert_eq!(bodies.of("evt_old"), [old.body().clone()]);
    assert_eq!(bodies.of("evt_new"), [new.body().clone()]);
    jetstream.delete().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_no_key_opens_is_buried_at_once_never_run_and_opens_in_the_dead_stream() {
    let (canary, streams) = (canary(), Streams::new());
    let k1 = ring(&[("k1", 1)]);
    let before = streams.jetstream(Some(k1.clone()), None).await;
    let lost = paid("evt_lost", &canary);
    before.accept(&lost).await.unwrap();
    // k1 removed before its messages were read.
    let jetstream = streams.jetstream(Some(ring(&[("k2", 2)])), None).await;
    let ok = paid("evt_ok", &canary);
    jetstream.accept(&ok).await.unwrap();
    // evt_ok's ciphertext published as another event's (its id changed): the associated
    // data names the event, so it does not open.
    let (mut headers, payload) = streams.raw_of(&streams.name, "evt_ok").await;
    headers.insert("Webhook-Id", "evt_moved");
    headers.insert("Nats-Msg-Id", "moved");
    let publisher = async_nats::jetstream::new(client().await);
    let subject = format!("{}.standard.payment_intent.succeeded", streams.name);
    let ack = publisher
        .publish_with_headers(subject, headers, payload)
        .await
        .unwrap();
    ack.await.unwrap();
    let stored_lost = streams.raw_of(&streams.name, "evt_lost").await;

    let bodies = Bodies::default();
    let worker = worker(&jetstream, &bodies).spawn();
    eventually("one processed, two dead", async || {
        settled(&jetstream).await == Some((1, 2))
    })
    .await;
    worker.shutdown().await;
    assert_eq!(bodies.ids(), ["evt_ok"], "neither unreadable message ran");
    assert_eq!(bodies.of("evt_ok"), [ok.body().clone()]);

    let dead = jetstream.dead_stream();
    let (headers, payload) = streams.raw_of(&dead, "evt_lost").await;
    assert_eq!(
        header(&headers, "Webhook-Error"),
        Some(r#"the body cannot be opened: sealed under key "k1", which no configured key has"#)
    );
    assert_eq!(header(&headers, "Webhook-Attempts"), Some("1"));
    assert_eq!(payload, stored_lost.1, "the payload as it was");
    assert_eq!(header(&headers, NONCE), header(&stored_lost.0, NONCE));
    assert!(!shows(&(headers.clone(), payload.clone()), &canary));
    // The key configured again opens the dead copy: nothing in it named the stream.
    assert_eq!(open(&k1, &(headers, payload)), lost.body().as_ref());

    let (headers, _) = streams.raw_of(&dead, "evt_moved").await;
    let error = header(&headers, "Webhook-Error").unwrap();
    assert!(
        error.starts_with(
            r#"the body cannot be opened: sealed under key "k2" but it does not open"#
        ),
        "{error}"
    );
    jetstream.delete().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sealed_message_without_keys_is_buried_not_run_as_ciphertext() {
    let (canary, streams) = (canary(), Streams::new());
    let sealing = streams.jetstream(Some(ring(&[("k1", 1)])), None).await;
    sealing.accept(&paid("evt_sealed", &canary)).await.unwrap();
    let jetstream = streams.jetstream(None, None).await;
    let bodies = Bodies::default();
    let worker = worker(&jetstream, &bodies).spawn();
    eventually("dead", async || settled(&jetstream).await == Some((0, 1))).await;
    worker.shutdown().await;
    assert!(
        bodies.ids().is_empty(),
        "the ciphertext never reached the processor"
    );
    let (headers, _) = streams.raw_of(&jetstream.dead_stream(), "evt_sealed").await;
    assert_eq!(
        header(&headers, "Webhook-Error"),
        Some(r#"the body cannot be opened: sealed under key "k1", which no configured key has"#)
    );
    jetstream.delete().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_message_stays_sealed_and_opens_when_published_back() {
    let (canary, streams) = (canary(), Streams::new());
    let jetstream = streams.jetstream(Some(ring(&[("k1", 1)])), None).await;
    assert!(jetstream.pause(Some("standard"), None).await.unwrap());
    let event = paid("evt_parked", &canary);
    jetstream.accept(&event).await.unwrap();
    let bodies = Bodies::default();
    let worker = worker(&jetstream, &bodies).spawn();
    eventually("parked", async || {
        jetstream.counts().await.is_ok_and(|c| c.paused == 1)
    })
    .await;
    let parked = streams.raw(&jetstream.paused_stream()).await;
    assert_eq!(parked.len(), 1);
    assert!(
        !shows(&parked[0], &canary),
        "the canary in the parked stream"
    );
    assert!(bodies.ids().is_empty());
    assert!(jetstream.resume(Some("standard"), None).await.unwrap());
    eventually("published back and processed", async || {
        settled(&jetstream).await == Some((1, 0))
    })
    .await;
    worker.shutdown().await;
    assert_eq!(bodies.of("evt_parked"), [event.body().clone()]);
    jetstream.delete().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_processors_worker_opens_and_buries_alike() {
    let (canary, streams) = (canary(), Streams::new());
    let processors = || {
        vec![
            ProcessorSpec::default_processor(),
            ProcessorSpec::new("billing")
                .unwrap()
                .with_types(["invoice.*"])
                .unwrap(),
        ]
    };
    let jetstream = streams
        .jetstream(Some(ring(&[("k2", 2)])), Some(processors()))
        .await;
    let old = streams
        .jetstream(Some(ring(&[("k1", 1)])), Some(processors()))
        .await;
    let invoice = event("evt_invoice", "invoice.paid", &canary);
    let customer = event("evt_customer", "customer.created", &canary);
    for e in [&invoice, &customer] {
        jetstream.accept(e).await.unwrap();
    }
    // Sealed under k1, which no worker has.
    old.accept(&event("evt_lost_invoice", "invoice.paid", &canary))
        .await
        .unwrap();
    old.accept(&event("evt_lost_customer", "customer.created", &canary))
        .await
        .unwrap();
    let store = MemoryStore::new();
    let (all, billing) = (Bodies::default(), Bodies::default());
    let workers = [
        worker(&jetstream, &all).spawn(),
        JetStreamWorker::processor(&jetstream, "billing", store.clone(), billing.processor())
            .unwrap()
            .with_poll_interval(Duration::from_millis(100))
            .unwrap()
            .spawn(),
    ];
    let (dead, dead_billing) = (jetstream.dead_stream(), jetstream.dead_stream_of("billing"));
    eventually("each processor done", async || {
        let by = jetstream.counts_by_processor().await.unwrap();
        let done = |name: &str| by[name].queued + by[name].processing == 0;
        done("default") && done("billing") && by["default"].dead == 2 && by["billing"].dead == 1
    })
    .await;
    for worker in workers {
        worker.shutdown().await;
    }
    assert_eq!(all.ids(), ["evt_customer", "evt_invoice"]);
    assert_eq!(all.of("evt_invoice"), [invoice.body().clone()]);
    assert_eq!(all.of("evt_customer"), [customer.body().clone()]);
    assert_eq!(billing.ids(), ["evt_invoice"]);
    assert_eq!(billing.of("evt_invoice"), [invoice.body().clone()]);
    // Each buries what it could have run: billing's filter takes no customer event.
    assert_eq!(streams.size(&dead).await, 2);
    assert_eq!(streams.size(&dead_billing).await, 1);
    let buried = streams.raw_of(&dead_billing, "evt_lost_invoice").await;
    assert!(!shows(&buried, &canary));
    jetstream.delete().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_processor_added_later_backfills_sealed_messages_and_gets_the_plaintext() {
    let (canary, streams) = (canary(), Streams::new());
    let keys = ring(&[("k1", 1)]);
    let before = streams.jetstream(Some(keys.clone()), None).await;
    let invoice = event("evt_invoice", "invoice.paid", &canary);
    before.accept(&invoice).await.unwrap();
    let customer = event("evt_customer", "customer.created", &canary);
    before.accept(&customer).await.unwrap();
    // Sealed under k0, which no worker has: copied for billing, which buries it.
    let lost = streams.jetstream(Some(ring(&[("k0", 9)])), None).await;
    let lost_invoice = event("evt_lost", "invoice.paid", &canary);
    lost.accept(&lost_invoice).await.unwrap();
    let billing_spec = ProcessorSpec::new("billing")
        .unwrap()
        .with_types(["invoice.*"])
        .unwrap();
    let processors = vec![ProcessorSpec::default_processor(), billing_spec];
    let jetstream = streams.jetstream(Some(keys), Some(processors)).await;
    let billing = Bodies::default();
    let worker = JetStreamWorker::processor(
        &jetstream,
        "billing",
        MemoryStore::new(),
        billing.processor(),
    )
    .unwrap()
    .with_poll_interval(Duration::from_millis(100))
    .unwrap()
    .spawn();
    let copied = jetstream.backfill("billing", None, None).await.unwrap();
    assert_eq!(
        copied, 2,
        "the invoice and the unreadable invoice, not the customer"
    );
    eventually("billing ran one and buried one", async || {
        let by = jetstream.counts_by_processor().await.unwrap();
        (by["billing"].processed, by["billing"].dead) == (1, 1)
    })
    .await;
    worker.shutdown().await;
    assert_eq!(billing.ids(), ["evt_invoice"]);
    assert_eq!(billing.of("evt_invoice"), [invoice.body().clone()]);
    // The copies are the sealed messages as they were.
    let stored = streams.raw(&streams.name).await;
    assert_eq!(stored.len(), 5);
    assert!(stored.iter().all(|m| !shows(m, &canary)));
    let dead = jetstream.dead_stream_of("billing");
    let (headers, _) = streams.raw_of(&dead, "evt_lost").await;
    assert_eq!(
        header(&headers, "Webhook-Error"),
        Some(r#"the body cannot be opened: sealed under key "k0", which no configured key has"#)
    );
    jetstream.delete().await.unwrap();
}
