//! RabbitMQ's accept against a real broker (127.0.0.1:5672, or `AMQP_URL`; `.ci/services`
//! starts one): each event is published persistent and `mandatory` with its headers and
//! answered 204 only once the broker confirmed it; a duplicate behind `DedupeLayer` is
//! never published twice; an unroutable message, no broker, or a cut connection is a 503
//! with `Retry-After` that releases the dedupe claim; publishing resumes after a cut
//! without rebuilding; an existing queue with other settings is a clear error at start.
//! Each test has exchanges and queues of its own, deleted at its end.
#![cfg(feature = "amqp")]

mod common;

use std::time::{Duration, Instant};

use common::amqp::deliver;
use common::{paid_event as event, NOW};
use http::StatusCode;
use lapin::options::{BasicGetOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::{AMQPValue, FieldTable};
use tower_webhook::inbox::amqp::Amqp;
use tower_webhook::inbox::Accepted;
use tower_webhook::store::{MemoryStore, StoreErrorKind};

/// Names of this test's own: the exchange and queue (and their `-dead` twins).
struct Names {
    name: String,
    url: String,
}

impl Names {
    fn new() -> Self {
        Self {
            name: common::amqp::name(),
            url: common::amqp_url(),
        }
    }

    async fn amqp(&self) -> Amqp {
        self.amqp_at(&self.url).await
    }

    async fn amqp_at(&self, url: &str) -> Amqp {
        common::amqp::named(url, &self.name).await
    }

    /// A raw channel of the test's own.
    async fn channel(&self) -> lapin::Channel {
        let connect = lapin::Connection::connect(&self.url, lapin::ConnectionProperties::default());
        // A broker that accepts connections but never answers fails the test, not hangs it.
        let connection = tokio::time::timeout(Duration::from_secs(10), connect)
            .await
            .expect("RabbitMQ accepted the connection but never answered")
            .expect("RabbitMQ must be running (.ci/services starts it)");
        connection.create_channel().await.unwrap()
    }

    /// Every message of the queue, taken off it (acknowledged).
    async fn take_all(&self, queue: &str) -> Vec<lapin::message::BasicGetMessage> {
        let channel = self.channel().await;
        let mut out = Vec::new();
        while let Some(message) = channel
            .basic_get(queue.into(), BasicGetOptions { no_ack: true })
            .await
            .unwrap()
        {
            out.push(message);
        }
        out
    }

    /// Deletes the queues and exchanges (whatever of them exists).
    async fn delete(self) {
        let channel = self.channel().await;
        let made = ["dead", "paused", "pauses", "pauses-seq"].map(|q| format!("{}-{q}", self.name));
        for queue in [self.name.clone()].into_iter().chain(made) {
            let _ = channel
                .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
                .await;
        }
        let channel = self.channel().await;
        for exchange in [self.name.clone(), format!("{}-dead", self.name)] {
            let _ = channel
                .exchange_delete(exchange.as_str().into(), Default::default())
                .await;
        }
    }
}

fn header(message: &lapin::message::BasicGetMessage, name: &str) -> Option<String> {
    let headers = message.delivery.properties.headers().as_ref()?;
    match headers.inner().get(name)? {
        AMQPValue::LongString(s) => Some(s.to_string()),
        other => panic!("{name} is not a long string: {other:?}"),
    }
}

#[tokio::test]
async fn accept_publishes_a_confirmed_persistent_message_with_its_headers() {
    let names = Names::new();
    let amqp = names.amqp().await;
    assert_eq!(amqp.accept(&event("evt_1")).await.unwrap(), Accepted::New);
    let messages = names.take_all(&names.name).await;
    assert_eq!(messages.len(), 1);
    let message = &messages[0];
    assert_eq!(message.delivery.exchange.as_str(), names.name);
    assert_eq!(
        message.delivery.routing_key.as_str(),
        "standard.payment_intent.succeeded"
    );
    assert_eq!(
        message.delivery.data,
        event("evt_1").body().to_vec(),
        "the exact bytes"
    );
    let properties = &message.delivery.properties;
    assert_eq!(*properties.delivery_mode(), Some(2), "persistent");
    assert_eq!(
        properties.message_id().as_ref().map(|id| id.as_str()),
        Some("8:standard:evt_1")
    );
    assert_eq!(*properties.timestamp(), Some(NOW));
    assert_eq!(
        header(message, "Webhook-Source").as_deref(),
        Some("standard")
    );
    assert_eq!(header(message, "Webhook-Id").as_deref(), Some("evt_1"));
    assert_eq!(
        header(message, "Webhook-Type").as_deref(),
        Some("payment_intent.succeeded")
    );
    assert_eq!(
        header(message, "Webhook-Object-Id").as_deref(),
        Some("pi_evt_1")
    );
    assert_eq!(header(message, "Webhook-Livemode").as_deref(), Some("true"));
    assert_eq!(header(message, "Webhook-Timestamp"), Some(NOW.to_string()));
    let counts = amqp.counts().await.unwrap();
    assert_eq!((counts.queued, counts.dead), (0, 0));
    names.delete().await;
}

#[tokio::test]
async fn a_duplicate_behind_dedupe_gets_204_without_a_second_message() {
    let names = Names::new();
    let amqp = names.amqp().await;
    let store = MemoryStore::new();
    assert_eq!(
        deliver(&amqp, &store, "evt_a").await.0,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        deliver(&amqp, &store, "evt_a").await.0,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        deliver(&amqp, &store, "evt_b").await.0,
        StatusCode::NO_CONTENT
    );
    assert_eq!(amqp.counts().await.unwrap().queued, 2);
    let messages = names.take_all(&names.name).await;
    let ids: Vec<_> = messages.iter().map(|m| header(m, "Webhook-Id")).collect();
    assert_eq!(ids, [Some("evt_a".to_owned()), Some("evt_b".to_owned())]);
    names.delete().await;
}

/// The queue unbound after the build: the broker returns the `mandatory` message (lapin's
/// `Ack` with the message back), which is a 503 that releases the claim; bound again, the
/// provider's retry is published.
#[tokio::test]
async fn an_unroutable_message_is_503_and_its_retry_is_published_once_routable() {
    let names = Names::new();
    let amqp = names.amqp().await;
    let store = MemoryStore::new();
    let channel = names.channel().await;
    channel
        .queue_unbind(
            names.name.as_str().into(),
            names.name.as_str().into(),
            "#".into(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let (status, retry_after) = deliver(&amqp, &store, "evt_lost").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(retry_after, "503 says when to retry");
    // Deleted outright, then declared again by a second build: still 503 until then.
    channel
        .queue_delete(names.name.as_str().into(), QueueDeleteOptions::default())
        .await
        .unwrap();
    let (status, _) = deliver(&amqp, &store, "evt_lost").await;
    assert_eq!(
        status,
        StatusCode::SERVICE_UNAVAILABLE,
        "the claim was released"
    );
    let _again = names.amqp().await;
    let (status, _) = deliver(&amqp, &store, "evt_lost").await;
    assert_eq!(status, StatusCode::NO_CONTENT, "the retry is published");
    let (status, _) = deliver(&amqp, &store, "evt_lost").await;
    assert_eq!(status, StatusCode::NO_CONTENT, "and then a duplicate");
    assert_eq!(names.take_all(&names.name).await.len(), 1);
    names.delete().await;
}

/// A broker that is not there: the build fails with an error that says so (no password in
/// it), and an `Amqp` whose broker went away answers 503 at once.
#[tokio::test]
async fn no_broker_fails_the_build_and_answers_503_fast() {
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let url = format!("amqp://guest:s3cret-pass@{closed}/%2f");
    let started = Instant::now();
    let error = Amqp::builder(&url).build().await.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(6));
    let text = format!("{error}: {}", std::error::Error::source(&error).unwrap());
    assert!(text.contains(&closed.to_string()), "{text}");
    assert!(!text.contains("s3cret-pass"), "{text}");
    assert!(!format!("{:?}", Amqp::builder(&url)).contains("s3cret-pass"));

    // Built through a proxy, then the broker gone for good.
    let names = Names::new();
    let upstream = names
        .url
        .split('@')
        .nth(1)
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .to_owned();
    let proxy = common::proxy::Proxy::start(upstream).await.unwrap();
    let via = format!("amqp://guest:guest@{}/%2f", proxy.addr());
    let amqp = names.amqp_at(&via).await;
    assert!(!format!("{amqp:?}").contains(":guest@"), "{amqp:?}");
    proxy.cut();
    drop(proxy);
    let store = MemoryStore::new();
    for _ in 0..3 {
        let started = Instant::now();
        let (status, retry_after) = deliver(&amqp, &store, "evt_none").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(retry_after);
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{:?}",
            started.elapsed()
        );
    }
    names.delete().await;
}

/// A cut (every connection reset, new ones refused) while deliveries keep coming: every
/// answer during it is 503, never 2xx; once restored, publishing resumes within 5 s on the
/// same `Amqp`, and every 204 is a message in the queue.
#[tokio::test]
async fn a_cut_is_503_throughout_and_publishing_resumes_within_5_s_after() {
    let names = Names::new();
    let upstream = names
        .url
        .split('@')
        .nth(1)
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .to_owned();
    let proxy = common::proxy::Proxy::start(upstream).await.unwrap();
    let via = format!("amqp://guest:guest@{}/%2f", proxy.addr());
    let amqp = names.amqp_at(&via).await;
    let store = MemoryStore::new();
    let mut accepted = 0;
    for i in 0..5 {
        let (status, _) = deliver(&amqp, &store, &format!("evt_before_{i}")).await;
        assert_eq!(status, StatusCode::NO_CONTENT);
        accepted += 1;
    }
    proxy.cut();
    let cut_until = Instant::now() + Duration::from_secs(2);
    let mut i = 0;
    while Instant::now() < cut_until {
        let (status, retry_after) = deliver(&amqp, &store, &format!("evt_cut_{i}")).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "during the cut");
        assert!(retry_after);
        i += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    proxy.restore();
    let restored = Instant::now();
    loop {
        let (status, _) = deliver(&amqp, &store, "evt_after").await;
        if status == StatusCode::NO_CONTENT {
            accepted += 1;
            break;
        }
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            restored.elapsed() < Duration::from_secs(5),
            "publishing did not resume within 5 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The deliveries refused during the cut, retried: each published now.
    for j in 0..i {
        let (status, _) = deliver(&amqp, &store, &format!("evt_cut_{j}")).await;
        assert_eq!(status, StatusCode::NO_CONTENT);
        accepted += 1;
    }
    assert_eq!(names.take_all(&names.name).await.len(), accepted);
    names.delete().await;
}

/// A queue of the same name that exists as a classic queue, or a quorum queue with another
/// delivery limit: the build fails naming the queue and the argument that differs.
#[tokio::test]
async fn an_existing_queue_with_other_settings_is_a_clear_error_at_start() {
    let names = Names::new();
    let channel = names.channel().await;
    channel
        .queue_declare(
            names.name.as_str().into(),
            QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
    let error = Amqp::builder(&names.url)
        .with_exchange(&names.name)
        .unwrap()
        .with_queue(&names.name)
        .unwrap()
        .build()
        .await
        .unwrap_err();
    assert_eq!(error.kind(), StoreErrorKind::Other);
    let text = std::error::Error::source(&error).unwrap().to_string();
    assert!(text.contains(&format!("'{}'", names.name)), "{text}");
    assert!(text.contains("inequivalent arg 'x-"), "{text}");
    channel
        .queue_delete(names.name.as_str().into(), QueueDeleteOptions::default())
        .await
        .unwrap();

    let _made = names.amqp().await; // a delivery limit of 20
    let error = Amqp::builder(&names.url)
        .with_exchange(&names.name)
        .unwrap()
        .with_queue(&names.name)
        .unwrap()
        .with_delivery_limit(3)
        .unwrap()
        .build()
        .await
        .unwrap_err();
    let text = std::error::Error::source(&error).unwrap().to_string();
    assert!(text.contains("x-delivery-limit"), "{text}");
    names.delete().await;
}

/// The broker's answers lost on the way back (the publish reaches it, its confirm never
/// does): 503 within the confirm timeout, the claim released; the provider's retry after
/// the connection came back is published — a second message of the same `message_id`,
/// since the first was stored after all (the worker's claim runs it once).
#[tokio::test]
async fn a_confirm_that_never_comes_is_503_within_the_timeout_and_releases_the_claim() {
    let names = Names::new();
    let upstream = names
        .url
        .split('@')
        .nth(1)
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .to_owned();
    let proxy = common::proxy::Proxy::start(upstream).await.unwrap();
    let via = format!("amqp://guest:guest@{}/%2f", proxy.addr());
    let amqp = names.amqp_at(&via).await; // a confirm timeout of 2 s
    let store = MemoryStore::new();
    assert_eq!(
        deliver(&amqp, &store, "evt_warm").await.0,
        StatusCode::NO_CONTENT
    );
    proxy.swallow();
    let started = Instant::now();
    let (status, retry_after) = deliver(&amqp, &store, "evt_late").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(retry_after);
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(2) && waited < Duration::from_secs(4),
        "{waited:?}"
    );
    proxy.cut();
    proxy.restore();
    let restored = Instant::now();
    while deliver(&amqp, &store, "evt_late").await.0 != StatusCode::NO_CONTENT {
        assert!(
            restored.elapsed() < Duration::from_secs(5),
            "no retry published"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let messages = names.take_all(&names.name).await;
    let ids: Vec<_> = messages
        .iter()
        .map(|m| {
            m.delivery
                .properties
                .message_id()
                .as_ref()
                .map(|id| id.to_string())
        })
        .collect();
    let late = Some("8:standard:evt_late".to_owned());
    assert_eq!(
        ids,
        [Some("8:standard:evt_warm".to_owned()), late.clone(), late]
    );
    names.delete().await;
}

/// The queue full (`with_max_length(2)`, with the queue's `reject-publish`): the broker
/// nacks, which is a 503 with `Retry-After` that releases the claim; once the messages
/// were taken, the retry is published, once. (A `max-length` set by policy instead once
/// left RabbitMQ 3.10.8 answering nothing at all: the bound is the queue's argument.)
#[tokio::test]
async fn a_nack_is_503_and_its_retry_is_published_once_the_queue_takes_it() {
    let names = Names::new();
    assert!(Amqp::builder(&names.url).with_max_length(0).is_err());
    let amqp = Amqp::builder(&names.url)
        .with_exchange(&names.name)
        .unwrap()
        .with_queue(&names.name)
        .unwrap()
        .with_max_length(2)
        .unwrap()
        .with_confirm_timeout(Duration::from_secs(2))
        .unwrap()
        .build()
        .await
        .unwrap();
    let store = MemoryStore::new();
    // A quorum queue applies its bound a little late: a few may fit past it.
    let mut fitted = 0;
    let refused = loop {
        let id = format!("evt_fill_{fitted}");
        let (status, retry_after) = deliver(&amqp, &store, &id).await;
        if status == StatusCode::SERVICE_UNAVAILABLE {
            assert!(retry_after);
            break id;
        }
        assert_eq!(status, StatusCode::NO_CONTENT);
        fitted += 1;
        assert!(fitted < 50, "a queue bounded to 2 took {fitted}");
    };
    assert!(fitted >= 2, "refused before the bound: {fitted}");
    let mut taken = names.take_all(&names.name).await;
    assert_eq!(taken.len(), fitted, "each 204 stored");
    // The queue's length reaches the publishers' side shortly after the messages left.
    let emptied = Instant::now();
    while deliver(&amqp, &store, &refused).await.0 != StatusCode::NO_CONTENT {
        assert!(
            emptied.elapsed() < Duration::from_secs(10),
            "the retry never published"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    taken.extend(names.take_all(&names.name).await);
    let full: Vec<_> = taken
        .iter()
        .filter(|m| header(m, "Webhook-Id").as_deref() == Some(refused.as_str()))
        .collect();
    assert_eq!(
        full.len(),
        1,
        "the nacked publish was not stored; its retry was"
    );
    names.delete().await;
}

/// Many accepts at once on the one publishing channel: each confirmed for itself, every
/// one a message, none twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_accepts_are_each_confirmed_and_each_one_message() {
    let names = Names::new();
    let amqp = names.amqp().await;
    let accepts = (0..200).map(|i| {
        let amqp = amqp.clone();
        tokio::spawn(async move { amqp.accept(&event(&format!("evt_{i}"))).await })
    });
    for accepted in futures_util::future::join_all(accepts).await {
        assert_eq!(accepted.unwrap().unwrap(), Accepted::New);
    }
    assert_eq!(amqp.counts().await.unwrap().queued, 200);
    let mut ids: Vec<_> = names
        .take_all(&names.name)
        .await
        .iter()
        .map(|m| header(m, "Webhook-Id").unwrap())
        .collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 200);
    names.delete().await;
}
