//! The RabbitMQ worker against a real broker (127.0.0.1:5672, or `AMQP_URL`): each event
//! processed once and acknowledged, a failure retried after its backoff (waiting in a delay
//! queue) with its attempt number rising and buried after the last, an event delivered
//! twice run once, two workers sharing a queue, and a worker killed mid-storm — counting
//! lost and duplicated events as a total-queue checker does. Each test has an exchange and
//! queues of its own, deleted when it ends well.
#![cfg(feature = "amqp")]

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::amqp::raw_channel;
use common::{amqp_url, eventually, paid_event as event};
use lapin::options::BasicGetOptions;
use tower_webhook::inbox::amqp::{Amqp, AmqpWorker};
use tower_webhook::inbox::{Attempt, Processor, WorkerHandle};
use tower_webhook::once::{Once, Ran};
use tower_webhook::store::{DedupeStore, MemoryStore, PgStore};
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

/// Each event's attempts: their numbers, and when they started.
type Attempts = HashMap<String, Vec<(u32, tokio::time::Instant)>>;

/// Attempts seen per event.
#[derive(Clone, Default)]
struct Seen {
    attempts: Arc<Mutex<Attempts>>,
}

impl Seen {
    fn of(&self, id: &str) -> Vec<u32> {
        let attempts = self.attempts.lock().unwrap();
        let of = attempts.get(id).cloned().unwrap_or_default();
        of.into_iter().map(|(n, _)| n).collect()
    }

    /// The waits between an event's attempts.
    fn gaps(&self, id: &str) -> Vec<Duration> {
        let attempts = self.attempts.lock().unwrap();
        let of = attempts.get(id).cloned().unwrap_or_default();
        of.windows(2).map(|w| w[1].1 - w[0].1).collect()
    }

    /// How many events ran `n` times, for each `n`: lost (none) and duplicated (more
    /// than one) are what a total-queue checker counts.
    fn runs(&self, ids: &[String]) -> (usize, usize) {
        let attempts = self.attempts.lock().unwrap();
        let lost = ids.iter().filter(|id| !attempts.contains_key(*id)).count();
        let duplicated = attempts.values().filter(|a| a.len() > 1).count();
        (lost, duplicated)
    }

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
                    .push((a.number(), tokio::time::Instant::now()));
                tokio::time::sleep(work).await;
                outcome(e.id().unwrap(), a.number())
            }
        }
    }
}

fn succeed(_: &str, _: u32) -> Result<(), String> {
    Ok(())
}

/// The queue's messages ready and the delay queues' (`queued`, `processing`), and the
/// dead queue's.
async fn counts(amqp: &Amqp) -> (u64, u64, u64) {
    let c = amqp.counts().await.unwrap();
    (c.queued, c.processing, c.dead)
}

async fn accept(amqp: &Amqp, ids: &[String]) {
    for id in ids {
        amqp.accept(&event(id)).await.unwrap();
    }
}

fn ids(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}_{i}")).collect()
}

#[tokio::test]
async fn each_event_is_processed_once_and_acknowledged() {
    let amqp = amqp().await;
    let ids = ids("evt", 20);
    accept(&amqp, &ids).await;
    let seen = Seen::default();
    let worker = AmqpWorker::new(
        &amqp,
        MemoryStore::new(),
        seen.processor(Duration::ZERO, succeed),
    )
    .spawn();
    eventually("all processed", async || seen.runs(&ids) == (0, 0)).await;
    worker.shutdown().await;
    // Acknowledged: nothing comes back once the worker's channel is closed.
    assert_eq!(counts(&amqp).await, (0, 0, 0));
    for id in &ids {
        assert_eq!(seen.of(id), vec![1], "{id} ran once, as its first attempt");
    }
    amqp.delete().await.unwrap();
}

