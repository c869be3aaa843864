//! RabbitMQ restarted under a running accept (`rabbitmqctl stop_app`, then `start_app`):
//! every delivery while it is down is a 503, never a 2xx; publishing resumes within 5 s of
//! its return on the same `Amqp` (the crate's own reconnection, not lapin's recovery:
//! lapin #450), and every 204 is a message in the quorum queue, which outlived the restart.
//!
//! A binary of its own, with one test: `cargo test` runs binaries one after another, so no
//! other test of the crate sees the broker go away. Needs `rabbitmqctl` for the broker at
//! `AMQP_URL` (the local one, as `.ci/services` starts it).
#![cfg(feature = "amqp")]

mod common;

use std::time::{Duration, Instant};

use common::amqp::{rabbitmqctl, Restart};
use http::StatusCode;
use lapin::options::{BasicGetOptions, QueueDeleteOptions};
use tower_webhook::inbox::amqp::Amqp;
use tower_webhook::store::MemoryStore;

/// One signed delivery through the layers: its status, a 503 always with `Retry-After`.
async fn deliver(amqp: &Amqp, store: &MemoryStore, id: &str) -> StatusCode {
    let (status, retry_after) = common::amqp::deliver(amqp, store, id).await;
    assert!(status != StatusCode::SERVICE_UNAVAILABLE || retry_after);
    status
}

#[tokio::test]
async fn a_broker_restart_is_503_throughout_and_publishing_resumes_within_5_s() {
    let url = common::amqp_url();
    let name = common::amqp::name();
    let amqp = common::amqp::named(&url, &name).await;
    let store = MemoryStore::new();
    let mut accepted = Vec::new();
    for i in 0..5 {
        let id = format!("evt_before_{i}");
        assert_eq!(deliver(&amqp, &store, &id).await, StatusCode::NO_CONTENT);
        accepted.push(id);
    }

    let restart = Restart;
    rabbitmqctl(&["stop_app"]);
    let mut refused = Vec::new();
    let down_until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < down_until {
        let id = format!("evt_down_{}", refused.len());
        let status = deliver(&amqp, &store, &id).await;
        assert_eq!(
            status,
            StatusCode::SERVICE_UNAVAILABLE,
            "while the broker is down"
        );
        refused.push(id);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    rabbitmqctl(&["start_app"]);
    drop(restart);
    let back = Instant::now();
    loop {
        match deliver(&amqp, &store, "evt_back").await {
            StatusCode::NO_CONTENT => break,
            status => assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE),
        }
        assert!(
            back.elapsed() < Duration::from_secs(5),
            "publishing did not resume within 5 s of the broker's return"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    accepted.push("evt_back".to_owned());
    // The provider's retries of what was refused: each published once now.
    for id in &refused {
        assert_eq!(deliver(&amqp, &store, id).await, StatusCode::NO_CONTENT);
    }
    accepted.extend(refused);

    let connection = lapin::Connection::connect(&url, lapin::ConnectionProperties::default())
        .await
        .unwrap();
    let channel = connection.create_channel().await.unwrap();
    let mut ids = Vec::new();
    while let Some(message) = channel
        .basic_get(name.as_str().into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
    {
        let id = message.delivery.properties.message_id().clone().unwrap();
        ids.push(id.to_string());
    }
    let mut want: Vec<_> = accepted
        .iter()
        .map(|id| format!("8:standard:{id}"))
        .collect();
    want.sort();
    ids.sort();
    assert_eq!(ids, want, "every 204 stored once, nothing else");
    let made = ["dead", "paused", "pauses", "pauses-seq"].map(|q| format!("{name}-{q}"));
    for queue in [name.clone()].into_iter().chain(made) {
        let _ = channel
            .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
            .await;
    }
    for exchange in [name.clone(), format!("{name}-dead")] {
        let _ = channel
            .exchange_delete(exchange.as_str().into(), Default::default())
            .await;
    }
}
