//! Processes, not just tasks: faults that take a store, a database server or a whole
//! process away in the middle of a storm of deliveries, against the real binaries.
//!
//! - the store cut off (every connection reset, new ones refused) for 2 s under two
//!   receiver processes, on PostgreSQL and on Redis, through a TCP proxy;
//! - a receiver process SIGKILLed mid-storm and restarted on its SQLite file;
//! - a private PostgreSQL cluster crashed and restarted under an inbox whose
//!   transactional worker writes one effect row per event;
//! - a worker process SIGKILLed three times while it records effects through `Once`.
//! - the store cut off for 1 s, then 3 s, under an inbox worker on PostgreSQL: how soon
//!   after the restore it processes again (under 5 s);
//! - RabbitMQ: a receiver in amqp mode (its worker in the process) SIGKILLed mid-storm and
//!   restarted on its queue and SQLite file, and two receivers sharing one queue and one
//!   file, 3 rounds each.
//!
//! The sender is a provider: each of ~150 events is delivered 1–3 times, 12 deliveries in
//! flight, and every delivery is retried after a short backoff until it gets a 2xx. Each
//! test counts the handler runs (or effect rows) per event, asserts what the library
//! promises for that fault, and prints one line:
//!
//! `RELIABILITY | <fault> | <mode> | events=<n> | lost=<n> | doubled=<n>`
//!
//! The receiver tests drive the `receiver` example's binary, built by the first of them
//! that needs it (`cargo test --test chaos` alone builds no example). The tests here run
//! one at a time: each one's fault must land in its own storm, not in a neighbour's.
#![cfg(unix)]

mod common;

#[path = "chaos/cluster.rs"]
mod cluster;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use cluster::PrivatePostgres;
use common::proxy::Proxy;
use common::{event_body, signed_headers};
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::task::{JoinHandle, JoinSet};
use tower::{ServiceBuilder, ServiceExt};
use tower_webhook::dedupe::PgTx;
use tower_webhook::inbox::{Attempt, Inbox, Worker};
use tower_webhook::once::{Once, Ran};
use tower_webhook::store::{PgStore, SqliteStore};
use tower_webhook::{Event, Scheme, Verifier, VerifyWebhookLayer};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// Events per storm.
const EVENTS: usize = 150;

/// Deliveries in flight at once.
const CONCURRENCY: usize = 12;

/// No delivery may take longer than this to get its 2xx, retries included.
const STORM_DEADLINE: Duration = Duration::from_secs(45);

/// One test at a time (see the module docs).
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The summary line RELIABILITY.md collects.
fn report(fault: &str, mode: &str, events: usize, tally: &Tally) {
    println!(
        "RELIABILITY | {fault} | {mode} | events={events} | lost={} | doubled={}",
        tally.lost.len(),
        tally.doubled
    );
}

// ---------------------------------------------------------------------------------------
// The storm: events, deliveries, a sender that retries until 2xx.
// ---------------------------------------------------------------------------------------

/// The events of one storm (ids unique to the run) and its deliveries: each event 1–3
/// times, shuffled.
struct Plan {
    ids: Vec<String>,
    deliveries: Vec<usize>,
}

impl Plan {
    fn new(tag: &str) -> Self {
        let run = uuid::Uuid::new_v4().simple().to_string();
        let ids: Vec<String> = (0..EVENTS)
            .map(|i| format!("evt_chaos_{tag}_{}_{i}", &run[..12]))
            .collect();
        let mut deliveries: Vec<usize> = (0..EVENTS)
            .flat_map(|i| std::iter::repeat_n(i, fastrand::usize(1..=3)))
            .collect();
        fastrand::shuffle(&mut deliveries);
        Self { ids, deliveries }
    }
}

/// What the sender saw.
#[derive(Default)]
struct Stats {
    /// Deliveries that got their 2xx.
    delivered: AtomicUsize,
    /// Every answer that was not a 2xx, by status (or "connection error", "timeout").
    refusals: Mutex<BTreeMap<String, usize>>,
    /// When each 503 came back.
    unavailable_at: Mutex<Vec<Instant>>,
}

impl Stats {
    fn refused(&self, why: String) {
        *self.refusals.lock().unwrap().entry(why).or_default() += 1;
    }

    fn delivered(&self) -> usize {
        self.delivered.load(Ordering::SeqCst)
    }

    /// 503s answered from `from` to `to`.
    fn unavailable_between(&self, from: Instant, to: Instant) -> usize {
        let at = self.unavailable_at.lock().unwrap();
        at.iter().filter(|t| (from..=to).contains(*t)).count()
    }

    fn summary(&self) -> String {
        format!("{:?}", self.refusals.lock().unwrap())
    }
}

/// Sends every delivery of `plan`, `CONCURRENCY` at a time, each retried after 50–150 ms
/// until a 2xx; `send` makes one attempt and says what came back (`Err`: no answer). Each
/// sender pauses `pace` after a delivery, so the storm lasts long enough to be hit.
async fn storm<F, Fut>(plan: &Plan, stats: Arc<Stats>, pace: (u64, u64), send: F)
where
    F: Fn(String) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Result<StatusCode, String>> + Send,
{
    let queue = Arc::new(Mutex::new(plan.deliveries.clone()));
    let ids = Arc::new(plan.ids.clone());
    let deadline = Instant::now() + STORM_DEADLINE;
    let mut senders = JoinSet::new();
    for _ in 0..CONCURRENCY {
        let (queue, ids, stats, send) = (queue.clone(), ids.clone(), stats.clone(), send.clone());
        senders.spawn(async move {
            loop {
                let Some(event) = queue.lock().unwrap().pop() else {
                    return;
                };
                let id = &ids[event];
                let mut last = String::new();
                loop {
                    assert!(
                        Instant::now() < deadline,
                        "{id} got no 2xx within {STORM_DEADLINE:?}; last answer: {last}; \
                         refusals so far: {}",
                        stats.summary()
                    );
                    match send(id.clone()).await {
                        Ok(status) if status.is_success() => break,
                        Ok(status) => {
                            if status == StatusCode::SERVICE_UNAVAILABLE {
                                stats.unavailable_at.lock().unwrap().push(Instant::now());
                            }
                            last = status.as_u16().to_string();
                        }
                        Err(why) => last = why,
                    }
                    stats.refused(last.clone());
                    tokio::time::sleep(Duration::from_millis(fastrand::u64(50..150))).await;
                }
                stats.delivered.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(fastrand::u64(pace.0..pace.1))).await;
            }
        });
    }
    while let Some(sender) = senders.join_next().await {
        if let Err(e) = sender {
            std::panic::resume_unwind(e.into_panic());
        }
    }
}

