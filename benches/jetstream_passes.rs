//! What a message a processor does not take costs its JetStream worker with fan-out: the
//! drain rate of `billing` (a filter of `invoice.*`, 8 processors, claims in a
//! `MemoryStore`) over events it runs (`invoice.paid`, a no-op processor) and over events
//! it passes unrun (`charge.refunded`: each recorded in its bucket of passes as it is
//! acknowledged), as a ratio in the same run.
//!
//! ```sh
//! bash .ci/services                                            # NATS, if it is not running
//! cargo bench --all-features --bench jetstream_passes          # 2 000 events a round
//! PASSES_EVENTS=5000 PASSES_ROUNDS=5 cargo bench --all-features --bench jetstream_passes
//! ```
//!
//! Each round publishes the events to a fresh stream (file storage, as the builder's
//! default) with the processors `default` and `billing`, then times `billing`'s worker
//! from its start until its consumer has nothing queued or unacknowledged, for each kind
//! of event in turn. The medians of the rounds are printed with their ratio.

mod support;

use std::time::Duration;

use support::{env, event};
use tower_webhook::inbox::jetstream::{JetStream, JetStreamWorker};
use tower_webhook::inbox::{Attempt, ProcessorSpec};
use tower_webhook::store::MemoryStore;
use tower_webhook::Event;

/// The kinds of event: the name printed, and the type.
const KINDS: [(&str, &str); 2] = [
    ("runs every event", "invoice.paid"),
    ("passes every event", "charge.refunded"),
];

/// Publishes `n` events of `event_type` to a fresh stream and times `billing`'s worker
/// draining them.
async fn drain(url: &str, n: usize, event_type: &str) -> Duration {
    let client = async_nats::connect(url)
        .await
        .expect("NATS with JetStream must be running (.ci/services starts it)");
    let name = format!("tw_bench_{}", uuid::Uuid::new_v4().simple());
    let billing = ProcessorSpec::new("billing").unwrap();
    let billing = billing.with_types(["invoice.*"]).unwrap();
    let jetstream = JetStream::builder(client, &name)
        .with_processors([ProcessorSpec::default_processor(), billing])
        .unwrap()
        .build()
        .await
        .unwrap();
    for i in 0..n {
        let id = format!("evt_{i}");
        let event = event(&id, event_type, &id);
        jetstream.accept(&event).await.unwrap();
    }
    let processor = |_: Event, _: Attempt| async { Ok::<_, std::convert::Infallible>(()) };
    let worker = JetStreamWorker::processor(&jetstream, "billing", MemoryStore::new(), processor)
        .unwrap()
        .with_concurrency(8)
        .unwrap()
        .with_poll_interval(Duration::from_millis(100))
        .unwrap();
    support::drained(&jetstream, worker, async || {
        let by = jetstream.counts_by_processor().await.unwrap();
        by["billing"].queued + by["billing"].processing == 0
    })
    .await
}

fn main() {
    let url = support::nats_url();
    let (n, rounds) = (env("PASSES_EVENTS", 2000), env("PASSES_ROUNDS", 3));
    let names: Vec<&str> = KINDS.iter().map(|k| k.0).collect();
    let medians = support::medians(rounds, &names, |i| drain(&url, n, KINDS[i].1));
    println!("{n} events, {rounds} rounds, billing's worker of 8 processors (medians):");
    for ((kind, _), t) in KINDS.iter().zip(&medians) {
        let rate = n as f64 / t.as_secs_f64();
        let ratio = medians[0].as_secs_f64() / t.as_secs_f64();
        println!("  {kind:<20} {rate:>8.0} events/s  ({ratio:.2} of running every event)");
    }
}
