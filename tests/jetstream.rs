//! The JetStream inbox against a real NATS server with JetStream (127.0.0.1:4222, or
//! `NATS_URL`; `.ci/services` starts one): accept publishes each event once and answers
//! 204 only once JetStream acknowledged, 503 while NATS is cut off; workers process each
//! event once, retry with backoff, bury what keeps failing with its error, renew their
//! leases, survive being killed, and share one consumer. Each test has streams of its own.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::{at, paid_event as event, request, verifier, Caused, NOW};
use futures_util::StreamExt;
use http::StatusCode;
use http_body_util::Full;
use tower::{Layer, ServiceBuilder, ServiceExt};
use tower_webhook::inbox::jetstream::{JetStream, JetStreamWorker};
use tower_webhook::inbox::{Accepted, Attempt, Processor, ProcessorSpec};
use tower_webhook::once::{Once, Ran};
use tower_webhook::store::MemoryStore;
use tower_webhook::{DedupeLayer, Event, Scheme, VerifyWebhookLayer};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

fn nats_url() -> String {
    common::nats_url()
}

async fn client(url: &str) -> async_nats::Client {
    async_nats::connect(url)
        .await
        .expect("NATS with JetStream must be running (.ci/services starts it)")
}

/// A stream of this test's own (and what is made beside it), deleted when the test ends well;
/// memory storage, so a failed test's streams go with the server.
struct Streams {
    name: String,
    url: String,
}

impl Streams {
    fn new() -> Self {
        Self {
            name: format!("tw_test_{}", uuid::Uuid::new_v4().simple()),
            url: nats_url(),
        }
    }

    async fn jetstream(&self) -> JetStream {
        self.jetstream_at(&self.url, Duration::from_secs(5)).await
    }

    async fn jetstream_at(&self, url: &str, publish_timeout: Duration) -> JetStream {
        JetStream::builder(client(url).await, &self.name)
            .with_memory_storage()
            .with_publish_timeout(publish_timeout)
            .build()
            .await
            .unwrap()
    }

    /// Every message of the stream (or its dead stream), in order.
    async fn messages(&self, dead: bool) -> Vec<async_nats::jetstream::message::StreamMessage> {
        let js = async_nats::jetstream::new(client(&self.url).await);
        let name = if dead {
            format!("{}-dead", self.name)
        } else {
            self.name.clone()
        };
        let mut stream = js.get_stream(&name).await.unwrap();
        let last = stream.info().await.unwrap().state.last_sequence;
        let mut out = Vec::new();
        for seq in 1..=last {
            if let Ok(m) = stream.get_raw_message(seq).await {
                out.push(m);
            }
        }
        out
    }

    /// Deletes every stream made for the test's: itself, `<name>-…` (dead and parked, each
    /// processor's) and its buckets' `KV_<name>-…`.
    async fn delete(self) {
        let js = async_nats::jetstream::new(client(&self.url).await);
        let ours = |n: &str| {
            n == self.name
                || n.strip_prefix(&*self.name)
                    .is_some_and(|rest| rest.starts_with('-'))
        };
        let names = js.stream_names().filter_map(|n| async { n.ok() });
        let names: Vec<String> = names.collect().await;
        for name in names {
            if ours(&name) || name.strip_prefix("KV_").is_some_and(ours) {
                let _ = js.delete_stream(name).await;
            }
        }
    }
}

/// Attempts seen per event, and the effects recorded through `Once` (a ledger).
#[derive(Clone, Default)]
struct Seen {
    attempts: Arc<Mutex<HashMap<String, Vec<u32>>>>,
}

impl Seen {
    fn of(&self, id: &str) -> Vec<u32> {
        self.attempts
            .lock()
            .unwrap()
            .get(id)
            .cloned()
            .unwrap_or_default()
    }

    fn events(&self) -> usize {
        self.attempts.lock().unwrap().len()
    }

    /// A processor that records each attempt, works for `work`, then answers `outcome`
    /// for that event and attempt.
    fn processor(
        &self,
        work: Duration,
        outcome: impl Fn(&str, u32) -> Result<(), String> + Send + Sync + 'static,
    ) -> impl Processor {
        let (seen, outcome) = (self.clone(), Arc::new(outcome));
        move |e: Event, a: Attempt| {
            let (seen, outcome) = (seen.clone(), outcome.clone());
            async move {
                seen.attempts
                    .lock()
                    .unwrap()
                    .entry(e.id().unwrap().to_owned())
                    .or_default()
                    .push(a.number());
                tokio::time::sleep(work).await;
                outcome(e.id().unwrap(), a.number())
            }
        }
    }
}

fn succeed(_: &str, _: u32) -> Result<(), String> {
    Ok(())
}

async fn eventually(what: &str, mut check: impl AsyncFnMut() -> bool) {
    for _ in 0..500 {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for: {what}");
}

#[tokio::test]
async fn accept_publishes_each_event_once_with_its_headers_on_its_subject() {
    let streams = Streams::new();
    // Two connections, as two receiver processes would have.
    let (a, b) = (streams.jetstream().await, streams.jetstream().await);
    assert_eq!(a.accept(&event("evt_1")).await.unwrap(), Accepted::New);
    assert_eq!(
        b.accept(&event("evt_1")).await.unwrap(),
        Accepted::Duplicate
    );
    assert_eq!(b.accept(&event("evt_2")).await.unwrap(), Accepted::New);
    let messages = streams.messages(false).await;
    assert_eq!(messages.len(), 2, "each event once");
    let first = &messages[0];
    assert_eq!(
        first.subject.as_str(),
        format!("{}.standard.payment_intent.succeeded", streams.name)
    );
    assert_eq!(
        first.payload,
        event("evt_1").body().clone(),
        "the exact bytes"
    );
    let header = |name: &str| first.headers.get(name).map(|v| v.as_str().to_owned());
    assert_eq!(header("Nats-Msg-Id").as_deref(), Some("8:standard:evt_1"));
    assert_eq!(header("Webhook-Source").as_deref(), Some("standard"));
    assert_eq!(header("Webhook-Id").as_deref(), Some("evt_1"));
    assert_eq!(
        header("Webhook-Type").as_deref(),
        Some("payment_intent.succeeded")
    );
    assert_eq!(header("Webhook-Object-Id").as_deref(), Some("pi_evt_1"));
    assert_eq!(header("Webhook-Livemode").as_deref(), Some("true"));
    assert_eq!(
        header("Webhook-Timestamp").as_deref(),
        Some(NOW.to_string().as_str())
    );
    streams.delete().await;
}

/// The layers in front: 204 once stored on the stream; a duplicate within JetStream's
/// window is dropped by JetStream, and `DedupeLayer` answers the long tail without
/// publishing again.
#[tokio::test]
async fn deliveries_get_204_once_stored_and_duplicates_never_publish_twice() {
    let streams = Streams::new();
    let jetstream = streams.jetstream().await;
    let store = MemoryStore::new();
    let deliver = |id: &'static str, dedupe: bool| {
        let (jetstream, store) = (jetstream.clone(), store.clone());
        async move {
            let verify = VerifyWebhookLayer::new(verifier(Scheme::standard(), &[SECRET]));
            let body = r#"{"type":"order.paid","data":{"object":{"id":"o"}}}"#;
            let headers = Scheme::standard()
                .sign([SECRET], id, at(NOW), body.as_bytes())
                .unwrap();
            let req: http::Request<Full<Bytes>> = request(headers, body);
            let accept = jetstream.accept_service();
            if dedupe {
                let svc = ServiceBuilder::new()
                    .layer(verify)
                    .layer(DedupeLayer::new(store))
                    .service(accept);
                svc.oneshot(req).await.unwrap().status()
            } else {
                verify.layer(accept).oneshot(req).await.unwrap().status()
            }
        }
    };
    assert_eq!(deliver("evt_a", true).await, StatusCode::NO_CONTENT);
    assert_eq!(deliver("evt_a", true).await, StatusCode::NO_CONTENT);
    assert_eq!(deliver("evt_a", false).await, StatusCode::NO_CONTENT);
    assert_eq!(deliver("evt_b", false).await, StatusCode::NO_CONTENT);
    assert_eq!(streams.messages(false).await.len(), 2);
    streams.delete().await;
}