/// The receivers' URLs; each attempt goes to one of them, at random (a load balancer).
#[derive(Clone, Default)]
struct Targets(Arc<RwLock<Vec<String>>>);

impl Targets {
    fn set(&self, urls: Vec<String>) {
        *self.0.write().unwrap() = urls;
    }

    fn pick(&self) -> String {
        let urls = self.0.read().unwrap();
        urls[fastrand::usize(..urls.len())].clone()
    }
}

/// One attempt over HTTP to one of `targets`: a freshly signed Standard Webhooks delivery.
fn http_sender(
    targets: Targets,
) -> impl Fn(
    String,
)
    -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<StatusCode, String>> + Send>>
       + Clone
       + Send
       + 'static {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    move |id: String| {
        let (client, url) = (client.clone(), targets.pick());
        Box::pin(async move {
            let body = event_body(&id, "invoice.paid", "in_chaos");
            let headers = signed_headers(&Scheme::standard(), SECRET, &id, &body);
            let mut request = Request::post(url)
                .body(Full::new(Bytes::from(body)))
                .unwrap();
            request.headers_mut().extend(headers);
            let attempt = async {
                let response = client
                    .request(request)
                    .await
                    .map_err(|_| "connection error")?;
                let status = response.status();
                // Read to the end, so the connection can carry the next attempt.
                let _ = response.into_body().collect().await;
                Ok::<_, &str>(status)
            };
            match tokio::time::timeout(Duration::from_secs(10), attempt).await {
                Ok(answer) => answer.map_err(str::to_owned),
                Err(_) => Err("timeout".to_owned()),
            }
        })
    }
}

/// Calls `f` every 5 ms until it is true; panics after `limit`.
async fn until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < end, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// How often each event's effect happened, against the plan.
struct Tally {
    lost: Vec<String>,
    doubled: usize,
    /// Events whose effect happened more than once, with how often.
    repeated: Vec<(String, usize)>,
}

impl Tally {
    fn of(plan: &Plan, counts: &HashMap<String, usize>) -> Self {
        let strangers: Vec<_> = counts.keys().filter(|id| !plan.ids.contains(id)).collect();
        assert!(
            strangers.is_empty(),
            "effects of unknown events: {strangers:?}"
        );
        let lost = plan
            .ids
            .iter()
            .filter(|id| counts.get(*id).copied().unwrap_or(0) == 0)
            .cloned()
            .collect();
        let repeated: Vec<(String, usize)> = counts
            .iter()
            .filter(|(_, n)| **n > 1)
            .map(|(id, n)| (id.clone(), *n))
            .collect();
        let doubled = repeated.iter().map(|(_, n)| n - 1).sum();
        Self {
            lost,
            doubled,
            repeated,
        }
    }
}

// ---------------------------------------------------------------------------------------
// Receiver processes: the `receiver` example binary.
// ---------------------------------------------------------------------------------------

/// `target/<profile>/examples/receiver`, built from the current sources: `cargo test
/// --test chaos` builds no example, so the first test to need it runs `cargo build
/// --example receiver` (a no-op when it is up to date; cargo does not hold its lock while
/// tests run).
fn receiver_binary() -> PathBuf {
    // The build's outcome, kept: after a failed build every later test fails at once.
    static BUILT: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();
    let built = BUILT.get_or_init(|| {
        // target/<profile>/deps/chaos-<hash> → target/<profile>/examples/receiver
        let exe = std::env::current_exe().unwrap();
        let profile_dir = exe.parent().unwrap().parent().unwrap();
        let target_dir = profile_dir.parent().unwrap();
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| env!("CARGO").to_owned());
        let mut build = std::process::Command::new(&cargo);
        build
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .args(["build", "--all-features", "--example", "receiver"])
            .arg("--target-dir")
            .arg(target_dir);
        match profile_dir.file_name().and_then(|n| n.to_str()) {
            Some("debug") | None => {}
            Some("release") => {
                build.arg("--release");
            }
            Some(profile) => {
                build.args(["--profile", profile]);
            }
        }
        // Its output to a file (a pipe nobody reads could fill and stall it), and
        // within 15 min: a build that waits forever on a lock fails the test instead.
        let log = std::env::temp_dir().join(format!(
            "tower-webhook-chaos-build-{}.log",
            std::process::id()
        ));
        let file = std::fs::File::create(&log).unwrap();
        build.stdout(Stdio::null()).stderr(file);
        let mut child = build
            .spawn()
            .map_err(|e| format!("could not run {cargo} to build the receiver example: {e}"))?;
        let deadline = Instant::now() + Duration::from_secs(15 * 60);
        let status = loop {
            if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
                break Some(status);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let output = std::fs::read_to_string(&log).unwrap_or_default();
        let _ = std::fs::remove_file(&log);
        if !status.is_some_and(|s| s.success()) {
            return Err(format!(
                "`cargo build --example receiver` failed or took over 15 min:\n{output}"
            ));
        }
        let path = profile_dir.join("examples").join("receiver");
        match path.exists() {
            true => Ok(path),
            false => Err(format!("{} is missing after its build", path.display())),
        }
    });
    built.clone().unwrap_or_else(|e| panic!("{e}"))
}

/// How often each event id was handled, across every receiver process of a test.
#[derive(Clone, Default)]
struct Handled(Arc<Mutex<HashMap<String, usize>>>);

/// A running `receiver`; its `handled <id>` lines are counted into a [`Handled`].
struct ReceiverProcess {
    child: tokio::process::Child,
    url: String,
    /// How many lines this process printed, when its stdout ends.
    stdout: JoinHandle<usize>,
}

