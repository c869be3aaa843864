//! Fan-out on RabbitMQ against a real broker (127.0.0.1:5672, or `AMQP_URL`): one quorum
//! queue per processor, all bound to the exchange, so one confirmed publish reaches each;
//! a worker per processor with its own retries, dead queue and claim keys; counts per
//! processor. Each test has an exchange and queues of its own, deleted when it ends well.
#![cfg(feature = "amqp")]

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::amqp::raw_channel;
use common::{amqp_url, eventually};
use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;
use tower_webhook::inbox::amqp::{Amqp, AmqpWorker};
use tower_webhook::inbox::{Attempt, Processor, ProcessorSpec, WorkerHandle};
use tower_webhook::store::{MemoryStore, StoreErrorKind};
use tower_webhook::{ConfigErrorKind, Event};

/// A verified event `id` of type `event_type`.
fn typed_event(id: &str, event_type: &str) -> Event {
    let body = format!(r#"{{"type":"{event_type}","data":{{"object":{{"id":"obj_{id}"}}}}}}"#);
    common::signed_event(id, body)
}

/// An exchange and queue of this test's own, fanned out to `processors`.
async fn fanned_out(name: &str, processors: Vec<ProcessorSpec>) -> Amqp {
    Amqp::builder(&amqp_url())
        .with_exchange(name)
        .unwrap()
        .with_queue(name)
        .unwrap()
        .with_processors(processors)
        .unwrap()
        .build()
        .await
        .unwrap()
}

fn billing() -> ProcessorSpec {
    ProcessorSpec::new("billing")
        .unwrap()
        .with_types(["invoice.*"])
        .unwrap()
}

/// Each event's attempts (their numbers), and the runs that succeeded (the effects).
#[derive(Clone, Default)]
struct Seen {
    attempts: Arc<Mutex<HashMap<String, Vec<u32>>>>,
    effects: Arc<Mutex<HashMap<String, u32>>>,
}

impl Seen {
    fn of(&self, id: &str) -> Vec<u32> {
        let attempts = self.attempts.lock().unwrap();
        attempts.get(id).cloned().unwrap_or_default()
    }

    fn effects(&self, id: &str) -> u32 {
        self.effects.lock().unwrap().get(id).copied().unwrap_or(0)
    }

    fn done(&self) -> usize {
        self.effects.lock().unwrap().len()
    }

    /// Records each attempt, works `work`, then fails the attempts `outcome` says fail.
    fn processor(
        &self,
        work: Duration,
        outcome: impl Fn(u32) -> Result<(), String> + Send + Sync + 'static,
    ) -> impl Processor {
        let (seen, outcome) = (self.clone(), Arc::new(outcome));
        move |e: Event, a: Attempt| {
            let (seen, outcome) = (seen.clone(), outcome.clone());
            async move {
                let id = e.id().unwrap().to_owned();
                let attempts = &seen.attempts;
                attempts
                    .lock()
                    .unwrap()
                    .entry(id.clone())
                    .or_default()
                    .push(a.number());
                tokio::time::sleep(work).await;
                let result = outcome(a.number());
                if result.is_ok() {
                    *seen.effects.lock().unwrap().entry(id).or_default() += 1;
                }
                result
            }
        }
    }
}

fn succeed(_: u32) -> Result<(), String> {
    Ok(())
}

/// Fails its first attempt: a transient failure.
fn first_fails(attempt: u32) -> Result<(), String> {
    match attempt {
        1 => Err("the ledger timed out".to_owned()),
        _ => Ok(()),
    }
}

fn always_fails(_: u32) -> Result<(), String> {
    Err("the mail server is down".to_owned())
}

/// `worker`, quick to retry and to look.
fn quick(worker: AmqpWorker) -> AmqpWorker {
    worker
        .with_backoff(Duration::from_millis(100), Duration::from_millis(200))
        .unwrap()
        .with_poll_interval(Duration::from_millis(100))
        .unwrap()
}

/// Each processor's `(queued, processing, dead)`.
async fn counts(amqp: &Amqp) -> Vec<(String, (u64, u64, u64))> {
    let by = amqp.counts_by_processor().await.unwrap();
    by.into_iter()
        .map(|(name, c)| (name, (c.queued, c.processing, c.dead)))
        .collect()
}

fn wanted(each: &[(&str, (u64, u64, u64))]) -> Vec<(String, (u64, u64, u64))> {
    each.iter().map(|(n, c)| ((*n).to_owned(), *c)).collect()
}

/// Whether the queue `name` exists (a passive declare on a channel of its own).
async fn exists(name: &str) -> bool {
    let passive = QueueDeclareOptions {
        passive: true,
        ..QueueDeclareOptions::default()
    };
    let channel = raw_channel().await;
    let declared = channel
        .queue_declare(name.into(), passive, FieldTable::default())
        .await;
    declared.is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processors_run_each_event_they_take_once_and_count_their_own() {
    let name = common::amqp::name();
    let amqp = fanned_out(
        &name,
        vec![
            ProcessorSpec::default_processor(),
            billing(),
            ProcessorSpec::new("ledger").unwrap(),
        ],
    )
    .await;
    // `build` declared every processor's queue and dead queue.
    assert_eq!(amqp.queue_of("default"), name);
    assert_eq!(amqp.queue_of("billing"), format!("{name}-billing"));
    assert_eq!(
        amqp.dead_queue_of("billing"),
        format!("{name}-billing-dead")
    );
    assert_eq!(amqp.dead_queue_of("default"), amqp.dead_queue());
    for processor in ["default", "billing", "ledger"] {
        assert!(exists(&amqp.queue_of(processor)).await, "{processor}");
        assert!(exists(&amqp.dead_queue_of(processor)).await, "{processor}");
    }
    let names: Vec<&str> = amqp.processors().map(ProcessorSpec::name).collect();
    assert_eq!(names, ["default", "billing", "ledger"]);
    assert!(amqp.has_processor("ledger") && !amqp.has_processor("email"));
    // Published before any worker started, each event twice (two messages: a provider's
    // retry without the dedupe layer): one confirmed publish reaches every queue.
    let ids: Vec<String> = (0..12).map(|i| format!("evt_{i}")).collect();
    let invoices: Vec<&String> = ids.iter().step_by(3).collect();
    for id in ids.iter().chain(&ids) {
        let ty = match invoices.contains(&id) {
            true => "invoice.paid",
            false => "customer.created",
        };
        amqp.accept(&typed_event(id, ty)).await.unwrap();
    }
    let n = 2 * ids.len() as u64;
    assert_eq!(
        counts(&amqp).await,
        wanted(&[
            ("billing", (n, 0, 0)),
            ("default", (n, 0, 0)),
            ("ledger", (n, 0, 0))
        ])
    );
    let sum = amqp.counts().await.unwrap();
    assert_eq!((sum.queued, sum.processing, sum.dead), (3 * n, 0, 0));
    // One store for every processor: the claim keys are each processor's own.
    let store = MemoryStore::new();
    let (all, billed, ledger) = (Seen::default(), Seen::default(), Seen::default());
    let workers = [
        quick(AmqpWorker::new(
            &amqp,
            store.clone(),
            all.processor(Duration::ZERO, succeed),
        ))
        .spawn(),
        // Each of `processor`'s variants but `at_least_once_processor` (a test below).
        quick(
            AmqpWorker::from_arc_processor(
                &amqp,
                "billing",
                Arc::new(store.clone()),
                billed.processor(Duration::ZERO, succeed),
            )
            .unwrap(),
        )
        .spawn(),
        quick(
            AmqpWorker::processor(
                &amqp,
                "ledger",
                store.clone(),
                ledger.processor(Duration::ZERO, first_fails),
            )
            .unwrap(),
        )
        .spawn(),
    ];
    eventually("every processor done", async || {
        all.done() == ids.len() && ledger.done() == ids.len() && billed.done() == invoices.len()
    })
    .await;
    let drained = wanted(&[
        ("billing", (0, 0, 0)),
        ("default", (0, 0, 0)),
        ("ledger", (0, 0, 0)),
    ]);
    eventually("every queue drained", async || {
        counts(&amqp).await == drained
    })
    .await;
    // A quiet while: nothing runs again.
    tokio::time::sleep(Duration::from_millis(500)).await;
    for worker in workers {
        worker.shutdown().await;
    }
    for id in &ids {
        assert_eq!((all.of(id), all.effects(id)), (vec![1], 1), "default, {id}");
        // Each of its two messages may fail its first attempt before a second ran it:
        // its effect is once.
        let tried = ledger.of(id);
        assert_eq!(ledger.effects(id), 1, "ledger ran {id} once: {tried:?}");
        assert!(
            matches!(tried[..], [1, 2] | [1, 1, 2]),
            "ledger failed {id}, then ran it: {tried:?}"
        );
        let (attempts, effects) = match invoices.contains(&id) {
            true => (vec![1], 1),
            false => (vec![], 0), // its filter excludes the type: acknowledged unrun
        };
        assert_eq!(
            (billed.of(id), billed.effects(id)),
            (attempts, effects),
            "billing, {id}"
        );
    }
    assert_eq!(counts(&amqp).await, drained);
    amqp.delete().await.unwrap();
    for processor in ["default", "billing", "ledger"] {
        assert!(!exists(&format!("{name}-{processor}")).await, "deleted");
    }
    assert!(!exists(&name).await, "deleted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_processors_failures_and_slowness_do_not_hold_the_others() {
    let name = common::amqp::name();
    let amqp = fanned_out(
        &name,
        vec![
            ProcessorSpec::default_processor(),
            ProcessorSpec::new("slow").unwrap(),
            ProcessorSpec::new("failing").unwrap(),
        ],
    )
    .await;
    let ids: Vec<String> = (0..10).map(|i| format!("evt_{i}")).collect();
    for id in &ids {
        amqp.accept(&typed_event(id, "invoice.paid")).await.unwrap();
    }
    let store = MemoryStore::new();
    let (all, slow, failing) = (Seen::default(), Seen::default(), Seen::default());
    let started = tokio::time::Instant::now();
    let workers = [
        quick(AmqpWorker::new(
            &amqp,
            store.clone(),
            all.processor(Duration::ZERO, succeed),
        ))
        .spawn(),
        // One at a time, 3 s a run: its queue stays full for 30 s.
        quick(
            AmqpWorker::processor(
                &amqp,
                "slow",
                store.clone(),
                slow.processor(Duration::from_secs(3), succeed),
            )
            .unwrap(),
        )
        .with_concurrency(1)
        .unwrap()
        .spawn(),
        quick(
            AmqpWorker::at_least_once_processor(
                &amqp,
                "failing",
                failing.processor(Duration::ZERO, always_fails),
            )
            .unwrap(),
        )
        .with_max_attempts(2)
        .unwrap()
        .spawn(),
    ];
    let n = ids.len() as u64;
    eventually("default done, failing's all dead", async || {
        let by = counts(&amqp).await;
        all.done() == ids.len() && by[0].1 .0 == 0 && by[1].1 == (0, 0, n)
    })
    .await;
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "held: {:?}",
        started.elapsed()
    );
    let by = amqp.counts_by_processor().await.unwrap();
    let slow_left = by["slow"].queued;
    assert!(
        slow_left >= n - 4,
        "slow is still at it: {slow_left} queued"
    );
    assert!(slow.done() <= 3, "slow ran {}", slow.done());
    assert_eq!((by["default"].queued, by["default"].dead), (0, 0));
    for id in &ids {
        assert_eq!(all.of(id), [1], "default ran {id} once");
        assert_eq!(failing.of(id), [1, 2], "failing tried {id} twice");
    }
    // Its dead are in its own dead queue only.
    let sum = amqp.counts().await.unwrap();
    assert_eq!(sum.dead, n, "only failing's");
    for worker in workers {
        worker.shutdown().await;
    }
    amqp.delete().await.unwrap();
}

#[tokio::test]
async fn an_unknown_or_clashing_processor_is_refused_and_a_publish_no_queue_takes_fails() {
    let name = common::amqp::name();
    let clashes = [
        vec![
            ProcessorSpec::default_processor(),
            ProcessorSpec::new("dead").unwrap(),
        ],
        vec![
            ProcessorSpec::new("a").unwrap(),
            ProcessorSpec::new("a-dead").unwrap(),
        ],
        vec![
            ProcessorSpec::new("retry-800").unwrap(),
            billing(),
            billing(),
        ],
    ];
    for processors in clashes {
        let refused = Amqp::builder(&amqp_url())
            .with_queue(&name)
            .unwrap()
            .with_processors(processors)
            .unwrap_err();
        assert_eq!(refused.kind(), ConfigErrorKind::InvalidProcessor);
    }
    // Set before a queue name that leaves no room for the processor's delay queues.
    let long = Amqp::builder(&amqp_url())
        .with_processors([ProcessorSpec::new("p".repeat(64)).unwrap()])
        .unwrap()
        .with_queue(&"q".repeat(200));
    assert_eq!(long.unwrap_err().kind(), ConfigErrorKind::InvalidProcessor);

    let amqp = fanned_out(&name, vec![billing(), ProcessorSpec::new("email").unwrap()]).await;
    // `default` is not configured: no queue of its own.
    assert!(!exists(&name).await);
    let store = MemoryStore::new();
    let nope = [
        AmqpWorker::processor(
            &amqp,
            "nope",
            store.clone(),
            Seen::default().processor(Duration::ZERO, succeed),
        )
        .err(),
        AmqpWorker::at_least_once_processor(
            &amqp,
            "default",
            Seen::default().processor(Duration::ZERO, succeed),
        )
        .err(),
    ];
    for refused in nope {
        let refused = refused.expect("an unknown processor");
        assert_eq!(refused.kind(), ConfigErrorKind::InvalidProcessor);
    }
    amqp.accept(&typed_event("evt_1", "invoice.paid"))
        .await
        .unwrap();
    // Every processor's queue gone: the publish is returned unroutable, a failure.
    let channel = raw_channel().await;
    for processor in ["billing", "email"] {
        let queue = amqp.queue_of(processor);
        channel
            .queue_delete(queue.as_str().into(), Default::default())
            .await
            .unwrap();
    }
    let returned = amqp.accept(&typed_event("evt_2", "invoice.paid")).await;
    assert_eq!(returned.unwrap_err().kind(), StoreErrorKind::Unavailable);
    amqp.delete().await.unwrap();
}

/// `default`'s and `billing`'s workers on one store, each processor's runs recorded.
fn default_and_billing(amqp: &Amqp) -> ([WorkerHandle; 2], Seen, Seen) {
    let store = MemoryStore::new();
    let (all, billed) = (Seen::default(), Seen::default());
    let default = AmqpWorker::new(amqp, store.clone(), all.processor(Duration::ZERO, succeed));
    let billing = AmqpWorker::processor(
        amqp,
        "billing",
        store,
        billed.processor(Duration::ZERO, succeed),
    );
    let workers = [quick(default).spawn(), quick(billing.unwrap()).spawn()];
    (workers, all, billed)
}

/// `default`'s and `billing`'s parked events.
async fn parked(amqp: &Amqp) -> (u64, u64) {
    let by = amqp.counts_by_processor().await.unwrap();
    (by["default"].paused, by["billing"].paused)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_parks_each_processors_events_in_its_own_queue_and_a_resume_runs_each_once() {
    let name = common::amqp::name();
    let amqp = fanned_out(&name, vec![ProcessorSpec::default_processor(), billing()]).await;
    assert!(amqp.pause(Some("standard"), None).await.unwrap());
    let ids: Vec<String> = (0..6).map(|i| format!("evt_{i}")).collect();
    for id in &ids {
        amqp.accept(&typed_event(id, "invoice.paid")).await.unwrap();
    }
    let (workers, all, billed) = default_and_billing(&amqp);
    let n = ids.len() as u64;
    eventually("each processor's events parked", async || {
        parked(&amqp).await == (n, n)
    })
    .await;
    assert_eq!(
        amqp.paused_queue_of("billing"),
        format!("{name}-billing-paused")
    );
    assert_eq!(amqp.paused_queue_of("default"), amqp.paused_queue());
    assert_eq!((all.done(), billed.done()), (0, 0), "paused: none ran");
    assert!(amqp.resume(Some("standard"), None).await.unwrap());
    eventually("each ran once after the resume", async || {
        all.done() == ids.len() && billed.done() == ids.len()
    })
    .await;
    eventually("nothing parked", async || parked(&amqp).await == (0, 0)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    for worker in workers {
        worker.shutdown().await;
    }
    for id in &ids {
        assert_eq!(all.of(id), [1], "default ran {id} once");
        assert_eq!(billed.of(id), [1], "billing ran {id} once");
    }
    amqp.delete().await.unwrap();
}

/// A processor's own pause parks its events alone: the other processor runs them while
/// it lasts, and after its resume the paused one runs each once; a pause of an unknown
/// processor is refused, and the listing names the processor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_processors_own_pause_holds_its_events_alone() {
    let name = common::amqp::name();
    let amqp = fanned_out(&name, vec![ProcessorSpec::default_processor(), billing()]).await;
    let refused = amqp.pause_processor("nope", None, None).await.unwrap_err();
    assert_eq!(refused.kind(), StoreErrorKind::InvalidInput);
    assert!(amqp.pause_processor("billing", None, None).await.unwrap());
    assert!(!amqp.pause_processor("billing", None, None).await.unwrap());
    let pauses = amqp.pauses().await.unwrap();
    assert_eq!(pauses.len(), 1);
    assert_eq!(pauses[0].processor.as_deref(), Some("billing"));
    let ids: Vec<String> = (0..5).map(|i| format!("evt_{i}")).collect();
    for id in &ids {
        amqp.accept(&typed_event(id, "invoice.paid")).await.unwrap();
    }
    let (workers, all, billed) = default_and_billing(&amqp);
    let n = ids.len() as u64;
    eventually("default ran them, billing parked them", async || {
        all.done() == ids.len() && parked(&amqp).await == (0, n)
    })
    .await;
    assert_eq!(billed.done(), 0, "billing paused: none ran");
    assert!(amqp.resume_processor("billing", None, None).await.unwrap());
    eventually("billing ran each after its resume", async || {
        billed.done() == ids.len() && parked(&amqp).await == (0, 0)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    for worker in workers {
        worker.shutdown().await;
    }
    for id in &ids {
        assert_eq!(all.of(id), [1], "default ran {id} once");
        assert_eq!(billed.of(id), [1], "billing ran {id} once");
    }
    assert!(amqp.pauses().await.unwrap().is_empty());
    amqp.delete().await.unwrap();
}