/// NATS cut off: the delivery gets 503 (nothing is acknowledged to the provider), and its
/// retry once NATS is back is stored once — a publish buffered during the cut and sent on
/// reconnect is dropped as the duplicate it is.
#[tokio::test]
async fn nats_cut_off_answers_503_and_the_retry_is_stored_once() {
    let streams = Streams::new();
    let upstream = nats_url().trim_start_matches("nats://").to_owned();
    let proxy = common::proxy::Proxy::start(upstream).await.unwrap();
    let via_proxy = format!("nats://{}", proxy.addr());
    let jetstream = streams
        .jetstream_at(&via_proxy, Duration::from_millis(500))
        .await;
    let svc = ServiceBuilder::new()
        .layer(VerifyWebhookLayer::new(verifier(
            Scheme::standard(),
            &[SECRET],
        )))
        .service(jetstream.accept_service());
    let deliver = || {
        let svc = svc.clone();
        async move {
            let body = r#"{"type":"order.paid"}"#;
            let headers = Scheme::standard()
                .sign([SECRET], "evt_cut", at(NOW), body.as_bytes())
                .unwrap();
            let req: http::Request<Full<Bytes>> = request(headers, body);
            let response = svc.oneshot(req).await.unwrap();
            (
                response.status(),
                response.headers().get("retry-after").cloned(),
            )
        }
    };
    proxy.cut();
    let (status, retry_after) = deliver().await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(retry_after.is_some(), "503 says when to retry");
    proxy.restore();
    let mut answered = StatusCode::SERVICE_UNAVAILABLE;
    for _ in 0..50 {
        answered = deliver().await.0;
        if answered == StatusCode::NO_CONTENT {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        answered,
        StatusCode::NO_CONTENT,
        "the provider's retry is stored"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(streams.messages(false).await.len(), 1);
    streams.delete().await;
}

#[tokio::test]
async fn a_worker_processes_each_event_once_and_counts_follow() {
    let streams = Streams::new();
    let jetstream = streams.jetstream().await;
    let store = MemoryStore::new(); // the workers' claims
    for i in 0..20 {
        jetstream.accept(&event(&format!("evt_{i}"))).await.unwrap();
    }
    let seen = Seen::default();
    let worker = JetStreamWorker::new(
        &jetstream,
        store.clone(),
        seen.processor(Duration::ZERO, succeed),
    )
    .with_concurrency(4)
    .unwrap()
    .spawn();
    eventually("20 processed", async || {
        jetstream
            .counts()
            .await
            .is_ok_and(|c| c.processed == 20 && c.queued + c.processing == 0)
    })
    .await;
    worker.shutdown().await;
    assert_eq!(seen.events(), 20);
    for i in 0..20 {
        assert_eq!(seen.of(&format!("evt_{i}")), vec![1], "evt_{i} once");
    }
    let counts = jetstream.counts().await.unwrap();
    assert_eq!((counts.dead, counts.oldest_due), (0, None), "{counts:?}");
    streams.delete().await;
}

/// The processor gets the crate's `Event` as published (its signed timestamp too, to the
/// second), attempts that count up to the policy's last, and a dead message's error is the
/// processor's with its source chain.
#[tokio::test]
async fn a_processor_gets_the_published_event_and_its_attempts() {
    let streams = Streams::new();
    let jetstream = streams.jetstream().await;
    let store = MemoryStore::new(); // the workers' claims
    let accepted = event("evt_shape");
    jetstream.accept(&accepted).await.unwrap();
    let got: Arc<Mutex<Vec<(Event, Attempt)>>> = Arc::default();
    let g = got.clone();
    let worker = JetStreamWorker::new(&jetstream, store.clone(), move |e: Event, a: Attempt| {
        g.lock().unwrap().push((e, a));
        async { Err::<(), _>(Caused::chain()) }
    })
    .with_max_attempts(2)
    .unwrap()
    .with_backoff(Duration::from_millis(50), Duration::from_millis(50))
    .unwrap()
    .spawn();
    eventually("dead after its last attempt", async || {
        jetstream.counts().await.is_ok_and(|c| c.dead == 1)
    })
    .await;
    worker.shutdown().await;
    let got = got.lock().unwrap().clone();
    let attempts: Vec<_> = got.iter().map(|(_, a)| (a.number(), a.is_last())).collect();
    assert_eq!(attempts, [(1, false), (2, true)]);
    let e = &got[0].0;
    assert_eq!(e.source(), accepted.source());
    assert_eq!(e.id(), Some("evt_shape"));
    assert_eq!(e.event_type(), Some("payment_intent.succeeded"));
    assert_eq!(e.object_id(), Some("pi_evt_shape"));
    assert_eq!(e.livemode(), Some(true));
    assert_eq!(e.body(), accepted.body());
    assert_eq!(e.timestamp(), Some(at(NOW)));
    let debug = format!("{e:?}");
    assert!(debug.contains("evt_shape"), "{debug}");
    assert!(
        !debug.contains("pi_evt_shape") && !debug.contains("livemode"),
        "{debug}"
    );
    let dead = streams.messages(true).await;
    let error = dead[0].headers.get("Webhook-Error").unwrap().as_str();
    assert_eq!(error, Caused::CHAIN_TEXT);
    streams.delete().await;
}

/// A failure is retried after the backoff; an event that keeps failing goes to the dead
/// stream after the last attempt, with its error and attempts, and is not seen again.
#[tokio::test]
async fn failures_retry_with_backoff_then_go_dead_with_their_error() {
    let streams = Streams::new();
    let jetstream = streams.jetstream().await;
    let store = MemoryStore::new(); // the workers' claims
    for id in ["evt_flaky", "evt_doomed"] {
        jetstream.accept(&event(id)).await.unwrap();
    }
    let seen = Seen::default();
    let outcome = |id: &str, attempt: u32| match (id, attempt) {
        ("evt_flaky", 1) => Err("the provider's API timed out".to_owned()),
        ("evt_doomed", _) => Err("order\nnot found".to_owned()),
        _ => Ok(()),
    };
    let started = std::time::Instant::now();
    let worker = JetStreamWorker::new(
        &jetstream,
        store.clone(),
        seen.processor(Duration::ZERO, outcome),
    )
    .with_max_attempts(3)
    .unwrap()
    .with_backoff(Duration::from_millis(200), Duration::from_millis(400))
    .unwrap()
    .spawn();
    eventually("one processed, one dead", async || {
        jetstream
            .counts()
            .await
            .is_ok_and(|c| (c.processed, c.dead) == (1, 1))
    })
    .await;
    worker.shutdown().await;
    assert_eq!(seen.of("evt_flaky"), vec![1, 2]);
    assert_eq!(
        seen.of("evt_doomed"),
        vec![1, 2, 3],
        "three attempts, no more"
    );
    // Backoff: at least 100 ms (half of 200) and then 200 ms (half of 400) between them.
    assert!(started.elapsed() >= Duration::from_millis(300));
    let dead = streams.messages(true).await;
    assert_eq!(dead.len(), 1);
    let header = |name: &str| dead[0].headers.get(name).map(|v| v.as_str().to_owned());
    assert_eq!(header("Webhook-Id").as_deref(), Some("evt_doomed"));
    assert_eq!(header("Webhook-Error").as_deref(), Some("order not found"));
    assert_eq!(header("Webhook-Attempts").as_deref(), Some("3"));
    assert_eq!(dead[0].payload, event("evt_doomed").body().clone());
    assert_eq!(
        dead[0].subject.as_str(),
        format!("{}-dead.standard.payment_intent.succeeded", streams.name)
    );
    streams.delete().await;
}

/// A worker killed mid-event: the message comes back after the lease, the attempt counted.
#[tokio::test]
async fn a_killed_workers_message_comes_back_after_the_lease_counting_the_attempt() {
    let streams = Streams::new();
    let jetstream = streams.jetstream().await;
    let store = MemoryStore::new(); // the workers' claims
    jetstream.accept(&event("evt_stuck")).await.unwrap();
    let seen = Seen::default();
    let doomed = JetStreamWorker::new(
        &jetstream,
        store.clone(),
        seen.processor(Duration::from_secs(60), succeed),
    )
    .with_lease(Duration::from_millis(500))
    .unwrap()
    .spawn();
    eventually("first attempt running", async || {
        seen.of("evt_stuck") == [1]
    })
    .await;
    doomed.abort(); // the process died mid-event
    let worker = JetStreamWorker::new(
        &jetstream,
        store.clone(),
        seen.processor(Duration::ZERO, succeed),
    )
    .spawn();
    eventually("processed by the next worker", async || {
        jetstream.counts().await.is_ok_and(|c| c.processed == 1)
    })
    .await;
    worker.shutdown().await;
    assert_eq!(seen.of("evt_stuck"), vec![1, 2]);
    streams.delete().await;
}

/// A message delivered more often than the attempts allow — every attempt crashed its
/// worker — goes dead without running again.
#[tokio::test]
async fn a_message_whose_every_attempt_crashed_goes_dead() {
    let streams = Streams::new();
    let jetstream = streams.jetstream().await;
    let store = MemoryStore::new(); // the workers' claims
    jetstream.accept(&event("evt_crashes")).await.unwrap();
    let seen = Seen::default();
    for attempt in 1..=2 {
        let doomed = JetStreamWorker::new(
            &jetstream,
            store.clone(),
            seen.processor(Duration::from_secs(60), succeed),
        )
        .with_lease(Duration::from_millis(300))
        .unwrap()
        .with_max_attempts(2)
        .unwrap()
        .spawn();
        eventually("running", async || seen.of("evt_crashes").len() == attempt).await;
        doomed.abort();
    }
    let worker = JetStreamWorker::new(
        &jetstream,
        store.clone(),
        seen.processor(Duration::ZERO, succeed),
    )
    .with_max_attempts(2)
    .unwrap()
    .spawn();
    eventually("dead", async || {
        jetstream.counts().await.is_ok_and(|c| c.dead == 1)
    })
    .await;
    worker.shutdown().await;
    assert_eq!(seen.of("evt_crashes"), vec![1, 2], "not run a third time");
    let dead = streams.messages(true).await;
    let error = dead[0].headers.get("Webhook-Error").unwrap().as_str();
    assert!(error.contains("crashed"), "{error}");
    streams.delete().await;
}

/// A processor running past its lease keeps its message: the lease is renewed (`+WPI`)
/// every third of it, so the message is never redelivered meanwhile.
#[tokio::test]
async fn a_slow_processor_keeps_its_message_by_renewing_the_lease() {
    let streams = Streams::new();
    let jetstream = streams.jetstream().await;
    let store = MemoryStore::new(); // the workers' claims
    jetstream.accept(&event("evt_slow")).await.unwrap();
    let seen = Seen::default();
    let worker = JetStreamWorker::new(
        &jetstream,
        store.clone(),
        seen.processor(Duration::from_millis(1500), succeed),
    )
    .with_lease(Duration::from_millis(400))
    .unwrap()
    .with_concurrency(2)
    .unwrap()
    .spawn();
    eventually("processed", async || {
        jetstream.counts().await.is_ok_and(|c| c.processed == 1)
    })
    .await;
    worker.shutdown().await;
    assert_eq!(
        seen.of("evt_slow"),
        vec![1],
        "never redelivered while it ran"
    );
    streams.delete().await;
}

/// Shutdown waits for running events; past a grace period it stops them and hands their
/// messages back at once, the attempt counted.
#[tokio::test]
async fn shutdown_waits_for_running_events_and_past_a_grace_hands_them_back() {
    let streams = Streams::new();
    let jetstream = streams.jetstream().await;
    let store = MemoryStore::new(); // the workers' claims
    jetstream.accept(&event("evt_a")).await.unwrap();
    let seen = Seen::default();
    let worker = JetStreamWorker::new(
        &jetstream,
        store.clone(),
        seen.processor(Duration::from_millis(500), succeed),
    )
    .spawn();
    eventually("running", async || seen.of("evt_a") == [1]).await;
    worker.shutdown().await;
    assert_eq!(
        jetstream.counts().await.unwrap().processed,
        1,
        "the shutdown waited for it"
    );

    jetstream.accept(&event("evt_b")).await.unwrap();
    let worker = JetStreamWorker::new(
        &jetstream,
        store.clone(),
        seen.processor(Duration::from_secs(60), succeed),
    )
    .with_grace(Duration::from_millis(100))
    .spawn();
    eventually("running", async || seen.of("evt_b") == [1]).await;
    let stopped = std::time::Instant::now();
    worker.shutdown().await;
    assert!(
        stopped.elapsed() < Duration::from_secs(5),
        "the grace bounds it"
    );
    let worker = JetStreamWorker::new(
        &jetstream,
        store.clone(),
        seen.processor(Duration::ZERO, succeed),
    )
    .spawn();
    eventually("handed back and processed", async || {
        jetstream.counts().await.is_ok_and(|c| c.processed == 2)
    })
    .await;
    worker.shutdown().await;
    assert_eq!(seen.of("evt_b"), vec![1, 2]);
    streams.delete().await;
}

/// Two workers (two processes' worth) share the consumer: each event is processed once, and
/// a worker killed mid-storm loses nothing — its messages are redelivered to the other, and
/// `Once` keeps every effect once.
#[tokio::test]
async fn two_workers_and_one_killed_mid_storm_process_every_event_with_each_effect_once() {
    let streams = Streams::new();
    let jetstream = streams.jetstream().await;
    let store = MemoryStore::new(); // the workers' claims
    let n = 120;
    for i in 0..n {
        jetstream.accept(&event(&format!("evt_{i}"))).await.unwrap();
    }
    let ledger: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    let once = Once::new(MemoryStore::new(), "effect");
    let ran = Arc::new(AtomicU32::new(0));
    let processor = |ledger: Arc<Mutex<HashMap<String, u32>>>, once: Once, ran: Arc<AtomicU32>| {
        move |e: Event, _: Attempt| {
            let (ledger, once, ran) = (ledger.clone(), once.clone(), ran.clone());
            async move {
                ran.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(5)).await;
                let id = e.id().unwrap().to_owned();
                let effect = once.run(e.id().unwrap(), move |_| async move {
                    *ledger.lock().unwrap().entry(id).or_default() += 1;
                    Ok::<_, String>(())
                });
                match effect.await {
                    Ok(Ran::InProgress { .. }) => Err("in progress elsewhere".to_owned()),
                    Ok(_) => Ok(()),
                    Err(e) => Err(e.to_string()),
                }
            }
        }
    };
    let worker = |lease: u64| {
        JetStreamWorker::new(
            &jetstream,
            store.clone(),
            processor(ledger.clone(), once.clone(), ran.clone()),
        )
        .with_concurrency(4)
        .unwrap()
        .with_lease(Duration::from_millis(lease))
        .unwrap()
        .with_backoff(Duration::from_millis(50), Duration::from_millis(200))
        .unwrap()
        .spawn()
    };
    let (a, b) = (worker(1000), worker(1000));
    eventually("a third done", async || {
        ledger.lock().unwrap().len() >= n / 3
    })
    .await;
    a.abort(); // killed mid-run
    eventually("all done", async || ledger.lock().unwrap().len() == n).await;
    eventually("all acknowledged", async || {
        jetstream
            .counts()
            .await
            .is_ok_and(|c| c.processed == n as u64 && c.queued + c.processing == 0)
    })
    .await;
    b.shutdown().await;
    assert!(
        ledger.lock().unwrap().values().all(|&n| n == 1),
        "every effect once"
    );
    assert!(ran.load(Ordering::SeqCst) >= n as u32);
    streams.delete().await;
}

/// The messages a stream holds can be read back by anyone on the cluster: what accept
/// wrote is what a consumer of the platform's own sees.
#[tokio::test]
async fn a_plain_consumer_reads_the_same_event() {
    let streams = Streams::new();
    let jetstream = streams.jetstream().await;
    jetstream.accept(&event("evt_plain")).await.unwrap();
    let js = async_nats::jetstream::new(client(&streams.url).await);
    let consumer: async_nats::jetstream::consumer::PullConsumer = js
        .get_stream(&streams.name)
        .await
        .unwrap()
        .create_consumer(async_nats::jetstream::consumer::pull::Config {
            filter_subject: format!("{}.standard.payment_intent.>", streams.name),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut batch = consumer.fetch().max_messages(1).messages().await.unwrap();
    let message = batch.next().await.unwrap().unwrap();
    assert_eq!(message.payload, event("evt_plain").body().clone());
    streams.delete().await;
}

/// The worker this file's regression tests run: it claims each event in `store`.
fn claiming_worker(
    jetstream: &JetStream,
    store: MemoryStore,
    processor: impl Processor,
) -> JetStreamWorker {
    JetStreamWorker::new(jetstream, store, processor)
}

/// A stored event published again after the stream's duplicate window — its first publish
/// was stored but acknowledged late (503), and the provider retried an hour later — is a
/// second message: the worker's claim runs the processor once, and acknowledges the
/// second message as the duplicate it is.
#[tokio::test]
async fn an_event_published_again_after_the_duplicate_window_is_processed_once() {
    let streams = Streams::new();
    let jetstream = JetStream::builder(client(&streams.url).await, &streams.name)
        .with_memory_storage()
        .with_duplicate_window(Duration::from_millis(200))
        .build()
        .await
        .unwrap();
    let seen = Seen::default();
    let worker = claiming_worker(
        &jetstream,
        MemoryStore::new(),
        seen.processor(Duration::ZERO, succeed),
    )
    .spawn();
    assert_eq!(
        jetstream.accept(&event("evt_late")).await.unwrap(),
        Accepted::New
    );
    eventually("processed", async || seen.of("evt_late") == [1]).await;
    tokio::time::sleep(Duration::from_millis(400)).await; // past the window
    assert_eq!(
        jetstream.accept(&event("evt_late")).await.unwrap(),
        Accepted::New,
        "JetStream stored it again: its window is over"
    );
    eventually("both messages acknowledged", async || {
        jetstream
            .counts()
            .await
            .is_ok_and(|c| c.processed == 2 && c.queued + c.processing == 0)
    })
    .await;
    worker.shutdown().await;
    assert_eq!(seen.of("evt_late"), vec![1], "processed once");
    streams.delete().await;
}

/// Two messages of one event (the second accepted past the duplicate window) pulled while
/// paused are both parked, and both come back when the pause ends: the parked stream's own
/// window does not drop the second, which would leave the stream a message short (its
/// `processed` count with it).
#[tokio::test]
async fn two_messages_of_one_event_parked_in_the_window_both_come_back() {
    let streams = Streams::new();
    let jetstream = JetStream::builder(client(&streams.url).await, &streams.name)
        .with_memory_storage()
        .with_duplicate_window(Duration::from_secs(2))
        .build()
        .await
        .unwrap();
    assert!(jetstream.pause(None, None).await.unwrap());
    let accepted = jetstream.accept(&event("evt_twice")).await.unwrap();
    assert_eq!(accepted, Accepted::New);
    tokio::time::sleep(Duration::from_millis(2200)).await; // past the window
    let again = jetstream.accept(&event("evt_twice")).await.unwrap();
    assert_eq!(again, Accepted::New, "a second message: the window is over");
    let seen = Seen::default();
    // The second message goes back while the first one's claim holds: a short lease.
    let worker = claiming_worker(
        &jetstream,
        MemoryStore::new(),
        seen.processor(Duration::ZERO, succeed),
    )
    .with_lease(Duration::from_secs(1))
    .unwrap()
    .spawn();
    // Both pulled and parked well within the parked stream's 2 s window.
    eventually("both parked", async || {
        jetstream.counts().await.is_ok_and(|c| c.paused == 2)
    })
    .await;
    assert!(jetstream.resume(None, None).await.unwrap());
    eventually("both back and acknowledged", async || {
        jetstream
            .counts()
            .await
            .is_ok_and(|c| c.processed == 2 && c.queued + c.processing + c.paused + c.dead == 0)
    })
    .await;
    worker.shutdown().await;
    assert_eq!(seen.of("evt_twice"), vec![1], "processed once");
    streams.delete().await;
}

/// A signed id with a line break (Stripe's id is in the body, where JSON can hold one)
/// cannot be a header value: accept refuses it as invalid input — a 500 through the
/// layers, every retry alike — and publishes nothing; it never panics.
#[tokio::test]
async fn an_id_with_a_line_break_is_refused_with_500_not_a_panic() {
    let streams = Streams::new();
    let jetstream = streams.jetstream().await;
    let secret = "whsec_stripe_test_secret_0123456789";
    let body = r#"{"id":"evt_1\r\nWebhook-Source: forged","type":"charge.succeeded"}"#;
    let verify = VerifyWebhookLayer::new(verifier(Scheme::stripe(), &[secret]));
    let svc = verify.layer(jetstream.accept_service());
    for _ in 0..2 {
        let headers = Scheme::stripe()
            .sign([secret], "", at(NOW), body.as_bytes())
            .unwrap();
        let response = svc.clone().oneshot(request(headers, body)).await.unwrap();
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    }
    let headers = Scheme::stripe()
        .sign([secret], "", at(NOW), body.as_bytes())
        .unwrap();
    let event = verifier(Scheme::stripe(), &[secret])
        .verify(&headers, body.into())
        .unwrap();
    assert_eq!(event.id(), Some("evt_1\r\nWebhook-Source: forged"));
    let refused = jetstream.accept(&event).await.unwrap_err();
    assert_eq!(
        refused.kind(),
        tower_webhook::store::StoreErrorKind::InvalidInput
    );
    assert!(
        streams.messages(false).await.is_empty(),
        "nothing published"
    );
    streams.delete().await;
}

/// A nats-server of a test's own (never the shared one): JetStream on a store directory
/// of its own, on a free port of 127.0.0.1, killed with SIGKILL and restarted on the same
/// port and directory. Killed and its directory removed when dropped.
struct OwnNats {
    port: u16,
    dir: std::path::PathBuf,
    child: Option<std::process::Child>,
}

impl OwnNats {
    fn start() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir = std::env::temp_dir().join(format!("tw-nats-{}", uuid::Uuid::new_v4().simple()));
        let mut nats = Self {
            port,
            dir,
            child: None,
        };
        nats.restart();
        nats
    }

    fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Starts the server (again), and waits until it takes connections.
    fn restart(&mut self) {
        assert!(self.child.is_none(), "already running");
        let child = std::process::Command::new("nats-server")
            .args([
                "-a",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-js",
                "-sd",
            ])
            .arg(&self.dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("nats-server must be installed (.ci/services uses it)");
        self.child = Some(child);
        let started = std::time::Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "nats-server did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL: the server ends at once, whatever it had not written yet.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for OwnNats {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Delivers the signed event `id` through `svc` as a provider does: again after each
/// answer that is not 204, until `deadline`. Whether it was acknowledged.
async fn deliver_until<S, B>(svc: S, id: &str, deadline: std::time::Instant) -> bool
where
    S: tower::Service<http::Request<Full<Bytes>>, Response = http::Response<B>> + Clone,
    S::Error: std::fmt::Debug,
{
    let body = format!(r#"{{"type":"order.paid","data":{{"object":{{"id":"o_{id}"}}}}}}"#);
    while std::time::Instant::now() < deadline {
        let headers = Scheme::standard()
            .sign([SECRET], id, at(NOW), body.as_bytes())
            .unwrap();
        let response = svc
            .clone()
            .oneshot(request(headers, body.clone()))
            .await
            .unwrap();
        if response.status() == StatusCode::NO_CONTENT {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

/// The NATS server SIGKILLed mid-storm and restarted on the same port and directory: every
/// event answered 204 is processed, and none twice — acknowledgements the broker lost
/// with its crash make it redeliver messages already processed, and the worker's claims
/// (done keys in the store) acknowledge those without running them again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_killed_mid_storm_loses_no_acknowledged_event_and_runs_none_twice() {
    let mut nats = OwnNats::start();
    let url = nats.url();
    let jetstream = JetStream::builder(client(&url).await, "storm")
        .with_publish_timeout(Duration::from_secs(2))
        .build()
        .await
        .unwrap();
    let store = MemoryStore::new();
    let svc = ServiceBuilder::new()
        .layer(VerifyWebhookLayer::new(verifier(
            Scheme::standard(),
            &[SECRET],
        )))
        .layer(DedupeLayer::new(store.clone()))
        .service(jetstream.accept_service());
    let runs: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    let r = runs.clone();
    let worker = claiming_worker(&jetstream, store.clone(), move |e: Event, _: Attempt| {
        let r = r.clone();
        async move {
            *r.lock()
                .unwrap()
                .entry(e.id().unwrap().to_owned())
                .or_default() += 1;
            tokio::time::sleep(Duration::from_millis(2)).await;
            Ok::<_, String>(())
        }
    })
    .with_concurrency(16)
    .unwrap()
    .with_lease(Duration::from_secs(2))
    .unwrap()
    .spawn();

    let n = 1500;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let acknowledged = Arc::new(AtomicU32::new(0));
    let ack = acknowledged.clone();
    let storm = tokio::spawn(async move {
        futures_util::stream::iter(0..n)
            .map(|i| {
                let (svc, ack) = (svc.clone(), ack.clone());
                async move {
                    let id = format!("evt_{i}");
                    let acked = deliver_until(svc, &id, deadline).await;
                    if acked {
                        ack.fetch_add(1, Ordering::SeqCst);
                    }
                    (id, acked)
                }
            })
            .buffer_unordered(32)
            .collect::<Vec<_>>()
            .await
    });
    eventually("a third acknowledged", async || {
        acknowledged.load(Ordering::SeqCst) >= n / 3
    })
    .await;
    nats.kill();
    tokio::time::sleep(Duration::from_secs(1)).await;
    nats.restart();
    let delivered = storm.await.unwrap();
    let acked: Vec<String> = delivered
        .into_iter()
        .filter_map(|(id, acked)| acked.then_some(id))
        .collect();
    assert_eq!(
        acked.len(),
        n as usize,
        "every delivery acknowledged in the end"
    );
    let settled = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let done = acked.iter().all(|id| runs.lock().unwrap().contains_key(id));
        let drained = jetstream
            .counts()
            .await
            .is_ok_and(|c| c.queued + c.processing == 0);
        if done && drained {
            break;
        }
        assert!(std::time::Instant::now() < settled, "not drained in time");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    worker.shutdown().await;
    let runs = runs.lock().unwrap().clone();
    let twice: Vec<_> = runs.iter().filter(|(_, &n)| n > 1).collect();
    assert!(twice.is_empty(), "processed more than once: {twice:?}");
    let lost: Vec<_> = acked.iter().filter(|id| !runs.contains_key(*id)).collect();
    assert!(lost.is_empty(), "acknowledged, never processed: {lost:?}");
}

/// Liveness: NATS cut off for a while (its server killed, restarted on the same port and
/// directory), the worker is processing again within 5 s of its return — outages of
/// 0.5, 1 and 3 s in a row. The event is published on a connection of its own, so the time
/// measured is the worker's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_processes_again_within_5_s_of_nats_coming_back() {
    let mut nats = OwnNats::start();
    let url = nats.url();
    let jetstream = JetStream::connect(&url, "outage").await.unwrap();
    let seen = Seen::default();
    let worker = claiming_worker(
        &jetstream,
        MemoryStore::new(),
        seen.processor(Duration::ZERO, succeed),
    )
    .spawn();
    jetstream.accept(&event("evt_before")).await.unwrap();
    eventually("processed before the outage", async || {
        seen.of("evt_before") == [1]
    })
    .await;
    let mut took = Vec::new();
    for (outage, millis) in [500, 1000, 3000].into_iter().enumerate() {
        nats.kill();
        tokio::time::sleep(Duration::from_millis(millis)).await;
        nats.restart();
        let back = std::time::Instant::now();
        let publisher = JetStream::connect(&url, "outage").await.unwrap();
        let id = format!("evt_after_{outage}");
        publisher.accept(&event(&id)).await.unwrap();
        while seen.of(&id).is_empty() && back.elapsed() < Duration::from_secs(90) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        took.push(back.elapsed());
    }
    worker.shutdown().await;
    eprintln!("processing again after NATS came back: {took:?}");
    assert!(
        took.iter().all(|t| *t < Duration::from_secs(5)),
        "not processing within 5 s of NATS's return: {took:?}"
    );
}

/// An event of type `order.paid` about `object` (its `data.object.id`).
fn event_about(id: &str, object: &str) -> Event {
    let body = format!(r#"{{"type":"order.paid","data":{{"object":{{"id":"{object}"}}}}}}"#);
    let headers = Scheme::standard()
        .sign([SECRET], id, at(NOW), body.as_bytes())
        .unwrap();
    verifier(Scheme::standard(), &[SECRET])
        .verify(&headers, body.into())
        .unwrap()
}

/// One run of a processor: the event's id, the attempt, when it began and ended, and
/// whether it succeeded.
type Run = (String, u32, std::time::Instant, std::time::Instant, bool);

/// Every run, in the order they ended; `fail(id, attempt)` says which fail.
#[derive(Clone, Default)]
struct Runs(Arc<Mutex<Vec<Run>>>);

impl Runs {
    fn processor(
        &self,
        work: Duration,
        fail: impl Fn(&str, u32) -> bool + Send + Sync + 'static,
    ) -> impl Processor {
        let (runs, fail) = (self.clone(), Arc::new(fail));
        move |e: Event, a: Attempt| {
            let (runs, fail) = (runs.clone(), fail.clone());
            async move {
                let start = std::time::Instant::now();
                tokio::time::sleep(work).await;
                let id = e.id().unwrap().to_owned();
                let ok = !fail(&id, a.number());
                let run = (id, a.number(), start, std::time::Instant::now(), ok);
                runs.0.lock().unwrap().push(run);
                if ok {
                    Ok(())
                } else {
                    Err("the provider's API timed out".to_owned())
                }
            }
        }
    }

    fn all(&self) -> Vec<Run> {
        self.0.lock().unwrap().clone()
    }

    /// The ids that succeeded, in the order they started.
    fn succeeded(&self) -> Vec<String> {
        let mut ok: Vec<Run> = self.all().into_iter().filter(|r| r.4).collect();
        ok.sort_by_key(|r| r.2);
        ok.into_iter().map(|r| r.0).collect()
    }
}

/// Shuts `worker` down, failing the test if that takes over 15 s.
async fn shut_down(worker: tower_webhook::inbox::WorkerHandle) {
    let shutdown = tokio::time::timeout(Duration::from_secs(15), worker.shutdown());
    shutdown
        .await
        .expect("the shutdown did not end within 15 s");
}

/// Per object 1: object A's first event fails once and waits out a backoff of 300 ms; A's
/// second event does not start until A's first has succeeded (its retry holds the
/// object's turn, as on the SQL inbox), while object B's event is not held back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_waiting_out_a_retry_holds_its_objects_later_events_back() {
    let streams = Streams::new();
    let jetstream = streams.jetstream().await;
    for (id, object) in [("evt_a1", "o_A"), ("evt_a2", "o_A"), ("evt_b1", "o_B")] {
        jetstream.accept(&event_about(id, object)).await.unwrap();
    }
    let runs = Runs::default();
    let worker = JetStreamWorker::new(
        &jetstream,
        MemoryStore::new(),
        runs.processor(Duration::from_millis(20), |id, attempt| {
            (id, attempt) == ("evt_a1", 1)
        }),
    )
    .with_concurrency(4)
    .unwrap()
    .with_poll_interval(Duration::from_millis(100))
    .unwrap()
    .with_backoff(Duration::from_millis(600), Duration::from_millis(600))
    .unwrap()
    .with_per_object(1)
    .unwrap()
    .spawn();
    eventually("the three succeeded", async || runs.succeeded().len() == 3).await;
    shut_down(worker).await;
    let all = runs.all();
    let of = |id: &str| -> Vec<Run> { all.iter().filter(|r| r.0 == id).cloned().collect() };
    let (a1, a2, b1) = (of("evt_a1"), of("evt_a2"), of("evt_b1"));
    let attempts = |runs: &[Run]| runs.iter().map(|r| r.1).collect::<Vec<_>>();
    assert_eq!(
        attempts(&a1),
        [1, 2],
        "A's first failed once, then succeeded"
    );
    assert_eq!((attempts(&a2), attempts(&b1)), (vec![1], vec![1]));
    assert!(
        a2[0].2 >= a1[1].3,
        "A's second started before A's first had succeeded"
    );
    assert!(b1[0].2 < a1[1].2, "B's event was held back by A's retry");
    streams.delete().await;
}

/// Per object 1: an event that failed runs again in its worker (its object's turn kept),
/// and that attempt is counted though it was no delivery: the worker killed during it,
/// the next worker's run is attempt 3.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_run_again_in_the_worker_is_counted_when_the_worker_dies() {
    let streams = Streams::new();
    let jetstream = streams.jetstream().await;
    jetstream
        .accept(&event_about("evt_c", "o_C"))
        .await
        .unwrap();
    let store: Arc<dyn tower_webhook::store::DedupeStore> = Arc::new(MemoryStore::new());
    let seen = Seen::default();
    let spawn = |work: Duration| {
        let seen = seen.clone();
        let processor = move |e: Event, a: Attempt| {
            let seen = seen.clone();
            async move {
                {
                    let mut attempts = seen.attempts.lock().unwrap();
                    attempts
                        .entry(e.id().unwrap().to_owned())
                        .or_default()
                        .push(a.number());
                }
                if a.number() == 1 {
                    return Err("the provider's API timed out".to_owned());
                }
                tokio::time::sleep(work).await;
                Ok(())
            }
        };
        JetStreamWorker::from_arc(&jetstream, store.clone(), processor)
            .with_lease(Duration::from_millis(600))
            .unwrap()
            .with_backoff(Duration::from_millis(100), Duration::from_millis(100))
            .unwrap()
            .with_per_object(1)
            .unwrap()
            .spawn()
    };
    let doomed = spawn(Duration::from_secs(60));
    eventually("its second attempt running", async || {
        seen.of("evt_c") == [1, 2]
    })
    .await;
    doomed.abort(); // the process died during the attempt run again in the worker
    let worker = spawn(Duration::ZERO);
    eventually("processed by the next worker", async || {
        jetstream.counts().await.is_ok_and(|c| c.processed == 1)
    })
    .await;
    shut_down(worker).await;
    // At least 3: the attempt run again counted. (NATS 2.9 may count a delivery to the
    // killed worker's last pull too: an attempt too many, never one too few.)
    let attempts = seen.of("evt_c");
    assert!(attempts[..2] == [1, 2] && attempts[2] >= 3, "{attempts:?}");
    assert_eq!(attempts.len(), 3, "{attempts:?}");
    streams.delete().await;
}

/// Per object 1: 30 events of one hot object, three graceful shutdowns mid-drain, each
/// followed by a new worker: the events run once each, in the order they arrived — the
/// messages a shutdown hands back run before the object's later ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_objects_order_holds_across_graceful_restarts() {
    let streams = Streams::new();
    let jetstream = streams.jetstream().await;
    let ids: Vec<String> = (0..30).map(|i| format!("evt_hot_{i:02}")).collect();
    for id in &ids {
        jetstream.accept(&event_about(id, "o_hot")).await.unwrap();
    }
    let runs = Runs::default();
    let store: Arc<dyn tower_webhook::store::DedupeStore> = Arc::new(MemoryStore::new());
    let spawn = || {
        JetStreamWorker::from_arc(
            &jetstream,
            store.clone(),
            runs.processor(Duration::from_millis(30), |_, _| false),
        )
        .with_concurrency(4)
        .unwrap()
        .with_poll_interval(Duration::from_millis(100))
        .unwrap()
        .with_per_object(1)
        .unwrap()
        .spawn()
    };
    for round in 1..=3 {
        let worker = spawn();
        eventually("mid-drain", async || runs.all().len() >= round * 7).await;
        shut_down(worker).await;
    }
    let worker = spawn();
    eventually("all 30 ran", async || runs.succeeded().len() >= 30).await;
    shut_down(worker).await;
    assert_eq!(
        runs.succeeded(),
        ids,
        "the hot object's events in arrival order"
    );
    streams.delete().await;
}

/// One call of a processor: the event's id, when it began and ended, and whether it
/// succeeded.
type Call = (String, std::time::Instant, Option<std::time::Instant>, bool);

/// Every call of a processor; `script(id, call)` says how each ends (`None`: it succeeds).
#[derive(Clone, Default)]
struct Calls(Arc<Mutex<Vec<Call>>>);

/// How a scripted call ends, when it does not succeed.
#[derive(Clone, Copy)]
enum Ends {
    Later,
    Hangs,
}

impl Calls {
    fn processor(
        &self,
        script: impl Fn(&str, usize) -> Option<Ends> + Send + Sync + 'static,
    ) -> impl Processor {
        let (calls, script) = (self.clone(), Arc::new(script));
        move |e: Event, _: Attempt| {
            let (calls, script) = (calls.clone(), script.clone());
            async move {
                let id = e.id().unwrap().to_owned();
                let (i, call) = {
                    let mut calls = calls.0.lock().unwrap();
                    let call = calls.iter().filter(|c| c.0 == id).count() + 1;
                    calls.push((id.clone(), std::time::Instant::now(), None, false));
                    (calls.len() - 1, call)
                };
                tokio::time::sleep(Duration::from_millis(5)).await;
                let ends = script(&id, call);
                if let Some(Ends::Hangs) = ends {
                    std::future::pending::<()>().await;
                }
                let mut calls = calls.0.lock().unwrap();
                calls[i].2 = Some(std::time::Instant::now());
                calls[i].3 = ends.is_none();
                match ends {
                    None => Ok::<(), Box<dyn std::error::Error + Send + Sync>>(()),
                    Some(_) => {
                        Err(tower_webhook::inbox::Later::after(Duration::from_millis(30)).into())
                    }
                }
            }
        }
    }

    fn succeeded(&self) -> usize {
        self.0.lock().unwrap().iter().filter(|c| c.3).count()
    }

    fn of(&self, id: &str) -> usize {
        self.0.lock().unwrap().iter().filter(|c| c.0 == id).count()
    }

    /// Fails unless every call of `later` began after `earlier` had succeeded.
    fn assert_after(&self, later: &str, earlier: &str) {
        let calls = self.0.lock().unwrap();
        let done = calls
            .iter()
            .find(|c| c.0 == earlier && c.3)
            .and_then(|c| c.2);
        for call in calls.iter().filter(|c| c.0 == later) {
            assert!(
                done.is_some_and(|done| done <= call.1),
                "{later} began before {earlier} had succeeded: {calls:?}"
            );
        }
    }
}

/// A per-object worker of four processors on `jetstream`, claims in `store`.
fn ordered_worker(
    jetstream: &JetStream,
    store: &Arc<dyn tower_webhook::store::DedupeStore>,
    calls: &Calls,
    script: impl Fn(&str, usize) -> Option<Ends> + Send + Sync + 'static,
) -> tower_webhook::inbox::WorkerHandle {
    JetStreamWorker::from_arc(jetstream, store.clone(), calls.processor(script))
        .with_concurrency(4)
        .unwrap()
        .with_lease(Duration::from_millis(600))
        .unwrap()
        .with_ack_wait(Duration::from_millis(600))
        .unwrap()
        .with_poll_interval(Duration::from_millis(100))
        .unwrap()
        .with_per_object(1)
        .unwrap()
        .spawn()
}

/// Per object 1, across a graceful restart (found by model H): each object's first event
/// snoozes while the worker shuts down. Its hand-back reached the stopping worker's own
/// pull, still out, which ran it again and handed it back once more — now behind the
/// object's second event, which the next worker pulled, and ran, first. The objects' lines
/// keep each first event first, however the messages come back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_snoozing_through_a_graceful_restart_keeps_its_objects_order() {
    let streams = Streams::new();
    let jetstream = streams.jetstream().await;
    let objects: Vec<String> = (1..=4).map(|i| format!("o_{i}")).collect();
    for object in &objects {
        for n in 1..=2 {
            let id = format!("evt_{object}_{n}");
            jetstream.accept(&event_about(&id, object)).await.unwrap();
        }
    }
    let store: Arc<dyn tower_webhook::store::DedupeStore> = Arc::new(MemoryStore::new());
    let calls = Calls::default();
    // Each first event says "later" at its first three calls.
    let script = |id: &str, call: usize| (id.ends_with("_1") && call <= 3).then_some(Ends::Later);
    let worker = ordered_worker(&jetstream, &store, &calls, script);
    eventually("each first event snoozed", async || {
        objects.iter().all(|o| calls.of(&format!("evt_{o}_1")) >= 1)
    })
    .await;
    shut_down(worker).await;
    let worker = ordered_worker(&jetstream, &store, &calls, script);
    eventually("all eight succeeded", async || calls.succeeded() == 8).await;
    shut_down(worker).await;
    for object in &objects {
        calls.assert_after(&format!("evt_{object}_2"), &format!("evt_{object}_1"));
    }
    streams.delete().await;
}

/// Per object 1, across a crash (found by model H): the worker running an object's first
/// event is killed; the object's second event, accepted then, is new to JetStream, which
/// hands it to the next worker at once, while the first waits out its lease. The
/// object's line, written by the killed worker, holds the second back until the first
/// has succeeded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_workers_event_still_runs_before_its_objects_later_ones() {
    let streams = Streams::new();
    let jetstream = streams.jetstream().await;
    jetstream
        .accept(&event_about("evt_k1", "o_K"))
        .await
        .unwrap();
    let store: Arc<dyn tower_webhook::store::DedupeStore> = Arc::new(MemoryStore::new());
    let calls = Calls::default();
    let script = |id: &str, call: usize| (id == "evt_k1" && call == 1).then_some(Ends::Hangs);
    let doomed = ordered_worker(&jetstream, &store, &calls, script);
    eventually("the first event running", async || calls.of("evt_k1") == 1).await;
    doomed.abort(); // the process died mid-event
    jetstream
        .accept(&event_about("evt_k2", "o_K"))
        .await
        .unwrap();
    let worker = ordered_worker(&jetstream, &store, &calls, script);
    eventually("both succeeded", async || calls.succeeded() == 2).await;
    shut_down(worker).await;
    calls.assert_after("evt_k2", "evt_k1");
    streams.delete().await;
}

/// Per object 1: a worker killed after JetStream delivered it a message and before it
/// wrote the message in its object's line (here a bare pull on the workers' consumer,
/// never acknowledged) — the next worker writes down what was delivered past the last
/// pull written down before it pulls, so the object's later event, new to JetStream and
/// handed over at once, waits for the redelivery.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_delivered_to_a_worker_killed_before_writing_it_down_keeps_its_place() {
    let streams = Streams::new();
    let jetstream = streams.jetstream().await;
    let store: Arc<dyn tower_webhook::store::DedupeStore> = Arc::new(MemoryStore::new());
    let calls = Calls::default();
    let script = |_: &str, _: usize| None;
    // A first worker with lines, so the consumer's frontier is written.
    jetstream
        .accept(&event_about("evt_w0", "o_W0"))
        .await
        .unwrap();
    let worker = ordered_worker(&jetstream, &store, &calls, script);
    eventually("the first event succeeded", async || calls.succeeded() == 1).await;
    shut_down(worker).await;
    jetstream
        .accept(&event_about("evt_w1", "o_W"))
        .await
        .unwrap();
    let js = async_nats::jetstream::new(client(&nats_url()).await);
    let consumer: async_nats::jetstream::consumer::PullConsumer = js
        .get_consumer_from_stream("tower-webhook", &streams.name)
        .await
        .unwrap();
    let mut pulled = consumer.fetch().max_messages(1).messages().await.unwrap();
    let message = pulled.next().await.unwrap().unwrap(); // delivered, never written down
    assert_eq!(
        message
            .headers
            .as_ref()
            .unwrap()
            .get("Webhook-Id")
            .unwrap()
            .as_str(),
        "evt_w1"
    );
    jetstream
        .accept(&event_about("evt_w2", "o_W"))
        .await
        .unwrap();
    let worker = ordered_worker(&jetstream, &store, &calls, script);
    eventually("all three succeeded", async || calls.succeeded() == 3).await;
    shut_down(worker).await;
    calls.assert_after("evt_w2", "evt_w1");
    streams.delete().await;
}

/// Liveness with two receivers (issue 31 item 14): two processes' worth (a connection, a
/// worker and the accepts each, default lease and `ack_wait`) share one stream through a
/// proxy that drops what the server sends for 300 ms, then resets every connection for
/// 3 s, three times, with work in flight (24 events accepted just before each cut). Every event is handled within 5 s of NATS's return:
/// those delivered during the outage (each delivery retried until answered), and those in
/// flight at the cut — a message the server had sent when the connection was reset is
/// lost in transit, and JetStream redelivers it once the consumer's `ack_wait` has run out
/// (it was the 60 s lease; now a few seconds, the worker renewing what it holds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_worker_resumes_within_5_s_of_nats_returning() {
    let streams = Streams::new();
    let _stream = streams.jetstream().await; // made here: in memory
    let to = nats_url().trim_start_matches("nats://").to_owned();
    // Cut: every connection reset, new ones reset as they come (common/proxy.rs).
    let proxy = common::proxy::Proxy::start(to).await.unwrap();
    let url = format!("nats://{}", proxy.authority());
    let store: Arc<dyn tower_webhook::store::DedupeStore> = Arc::new(MemoryStore::new());
    let runs = Runs::default();
    let mut receivers = Vec::new();
    for _ in 0..2 {
        let jetstream = JetStream::connect(&url, &streams.name).await.unwrap();
        let worker = JetStreamWorker::from_arc(
            &jetstream,
            store.clone(),
            runs.processor(Duration::from_millis(100), |_, _| false),
        )
        .with_concurrency(2)
        .unwrap()
        .spawn();
        receivers.push((jetstream, worker));
    }
    let handled = |ids: &[String]| {
        let done = runs.succeeded();
        ids.iter().all(|id| done.contains(id))
    };
    // Waited for up to 10 s after each return, so a miss shows by how much.
    let most = Duration::from_secs(10);
    let (mut resumed, mut in_flight) = (Vec::new(), Vec::new());
    for round in 0..3 {
        let busy: Vec<String> = (0..24).map(|i| format!("evt_busy_{round}_{i}")).collect();
        for id in &busy {
            receivers[0].0.accept(&event(id)).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
        // The path fails one way first: what the server delivers for 300 ms is lost.
        proxy.swallow();
        tokio::time::sleep(Duration::from_millis(300)).await;
        proxy.cut();
        let sent = std::time::Instant::now();
        let ids: Vec<String> = (0..12).map(|i| format!("evt_{round}_{i}")).collect();
        // Delivered during the outage, as a provider does: again until answered.
        let accepts: Vec<_> = ids
            .iter()
            .enumerate()
            .map(|(i, id)| {
                let (jetstream, id) = (receivers[i % 2].0.clone(), id.clone());
                tokio::spawn(async move {
                    while jetstream.accept(&event(&id)).await.is_err() {
                        assert!(sent.elapsed() < Duration::from_secs(30), "never accepted");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_secs(3)).await;
        proxy.restore();
        let back = std::time::Instant::now();
        for accepted in accepts {
            tokio::time::timeout(Duration::from_secs(30), accepted)
                .await
                .expect("accepted within 30 s")
                .unwrap();
        }
        while !handled(&ids) && back.elapsed() < most {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        resumed.push(back.elapsed());
        while !handled(&busy) && back.elapsed() < most {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        in_flight.push(back.elapsed());
        if back.elapsed() >= most {
            break; // failed already: no need for the other rounds
        }
    }
    for (_, worker) in receivers {
        shut_down(worker).await;
    }
    eprintln!("after NATS came back: delivered during the outage, all handled after {resumed:?}; in flight at the cut, after {in_flight:?}");
    assert!(
        resumed.iter().all(|t| *t < Duration::from_secs(5)),
        "events delivered during the outage not all handled within 5 s of NATS's return: {resumed:?}"
    );
    assert!(
        in_flight.iter().all(|t| *t < Duration::from_secs(5)),
        "events in flight at the cut not all handled within 5 s of NATS's return: {in_flight:?}"
    );
    streams.delete().await;
}

/// The claim key the worker takes for `id` (`jetstream/<stream>/<consumer>/<source>`).
fn claim_key(jetstream: &JetStream, id: &str) -> tower_webhook::store::Delivery {
    let source = event(id).source().to_owned();
    let source = format!("jetstream/{}/tower-webhook/{source}", jetstream.stream());
    tower_webhook::store::Delivery::new(source, id)
}

/// A consumer made with a long `ack_wait` (by a worker of an earlier version, whose lease
/// it was: 60 s) gets the worker's 3 s when the worker starts, its other settings kept:
/// a message lost in transit then comes back within 3 s, not 60.
#[tokio::test]
async fn a_consumer_made_with_a_long_ack_wait_gets_the_workers_when_it_starts() {
    use async_nats::jetstream::consumer::{pull, AckPolicy};
    let streams = Streams::new();
    let jetstream = streams.jetstream().await;
    let js = async_nats::jetstream::new(client(&streams.url).await);
    let stream = js.get_stream(&streams.name).await.unwrap();
    let old = pull::Config {
        durable_name: Some("tower-webhook".to_owned()),
        ack_policy: AckPolicy::Explicit,
        ack_wait: Duration::from_secs(60),
        max_deliver: -1,
        max_ack_pending: 77, // an operator's own setting
        ..Default::default()
    };
    stream.create_consumer(old).await.unwrap();
    let worker = JetStreamWorker::new(&jetstream, MemoryStore::new(), |_: Event, _: Attempt| {
        std::future::ready(Ok::<_, std::convert::Infallible>(()))
    })
    .spawn();
    let config = async || {
        let info = stream.consumer_info("tower-webhook").await.unwrap();
        (info.config.ack_wait, info.config.max_ack_pending)
    };
    eventually("the worker's ack_wait set", async || {
        config().await.0 == Duration::from_secs(3)
    })
    .await;
    assert_eq!(config().await.1, 77, "the consumer's other settings kept");
    shut_down(worker).await;
    streams.delete().await;
}

/// An event whose claim another attempt holds (a worker on another host died running it,
/// its claim left for 4 s): its message goes back until the claim lapses, not holding
/// the worker's only processor — the events behind it run meanwhile — and then runs as
/// attempt 1: the deliveries that went back were no attempts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_whose_event_another_attempt_holds_waits_uncounted_without_a_processor() {
    use tower_webhook::store::{Claim, DedupeStore, Token};
    let streams = Streams::new();
    let jetstream = streams.jetstream().await;
    let store = Arc::new(MemoryStore::new());
    let lease = Duration::from_secs(4);
    let claimed = store.claim(claim_key(&jetstream, "evt_held"), Token::new(), lease);
    assert!(matches!(claimed.await.unwrap(), Claim::New(_)));
    let since = std::time::Instant::now();
    jetstream.accept(&event("evt_held")).await.unwrap();
    let others: Vec<String> = (0..5).map(|i| format!("evt_other_{i}")).collect();
    for id in &others {
        jetstream.accept(&event(id)).await.unwrap();
    }
    let runs = Runs::default();
    let processor = runs.processor(Duration::from_millis(50), |_, _| false);
    let worker = JetStreamWorker::from_arc(&jetstream, store, processor)
        .with_concurrency(1)
        .unwrap()
        .spawn();
    eventually("the events behind it ran", async || {
        let done = runs.succeeded();
        others.iter().all(|id| done.contains(id))
    })
    .await;
    let others_ran = since.elapsed();
    eventually("the held event ran once its claim lapsed", async || {
        runs.succeeded().contains(&"evt_held".to_owned())
    })
    .await;
    shut_down(worker).await;
    assert!(
        others_ran < Duration::from_secs(2),
        "the events behind it waited for the claim: {others_ran:?}"
    );
    let held: Vec<Run> = runs
        .all()
        .into_iter()
        .filter(|r| r.0 == "evt_held")
        .collect();
    assert_eq!(held.len(), 1, "{held:?}");
    assert!(held[0].2 >= since + lease, "ran before the claim lapsed");
    assert_eq!(
        held[0].1, 1,
        "the deliveries that went back counted attempts"
    );
    streams.delete().await;
}

/// A worker whose renewals come late (a processor blocks its runtime for three times the
/// `ack_wait`) has its running message delivered again, to the other worker: that
/// delivery goes back (the claim holds the event) and is no attempt. The failed attempt's
/// retry is attempt 2, after its whole backoff (no late renewal undid the delayed
/// hand-back), and the event never runs twice at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_renewal_costs_a_redelivery_not_an_attempt() {
    let streams = Streams::new();
    let jetstream = streams.jetstream().await;
    jetstream.accept(&event("evt_slow")).await.unwrap();
    let store: Arc<dyn tower_webhook::store::DedupeStore> = Arc::new(MemoryStore::new());
    let runs = Runs::default();
    let (ack_wait, backoff) = (Duration::from_millis(500), Duration::from_secs(2));
    let started = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // The first attempt blocks its thread, then fails; the next succeeds.
    let processor = {
        let (runs, started) = (runs.clone(), started.clone());
        move |e: Event, a: Attempt| {
            let (runs, started) = (runs.clone(), started.clone());
            async move {
                let start = std::time::Instant::now();
                started.store(true, Ordering::SeqCst);
                if a.number() == 1 {
                    std::thread::sleep(ack_wait * 3);
                }
                let ok = a.number() > 1;
                let run = (
                    e.id().unwrap().to_owned(),
                    a.number(),
                    start,
                    std::time::Instant::now(),
                    ok,
                );
                runs.0.lock().unwrap().push(run);
                ok.then_some(())
                    .ok_or_else(|| "the provider's API timed out".to_owned())
            }
        }
    };
    let retry = tower_webhook::inbox::RetryPolicy::default()
        .with_backoff(backoff, backoff)
        .unwrap()
        .with_jitter(tower_webhook::inbox::Jitter::None);
    // One at a time: no pull of the blocked worker is out to take the redelivery.
    let spawn = move |jetstream: &JetStream, store, processor| {
        JetStreamWorker::from_arc(jetstream, store, processor)
            .with_concurrency(1)
            .unwrap()
            .with_ack_wait(ack_wait)
            .unwrap()
            .with_retry(retry)
            .spawn()
    };
    // The first worker on a runtime of its own, of one thread, which its processor blocks.
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let first = {
        let (url, name) = (streams.url.clone(), streams.name.clone());
        let (store, processor) = (store.clone(), processor.clone());
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let jetstream = JetStream::connect(&url, &name).await.unwrap();
                let worker = spawn(&jetstream, store, processor);
                let _ = stopped.await;
                worker.shutdown().await;
            });
        })
    };
    eventually("the first attempt running", async || {
        started.load(Ordering::SeqCst)
    })
    .await;
    let second = spawn(&jetstream, store.clone(), processor);
    eventually("the retry succeeded", async || {
        runs.succeeded().contains(&"evt_slow".to_owned())
    })
    .await;
    let _ = stop.send(());
    tokio::task::spawn_blocking(move || first.join().unwrap())
        .await
        .unwrap();
    shut_down(second).await;
    let mut all = runs.all();
    all.sort_by_key(|r| r.2);
    let attempts: Vec<(u32, bool)> = all.iter().map(|r| (r.1, r.4)).collect();
    assert_eq!(attempts, [(1, false), (2, true)], "{all:?}");
    let waited = all[1].2 - all[0].3;
    assert!(
        waited >= backoff - Duration::from_millis(100),
        "the retry came after {waited:?}, not its backoff"
    );
    streams.delete().await;
}

/// This process's CPU time so far (Linux; zero elsewhere).
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after_name = stat.rsplit(')').next().unwrap_or_default();
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|t| t.parse::<u64>().ok())
            .unwrap_or(0)
    };
    Duration::from_millis((ticks(11) + ticks(12)) * 10) // utime and stime, 100 ticks a second
}

