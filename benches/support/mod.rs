//! What the JetStream benches share: signed events, settings read from the environment,
//! and rounds that run each setting in turn and keep each one's median.

use std::future::Future;
use std::time::{Duration, Instant, SystemTime};

use tower_webhook::inbox::jetstream::{JetStream, JetStreamWorker};
use tower_webhook::{Event, Scheme, Verifier};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// The variable `name` as a number, else `default`.
pub fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A verified event `id` of `event_type` about `object`, signed now.
pub fn event(id: &str, event_type: &str, object: &str) -> Event {
    let body = format!(r#"{{"type":"{event_type}","data":{{"object":{{"id":"{object}"}}}}}}"#);
    let headers = Scheme::standard()
        .sign([SECRET], id, SystemTime::now(), body.as_bytes())
        .unwrap();
    Verifier::new(Scheme::standard(), [SECRET])
        .unwrap()
        .verify(&headers, body.into())
        .unwrap()
}

/// Times `run(i)` for each of the settings `names` in turn, `rounds` times, on a runtime
/// of two threads; each setting's median. In turn within each round: a machine shared with
/// other work slows them alike.
pub fn medians<F: Future<Output = Duration>>(
    rounds: usize,
    names: &[&str],
    mut run: impl FnMut(usize) -> F,
) -> Vec<Duration> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut took: Vec<Vec<Duration>> = vec![Vec::new(); names.len()];
    runtime.block_on(async {
        for round in 0..rounds {
            for (i, name) in names.iter().enumerate() {
                let t = run(i).await;
                eprintln!("round {round}: {name}: {t:.2?}");
                took[i].push(t);
            }
        }
    });
    let median = |mut v: Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    took.into_iter().map(median).collect()
}

/// The NATS server the benches use (`NATS_URL`, else the local one).
pub fn nats_url() -> String {
    std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned())
}

/// Spawns `worker` and times it until `done` says so (asked every 5 ms); then shuts it
/// down and deletes `jetstream`'s stream.
pub async fn drained(
    jetstream: &JetStream,
    worker: JetStreamWorker,
    mut done: impl AsyncFnMut() -> bool,
) -> Duration {
    let started = Instant::now();
    let worker = worker.spawn();
    while !done().await {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let took = started.elapsed();
    worker.shutdown().await;
    jetstream.clone().delete().await.unwrap();
    took
}