impl ReceiverProcess {
    /// Starts a receiver with `env` (besides the scheme, the secret and `BIND`), and waits
    /// for its URL.
    async fn start(env: &[(&str, String)], handled: &Handled) -> Self {
        let mut child = tokio::process::Command::new(receiver_binary())
            .env_remove("DATABASE_URL")
            .env_remove("WEBHOOK_SQLITE")
            .env("WEBHOOK_SCHEME", "standard")
            .env("WEBHOOK_SECRETS", SECRET)
            .env("BIND", "127.0.0.1:0")
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("the receiver example starts");
        let mut stderr = BufReader::new(child.stderr.take().unwrap()).lines();
        let first = tokio::time::timeout(Duration::from_secs(30), stderr.next_line())
            .await
            .expect("the receiver says where it listens within 30 s")
            .unwrap()
            .unwrap_or_default();
        let url = first
            .split_whitespace()
            .last()
            .unwrap_or_default()
            .to_owned();
        if !url.starts_with("http://127.0.0.1:") {
            let mut rest = String::new();
            while let Ok(Some(line)) = stderr.next_line().await {
                rest += &line;
                rest.push('\n');
            }
            panic!("the receiver did not start: {first}\n{rest}");
        }
        // Keep its stderr drained: a full pipe would stall it.
        tokio::spawn(async move { while let Ok(Some(_)) = stderr.next_line().await {} });
        let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
        let handled = handled.clone();
        let stdout = tokio::spawn(async move {
            let mut lines = 0;
            while let Ok(Some(line)) = stdout.next_line().await {
                if let Some(id) = line.strip_prefix("handled ") {
                    *handled.0.lock().unwrap().entry(id.to_owned()).or_default() += 1;
                    lines += 1;
                }
            }
            lines
        });
        Self { child, url, stdout }
    }

    /// SIGKILL; returns how many events this process handled (every line it printed).
    async fn kill(mut self) -> usize {
        self.child.start_kill().unwrap();
        self.child.wait().await.unwrap();
        self.stdout.await.unwrap()
    }
}

/// Deletes a SQLite database and its `-wal` and `-shm` files.
fn remove_sqlite(db: &Path) {
    for suffix in ["", "-wal", "-shm"] {
        let mut path = db.as_os_str().to_owned();
        path.push(suffix);
        let _ = std::fs::remove_file(path);
    }
}

/// `url` with its `host:port` replaced by `authority`.
fn with_authority(url: &str, authority: &str) -> String {
    let start = url.find("://").map_or(0, |i| i + 3);
    let end = url[start..].find('/').map_or(url.len(), |i| start + i);
    let host_start = url[start..end].rfind('@').map_or(start, |i| start + i + 1);
    format!("{}{authority}{}", &url[..host_start], &url[end..])
}

/// `url`'s `host:port`, with `default_port` when it names none.
fn authority_of(url: &str, default_port: u16) -> String {
    let start = url.find("://").map_or(0, |i| i + 3);
    let end = url[start..].find('/').map_or(url.len(), |i| start + i);
    let host = &url[start..end];
    let host = host.rfind('@').map_or(host, |i| &host[i + 1..]);
    if host.contains(':') {
        host.to_owned()
    } else {
        format!("{host}:{default_port}")
    }
}

// ---------------------------------------------------------------------------------------
// 1. The store cut off mid-storm, under two receiver processes.
// ---------------------------------------------------------------------------------------

