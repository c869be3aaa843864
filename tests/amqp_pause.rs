//! Pauses on RabbitMQ against a real broker (127.0.0.1:5672, or `AMQP_URL`): a paused
//! event is parked in `<queue>-paused` and never runs, a resume runs each once, a pause by
//! type holds that type only, a worker of another `Amqp` (another process's) honours a
//! pause made through the first, and a worker restarted while events are parked loses
//! none. Each test has an exchange and queues of its own, deleted when it ends well.
#![cfg(feature = "amqp")]

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{amqp_url, eventually};
use tower_webhook::inbox::amqp::{Amqp, AmqpWorker};
use tower_webhook::inbox::{Attempt, Processor, WorkerHandle};
use tower_webhook::store::MemoryStore;
use tower_webhook::Event;

/// An exchange and queue of this test's own.
async fn amqp() -> Amqp {
    let name = common::amqp::name();
    Amqp::builder(&amqp_url())
        .with_exchange(&name)
        .unwrap()
        .with_queue(&name)
        .unwrap()
        .build()
        .await
        .unwrap()
}

/// A second connection to the same exchange and queue (another process's).
async fn again(amqp: &Amqp) -> Amqp {
    Amqp::builder(&amqp_url())
        .with_exchange(amqp.exchange())
        .unwrap()
        .with_queue(amqp.queue())
        .unwrap()
        .build()
        .await
        .unwrap()
}

/// A verified event `id` of type `event_type` (source `standard`).
fn event(id: &str, event_type: &str) -> Event {
    let body = format!(r#"{{"type":"{event_type}","data":{{"object":{{"id":"o_{id}"}}}}}}"#);
    common::signed_event(id, body)
}

/// Each event's attempts, by number.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<HashMap<String, Vec<u32>>>>);

impl Seen {
    fn processor(&self) -> impl Processor {
        let seen = self.clone();
        move |e: Event, a: Attempt| {
            let seen = seen.clone();
            async move {
                let mut runs = seen.0.lock().unwrap();
                let id = e.id().unwrap().to_owned();
                runs.entry(id).or_default().push(a.number());
                Ok::<(), String>(())
            }
        }
    }

    fn of(&self, id: &str) -> Vec<u32> {
        self.0.lock().unwrap().get(id).cloned().unwrap_or_default()
    }

    fn ran(&self) -> usize {
        self.0.lock().unwrap().len()
    }
}

fn worker(amqp: &Amqp, seen: &Seen) -> WorkerHandle {
    AmqpWorker::new(amqp, MemoryStore::new(), seen.processor()).spawn()
}

fn ids(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}_{i}")).collect()
}

async fn accept(amqp: &Amqp, ids: &[String], event_type: &str) {
    for id in ids {
        amqp.accept(&event(id, event_type)).await.unwrap();
    }
}

async fn paused(amqp: &Amqp) -> u64 {
    amqp.counts().await.unwrap().paused
}

/// Long enough for a worker to have run what it was free to run.
async fn a_while() {
    tokio::time::sleep(Duration::from_millis(800)).await;
}

#[tokio::test]
async fn a_paused_event_is_parked_and_a_resume_runs_each_once() {
    let amqp = amqp().await;
    let seen = Seen::default();
    let running = worker(&amqp, &seen);
    assert!(amqp.pause(None, None).await.unwrap());
    assert!(!amqp.pause(None, None).await.unwrap(), "paused already");
    let pauses = amqp.pauses().await.unwrap();
    assert_eq!(pauses.len(), 1);
    assert_eq!(
        (pauses[0].source.as_deref(), pauses[0].event_type.as_deref()),
        (None, None)
    );
    // Accepted right after the pause returned: none may start.
    let ids = ids("evt_held", 8);
    accept(&amqp, &ids, "order.paid").await;
    eventually("all parked", async || paused(&amqp).await == 8).await;
    a_while().await;
    assert_eq!(seen.ran(), 0, "a paused event ran");
    let counts = amqp.counts().await.unwrap();
    assert_eq!((counts.queued, counts.paused), (0, 8));
    assert!(amqp.resume(None, None).await.unwrap());
    assert!(
        !amqp.resume(None, None).await.unwrap(),
        "no such pause any more"
    );
    eventually("all ran", async || seen.ran() == ids.len()).await;
    a_while().await;
    for id in &ids {
        // Parking was no attempt: each runs once, as its first.
        assert_eq!(seen.of(id), vec![1], "{id}");
    }
    assert_eq!(paused(&amqp).await, 0);
    assert!(amqp.pauses().await.unwrap().is_empty());
    running.shutdown().await;
    amqp.delete().await.unwrap();
}

