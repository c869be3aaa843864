//! An `AmqpWorker` across a RabbitMQ restart (`rabbitmqctl stop_app`, then `start_app`)
//! under a stream of events: it consumes again within 5 s of the broker's return, on the
//! crate's own reconnection, and no event is lost or run twice — the events running at the
//! stop finish, their acknowledgements lost with the channel, and are acknowledged unrun
//! when delivered again (their keys are done in the claim store).
//!
//! A binary of its own, with one test: `cargo test` runs binaries one after another, so no
//! other test of the crate sees the broker go away. Needs `rabbitmqctl` for the broker at
//! `AMQP_URL` (the local one, as `.ci/services` starts it); the broker is started again and
//! awaited however the test ends.
#![cfg(feature = "amqp")]

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::amqp::{rabbitmqctl, Restart};
use common::{amqp_url, paid_event};
use tokio::time::Instant;
use tower_webhook::inbox::amqp::{Amqp, AmqpWorker};
use tower_webhook::inbox::Attempt;
use tower_webhook::store::MemoryStore;
use tower_webhook::Event;

/// Each event's runs: when each started.
type Runs = Arc<Mutex<HashMap<String, Vec<Instant>>>>;

async fn eventually(what: &str, limit: Duration, mut check: impl AsyncFnMut() -> bool) {
    let until = Instant::now() + limit;
    while Instant::now() < until {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for: {what}");
}

/// Accepts `id`, asking again (as a provider retries) while the broker cannot confirm.
async fn accept(amqp: &Amqp, id: &str) {
    let until = Instant::now() + Duration::from_secs(30);
    while amqp.accept(&paid_event(id)).await.is_err() {
        assert!(Instant::now() < until, "{id} not accepted within 30 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_worker_consumes_again_within_5_s_of_a_broker_restart_and_loses_or_doubles_nothing() {
    let name = common::amqp::name();
    let amqp = common::amqp::named(&amqp_url(), &name).await;
    let runs: Runs = Arc::default();
    let record = runs.clone();
    let processor = move |e: Event, _: Attempt| {
        let record = record.clone();
        async move {
            let id = e.id().unwrap().to_owned();
            record
                .lock()
                .unwrap()
                .entry(id)
                .or_default()
                .push(Instant::now());
            tokio::time::sleep(Duration::from_millis(20)).await;
            Ok::<(), String>(())
        }
    };
    let worker = AmqpWorker::new(&amqp, MemoryStore::new(), processor)
        .with_concurrency(4)
        .unwrap()
        .spawn();
    let before: Vec<String> = (0..120).map(|i| format!("evt_before_{i}")).collect();
    for id in &before {
        accept(&amqp, id).await;
    }
    // Stopped while events run: 120 at 4 × 20 ms take about 600 ms.
    eventually("some processed", Duration::from_secs(10), async || {
        runs.lock().unwrap().len() >= 20
    })
    .await;
    let restart = Restart;
    rabbitmqctl(&["stop_app"]);
    let stopped_with = runs.lock().unwrap().len();
    assert!(stopped_with < before.len(), "stopped mid-stream");
    tokio::time::sleep(Duration::from_secs(1)).await;
    rabbitmqctl(&["start_app"]);
    drop(restart); // and awaited
    let back = Instant::now();
    let after: Vec<String> = (0..20).map(|i| format!("evt_after_{i}")).collect();
    for id in &after {
        accept(&amqp, id).await;
    }
    let all: Vec<String> = before.iter().chain(&after).cloned().collect();
    eventually("all processed", Duration::from_secs(30), async || {
        let runs = runs.lock().unwrap();
        all.iter().all(|id| runs.contains_key(id))
    })
    .await;
    // The first run that started after the broker's return: consuming resumed by then.
    let resumed = {
        let runs = runs.lock().unwrap();
        let starts = runs.values().flatten().filter(|&&at| at >= back);
        starts.min().copied().expect("runs after the return")
    };
    assert!(
        resumed - back < Duration::from_secs(5),
        "consuming resumed {:?} after the broker's return",
        resumed - back
    );
    eventually("all acknowledged", Duration::from_secs(30), async || {
        amqp.counts()
            .await
            .is_ok_and(|c| (c.queued, c.processing, c.dead) == (0, 0, 0))
    })
    .await;
    let shutdown = tokio::time::timeout(Duration::from_secs(20), worker.shutdown());
    assert!(
        shutdown.await.is_ok(),
        "the worker's shutdown returns after the restart"
    );
    let runs = runs.lock().unwrap().clone();
    let lost = all.iter().filter(|id| !runs.contains_key(*id)).count();
    let doubled: Vec<_> = runs
        .iter()
        .filter(|(_, r)| r.len() > 1)
        .map(|(id, _)| id)
        .collect();
    assert_eq!(lost, 0, "every accepted event processed");
    assert!(doubled.is_empty(), "each run once: {doubled:?}");
    assert_eq!(runs.len(), all.len(), "nothing else ran");
    amqp.delete().await.unwrap();
}