/// Two receivers deduplicate in the store at `url` (reached through `proxy`); a storm
/// runs; a third of the way in, the proxy cuts the store off for 2 s. Every event is
/// handled exactly once — the outage is shorter than the claims' 6 s lease — and the
/// receivers answered 503 while it lasted.
async fn store_cut_off_mid_storm(url: String, proxy: &Proxy, plan: &Plan) -> Tally {
    const LEASE_SECS: &str = "6";
    let handled = Handled::default();
    let env = [
        ("DATABASE_URL", url),
        ("WEBHOOK_LEASE_SECS", LEASE_SECS.to_owned()),
    ];
    let a = ReceiverProcess::start(&env, &handled).await;
    let b = ReceiverProcess::start(&env, &handled).await;
    let targets = Targets::default();
    targets.set(vec![a.url.clone(), b.url.clone()]);
    let stats = Arc::new(Stats::default());
    let total = plan.deliveries.len();

    let fault = async {
        until("a third of the storm delivered", STORM_DEADLINE, || {
            stats.delivered() >= total / 3
        })
        .await;
        let delivered_at_cut = stats.delivered();
        let cut_at = Instant::now();
        proxy.cut();
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(proxy.live(), 0, "the cut left no connection standing");
        proxy.restore();
        (delivered_at_cut, cut_at, Instant::now())
    };
    let ((delivered_at_cut, cut_at, restored_at), ()) = tokio::join!(
        fault,
        storm(plan, stats.clone(), (20, 60), http_sender(targets))
    );
    // Every handler that ran has printed (each prints before it answers); let the pipes
    // drain, then stop the receivers and read to the end of their output.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let by_a = a.kill().await;
    let by_b = b.kill().await;

    let counts = handled.0.lock().unwrap().clone();
    let tally = Tally::of(plan, &counts);
    let during_cut = stats.unavailable_between(cut_at, restored_at + Duration::from_secs(1));
    println!(
        "chaos: deliveries={total}, {delivered_at_cut} before the cut; handled by A={by_a}, \
         B={by_b}; 503s during the cut={during_cut}; proxy dropped {} connections; \
         refusals={}; repeated={:?}",
        proxy.dropped(),
        stats.summary(),
        tally.repeated
    );
    assert!(
        delivered_at_cut < total,
        "the cut came mid-storm, not after it"
    );
    assert!(
        during_cut > 0,
        "the receivers answered 503 while the store was cut off: {}",
        stats.summary()
    );
    assert!(by_a > 0 && by_b > 0, "both receivers handled events");
    tally
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_cut_off_mid_storm_dedupe_on_postgres() {
    let _serial = SERIAL.lock().await;
    let url = common::fresh_pg_url().await;
    let proxy = Proxy::start(authority_of(&url, 5432)).await.unwrap();
    let plan = Plan::new("pg");
    let tally =
        store_cut_off_mid_storm(with_authority(&url, &proxy.authority()), &proxy, &plan).await;
    report(
        "store cut off 2 s mid-storm (connections reset, new ones refused)",
        "DedupeLayer on PostgreSQL, 2 receiver processes, 6 s lease",
        EVENTS,
        &tally,
    );
    assert_eq!(tally.lost, Vec::<String>::new(), "lost");
    assert_eq!(tally.doubled, 0, "handled twice: {:?}", tally.repeated);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_cut_off_mid_storm_dedupe_on_redis() {
    let _serial = SERIAL.lock().await;
    let url = common::redis_url();
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut redis = client
        .get_multiplexed_async_connection()
        .await
        .unwrap_or_else(|e| panic!("Redis must be running at {url} (.ci/services starts it): {e}"));
    let proxy = Proxy::start(authority_of(&url, 6379)).await.unwrap();
    // The receiver keeps its keys under the default prefix; the event ids are this run's
    // own, and its keys are deleted by name at the end (nothing else is touched).
    let plan = Plan::new("redis");
    let tally =
        store_cut_off_mid_storm(with_authority(&url, &proxy.authority()), &proxy, &plan).await;
    report(
        "store cut off 2 s mid-storm (connections reset, new ones refused)",
        "DedupeLayer on Redis, 2 receiver processes, 6 s lease",
        EVENTS,
        &tally,
    );
    // Each event's done key is in Redis: delete them, counting.
    let keys: Vec<String> = plan
        .ids
        .iter()
        .map(|id| format!("webhook:dedupe:8:standard:{id}"))
        .collect();
    let deleted: usize = redis::cmd("DEL")
        .arg(&keys)
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(tally.lost, Vec::<String>::new(), "lost");
    assert_eq!(tally.doubled, 0, "handled twice: {:?}", tally.repeated);
    assert_eq!(deleted, EVENTS, "one done key per event");
}

// ---------------------------------------------------------------------------------------
// 2. A receiver process SIGKILLed mid-storm.
// ---------------------------------------------------------------------------------------

/// One receiver on the embedded SQLite store, SIGKILLed at a random moment mid-storm and
/// restarted on the same file (on a new port, which the sender follows). Nothing is lost;
/// a handler re-runs only where the kill interrupted it — after it printed, before "done"
/// was recorded — so at most once per delivery in flight at the kill.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receiver_killed_mid_storm() {
    let _serial = SERIAL.lock().await;
    let db = std::env::temp_dir().join(format!(
        "tower-webhook-chaos-{}.db",
        uuid::Uuid::new_v4().simple()
    ));
    let env = [
        ("WEBHOOK_SQLITE", db.to_string_lossy().into_owned()),
        // Short, so the killed process's claims free themselves soon.
        ("WEBHOOK_LEASE_SECS", "3".to_owned()),
        // A handler that takes a moment after its effect: kills land mid-handler too.
        ("WEBHOOK_HANDLER_DELAY_MS", "10".to_owned()),
    ];
    let handled = Handled::default();
    let first = ReceiverProcess::start(&env, &handled).await;
    let targets = Targets::default();
    targets.set(vec![first.url.clone()]);
    let plan = Plan::new("kill");
    let stats = Arc::new(Stats::default());
    let total = plan.deliveries.len();
    let kill_after = fastrand::usize(total / 4..total * 3 / 5);

    let fault = async {
        until("the kill's moment", STORM_DEADLINE, || {
            stats.delivered() >= kill_after
        })
        .await;
        tokio::time::sleep(Duration::from_millis(fastrand::u64(0..40))).await;
        let delivered_at_kill = stats.delivered();
        let by_first = first.kill().await;
        let second = ReceiverProcess::start(&env, &handled).await;
        targets.set(vec![second.url.clone()]);
        (delivered_at_kill, by_first, second)
    };
    let ((delivered_at_kill, by_first, second), ()) = tokio::join!(
        fault,
        storm(&plan, stats.clone(), (10, 40), http_sender(targets.clone()))
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let by_second = second.kill().await;
    remove_sqlite(&db);

    let counts = handled.0.lock().unwrap().clone();
    let tally = Tally::of(&plan, &counts);
    report(
        "receiver process SIGKILLed at a random moment mid-storm, restarted on its file",
        "DedupeLayer on SQLite, 1 receiver process, 3 s lease",
        EVENTS,
        &tally,
    );
    println!(
        "chaos: deliveries={total}, killed after {delivered_at_kill}; handled by the killed \
         process={by_first}, by its successor={by_second}; refusals={}; repeated={:?}",
        stats.summary(),
        tally.repeated
    );
    assert!(delivered_at_kill < total, "killed mid-storm, not after it");
    assert!(
        by_first > 0 && by_second > 0,
        "both processes handled events"
    );
    assert_eq!(tally.lost, Vec::<String>::new(), "lost");
    assert!(
        tally.doubled <= CONCURRENCY,
        "re-run only where the kill interrupted a handler (at most {CONCURRENCY} in flight): \
         {:?}",
        tally.repeated
    );
}

// ---------------------------------------------------------------------------------------
// 3. PostgreSQL itself crashed and restarted under a transactional inbox.
// ---------------------------------------------------------------------------------------

/// A private PostgreSQL cluster; the inbox accepts deliveries (verify + accept, in
/// process) while a transactional worker writes one effect row per event in the row's
/// transaction. A third of the way in, the server is stopped as by a crash (`-m
/// immediate`) and started again. Every event has exactly one effect row after the drain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_restarted_mid_run_inbox_transactional() {
    let _serial = SERIAL.lock().await;
    let cluster = tokio::task::spawn_blocking(PrivatePostgres::start)
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
    let store = PgStore::connect(&cluster.url()).await.unwrap();
    let pool = store.pool().clone();
    sqlx::query("CREATE TABLE chaos_effects (event_id TEXT NOT NULL, attempt INT NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    let inbox = Inbox::postgres(&store);
    let runs = Arc::new(AtomicUsize::new(0));
    let r = runs.clone();
    let worker = Worker::transactional(&store, move |e: Event, a: Attempt, tx: PgTx| {
        let r = r.clone();
        async move {
            r.fetch_add(1, Ordering::SeqCst);
            // A moment of work inside the transaction: the crash lands mid-transaction too.
            tokio::time::sleep(Duration::from_millis(fastrand::u64(0..10))).await;
            let mut tx = tx.lock().await;
            sqlx::query("INSERT INTO chaos_effects VALUES ($1, $2)")
                .bind(e.id().unwrap().to_owned())
                .bind(a.number() as i32)
                .execute(&mut **tx)
                .await
                .map_err(|e| e.to_string())?;
            Ok::<_, String>(())
        }
    })
    .with_concurrency(4)
    .unwrap()
    // Short: a row whose claim was lost with the server comes back soon.
    .with_lease(Duration::from_secs(2))
    .unwrap()
    .with_backoff(Duration::from_millis(50), Duration::from_millis(500))
    .unwrap()
    .with_max_attempts(100)
    .unwrap()
    .with_poll_interval(Duration::from_millis(100))
    .unwrap()
    .spawn();

    let send = accept_sender(&inbox);
    let plan = Plan::new("pgcrash");
    let stats = Arc::new(Stats::default());
    let total = plan.deliveries.len();
    let fault = async {
        until(
            "a third of the storm accepted and processing under way",
            STORM_DEADLINE,
            || stats.delivered() >= total / 3 && runs.load(Ordering::SeqCst) >= 10,
        )
        .await;
        let delivered_at_crash = stats.delivered();
        let runs_at_crash = runs.load(Ordering::SeqCst);
        let crashed = Instant::now();
        cluster.crash().await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        cluster.start_again().await;
        (delivered_at_crash, runs_at_crash, crashed.elapsed())
    };
    let ((delivered_at_crash, runs_at_crash, downtime), ()) =
        tokio::join!(fault, storm(&plan, stats.clone(), (10, 40), send));

    let drained = Instant::now() + Duration::from_secs(45);
    loop {
        let counts = inbox.counts().await.unwrap();
        assert_eq!(counts.dead, 0, "no row gave up: {counts:?}");
        if counts.processed == EVENTS as u64 {
            break;
        }
        assert!(
            Instant::now() < drained,
            "the worker did not drain: {counts:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    worker.shutdown().await;
    let rows: Vec<(String, i64, i32)> = sqlx::query_as(
        "SELECT event_id, count(*), max(attempt) FROM chaos_effects GROUP BY event_id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    pool.close().await;
    let retried = rows.iter().filter(|(_, _, attempt)| *attempt > 1).count();
    let counts: HashMap<String, usize> = rows
        .into_iter()
        .map(|(id, n, _)| (id, n as usize))
        .collect();
    let tally = Tally::of(&plan, &counts);
    report(
        "PostgreSQL server crashed (pg_ctl stop -m immediate) and restarted mid-run",
        "inbox + Worker::transactional on PostgreSQL, effect rows in the row's transaction",
        EVENTS,
        &tally,
    );
    println!(
        "chaos: deliveries={total}, {delivered_at_crash} accepted and {runs_at_crash} \
         processor runs before the crash; down for {downtime:?}; {} runs in all; {retried} \
         events committed on a later attempt; refusals={}",
        runs.load(Ordering::SeqCst),
        stats.summary()
    );
    assert!(
        delivered_at_crash < total && runs_at_crash < EVENTS,
        "the crash came mid-run"
    );
    assert_eq!(tally.lost, Vec::<String>::new(), "lost");
    assert_eq!(
        tally.doubled, 0,
        "effects committed twice: {:?}",
        tally.repeated
    );
}

// ---------------------------------------------------------------------------------------
// 4. A worker process SIGKILLed again and again.
// ---------------------------------------------------------------------------------------

/// Appends `id` and a newline to `path` in one write (atomic with `O_APPEND`).
fn append_line(path: &Path, id: &str) -> std::io::Result<()> {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    file.write_all(format!("{id}\n").as_bytes())
}

/// The effects file, as a count per event id.
fn effects_in(path: &Path) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for line in std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.is_empty())
    {
        *counts.entry(line.to_owned()).or_default() += 1;
    }
    counts
}

/// Concurrency of the worker process.
const WORKER_CONCURRENCY: usize = 4;

/// Not a test of its own: the worker process `worker_process_killed_repeatedly` starts and
/// kills. Its processor writes each event's effect (a line in a file) through `Once`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "started and killed by worker_process_killed_repeatedly"]
async fn chaos_worker_process() {
    let (Ok(db), Ok(effects)) = (std::env::var("CHAOS_INBOX"), std::env::var("CHAOS_EFFECTS"))
    else {
        return;
    };
    // 1 s leases: the floor of four busy timeouts allows them.
    let store = SqliteStore::open(&db)
        .await
        .unwrap()
        .with_busy_timeout(Duration::from_millis(250));
    let inbox = Inbox::sqlite(&store);
    let once = Once::new(store.clone(), "chaos-effects")
        .with_lease(Duration::from_secs(1))
        .unwrap();
    let effects = PathBuf::from(effects);
    let _worker = Worker::new(&inbox, move |e: Event, _: Attempt| {
        let (once, effects) = (once.clone(), effects.clone());
        async move {
            let id = e.id().unwrap().to_owned();
            let ran = once
                .run(e.id().unwrap(), move |_key| async move {
                    tokio::time::sleep(Duration::from_millis(fastrand::u64(0..15))).await;
                    append_line(&effects, &id)?;
                    tokio::time::sleep(Duration::from_millis(fastrand::u64(0..15))).await;
                    Ok::<_, std::io::Error>(())
                })
                .await;
            match ran {
                Ok(Ran::InProgress { .. }) => Err("another attempt holds the action".to_owned()),
                Ok(_) => Ok(()),
                Err(e) => Err(e.to_string()),
            }
        }
    })
    .with_concurrency(WORKER_CONCURRENCY)
    .unwrap()
    .with_lease(Duration::from_secs(1))
    .unwrap()
    .with_backoff(Duration::from_millis(50), Duration::from_millis(300))
    .unwrap()
    .with_max_attempts(1000)
    .unwrap()
    .with_poll_interval(Duration::from_millis(50))
    .unwrap()
    .spawn();
    // Orphaned (the test died without killing it): go too.
    let parent = std::os::unix::process::parent_id();
    while std::os::unix::process::parent_id() == parent {
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// SIGKILLs the process when dropped: on success, and if the test fails first.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The SQLite inbox accepts a storm in this process while a worker in another drains it,
/// recording each effect through `Once`; the worker process is SIGKILLed three times at
/// random moments while it works, and started again each time. Every event is processed;
/// an effect repeats only where a kill interrupted its action (after the write, before
/// `Once` recorded it): at most the worker's concurrency per kill.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_process_killed_repeatedly() {
    const KILLS: usize = 3;
    let _serial = SERIAL.lock().await;
    let run = uuid::Uuid::new_v4().simple().to_string();
    let tmp = std::env::temp_dir();
    let db = tmp.join(format!("tower-webhook-chaos-inbox-{run}.db"));
    let effects = tmp.join(format!("tower-webhook-chaos-effects-{run}.txt"));
    let log = tmp.join(format!("tower-webhook-chaos-worker-{run}.log"));
    let store = SqliteStore::open(&db).await.unwrap();
    let inbox = Inbox::sqlite(&store);
    let spawn_worker = || {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        let child = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "chaos_worker_process",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("CHAOS_INBOX", &db)
            .env("CHAOS_EFFECTS", &effects)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        KillOnDrop(child)
    };

    let send = accept_sender(&inbox);
    let plan = Plan::new("worker");
    let stats = Arc::new(Stats::default());
    let written = || effects_in(&effects).values().sum::<usize>();

    let mut worker = spawn_worker();
    let kills = async {
        let mut moments = Vec::new();
        for _ in 0..KILLS {
            // Once this process has written an effect, at a random moment after.
            let before = written();
            until(
                "the worker process writes an effect",
                STORM_DEADLINE,
                || written() > before,
            )
            .await;
            tokio::time::sleep(Duration::from_millis(fastrand::u64(0..300))).await;
            moments.push(written());
            drop(std::mem::replace(&mut worker, spawn_worker()));
        }
        moments
    };
    let (moments, ()) = tokio::join!(kills, storm(&plan, stats.clone(), (100, 200), send));

    let drained = Instant::now() + Duration::from_secs(45);
    loop {
        let counts = inbox.counts().await.unwrap();
        assert_eq!(counts.dead, 0, "no row gave up: {counts:?}");
        if counts.processed == EVENTS as u64 {
            break;
        }
        assert!(
            Instant::now() < drained,
            "the worker did not drain: {counts:?}; its log:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(worker);
    store.pool().close().await;
    let counts = effects_in(&effects);
    remove_sqlite(&db);
    for path in [&effects, &log] {
        let _ = std::fs::remove_file(path);
    }
    let tally = Tally::of(&plan, &counts);
    report(
        "worker process SIGKILLed 3 times at random moments mid-run",
        "inbox on SQLite + Worker process, effects through Once, 1 s leases",
        EVENTS,
        &tally,
    );
    println!(
        "chaos: deliveries={}, effects written at the kills: {moments:?}; refusals={}; \
         repeated={:?}",
        plan.deliveries.len(),
        stats.summary(),
        tally.repeated
    );
    assert!(
        moments.iter().all(|m| *m < EVENTS),
        "every kill came mid-run: {moments:?}"
    );
    assert_eq!(tally.lost, Vec::<String>::new(), "lost");
    assert!(
        tally.doubled <= KILLS * WORKER_CONCURRENCY,
        "an effect repeats only where a kill interrupted its action: {:?}",
        tally.repeated
    );
}

/// Delivers event `id`, signed, through `VerifyWebhookLayer` and the inbox's accept
/// service in this process; a delivery unanswered for 40 s counts as failed (retried).
fn accept_sender(
    inbox: &Inbox,
) -> impl Fn(
    String,
)
    -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<StatusCode, String>> + Send>>
       + Clone {
    let accept = ServiceBuilder::new()
        .layer(VerifyWebhookLayer::new(
            Verifier::new(Scheme::standard(), [SECRET]).unwrap(),
        ))
        .service(inbox.accept_service());
    move |id: String| {
        let accept = accept.clone();
        Box::pin(async move {
            let body = event_body(&id, "invoice.paid", "in_chaos");
            let headers = signed_headers(&Scheme::standard(), SECRET, &id, &body);
            let mut request = Request::post("/webhooks")
                .body(Full::new(Bytes::from(body)))
                .unwrap();
            *request.headers_mut() = headers;
            match tokio::time::timeout(Duration::from_secs(40), accept.oneshot(request)).await {
                Ok(response) => Ok(response.unwrap().status()),
                Err(_) => Err("timeout".to_owned()),
            }
        })
    }
}

// ---------------------------------------------------------------------------------------
// 5. The store cut off under an inbox worker: how soon it works again.
// ---------------------------------------------------------------------------------------

/// An inbox worker on PostgreSQL reached through the proxy (the crate's defaults: pool,
/// lease, concurrency; a 500 ms poll so the poll does not hide the reconnect). The store
/// is cut off for 1 s, then 3 s; meanwhile another process accepts events on its own
/// connection (no wake-up reaches this worker). From the restore to the first of them
/// processed must take under 5 s (issue 18, item 6).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_inbox_worker_processes_again_within_5_s_of_the_store_returning() {
    const PER_OUTAGE: usize = 5;
    let _serial = SERIAL.lock().await;
    let url = common::fresh_pg_url().await;
    let direct = PgStore::connect(&url).await.unwrap();
    let proxy = Proxy::start(authority_of(&url, 5432)).await.unwrap();
    let proxied = PgStore::connect(&with_authority(&url, &proxy.authority()))
        .await
        .unwrap();
    let inbox = Inbox::postgres(&proxied);
    let elsewhere = Inbox::postgres(&direct);
    let processed: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let p = processed.clone();
    let worker = Worker::new(&inbox, move |e: Event, _: Attempt| {
        let p = p.clone();
        async move {
            let id = e.id().unwrap().to_owned();
            p.lock().unwrap().entry(id).or_insert_with(Instant::now);
            Ok::<_, String>(())
        }
    })
    .with_poll_interval(Duration::from_millis(500))
    .unwrap()
    .spawn();
    let verifier = Verifier::new(Scheme::standard(), [SECRET]).unwrap();
    let ingest = |inbox: &Inbox, id: String| {
        let (inbox, verifier) = (inbox.clone(), verifier.clone());
        async move {
            let body = event_body(&id, "invoice.paid", "in_liveness");
            inbox.ingest(&verifier, Some(&id), body).await.unwrap();
            id
        }
    };
    let all_processed = |ids: &[String]| {
        let done = processed.lock().unwrap();
        ids.iter().all(|id| done.contains_key(id))
    };

    // Working before any outage, through the proxy.
    let mut before = Vec::new();
    for i in 0..PER_OUTAGE {
        before.push(ingest(&inbox, format!("msg_before_{i}")).await);
    }
    until(
        "the events before the outages processed",
        STORM_DEADLINE,
        || all_processed(&before),
    )
    .await;

    let mut figures = Vec::new();
    for outage in [Duration::from_secs(1), Duration::from_secs(3)] {
        proxy.cut();
        let mut during = Vec::new();
        for i in 0..PER_OUTAGE {
            let id = format!("msg_during_{}s_{i}", outage.as_secs());
            during.push(ingest(&elsewhere, id).await);
        }
        tokio::time::sleep(outage).await;
        assert_eq!(proxy.live(), 0, "the cut left no connection standing");
        let dropped = proxy.dropped();
        proxy.restore();
        let restored = Instant::now();
        until(
            "an event accepted during the outage processed",
            STORM_DEADLINE,
            || {
                let done = processed.lock().unwrap();
                during.iter().any(|id| done.contains_key(id))
            },
        )
        .await;
        let first = {
            let done = processed.lock().unwrap();
            let at = during.iter().filter_map(|id| done.get(id)).min().copied();
            at.unwrap().checked_duration_since(restored)
        };
        let first = first.expect("nothing is processed while the store is cut off");
        until(
            "every event accepted during the outage processed",
            STORM_DEADLINE,
            || all_processed(&during),
        )
        .await;
        let all = restored.elapsed();
        println!(
            "chaos: store cut off {outage:?} under an inbox worker on PostgreSQL (proxy \
             dropped {dropped} connections): first event processed {first:?} after the \
             restore, all {PER_OUTAGE} within {all:?}"
        );
        figures.push((outage, first));
    }
    worker.shutdown().await;
    let counts = elsewhere.counts().await.unwrap();
    assert_eq!(counts.processed, 3 * PER_OUTAGE as u64, "{counts:?}");
    for (outage, first) in figures {
        assert!(
            first < Duration::from_secs(5),
            "after a {outage:?} outage the worker processed again only {first:?} after the \
             store returned"
        );
    }
}

// ---------------------------------------------------------------------------------------
// 6. RabbitMQ: a receiver in amqp mode SIGKILLed mid-storm; two sharing one queue.
// ---------------------------------------------------------------------------------------

/// The worker concurrency of the receivers in amqp mode: at most this many events run
/// when one is killed.
const AMQP_WORKERS: usize = 4;

/// Rounds per RabbitMQ test, each a storm of its own on a queue of its own.
const AMQP_ROUNDS: usize = 3;

/// An exchange and quorum queue of a round's own (`tw_test_chaos_*`) and a SQLite file
/// (the dedupe layer's and the workers' claims), for receivers in amqp mode.
struct AmqpRig {
    name: String,
    db: PathBuf,
}

impl AmqpRig {
    fn new(tag: &str) -> Self {
        let run = uuid::Uuid::new_v4().simple().to_string();
        Self {
            name: format!("tw_test_chaos_{tag}_{run}"),
            db: std::env::temp_dir().join(format!("tower-webhook-chaos-amqp-{run}.db")),
        }
    }

    /// The receivers' variables: the queue, the file, 3 s leases (a killed process's
    /// claims free themselves soon), a handler that takes a moment after its effect (a
    /// kill lands mid-handler too) and [`AMQP_WORKERS`] at a time.
    fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("WEBHOOK_MODE", "amqp".to_owned()),
            ("AMQP_URL", common::amqp_url()),
            ("AMQP_EXCHANGE", self.name.clone()),
            ("AMQP_QUEUE", self.name.clone()),
            ("WEBHOOK_SQLITE", self.db.to_string_lossy().into_owned()),
            ("WEBHOOK_LEASE_SECS", "3".to_owned()),
            ("WEBHOOK_HANDLER_DELAY_MS", "10".to_owned()),
            ("WEBHOOK_WORKER_CONCURRENCY", AMQP_WORKERS.to_string()),
        ]
    }

    /// The test's own handle on the queue the receivers declared.
    async fn amqp(&self) -> tower_webhook::inbox::amqp::Amqp {
        common::amqp::named(&common::amqp_url(), &self.name).await
    }

    /// Deletes the queues and exchanges (with the delay and dead ones) and the file.
    async fn delete(self) {
        self.amqp().await.delete().await.unwrap();
        remove_sqlite(&self.db);
    }
}

impl Handled {
    fn counts(&self) -> HashMap<String, usize> {
        self.0.lock().unwrap().clone()
    }

    fn total(&self) -> usize {
        self.0.lock().unwrap().values().sum()
    }
}

/// Waits (up to 30 s) until every event of `plan` was handled by one of `handled`, the
/// queue and its delay queues hold nothing, and no line came for a second: an event held
/// back behind a killed process's claim has run again by then.
async fn amqp_settled(rig: &AmqpRig, plan: &Plan, handled: &[&Handled]) {
    let amqp = rig.amqp().await;
    let end = Instant::now() + Duration::from_secs(30);
    let (mut last, mut quiet_since) = (usize::MAX, Instant::now());
    loop {
        let total: usize = handled.iter().map(|h| h.total()).sum();
        if total != last {
            (last, quiet_since) = (total, Instant::now());
        }
        let all = plan
            .ids
            .iter()
            .all(|id| handled.iter().any(|h| h.0.lock().unwrap().contains_key(id)));
        let counts = amqp.counts().await.unwrap();
        let empty = counts.queued + counts.processing + counts.dead == 0;
        if all && empty && quiet_since.elapsed() >= Duration::from_secs(1) {
            return;
        }
        assert!(
            Instant::now() < end,
            "not settled within 30 s: every event handled: {all}, {counts:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A RabbitMQ round's result; a round still running after 2 min (they take ~15 s) fails
/// the test instead of holding the run (a broker that stopped answering).
async fn bounded_round<T>(round: usize, run: impl std::future::Future<Output = T>) -> T {
    match tokio::time::timeout(Duration::from_secs(120), run).await {
        Ok(result) => result,
        Err(_) => panic!("round {round} did not finish within 2 min"),
    }
}

/// `a` and `b`'s counts, summed.
fn merged(a: &Handled, b: &Handled) -> HashMap<String, usize> {
    let mut counts = a.counts();
    for (id, n) in b.counts() {
        *counts.entry(id).or_default() += n;
    }
    counts
}

/// One round: a receiver in amqp mode (its worker in the same process) SIGKILLed at a
/// random moment mid-storm, once it handled some events, and restarted on the same queue
/// and file (on a new port, which the sender follows). Returns the tally and how many the
/// killed process handled.
async fn amqp_receiver_killed_round() -> (Tally, usize) {
    let rig = AmqpRig::new("kill");
    let env = rig.env();
    let (by_first, by_second) = (Handled::default(), Handled::default());
    let first = ReceiverProcess::start(&env, &by_first).await;
    let targets = Targets::default();
    targets.set(vec![first.url.clone()]);
    let plan = Plan::new("amqp_kill");
    let stats = Arc::new(Stats::default());
    let total = plan.deliveries.len();
    let kill_after = fastrand::usize(total / 4..total * 3 / 5);
    let fault = async {
        until("the kill's moment", STORM_DEADLINE, || {
            stats.delivered() >= kill_after && by_first.total() > 0
        })
        .await;
        tokio::time::sleep(Duration::from_millis(fastrand::u64(0..40))).await;
        let delivered_at_kill = stats.delivered();
        first.kill().await;
        let second = ReceiverProcess::start(&env, &by_second).await;
        targets.set(vec![second.url.clone()]);
        (delivered_at_kill, second)
    };
    let ((delivered_at_kill, second), ()) = tokio::join!(
        fault,
        storm(&plan, stats.clone(), (10, 40), http_sender(targets.clone()))
    );
    amqp_settled(&rig, &plan, &[&by_first, &by_second]).await;
    second.kill().await;
    rig.delete().await;

    let tally = Tally::of(&plan, &merged(&by_first, &by_second));
    let killed = by_first.counts();
    println!(
        "chaos: amqp deliveries={total}, killed after {delivered_at_kill}; handled by the \
         killed process={}, by its successor={}; refusals={}; repeated={:?}",
        killed.len(),
        by_second.total(),
        stats.summary(),
        tally.repeated
    );
    assert!(delivered_at_kill < total, "killed mid-storm, not after it");
    assert!(by_second.total() > 0, "the successor handled events");
    assert!(
        killed.values().all(|&n| n == 1),
        "one process runs an event once: {killed:?}"
    );
    // Only an event whose run had started in the killed process runs again, and at most
    // as many as its worker ran at once.
    for (id, _) in &tally.repeated {
        assert!(
            killed.contains_key(id),
            "{id} ran twice, its first run not in the killed process"
        );
    }
    (tally, killed.len())
}

/// RabbitMQ, [`AMQP_ROUNDS`] rounds of a receiver in amqp mode SIGKILLed mid-storm and
/// restarted on its queue and SQLite file: every event answered 2xx is handled (none
/// lost); an event runs twice only where its run had started in the killed process
/// before the kill — the crash row of the Guarantees table — so at most
/// [`AMQP_WORKERS`] a round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_receiver_killed_mid_storm() {
    let _serial = SERIAL.lock().await;
    receiver_binary(); // built before the rounds' clock starts
    let started = Instant::now();
    for round in 1..=AMQP_ROUNDS {
        let (tally, _) = bounded_round(round, amqp_receiver_killed_round()).await;
        report(
            &format!("receiver process in amqp mode SIGKILLed mid-storm, restarted (round {round})"),
            "RabbitMQ quorum queue + AmqpWorker in the receiver, claims on SQLite, 3 s lease, 4 workers",
            EVENTS,
            &tally,
        );
        assert_eq!(tally.lost, Vec::<String>::new(), "lost in round {round}");
        assert!(
            tally.doubled <= AMQP_WORKERS,
            "round {round}: re-run only what ran at the kill (at most {AMQP_WORKERS}): {:?}",
            tally.repeated
        );
    }
    println!(
        "chaos: {AMQP_ROUNDS} amqp kill rounds in {:?}",
        started.elapsed()
    );
}

/// One round: two receivers in amqp mode on one queue and one SQLite file, each delivery
/// to one of them at random; returns the tally and how many each handled.
async fn amqp_two_receivers_round() -> (Tally, usize, usize) {
    let rig = AmqpRig::new("two");
    let env = rig.env();
    let (by_a, by_b) = (Handled::default(), Handled::default());
    let a = ReceiverProcess::start(&env, &by_a).await;
    let b = ReceiverProcess::start(&env, &by_b).await;
    let targets = Targets::default();
    targets.set(vec![a.url.clone(), b.url.clone()]);
    let plan = Plan::new("amqp_two");
    let stats = Arc::new(Stats::default());
    storm(&plan, stats.clone(), (5, 20), http_sender(targets)).await;
    amqp_settled(&rig, &plan, &[&by_a, &by_b]).await;
    a.kill().await;
    b.kill().await;
    rig.delete().await;
    let tally = Tally::of(&plan, &merged(&by_a, &by_b));
    println!(
        "chaos: amqp two receivers, deliveries={}; handled by a={}, by b={}; refusals={}",
        plan.deliveries.len(),
        by_a.total(),
        by_b.total(),
        stats.summary()
    );
    (tally, by_a.total(), by_b.total())
}

/// RabbitMQ, [`AMQP_ROUNDS`] rounds of two receivers in amqp mode sharing one queue and
/// one SQLite file (the dedupe layer's and the workers' claims) under a storm that
/// delivers each event 1–3 times to either: each event is handled exactly once across
/// both, and both workers take a share.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_two_receivers_share_a_queue() {
    let _serial = SERIAL.lock().await;
    receiver_binary(); // built before the rounds' clock starts
    let started = Instant::now();
    for round in 1..=AMQP_ROUNDS {
        let (tally, by_a, by_b) = bounded_round(round, amqp_two_receivers_round()).await;
        report(
            &format!("two receiver processes in amqp mode share one queue (round {round})"),
            "RabbitMQ quorum queue + AmqpWorker in each receiver, claims on one SQLite file",
            EVENTS,
            &tally,
        );
        assert_eq!(tally.lost, Vec::<String>::new(), "lost in round {round}");
        assert_eq!(
            tally.repeated,
            Vec::<(String, usize)>::new(),
            "round {round}: each event exactly once"
        );
        assert!(
            by_a > 0 && by_b > 0,
            "both workers took events: {by_a}, {by_b}"
        );
    }
    println!(
        "chaos: {AMQP_ROUNDS} amqp two-receiver rounds in {:?}",
        started.elapsed()
    );
}