#[tokio::test]
async fn a_pause_by_type_holds_only_that_type() {
    let amqp = amqp().await;
    let seen = Seen::default();
    let running = worker(&amqp, &seen);
    assert!(amqp.pause(None, Some("invoice.paid")).await.unwrap());
    let (held, free) = (ids("evt_invoice", 4), ids("evt_charge", 4));
    accept(&amqp, &held, "invoice.paid").await;
    accept(&amqp, &free, "charge.succeeded").await;
    eventually("the other type ran", async || {
        free.iter().all(|id| seen.of(id) == vec![1])
    })
    .await;
    eventually("the paused type parked", async || paused(&amqp).await == 4).await;
    a_while().await;
    assert!(
        held.iter().all(|id| seen.of(id).is_empty()),
        "a paused type ran"
    );
    // Another rule's resume does not end it.
    assert!(!amqp.resume(Some("standard"), None).await.unwrap());
    assert!(amqp.resume(None, Some("invoice.paid")).await.unwrap());
    eventually("the paused type ran", async || seen.ran() == 8).await;
    a_while().await;
    for id in held.iter().chain(&free) {
        assert_eq!(seen.of(id), vec![1], "{id}");
    }
    running.shutdown().await;
    amqp.delete().await.unwrap();
}

#[tokio::test]
async fn another_processs_worker_honours_a_pause_made_by_the_first() {
    let first = amqp().await;
    let second = again(&first).await;
    let seen = Seen::default();
    // Already running (tailing the pauses) when the pause is made elsewhere.
    let running = worker(&second, &seen);
    first
        .accept(&event("evt_before", "order.paid"))
        .await
        .unwrap();
    eventually("ran before the pause", async || seen.ran() == 1).await;
    assert!(first.pause(Some("standard"), None).await.unwrap());
    let ids = ids("evt_other", 6);
    accept(&first, &ids, "order.paid").await;
    eventually("parked by the other worker", async || {
        paused(&first).await == 6
    })
    .await;
    a_while().await;
    assert_eq!(
        seen.ran(),
        1,
        "the other process's worker ran a paused event"
    );
    let pauses = second.pauses().await.unwrap();
    assert_eq!(pauses.len(), 1);
    assert_eq!(pauses[0].source.as_deref(), Some("standard"));
    // A worker started while paused honours it too.
    let third = again(&first).await;
    let late = worker(&third, &seen);
    first
        .accept(&event("evt_late", "order.paid"))
        .await
        .unwrap();
    eventually("parked", async || paused(&first).await == 7).await;
    a_while().await;
    assert_eq!(seen.ran(), 1);
    assert!(first.resume(Some("standard"), None).await.unwrap());
    eventually("all ran", async || seen.ran() == 8).await;
    a_while().await;
    for id in ids
        .iter()
        .map(String::as_str)
        .chain(["evt_before", "evt_late"])
    {
        assert_eq!(seen.of(id), vec![1], "{id}");
    }
    running.shutdown().await;
    late.shutdown().await;
    drop((second, third));
    first.delete().await.unwrap();
}

#[tokio::test]
async fn a_worker_restarted_while_events_are_parked_loses_none() {
    let amqp = amqp().await;
    let seen = Seen::default();
    let running = worker(&amqp, &seen);
    assert!(amqp.pause(None, Some("order.paid")).await.unwrap());
    let ids = ids("evt_parked", 10);
    accept(&amqp, &ids, "order.paid").await;
    eventually("all parked", async || paused(&amqp).await == 10).await;
    running.shutdown().await;
    // Another process: the pause still holds, what is parked stays parked.
    let restarted = again(&amqp).await;
    drop(amqp);
    let (amqp, running) = (restarted.clone(), worker(&restarted, &seen));
    a_while().await;
    assert_eq!(seen.ran(), 0);
    assert_eq!(paused(&amqp).await, 10);
    assert!(amqp.resume(None, Some("order.paid")).await.unwrap());
    eventually("all ran", async || seen.ran() == 10).await;
    a_while().await;
    for id in &ids {
        assert_eq!(seen.of(id), vec![1], "{id}");
    }
    assert_eq!(paused(&amqp).await, 0);
    running.shutdown().await;
    amqp.delete().await.unwrap();
}

