//! What `with_per_object(1)` costs a JetStream worker: the drain rate of a no-op processor
//! with the cap off, and with it on — the objects' lines kept in the stream's bucket
//! (written at each pull, read before each event, taken out at each settle) — as a ratio
//! in the same run.
//!
//! ```sh
//! bash .ci/services                                           # NATS, if it is not running
//! cargo bench --all-features --bench jetstream_order          # 2 000 events a round
//! ORDER_EVENTS=5000 ORDER_ROUNDS=5 cargo bench --all-features --bench jetstream_order
//! ORDER_WORK_MS=5 cargo bench --all-features --bench jetstream_order   # a processor of 5 ms
//! ```
//!
//! Each round publishes the events to a fresh stream (file storage, as the builder's
//! default), then times a worker of 8 processors (claims in a `MemoryStore`) from its
//! start until every event was processed, for each setting in turn: the cap off; a cap of
//! 2 (kept in the worker alone), each event its own object; a cap of 1, each event its own
//! object (the lines' bookkeeping alone: no event waits); a cap of 1 over 16 objects (a
//! hot set: an object's events one at a time). The medians of the rounds are printed
//! with their ratio to the cap off.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use support::{env, event};
use tower_webhook::inbox::jetstream::{JetStream, JetStreamWorker};
use tower_webhook::inbox::Attempt;
use tower_webhook::store::MemoryStore;
use tower_webhook::Event;

/// A setting: its name, the per-object cap, and how many objects the events are about
/// (`None`: each its own).
type Setting = (&'static str, Option<u32>, Option<usize>);

const SETTINGS: [Setting; 4] = [
    ("per-object off", None, None),
    ("per-object 2, an object per event", Some(2), None),
    ("per-object 1, an object per event", Some(1), None),
    ("per-object 1, 16 objects", Some(1), Some(16)),
];

/// Publishes `n` events to a fresh stream and times a worker draining them, each taking
/// `work`.
async fn drain(url: &str, (n, work): (usize, Duration), (_, cap, objects): Setting) -> Duration {
    let client = async_nats::connect(url)
        .await
        .expect("NATS with JetStream must be running (.ci/services starts it)");
    let name = format!("tw_bench_{}", uuid::Uuid::new_v4().simple());
    let jetstream = JetStream::builder(client, &name).build().await.unwrap();
    for i in 0..n {
        let object = objects.map_or_else(|| format!("o_{i}"), |k| format!("o_{}", i % k));
        jetstream
            .accept(&event(&format!("evt_{i}"), "bench.event", &object))
            .await
            .unwrap();
    }
    let done = Arc::new(AtomicUsize::new(0));
    let counted = done.clone();
    let processor = move |_: Event, _: Attempt| {
        let counted = counted.clone();
        async move {
            if !work.is_zero() {
                tokio::time::sleep(work).await;
            }
            counted.fetch_add(1, Ordering::Relaxed);
            Ok::<_, std::convert::Infallible>(())
        }
    };
    let mut worker = JetStreamWorker::new(&jetstream, MemoryStore::new(), processor)
        .with_concurrency(8)
        .unwrap()
        .with_poll_interval(Duration::from_millis(100))
        .unwrap();
    if let Some(cap) = cap {
        worker = worker.with_per_object(cap).unwrap();
    }
    support::drained(&jetstream, worker, async || {
        done.load(Ordering::Relaxed) >= n
    })
    .await
}

fn main() {
    let url = support::nats_url();
    let (n, rounds) = (env("ORDER_EVENTS", 2000), env("ORDER_ROUNDS", 3));
    let work = Duration::from_millis(env("ORDER_WORK_MS", 0) as u64);
    let names: Vec<&str> = SETTINGS.iter().map(|s| s.0).collect();
    let medians = support::medians(rounds, &names, |i| drain(&url, (n, work), SETTINGS[i]));
    println!("{n} events, {rounds} rounds, 8 processors, each event {work:?} (medians):");
    for (setting, t) in SETTINGS.iter().zip(&medians) {
        let rate = n as f64 / t.as_secs_f64();
        let ratio = medians[0].as_secs_f64() / t.as_secs_f64();
        println!(
            "  {:<36} {rate:>8.0} events/s  ({ratio:.2} of the cap off)",
            setting.0
        );
    }
}