#[tokio::test]
async fn a_failure_waits_out_its_backoff_in_a_delay_queue_then_goes_dead_with_its_error() {
    let amqp = amqp().await;
    amqp.accept(&event("evt_doomed")).await.unwrap();
    amqp.accept(&event("evt_fine")).await.unwrap();
    let seen = Seen::default();
    let processor = seen.processor(Duration::ZERO, |id, _| match id {
        "evt_doomed" => Err("order\nnot found".to_owned()),
        _ => Ok(()),
    });
    let worker = AmqpWorker::new(&amqp, MemoryStore::new(), processor)
        .with_max_attempts(3)
        .unwrap()
        .with_backoff(Duration::from_millis(400), Duration::from_millis(800))
        .unwrap()
        .spawn();
    eventually("buried", async || counts(&amqp).await.2 == 1).await;
    assert_eq!(
        seen.of("evt_doomed"),
        vec![1, 2, 3],
        "the attempt number rises"
    );
    assert_eq!(seen.of("evt_fine"), vec![1]);
    for gap in seen.gaps("evt_doomed") {
        // Backoff 400 ms then 800 ms, each drawn in [half, all] and waited at the nearest
        // step of the ladder (100 ms doubling): never less than 200 ms.
        assert!(
            gap >= Duration::from_millis(190),
            "waited its backoff: {gap:?}"
        );
        assert!(
            gap < Duration::from_secs(3),
            "not held much longer: {gap:?}"
        );
    }
    worker.shutdown().await;
    assert_eq!(counts(&amqp).await, (0, 0, 1));
    // The dead message: the event's body, its error on one line, and its attempts.
    let channel = raw_channel().await;
    let dead = channel
        .basic_get(amqp.dead_queue().into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
        .expect("a dead message");
    let headers = dead.delivery.properties.headers().clone().unwrap();
    let header = |name: &str| match headers.inner().get(name) {
        Some(lapin::types::AMQPValue::LongString(s)) => {
            Some(String::from_utf8_lossy(s.as_bytes()).into_owned())
        }
        _ => None,
    };
    assert_eq!(header("Webhook-Error").as_deref(), Some("order not found"));
    assert_eq!(header("Webhook-Attempts").as_deref(), Some("3"));
    assert_eq!(header("Webhook-Id").as_deref(), Some("evt_doomed"));
    assert_eq!(dead.delivery.data, event("evt_doomed").body().to_vec());
    amqp.delete().await.unwrap();
}

#[tokio::test]
async fn a_snoozed_event_runs_again_later_without_counting_an_attempt() {
    let amqp = amqp().await;
    amqp.accept(&event("evt_later")).await.unwrap();
    let calls = Arc::new(AtomicU32::new(0));
    let seen = Seen::default();
    let (record, counter) = (seen.clone(), calls.clone());
    let processor = move |e: Event, a: Attempt| {
        let (record, counter) = (record.clone(), counter.clone());
        async move {
            record
                .attempts
                .lock()
                .unwrap()
                .entry(e.id().unwrap().to_owned())
                .or_default()
                .push((a.number(), tokio::time::Instant::now()));
            match counter.fetch_add(1, Ordering::SeqCst) {
                0 => Err(tower_webhook::inbox::Later::after(Duration::from_millis(300)).into()),
                _ => Ok::<(), Box<dyn std::error::Error + Send + Sync>>(()),
            }
        }
    };
    let worker = AmqpWorker::new(&amqp, MemoryStore::new(), processor).spawn();
    eventually("ran again", async || calls.load(Ordering::SeqCst) == 2).await;
    assert_eq!(seen.of("evt_later"), vec![1, 1], "a snooze is no attempt");
    assert!(seen.gaps("evt_later")[0] >= Duration::from_millis(190));
    worker.shutdown().await;
    assert_eq!(counts(&amqp).await, (0, 0, 0));
    amqp.delete().await.unwrap();
}

/// The same event accepted twice (no `DedupeLayer` in front) is two messages: the worker's
/// claim runs it once and acknowledges the second unrun.
#[tokio::test]
async fn an_event_delivered_twice_runs_once_and_both_messages_are_acknowledged() {
    let amqp = amqp().await;
    amqp.accept(&event("evt_twice")).await.unwrap();
    amqp.accept(&event("evt_twice")).await.unwrap();
    amqp.accept(&event("evt_other")).await.unwrap();
    let seen = Seen::default();
    let worker = AmqpWorker::new(
        &amqp,
        MemoryStore::new(),
        seen.processor(Duration::ZERO, succeed),
    )
    .with_concurrency(1)
    .unwrap()
    .spawn();
    eventually("both events processed", async || {
        seen.of("evt_other").len() == 1 && seen.of("evt_twice").len() == 1
    })
    .await;
    eventually("every message acknowledged", async || {
        counts(&amqp).await == (0, 0, 0)
    })
    .await;
    worker.shutdown().await;
    assert_eq!(
        counts(&amqp).await,
        (0, 0, 0),
        "none came back unacknowledged"
    );
    assert_eq!(seen.of("evt_twice"), vec![1]);
    amqp.delete().await.unwrap();
}

/// Two workers, each on its own connection (two processes' worth), share the queue: of N
/// events none is lost and none runs twice.
async fn two_workers_share_the_queue(store: Arc<dyn DedupeStore>) {
    let amqp = amqp().await;
    let other = again(&amqp).await;
    let ids = ids("evt", 200);
    accept(&amqp, &ids).await;
    let seen = Seen::default();
    let worker = |amqp: &Amqp| {
        AmqpWorker::from_arc(
            amqp,
            store.clone(),
            seen.processor(Duration::from_millis(2), succeed),
        )
        .with_concurrency(8)
        .unwrap()
        .spawn()
    };
    let (a, b) = (worker(&amqp), worker(&other));
    eventually("all processed", async || seen.runs(&ids).0 == 0).await;
    a.shutdown().await;
    b.shutdown().await;
    assert_eq!(seen.runs(&ids), (0, 0), "(lost, duplicated)");
    assert_eq!(counts(&amqp).await, (0, 0, 0));
    amqp.delete().await.unwrap();
}

#[tokio::test]
async fn two_workers_share_the_queue_with_a_memory_store() {
    two_workers_share_the_queue(Arc::new(MemoryStore::new())).await;
}

#[tokio::test]
async fn two_workers_share_the_queue_with_a_postgres_store() {
    let store = PgStore::connect(&common::fresh_pg_url().await)
        .await
        .unwrap();
    two_workers_share_the_queue(Arc::new(store)).await;
}

/// Each effect, applied through `once` (its claim exactly once per event), counted in
/// `ledger`; each attempt recorded in `seen`. A run finding the effect in progress
/// elsewhere fails, to be retried.
fn effects(ledger: &Ledger, once: &Once, seen: &Seen) -> impl Processor + Clone {
    let (ledger, once, seen) = (ledger.clone(), once.clone(), seen.clone());
    move |e: Event, a: Attempt| {
        let (ledger, once, seen) = (ledger.clone(), once.clone(), seen.clone());
        async move {
            let id = e.id().unwrap().to_owned();
            seen.attempts
                .lock()
                .unwrap()
                .entry(id.clone())
                .or_default()
                .push((a.number(), tokio::time::Instant::now()));
            tokio::time::sleep(Duration::from_millis(10)).await;
            let key = id.clone();
            let effect = once.run(&key, move |_| async move {
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
}

/// The effects applied, by event id.
type Ledger = Arc<Mutex<HashMap<String, u32>>>;

/// A storm's worker on `amqp`, spawned: four at a time, a 1 s lease, a quick backoff.
fn storm_worker(
    amqp: &Amqp,
    store: Arc<dyn DedupeStore>,
    processor: impl Processor,
) -> WorkerHandle {
    AmqpWorker::from_arc(amqp, store, processor)
        .with_concurrency(4)
        .unwrap()
        .with_lease(Duration::from_secs(1))
        .unwrap()
        .with_backoff(Duration::from_millis(50), Duration::from_millis(200))
        .unwrap()
        .spawn()
}

/// Waits until `ledger` holds the effects of all `n` events and `amqp`'s queue is empty,
/// then shuts `worker` down.
async fn drain(amqp: &Amqp, ledger: &Ledger, n: usize, worker: WorkerHandle) {
    eventually("all done", async || ledger.lock().unwrap().len() == n).await;
    eventually("all acknowledged", async || counts(amqp).await == (0, 0, 0)).await;
    worker.shutdown().await;
}

/// A worker killed mid-storm (its task aborted: its channel closes, its deliveries go back
/// to the queue) and another finishing: none lost, and each effect once (`Once`) — the
/// killed worker's attempts that ran count, the rest run again.
async fn a_worker_killed_mid_storm(store: Arc<dyn DedupeStore>) {
    let amqp = amqp().await;
    let other = again(&amqp).await;
    let ids = ids("evt", 150);
    accept(&amqp, &ids).await;
    let ledger: Ledger = Arc::default();
    let once = Once::new(MemoryStore::new(), "effect");
    let seen = Seen::default();
    let worker = |amqp: &Amqp| storm_worker(amqp, store.clone(), effects(&ledger, &once, &seen));
    let a = worker(&amqp);
    eventually("a third done", async || {
        ledger.lock().unwrap().len() >= ids.len() / 3
    })
    .await;
    a.abort(); // killed mid-run
    drain(&amqp, &ledger, ids.len(), worker(&other)).await;
    assert!(
        ledger.lock().unwrap().values().all(|&n| n == 1),
        "every effect once"
    );
    let ran_twice: Vec<_> = ids.iter().filter(|id| seen.of(id).len() > 1).collect();
    // Only the killed worker's events in flight may have run twice (at most its
    // concurrency), each a later attempt.
    assert!(ran_twice.len() <= 4, "ran twice: {ran_twice:?}");
    assert_eq!(counts(&amqp).await, (0, 0, 0));
    amqp.delete().await.unwrap();
}

#[tokio::test]
async fn a_worker_killed_mid_storm_loses_nothing_with_a_memory_store() {
    a_worker_killed_mid_storm(Arc::new(MemoryStore::new())).await;
}

#[tokio::test]
async fn a_worker_killed_mid_storm_loses_nothing_with_a_postgres_store() {
    let store = PgStore::connect(&common::fresh_pg_url().await)
        .await
        .unwrap();
    a_worker_killed_mid_storm(Arc::new(store)).await;
}

/// A cut between the worker and the broker (every connection reset, new ones refused):
/// the worker's consumer dies with its channel, and once the broker is back it consumes
/// again within 5 s — on a channel of its own making. The event running at the cut
/// finishes, its acknowledgement lost with the channel: delivered again, it is
/// acknowledged unrun (its key is done).
#[tokio::test]
async fn consuming_resumes_within_5_s_after_a_cut_and_the_event_running_then_runs_once() {
    let amqp = amqp().await; // direct: accepts and counts go on during the cut
    let upstream = amqp_url()
        .split('@')
        .nth(1)
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .to_owned();
    let proxy = common::proxy::Proxy::start(upstream).await.unwrap();
    let via = Amqp::builder(&format!("amqp://guest:guest@{}/%2f", proxy.addr()))
        .with_exchange(amqp.exchange())
        .unwrap()
        .with_queue(amqp.queue())
        .unwrap()
        .build()
        .await
        .unwrap();
    let seen = Seen::default();
    let processor = seen.processor(Duration::ZERO, |_, _| Ok(()));
    let slow = seen.clone();
    let processor = move |e: Event, a: Attempt| {
        let (slow, run) = (slow.clone(), processor.process(e.clone(), a));
        async move {
            if e.id() == Some("evt_slow") {
                slow.attempts
                    .lock()
                    .unwrap()
                    .entry("evt_slow".to_owned())
                    .or_default()
                    .push((a.number(), tokio::time::Instant::now()));
                tokio::time::sleep(Duration::from_millis(1500)).await;
                return Ok(());
            }
            run.await
        }
    };
    let worker = AmqpWorker::new(&via, MemoryStore::new(), processor).spawn();
    let before = ids("evt_before", 5);
    accept(&amqp, &before).await;
    amqp.accept(&event("evt_slow")).await.unwrap();
    eventually("processed before the cut", async || {
        seen.runs(&before) == (0, 0) && seen.of("evt_slow") == vec![1]
    })
    .await;
    proxy.cut();
    let during = ids("evt_during", 5);
    accept(&amqp, &during).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(seen.runs(&during).0, 5, "none runs while cut off");
    proxy.restore();
    let restored = tokio::time::Instant::now();
    eventually("processed after the cut", async || {
        seen.runs(&during) == (0, 0)
    })
    .await;
    assert!(
        restored.elapsed() < Duration::from_secs(5),
        "consuming resumed {:?} after the broker came back",
        restored.elapsed()
    );
    eventually("every message acknowledged", async || {
        counts(&amqp).await == (0, 0, 0)
    })
    .await;
    worker.shutdown().await;
    assert_eq!(seen.of("evt_slow"), vec![1], "ran once across the cut");
    assert_eq!(counts(&amqp).await, (0, 0, 0));
    amqp.delete().await.unwrap();
}

/// A message whose every delivery ended without an outcome (each crashed its worker: here,
/// handed back by hand) is buried unprocessed once its deliveries pass the attempts.
#[tokio::test]
async fn a_message_delivered_more_often_than_the_attempts_allow_goes_dead_unprocessed() {
    let amqp = amqp().await;
    amqp.accept(&event("evt_crashing")).await.unwrap();
    let channel = raw_channel().await;
    for _ in 0..3 {
        let got = channel
            .basic_get(amqp.queue().into(), BasicGetOptions::default())
            .await
            .unwrap()
            .expect("the message");
        let requeue = lapin::options::BasicNackOptions {
            requeue: true,
            ..Default::default()
        };
        got.delivery.nack(requeue).await.unwrap();
    }
    let seen = Seen::default();
    let worker = AmqpWorker::new(
        &amqp,
        MemoryStore::new(),
        seen.processor(Duration::ZERO, succeed),
    )
    .with_max_attempts(3)
    .unwrap()
    .spawn();
    eventually("buried", async || counts(&amqp).await == (0, 0, 1)).await;
    worker.shutdown().await;
    assert!(seen.of("evt_crashing").is_empty(), "never run");
    let dead = channel
        .basic_get(amqp.dead_queue().into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
        .expect("a dead message");
    let headers = dead.delivery.properties.headers().clone().unwrap();
    let attempts = headers.inner().get("Webhook-Attempts").cloned();
    assert_eq!(
        attempts,
        Some(lapin::types::AMQPValue::LongString("4".into())),
        "three crashed, the fourth not run"
    );
    amqp.delete().await.unwrap();
}

/// A shutdown lets the running event finish and hands back what the consumer had
/// prefetched, not counted: the next worker runs each as its first attempt.
#[tokio::test]
async fn a_shutdown_hands_prefetched_messages_back_uncounted() {
    let amqp = amqp().await;
    let ids = ids("evt", 10);
    accept(&amqp, &ids).await;
    let seen = Seen::default();
    let worker = AmqpWorker::new(
        &amqp,
        MemoryStore::new(),
        seen.processor(Duration::from_millis(300), succeed),
    )
    .with_concurrency(1)
    .unwrap()
    .spawn();
    eventually("one started", async || seen.runs(&ids).0 < ids.len()).await;
    worker.shutdown().await;
    let ran = ids.len() - seen.runs(&ids).0;
    assert!(ran < ids.len(), "some were prefetched, not run");
    assert_eq!(
        counts(&amqp).await.0,
        (ids.len() - ran) as u64,
        "back in the queue"
    );
    let worker = AmqpWorker::new(
        &amqp,
        MemoryStore::new(),
        seen.processor(Duration::ZERO, succeed),
    )
    .spawn();
    eventually("all processed", async || seen.runs(&ids).0 == 0).await;
    worker.shutdown().await;
    for id in &ids {
        assert_eq!(seen.of(id), vec![1], "{id}: one attempt, its first");
    }
    assert_eq!(counts(&amqp).await, (0, 0, 0));
    amqp.delete().await.unwrap();
}

/// Counting the delay queues probes steps never used (a 404 each): on a connection apart,
/// so the worker's own keeps opening channels however often the admin counts (lapin
/// keeps the error of a channel the broker closed, and fails the next one it numbers so).
#[tokio::test]
async fn counting_often_leaves_the_workers_connection_able_to_open_channels() {
    let amqp = amqp().await;
    for _ in 0..120 {
        assert_eq!(counts(&amqp).await, (0, 0, 0));
    }
    amqp.accept(&event("evt_after_counts")).await.unwrap();
    let seen = Seen::default();
    let worker = AmqpWorker::new(
        &amqp,
        MemoryStore::new(),
        seen.processor(Duration::ZERO, succeed),
    )
    .spawn();
    eventually("processed", async || seen.of("evt_after_counts") == vec![1]).await;
    worker.shutdown().await;
    assert_eq!(counts(&amqp).await, (0, 0, 0));
    amqp.delete().await.unwrap();
}

/// RabbitMQ closes the channel of a delivery unacknowledged past its `consumer_timeout`
/// (30 min by default), so a worker's max run must end well within it: by default it is
/// derived from it, and a longer one is refused with the reason.
#[tokio::test]
async fn a_max_run_past_the_brokers_consumer_timeout_is_refused_and_the_default_fits_it() {
    let amqp = amqp().await;
    assert_eq!(amqp.consumer_timeout(), Duration::from_secs(30 * 60));
    let worker = || {
        AmqpWorker::new(&amqp, MemoryStore::new(), |_: Event, _: Attempt| async {
            Ok::<(), String>(())
        })
    };
    // The broker's 30 min less 5 for a delivery's wait in the worker.
    let debug = format!("{:?}", worker());
    assert!(debug.contains("max_run: 1500s"), "{debug}");
    let refused = worker()
        .with_max_run(Duration::from_secs(3600))
        .unwrap_err();
    assert!(
        refused.to_string().contains("consumer_timeout"),
        "the reason names the broker's setting: {refused}"
    );
    assert!(worker().with_max_run(Duration::from_secs(25 * 60)).is_ok());
    // Told of a broker whose timeout was raised to 2 h: the crate's 1 h, and up to 1 h 55.
    let raised = Amqp::builder(&amqp_url())
        .with_exchange(amqp.exchange())
        .unwrap()
        .with_queue(amqp.queue())
        .unwrap()
        .with_consumer_timeout(Duration::from_secs(2 * 3600))
        .unwrap()
        .build()
        .await
        .unwrap();
    let worker = || {
        AmqpWorker::new(&raised, MemoryStore::new(), |_: Event, _: Attempt| async {
            Ok::<(), String>(())
        })
    };
    assert!(format!("{:?}", worker()).contains("max_run: 3600s"));
    assert!(worker().with_max_run(Duration::from_secs(115 * 60)).is_ok());
    assert!(worker()
        .with_max_run(Duration::from_secs(116 * 60))
        .is_err());
    let short = Amqp::builder(&amqp_url()).with_consumer_timeout(Duration::from_secs(30));
    assert!(
        short.is_err(),
        "a consumer timeout under a minute is refused"
    );
    amqp.delete().await.unwrap();
}

/// A worker whose runtime is dropped mid-storm — every task stopped at whatever await it
/// was in, its connection gone with it: no release, no acknowledgement, no shutdown, as a
/// killed process — while events keep being accepted, and a new worker draining the rest.
/// Counted as a total-queue checker does: every accepted event processed at least once,
/// and each effect exactly once through the claim (`Once`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_runtime_is_dropped_mid_storm_loses_nothing_and_doubles_no_effect() {
    let amqp = amqp().await;
    let ids = ids("evt", 240);
    let (first, rest) = ids.split_at(80);
    accept(&amqp, first).await;
    let store: Arc<dyn DedupeStore> = Arc::new(MemoryStore::new());
    let once = Once::new(MemoryStore::new(), "effect")
        .with_lease(Duration::from_secs(1))
        .unwrap();
    let ledger: Ledger = Arc::default();
    let seen = Seen::default();
    let processor = effects(&ledger, &once, &seen);
    let worker = move |amqp: &Amqp, processor| storm_worker(amqp, store.clone(), processor);
    // The killed worker: its own runtime, its own connection.
    let doomed = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let (url, exchange, queue) = (
        amqp_url(),
        amqp.exchange().to_owned(),
        amqp.queue().to_owned(),
    );
    let its_amqp = doomed
        .spawn(async move {
            Amqp::builder(&url)
                .with_exchange(&exchange)
                .unwrap()
                .with_queue(&queue)
                .unwrap()
                .build()
                .await
                .unwrap()
        })
        .await
        .unwrap();
    let a = {
        let (its_amqp, processor, worker) = (its_amqp.clone(), processor.clone(), worker.clone());
        let spawned = doomed.spawn(async move { worker(&its_amqp, processor) });
        spawned.await.unwrap()
    };
    // The storm goes on while it runs and after it dies.
    let storm = {
        let (amqp, rest) = (amqp.clone(), rest.to_vec());
        tokio::spawn(async move {
            for id in rest {
                amqp.accept(&event(&id)).await.unwrap();
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    };
    eventually("a fifth done", async || {
        ledger.lock().unwrap().len() >= ids.len() / 5
    })
    .await;
    doomed.shutdown_background(); // killed mid-run: nothing more of it runs
    let done_by_it = ledger.lock().unwrap().len();
    assert!(
        done_by_it < ids.len(),
        "killed with events left ({done_by_it} done)"
    );
    drop((a, its_amqp));
    let b = worker(&amqp, processor);
    storm.await.unwrap();
    drain(&amqp, &ledger, ids.len(), b).await;
    let (lost, _) = seen.runs(&ids);
    assert_eq!(lost, 0, "every accepted event processed at least once");
    let doubled: Vec<_> = ledger
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, &n)| n != 1)
        .map(|(id, n)| format!("{id}: {n}"))
        .collect();
    assert!(doubled.is_empty(), "each effect exactly once: {doubled:?}");
    assert_eq!(
        ledger.lock().unwrap().len(),
        ids.len(),
        "no effect of anything else"
    );
    assert_eq!(counts(&amqp).await, (0, 0, 0));
    amqp.delete().await.unwrap();
}