#[tokio::test]
async fn parked_events_go_back_in_the_order_they_were_parked() {
    let amqp = amqp().await;
    let order = Arc::new(Mutex::new(Vec::new()));
    let ran = order.clone();
    let processor = move |e: Event, _: Attempt| {
        let ran = ran.clone();
        async move {
            ran.lock().unwrap().push(e.id().unwrap().to_owned());
            Ok::<(), String>(())
        }
    };
    let running = AmqpWorker::new(&amqp, MemoryStore::new(), processor)
        .with_concurrency(1)
        .unwrap()
        .spawn();
    assert!(amqp.pause(None, None).await.unwrap());
    let ids = ids("evt_order", 12);
    accept(&amqp, &ids, "order.paid").await;
    eventually("all parked", async || paused(&amqp).await == 12).await;
    assert!(amqp.resume(None, None).await.unwrap());
    eventually("all ran", async || order.lock().unwrap().len() == 12).await;
    assert_eq!(*order.lock().unwrap(), ids, "in the order they were parked");
    running.shutdown().await;
    amqp.delete().await.unwrap();
}

#[tokio::test]
async fn a_parked_event_keeps_the_attempts_it_had() {
    let amqp = amqp().await;
    let seen = Seen::default();
    let attempts = seen.clone();
    // The first attempt fails; the retry waits out its backoff, comes back paused, and
    // is parked: after the resume it runs as the second attempt.
    let processor = move |e: Event, a: Attempt| {
        let attempts = attempts.clone();
        async move {
            let mut runs = attempts.0.lock().unwrap();
            runs.entry(e.id().unwrap().to_owned())
                .or_default()
                .push(a.number());
            match a.number() {
                1 => Err("not yet".to_owned()),
                _ => Ok(()),
            }
        }
    };
    let running = AmqpWorker::new(&amqp, MemoryStore::new(), processor)
        .with_backoff(Duration::from_millis(800), Duration::from_millis(800))
        .unwrap()
        .spawn();
    amqp.accept(&event("evt_retried", "order.paid"))
        .await
        .unwrap();
    eventually("the first attempt", async || {
        seen.of("evt_retried") == vec![1]
    })
    .await;
    assert!(amqp.pause(None, None).await.unwrap());
    eventually("parked", async || paused(&amqp).await == 1).await;
    a_while().await;
    assert_eq!(seen.of("evt_retried"), vec![1]);
    assert!(amqp.resume(None, None).await.unwrap());
    eventually("the second attempt", async || {
        seen.of("evt_retried").len() == 2
    })
    .await;
    a_while().await;
    assert_eq!(seen.of("evt_retried"), vec![1, 2], "parking was no attempt");
    running.shutdown().await;
    amqp.delete().await.unwrap();
}

/// The queues that hold messages — parked, dead, the pauses' count — carry an explicit
/// delivery limit: RabbitMQ 4.0–4.2 would put 20 on them, counting each time an unpark
/// or a listing held a message and handed it back, and drop it at 20. Declared again
/// with the crate's limit they are equivalent; without one, the broker names the
/// argument that differs.
#[tokio::test]
async fn the_queues_that_hold_messages_carry_a_delivery_limit_past_any_count() {
    use lapin::options::QueueDeclareOptions;
    use lapin::types::{AMQPValue, FieldTable, LongString};
    let amqp = amqp().await;
    let queue = amqp.queue().to_owned();
    let quorum = |limit: Option<i64>| {
        let mut args = FieldTable::default();
        args.insert(
            "x-queue-type".into(),
            AMQPValue::LongString(LongString::from("quorum")),
        );
        if let Some(limit) = limit {
            args.insert("x-delivery-limit".into(), AMQPValue::LongLongInt(limit));
        }
        args
    };
    let durable = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    for held in ["paused", "dead", "pauses-seq"] {
        let name = format!("{queue}-{held}");
        let channel = common::amqp::raw_channel().await;
        let same = channel.queue_declare(
            name.as_str().into(),
            durable,
            quorum(Some(i64::from(i32::MAX))),
        );
        same.await.unwrap_or_else(|e| panic!("{name}: {e}"));
        let without = channel.queue_declare(name.as_str().into(), durable, quorum(None));
        let error = without.await.unwrap_err().to_string();
        assert!(error.contains("x-delivery-limit"), "{name}: {error}");
    }
    amqp.delete().await.unwrap();
}