/// What the short `ack_wait` costs: a worker holding over 256 messages (one running, the
/// rest waiting in its lookahead for their source's turn) renews each once a second (a third of the 3 s `ack_wait`): one `+WPI` each, and
/// none is delivered twice meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_lookahead_costs_one_renewal_a_second_per_message() {
    let streams = Streams::new();
    let jetstream = streams.jetstream().await;
    for i in 0..300 {
        jetstream
            .accept(&event(&format!("evt_held_{i:03}")))
            .await
            .unwrap();
    }
    let runs = Runs::default();
    let processor = runs.processor(Duration::from_secs(60), |_, _| false);
    let worker = JetStreamWorker::new(&jetstream, MemoryStore::new(), processor)
        .with_concurrency(2)
        .unwrap()
        .with_per_source(1)
        .unwrap()
        .spawn();
    eventually("the lookahead full", async || {
        jetstream.counts().await.is_ok_and(|c| c.processing > 256)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let held = jetstream.counts().await.unwrap().processing;
    let watcher = client(&streams.url).await;
    let mut acks = watcher
        .subscribe(format!("$JS.ACK.{}.>", streams.name))
        .await
        .unwrap();
    let window = Duration::from_secs(5);
    let (since, cpu) = (tokio::time::Instant::now(), cpu_time());
    let mut renewals = 0;
    while let Ok(Some(ack)) = tokio::time::timeout_at(since + window, acks.next()).await {
        renewals += usize::from(&ack.payload[..] == b"+WPI");
    }
    let cpu = cpu_time() - cpu;
    let js = async_nats::jetstream::new(client(&streams.url).await);
    let mut stream = js.get_stream(&streams.name).await.unwrap();
    let consumer = stream.consumer_info("tower-webhook").await.unwrap();
    worker.abort();
    let per_message = renewals as f64 / window.as_secs_f64() / held as f64;
    assert!(held > 256, "{held} held");
    eprintln!(
        "{held} messages held: {renewals} renewals in {window:?} ({per_message:.2} a second \
         each); this process's CPU meanwhile {cpu:?}"
    );
    assert!(
        (0.8..=1.2).contains(&per_message),
        "renewals a second per held message: {per_message:.2}"
    );
    assert_eq!(
        consumer.num_redelivered, 0,
        "a held message delivered again"
    );
    let _ = stream.info().await;
    streams.delete().await;
}

// Fan-out: one durable consumer per processor (issue 33, docs/design/fan-out.md §5).

/// An event of type `event_type`.
fn typed_event(id: &str, event_type: &str) -> Event {
    let body = format!(r#"{{"type":"{event_type}","data":{{"object":{{"id":"obj_{id}"}}}}}}"#);
    let headers = Scheme::standard()
        .sign([SECRET], id, at(NOW), body.as_bytes())
        .unwrap();
    verifier(Scheme::standard(), &[SECRET])
        .verify(&headers, body.into())
        .unwrap()
}

impl Streams {
    async fn fanned_out(&self, processors: Vec<ProcessorSpec>) -> JetStream {
        JetStream::builder(client(&self.url).await, &self.name)
            .with_memory_storage()
            .with_processors(processors)
            .unwrap()
            .build()
            .await
            .unwrap()
    }

    /// Fanned out to the default processor and `billing`, which takes `invoice.*`.
    async fn with_billing(&self) -> JetStream {
        let billing = ProcessorSpec::new("billing")
            .unwrap()
            .with_types(["invoice.*"])
            .unwrap();
        self.fanned_out(vec![ProcessorSpec::default_processor(), billing])
            .await
    }

    /// How many messages the stream `name` holds.
    async fn size(&self, name: &str) -> u64 {
        let js = async_nats::jetstream::new(client(&self.url).await);
        let mut stream = js.get_stream(name).await.unwrap();
        stream.info().await.unwrap().state.messages
    }
}

/// A processor's worker, quick to retry.
fn processor_worker(
    jetstream: &JetStream,
    name: &str,
    store: &MemoryStore,
    processor: impl Processor,
) -> JetStreamWorker {
    quick(JetStreamWorker::processor(jetstream, name, store.clone(), processor).unwrap())
}

/// `billing`'s worker (not yet spawned): each attempt succeeds and is recorded in `seen`.
fn billing_worker(jetstream: &JetStream, store: &MemoryStore, seen: &Seen) -> JetStreamWorker {
    processor_worker(
        jetstream,
        "billing",
        store,
        seen.processor(Duration::ZERO, succeed),
    )
}

/// `worker`, quick to retry.
fn quick(worker: JetStreamWorker) -> JetStreamWorker {
    worker
        .with_max_attempts(2)
        .unwrap()
        .with_backoff(Duration::from_millis(50), Duration::from_millis(100))
        .unwrap()
        .with_poll_interval(Duration::from_millis(100))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processors_run_each_event_they_take_once_and_a_failing_one_buries_its_own() {
    let streams = Streams::new();
    let jetstream = streams
        .fanned_out(vec![
            ProcessorSpec::default_processor(),
            ProcessorSpec::new("billing")
                .unwrap()
                .with_types(["invoice.*"])
                .unwrap(),
            ProcessorSpec::new("flaky").unwrap(),
        ])
        .await;
    // Published before any worker started: `build` made every processor's consumer.
    let ids: Vec<String> = (0..12).map(|i| format!("evt_{i}")).collect();
    let invoices: Vec<&String> = ids.iter().step_by(3).collect();
    for id in &ids {
        let ty = match invoices.contains(&id) {
            true => "invoice.paid",
            false => "customer.created",
        };
        jetstream.accept(&typed_event(id, ty)).await.unwrap();
    }
    let store = MemoryStore::new(); // one store: the claim keys are per processor
    let (all, billing, flaky) = (Seen::default(), Seen::default(), Seen::default());
    let fail = |_: &str, _: u32| Err("the mail server is down".to_owned());
    let workers = [
        JetStreamWorker::new(
            &jetstream,
            store.clone(),
            all.processor(Duration::ZERO, succeed),
        )
        .with_poll_interval(Duration::from_millis(100))
        .unwrap()
        .spawn(),
        // Each of `processor`'s variants: a shared store, and none (at least once).
        quick(
            JetStreamWorker::from_arc_processor(
                &jetstream,
                "billing",
                Arc::new(store.clone()),
                billing.processor(Duration::ZERO, succeed),
            )
            .unwrap(),
        )
        .spawn(),
        quick(
            JetStreamWorker::at_least_once_processor(
                &jetstream,
                "flaky",
                flaky.processor(Duration::ZERO, fail),
            )
            .unwrap(),
        )
        .spawn(),
    ];
    let n = ids.len() as u64;
    let want = |processed: u64, dead: u64| (0, 0, processed, dead, 0);
    let wanted = [
        ("billing", want(invoices.len() as u64, 0)),
        ("default", want(n, 0)),
        ("flaky", want(0, n)),
    ];
    eventually("every processor done", async || {
        let by = jetstream.counts_by_processor().await.unwrap();
        let got: Vec<_> = by
            .iter()
            .map(|(name, c)| {
                let c = (c.queued, c.processing, c.processed, c.dead, c.paused);
                (name.as_str(), c)
            })
            .collect();
        got == wanted
    })
    .await;
    for worker in workers {
        worker.shutdown().await;
    }
    for id in &ids {
        assert_eq!(all.of(id), [1], "default ran {id} once");
        assert_eq!(flaky.of(id), [1, 2], "flaky tried {id} twice");
        let billed: &[u32] = match invoices.contains(&id) {
            true => &[1],
            false => &[], // its filter excludes the type: acknowledged unrun
        };
        assert_eq!(billing.of(id), billed, "billing and {id}");
    }
    // The failing processor's messages are in its own dead stream only; none left the
    // stream, which the others still read.
    assert_eq!(
        jetstream.dead_stream_of("flaky"),
        format!("{}-dead-flaky", streams.name)
    );
    assert_eq!(streams.size(&jetstream.dead_stream_of("flaky")).await, n);
    assert_eq!(streams.size(&jetstream.dead_stream()).await, 0);
    assert_eq!(streams.size(&jetstream.dead_stream_of("billing")).await, 0);
    assert_eq!(streams.size(&streams.name).await, n);
    let sum = jetstream.counts().await.unwrap();
    let sum = (sum.processed, sum.dead, sum.queued);
    assert_eq!(
        sum,
        (n + invoices.len() as u64, n, 0),
        "counts() is the sum"
    );
    // Claims are per processor: `default`'s key of an event is not `billing`'s.
    let shared = Arc::new(store.clone());
    let unknown = [
        JetStreamWorker::processor(&jetstream, "nope", store.clone(), succeed_now).err(),
        JetStreamWorker::from_arc_processor(&jetstream, "nope", shared, succeed_now).err(),
        JetStreamWorker::at_least_once_processor(&jetstream, "nope", succeed_now).err(),
    ];
    for unknown in unknown {
        assert_eq!(
            unknown.expect("an unknown processor").kind(),
            tower_webhook::ConfigErrorKind::InvalidProcessor
        );
    }
    jetstream.delete().await.unwrap();
}

async fn succeed_now(_: Event, _: Attempt) -> Result<(), std::convert::Infallible> {
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_processors_pause_parks_only_its_messages_and_its_resume_brings_only_them_back() {
    let streams = Streams::new();
    let jetstream = streams
        .fanned_out(vec![
            ProcessorSpec::default_processor(),
            ProcessorSpec::new("email").unwrap(),
        ])
        .await;
    assert!(jetstream
        .pause_processor("email", Some("standard"), None)
        .await
        .unwrap());
    let refused = jetstream.pause_processor("nope", None, None).await;
    assert_eq!(
        refused.unwrap_err().kind(),
        tower_webhook::store::StoreErrorKind::InvalidInput
    );
    let pauses = jetstream.pauses().await.unwrap();
    assert_eq!(pauses.len(), 1);
    assert_eq!(pauses[0].processor.as_deref(), Some("email"));
    let ids: Vec<String> = (0..6).map(|i| format!("evt_{i}")).collect();
    for id in &ids {
        jetstream.accept(&event(id)).await.unwrap();
    }
    let store = MemoryStore::new();
    let (all, email) = (Seen::default(), Seen::default());
    let workers = [
        JetStreamWorker::new(
            &jetstream,
            store.clone(),
            all.processor(Duration::ZERO, succeed),
        )
        .with_poll_interval(Duration::from_millis(100))
        .unwrap()
        .spawn(),
        processor_worker(
            &jetstream,
            "email",
            &store,
            email.processor(Duration::ZERO, succeed),
        )
        .spawn(),
    ];
    let n = ids.len() as u64;
    let counts = async |name: &str| {
        let by = jetstream.counts_by_processor().await.unwrap();
        let c = by[name];
        (c.queued, c.processing, c.processed, c.dead, c.paused)
    };
    eventually("email's parked, default's processed", async || {
        counts("email").await == (0, 0, 0, 0, n) && counts("default").await == (0, 0, n, 0, 0)
    })
    .await;
    assert_eq!(email.events(), 0, "paused for email: none ran");
    assert_eq!(all.events(), ids.len(), "default ran on");
    assert_eq!(streams.size(&jetstream.paused_stream_of("email")).await, n);
    assert_eq!(streams.size(&jetstream.paused_stream()).await, 0);
    assert_eq!(streams.size(&streams.name).await, n, "parked, not deleted");
    // Resuming every processor's pause of that source does not end email's own.
    assert!(!jetstream.resume(Some("standard"), None).await.unwrap());
    assert!(jetstream
        .resume_processor("email", Some("standard"), None)
        .await
        .unwrap());
    eventually("email's events back and processed", async || {
        counts("email").await == (0, 0, n, 0, 0) && counts("default").await == (0, 0, n, 0, 0)
    })
    .await;
    for worker in workers {
        worker.shutdown().await;
    }
    for id in &ids {
        assert_eq!(email.of(id), [1], "email ran {id} once, after the resume");
        assert_eq!(all.of(id), [1], "default did not run {id} again");
    }
    // Published back for email alone: the stream has each event twice now.
    assert_eq!(streams.size(&streams.name).await, 2 * n);
    assert_eq!(streams.size(&jetstream.paused_stream_of("email")).await, 0);
    jetstream.delete().await.unwrap();
}

#[tokio::test]
async fn a_processor_added_later_reads_from_when_it_was_made() {
    let streams = Streams::new();
    let before = streams.jetstream().await;
    before.accept(&event("evt_old")).await.unwrap();
    let jetstream = streams
        .fanned_out(vec![
            ProcessorSpec::default_processor(),
            ProcessorSpec::new("late").unwrap(),
        ])
        .await;
    jetstream.accept(&event("evt_new")).await.unwrap();
    let by = jetstream.counts_by_processor().await.unwrap();
    assert_eq!(
        by["default"].queued, 2,
        "default reads the stream from its start"
    );
    assert_eq!(by["late"].queued, 1, "late reads from when build made it");
    let store = MemoryStore::new();
    let late = Seen::default();
    let worker = processor_worker(
        &jetstream,
        "late",
        &store,
        late.processor(Duration::ZERO, succeed),
    )
    .spawn();
    eventually("late processed its one", async || {
        let by = jetstream.counts_by_processor().await.unwrap();
        by["late"].processed == 1
    })
    .await;
    worker.shutdown().await;
    assert_eq!(late.of("evt_new"), [1]);
    assert!(late.of("evt_old").is_empty());
    jetstream.delete().await.unwrap();
}

/// A processor's `processed` is the stream less what it passed unrun: read the moment its
/// consumer has nothing pending, it is already exact, every pass counted (a batch once
/// went missing while its write was under way, and a demo read 377 of 320).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filtered_processors_count_is_exact_the_moment_it_drains() {
    let streams = Streams::new();
    let jetstream = streams.with_billing().await;
    let n = 300;
    for i in 0..n {
        let ty = if i % 3 == 0 {
            "invoice.paid"
        } else {
            "charge.refunded"
        };
        jetstream
            .accept(&typed_event(&format!("evt_{i}"), ty))
            .await
            .unwrap();
    }
    let store = MemoryStore::new();
    let seen = Seen::default();
    let worker = billing_worker(&jetstream, &store, &seen)
        .with_concurrency(16)
        .unwrap()
        .spawn();
    let mut reads = 0;
    let drained = loop {
        let by = jetstream.counts_by_processor().await.unwrap();
        let c = by["billing"];
        reads += 1;
        if c.queued + c.processing == 0 {
            break c;
        }
        assert!(reads < 20_000, "billing drains within a minute: {c:?}");
        // No pause between reads: the first one after the last acknowledgement counts.
    };
    worker.shutdown().await;
    let ran = (0..n).filter(|i| !seen.of(&format!("evt_{i}")).is_empty());
    assert_eq!(ran.count(), n / 3, "billing ran its invoices");
    assert_eq!(
        drained.processed,
        (n / 3) as u64,
        "exact at the first drained read ({reads} reads): {drained:?}"
    );
    jetstream.delete().await.unwrap();
}

/// A message NATS hands out again after its acknowledgement — 2.9 does, as a first
/// delivery, when the client of the pull that took it went away; here every message, the
/// consumer made anew from the stream's start — is neither run nor counted a second time:
/// a message passed unrun is a key named after it, created before its acknowledgement (a
/// counter took each such message twice, and `billing`'s `processed` fell short).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_handed_out_again_after_their_acknowledgement_count_once() {
    use async_nats::jetstream::consumer::{pull, AckPolicy, DeliverPolicy};
    let streams = Streams::new();
    let jetstream = streams.with_billing().await;
    let n = 12;
    for i in 0..n {
        let ty = if i % 3 == 0 {
            "invoice.paid"
        } else {
            "charge.refunded"
        };
        let event = typed_event(&format!("evt_{i}"), ty);
        jetstream.accept(&event).await.unwrap();
    }
    let store = MemoryStore::new();
    let seen = Seen::default();
    let billing = || async {
        let by = jetstream.counts_by_processor().await.unwrap();
        let c = by["billing"];
        (c.queued, c.processing, c.processed, c.dead)
    };
    let settled = (0, 0, n / 3, 0);
    for round in ["first", "again"] {
        if round == "again" {
            let js = async_nats::jetstream::new(client(&streams.url).await);
            let stream = js.get_stream(&streams.name).await.unwrap();
            stream
                .delete_consumer("tower-webhook-billing")
                .await
                .unwrap();
            let config = pull::Config {
                durable_name: Some("tower-webhook-billing".to_owned()),
                ack_policy: AckPolicy::Explicit,
                deliver_policy: DeliverPolicy::All,
                max_deliver: -1,
                ..Default::default()
            };
            stream.create_consumer(config).await.unwrap();
            assert_eq!(billing().await.0, n, "every message is handed out again");
        }
        let worker = billing_worker(&jetstream, &store, &seen).spawn();
        eventually("billing drained", async || billing().await == settled).await;
        worker.shutdown().await;
        assert_eq!(billing().await, settled, "{round}: billing's counts");
    }
    for i in 0..n {
        let runs: &[u32] = if i % 3 == 0 { &[1] } else { &[] };
        assert_eq!(seen.of(&format!("evt_{i}")), runs, "billing and evt_{i}");
    }
    jetstream.delete().await.unwrap();
    let js = async_nats::jetstream::new(client(&streams.url).await);
    let names: Vec<String> = js
        .stream_names()
        .filter_map(|n| async { n.ok() })
        .collect()
        .await;
    let left: Vec<&String> = names
        .iter()
        .filter(|n| n.contains(&*streams.name))
        .collect();
    assert!(
        left.is_empty(),
        "delete leaves none of its streams: {left:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_processor_added_later_backfills_its_window_once_and_a_second_backfill_runs_nothing() {
    let streams = Streams::new();
    let only_default = streams
        .fanned_out(vec![ProcessorSpec::default_processor()])
        .await;
    let accept = |id: &str, ty: &str| {
        let (js, event) = (only_default.clone(), typed_event(id, ty));
        async move { js.accept(&event).await.unwrap() }
    };
    let pause = || tokio::time::sleep(Duration::from_millis(50));
    accept("old", "invoice.paid").await;
    pause().await;
    let from = std::time::SystemTime::now();
    accept("in_1", "invoice.paid").await;
    accept("in_other", "customer.created").await;
    accept("in_2", "invoice.paid").await;
    pause().await;
    let before = std::time::SystemTime::now();
    accept("late", "invoice.paid").await;
    // `billing` is added: its consumer reads what is published from now on.
    let jetstream = streams.with_billing().await;
    jetstream
        .accept(&typed_event("after", "invoice.paid"))
        .await
        .unwrap();
    let store = MemoryStore::new();
    let seen = Seen::default();
    let worker = billing_worker(&jetstream, &store, &seen).spawn();
    let created = jetstream.backfill("billing", Some(from), Some(before));
    assert_eq!(created.await.unwrap(), 2, "the window's two invoices");
    let processed = async |n: u64| {
        let by = jetstream.counts_by_processor().await.unwrap();
        let c = by["billing"];
        (c.queued, c.processing, c.processed, c.dead) == (0, 0, n, 0)
    };
    eventually("the window and the later event run", async || {
        processed(3).await
    })
    .await;
    for (id, runs) in [
        ("in_1", 1),
        ("in_2", 1),
        ("after", 1),
        ("in_other", 0),
        ("old", 0),
        ("late", 0),
    ] {
        assert_eq!(seen.of(id).len(), runs, "billing ran {id}");
    }
    // The same window again: nothing copied, nothing run.
    let again = jetstream.backfill("billing", Some(from), Some(before));
    assert_eq!(again.await.unwrap(), 0, "a second backfill creates nothing");
    // Everything before its start: only what the first window left (its filter applied).
    let rest = jetstream.backfill("billing", None, None).await.unwrap();
    assert_eq!(rest, 2, "the invoices before and after the window");
    eventually("the rest runs", async || processed(5).await).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    for id in ["in_1", "in_2", "after", "old", "late"] {
        assert_eq!(seen.of(id), [1], "billing ran {id} once");
    }
    assert!(
        seen.of("in_other").is_empty(),
        "its filter excludes the type"
    );
    assert_eq!(jetstream.backfill("billing", None, None).await.unwrap(), 0);
    // `default` reads the stream from its start; an unknown processor is refused.
    assert_eq!(jetstream.backfill("default", None, None).await.unwrap(), 0);
    let unknown = jetstream.backfill("nope", None, None).await.unwrap_err();
    assert_eq!(
        unknown.kind(),
        tower_webhook::store::StoreErrorKind::InvalidInput
    );
    worker.shutdown().await;
    jetstream.delete().await.unwrap();
}