/// A pause's record is one publish to the fanout exchange `<queue>-pauses`, routed to the
/// stream and to the count alike, so no record lands without its count (two publishes
/// could fail between them, leaving the count short for good and a later pause unheld
/// for a moment after it returned). One published there by hand is both replayed
/// (listed) and counted.
#[tokio::test]
async fn a_pause_record_is_one_publish_routed_to_the_stream_and_to_its_count() {
    use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions};
    use lapin::types::{AMQPValue, FieldTable, LongString};
    let amqp = amqp().await;
    assert!(amqp.pause(Some("first"), None).await.unwrap());
    let channel = common::amqp::raw_channel().await;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let mut headers = FieldTable::default();
    for (name, value) in [("op", "pause"), ("source", "by_hand")] {
        headers.insert(name.into(), AMQPValue::LongString(LongString::from(value)));
    }
    let exchange = format!("{}-pauses", amqp.queue());
    let properties = lapin::BasicProperties::default().with_headers(headers);
    let options = BasicPublishOptions {
        mandatory: true,
        ..BasicPublishOptions::default()
    };
    let published = channel
        .basic_publish(
            exchange.as_str().into(),
            "".into(),
            options,
            &[],
            properties,
        )
        .await
        .unwrap_or_else(|e| panic!("{exchange}: {e}"));
    assert_eq!(published.await.unwrap(), lapin::Confirmation::Ack(None));

    let count = format!("{}-pauses-seq", amqp.queue());
    let passive = QueueDeclareOptions {
        passive: true,
        ..QueueDeclareOptions::default()
    };
    let counted = channel
        .queue_declare(count.as_str().into(), passive, FieldTable::default())
        .await
        .unwrap();
    assert_eq!(counted.message_count(), 2, "each record counted once");
    let mut sources: Vec<_> = (amqp.pauses().await.unwrap().into_iter())
        .filter_map(|p| p.source)
        .collect();
    sources.sort();
    assert_eq!(sources, ["by_hand", "first"]);
    amqp.delete().await.unwrap();
}

/// A worker that cannot read the pauses' log (its queue deleted here; a broker that cannot
/// answer alike) starts none of its events, and says so:
/// `tower_webhook_inbox_held_back_total{rule="pauses_unread"}` counts each event held,
/// each try. Once the log is back (declared again), each runs once, as its first attempt.
#[cfg(feature = "metrics")]
#[tokio::test]
async fn a_worker_that_cannot_read_the_pauses_starts_nothing_and_counts_it() {
    use lapin::options::QueueDeleteOptions;
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let held = std::cell::Cell::new(0u64);
    // Snapshots hand over the counts since the one before: added up here.
    let unread = || {
        for (key, _, _, value) in snapshotter.snapshot().into_vec() {
            let key = key.key();
            let rule = key
                .labels()
                .any(|l| l.key() == "rule" && l.value() == "pauses_unread");
            if let (true, DebugValue::Counter(n)) = (rule, value) {
                assert_eq!(key.name(), "tower_webhook_inbox_held_back_total");
                held.set(held.get() + n);
            }
        }
        held.get()
    };
    let amqp = amqp().await;
    let log = format!("{}-pauses-seq", amqp.queue());
    let channel = common::amqp::raw_channel().await;
    let options = QueueDeleteOptions::default();
    channel
        .queue_delete(log.as_str().into(), options)
        .await
        .unwrap();
    let seen = Seen::default();
    let running = worker(&amqp, &seen);
    let ids = ids("evt_unread", 3);
    accept(&amqp, &ids, "order.paid").await;
    eventually("each held, twice", async || unread() >= 6).await;
    assert_eq!(seen.ran(), 0, "an event ran while the pauses were unknown");
    let _declared = again(&amqp).await; // declares the topology, the log among it
    eventually("all ran", async || seen.ran() == ids.len()).await;
    a_while().await;
    for id in &ids {
        assert_eq!(seen.of(id), vec![1], "{id}");
    }
    running.shutdown().await;
    amqp.delete().await.unwrap();
}
