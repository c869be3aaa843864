//! The examples, served over real sockets on 127.0.0.1 and driven as a provider would.

mod common;

#[allow(dead_code)]
#[path = "../examples/axum.rs"]
mod axum_example;
#[allow(dead_code)]
#[path = "../examples/hyper.rs"]
mod hyper_example;
#[allow(dead_code)]
#[path = "../examples/tonic.rs"]
mod tonic_example;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use common::{event_body, example_binary, get, post, signed_headers};
use http::{HeaderMap, HeaderValue, StatusCode};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::TcpListener;
use tokio::process::Command;
use tower_webhook::{Scheme, Verifier};

async fn listener() -> (TcpListener, String) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    (listener, format!("http://{addr}"))
}

/// The receiver example on the SQLite file `db`, configured by `env`: the child, its URL
/// (the last word of its first line on stderr) and its stdout, line by line.
async fn start_receiver(
    db: &std::path::Path,
    env: &[(&str, &str)],
) -> (
    tokio::process::Child,
    String,
    tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
) {
    spawn_receiver(Command::new(example_binary("receiver")), db, env).await
}

/// [`start_receiver`] through `command`, which runs the receiver (a shell setting limits).
async fn spawn_receiver(
    mut command: Command,
    db: &std::path::Path,
    env: &[(&str, &str)],
) -> (
    tokio::process::Child,
    String,
    tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
) {
    let mut child = command
        .env_remove("DATABASE_URL")
        .env("WEBHOOK_SQLITE", db)
        .env("BIND", "127.0.0.1:0")
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap()).lines();
    let first = tokio::time::timeout(Duration::from_secs(30), stderr.next_line())
        .await
        .expect("receiver starts")
        .unwrap()
        .unwrap();
    let url = first.split_whitespace().last().unwrap().to_owned();
    assert!(
        url.starts_with("http://127.0.0.1:") && url.ends_with("/webhooks"),
        "{first}"
    );
    // Read on: a closed pipe would make its next `eprintln!` panic and the process die.
    tokio::spawn(async move { while let Ok(Some(_)) = stderr.next_line().await {} });
    let stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    (child, url, stdout)
}

#[tokio::test]
async fn receiver_handles_signed_deliveries_once_each_and_refuses_forged_ones() {
    let secrets = "whsec_receiver_current_0123456789,whsec_receiver_old_0123456789";
    let db = std::env::temp_dir().join(format!("tower-webhook-receiver-{}.db", std::process::id()));
    let (mut child, url, mut stdout) = start_receiver(
        &db,
        &[
            ("WEBHOOK_SCHEME", "stripe"),
            ("WEBHOOK_SECRETS", secrets),
            ("WEBHOOK_TOLERANCE_SECS", "60"),
        ],
    )
    .await;

    let deliver = |id: &'static str, secret: &'static str| {
        let url = url.clone();
        async move {
            let body = event_body(id, "payment_intent.succeeded", "pi_1");
            let headers = signed_headers(&Scheme::stripe(), secret, "", &body);
            post(&url, headers, body).await.unwrap()
        }
    };
    const CURRENT: &str = "whsec_receiver_current_0123456789";

    // Signed with the old secret: still accepted during a rotation.
    let (status, _) = deliver("evt_recv_1", "whsec_receiver_old_0123456789").await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(
        next_line(&mut stdout).await.as_deref(),
        Some("handled evt_recv_1")
    );

    // Delivered again: acknowledged, and the handler does not run. Forged: 400. Neither
    // prints a line: the next line is the next good delivery's.
    assert_eq!(
        deliver("evt_recv_1", CURRENT).await.0,
        StatusCode::NO_CONTENT
    );
    let (status, text) = deliver("evt_forged", "whsec_attacker_guess_0123456789").await;
    assert_eq!(
        (status, text.as_ref()),
        (StatusCode::BAD_REQUEST, &b"invalid webhook signature"[..])
    );

    assert_eq!(
        deliver("evt_recv_2", CURRENT).await.0,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        next_line(&mut stdout).await.as_deref(),
        Some("handled evt_recv_2")
    );
    child.kill().await.unwrap();
}

/// The receiver's `GET /metrics`, read: each sample's value by its name and labels
/// (`name{k="v",…}`, labels sorted), and the text itself.
async fn scrape(url: &str) -> (Samples, String) {
    let (status, body) = get(&url.replace("/webhooks", "/metrics")).await.unwrap();
    assert_eq!(status, StatusCode::OK);
    let text = String::from_utf8(body.to_vec()).unwrap();
    let mut samples = Samples::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (series, value) = line.rsplit_once(' ').unwrap();
        let (name, labels) = match series.split_once('{') {
            Some((name, labels)) => (name, labels.trim_end_matches('}')),
            None => (series, ""),
        };
        let mut labels: Vec<String> = labels
            .split(',')
            .filter(|l| !l.is_empty())
            .map(|l| l.replace('"', ""))
            .collect();
        labels.sort();
        let key = format!("{name}{{{}}}", labels.join(","));
        samples.insert(key, value.parse().unwrap());
    }
    (samples, text)
}

type Samples = std::collections::HashMap<String, f64>;

/// A sample's value; 0 when the series is absent (nothing counted yet).
fn sample(samples: &Samples, series: &str) -> f64 {
    samples.get(series).copied().unwrap_or(0.0)
}

#[tokio::test]
async fn receiver_serves_metrics_that_count_what_was_sent() {
    const SECRET: &str = "whsec_receiver_metrics_0123456789";
    let db = std::env::temp_dir().join(format!(
        "tower-webhook-receiver-metrics-{}.db",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&db);
    let (mut child, url, mut stdout) = start_receiver(
        &db,
        &[("WEBHOOK_SCHEME", "stripe"), ("WEBHOOK_SECRETS", SECRET)],
    )
    .await;
    let deliver = |id: String, secret: &'static str| {
        let url = url.clone();
        async move {
            let body = event_body(&id, "invoice.paid", "in_1");
            let headers = signed_headers(&Scheme::stripe(), secret, "", &body);
            post(&url, headers, body).await.unwrap().0
        }
    };
    // 4 events, 3 of them delivered twice, and 2 forged deliveries.
    for i in 0..4 {
        let id = format!("evt_metrics_{i}");
        assert_eq!(deliver(id.clone(), SECRET).await, StatusCode::NO_CONTENT);
        assert_eq!(next_line(&mut stdout).await, Some(format!("handled {id}")));
    }
    for i in 0..3 {
        let id = format!("evt_metrics_{i}");
        assert_eq!(deliver(id, SECRET).await, StatusCode::NO_CONTENT);
    }
    for i in 0..2 {
        let id = format!("evt_forged_{i}");
        let status = deliver(id, "whsec_attacker_guess_0123456789").await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
    }

    let (samples, text) = scrape(&url).await;
    let of = |series: &str| sample(&samples, series);
    assert_eq!(
        of("tower_webhook_deliveries_verified_total{source=stripe}"),
        7.0,
        "{text}"
    );
    assert_eq!(
        of("tower_webhook_deliveries_rejected_total{reason=invalid_signature,source=stripe}"),
        2.0,
        "{text}"
    );
    assert_eq!(
        of("tower_webhook_duplicates_total{source=stripe}"),
        3.0,
        "{text}"
    );
    assert_eq!(
        of("tower_webhook_handler_outcomes_total{outcome=success,source=stripe}"),
        4.0,
        "{text}"
    );
    // Histograms, with buckets: every checked body timed, every claim sent to SQLite.
    assert_eq!(
        of("tower_webhook_verification_duration_seconds_count{source=stripe}"),
        9.0,
        "{text}"
    );
    assert_eq!(
        of("tower_webhook_store_operation_duration_seconds_count{operation=claim}"),
        7.0,
        "{text}"
    );
    assert_eq!(
        of("tower_webhook_store_operation_duration_seconds_count{operation=complete}"),
        4.0,
        "{text}"
    );
    assert_eq!(
        of("tower_webhook_store_operation_duration_seconds_bucket{le=+Inf,operation=claim}"),
        7.0,
        "{text}"
    );
    // Nothing else happened.
    for series in [
        "tower_webhook_in_flight_conflicts_total{source=stripe}",
        "tower_webhook_store_unavailable_total{source=stripe}",
        "tower_webhook_handler_outcomes_total{outcome=failure,source=stripe}",
    ] {
        assert_eq!(of(series), 0.0, "{series}: {text}");
    }
    // Described for whoever scrapes it.
    for line in [
        "# TYPE tower_webhook_deliveries_verified_total counter",
        "# HELP tower_webhook_deliveries_verified_total Webhook deliveries whose signature and timestamp verified.",
        "# TYPE tower_webhook_verification_duration_seconds histogram",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} in {text}");
    }
    assert!(!text.contains("evt_metrics"), "no event id is a label");
    child.kill().await.unwrap();
    let _ = std::fs::remove_file(&db);
}

#[tokio::test]
async fn receiver_in_inbox_mode_answers_at_once_and_its_worker_handles_each_event_once() {
    const SECRET: &str = "whsec_receiver_inbox_0123456789";
    let db = std::env::temp_dir().join(format!(
        "tower-webhook-receiver-inbox-{}.db",
        std::process::id()
    ));
    // A slow worker: the deliveries are answered long before their events are handled.
    let (mut child, url, mut stdout) = start_receiver(
        &db,
        &[
            ("WEBHOOK_SCHEME", "stripe"),
            ("WEBHOOK_SECRETS", SECRET),
            ("WEBHOOK_MODE", "inbox"),
            ("WEBHOOK_HANDLER_DELAY_MS", "300"),
        ],
    )
    .await;
    let ids: Vec<String> = (0..5).map(|i| format!("evt_inbox_{i}")).collect();
    let started = std::time::Instant::now();
    // Each event twice, and a forged one.
    for id in ids.iter().chain(ids.iter()) {
        let body = event_body(id, "payment_intent.succeeded", "pi_1");
        let headers = signed_headers(&Scheme::stripe(), SECRET, "", &body);
        let (status, _) = post(&url, headers, body).await.unwrap();
        assert_eq!(status, StatusCode::NO_CONTENT);
    }
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "answered without waiting for the worker: {:?}",
        started.elapsed()
    );
    let body = event_body("evt_forged", "payment_intent.succeeded", "pi_1");
    let headers = signed_headers(&Scheme::stripe(), "whsec_attacker_0123456789", "", &body);
    assert_eq!(
        post(&url, headers, body).await.unwrap().0,
        StatusCode::BAD_REQUEST
    );

    let mut handled = Vec::new();
    for _ in 0..ids.len() {
        handled.push(next_line(&mut stdout).await.unwrap());
    }
    handled.sort();
    let expected: Vec<String> = ids.iter().map(|id| format!("handled {id}")).collect();
    assert_eq!(handled, expected);
    // Nothing more: no event is handled twice.
    assert!(
        tokio::time::timeout(Duration::from_millis(1500), next_line(&mut stdout))
            .await
            .is_err(),
        "a second line"
    );
    // Its metrics say the same: 10 verified, 5 of them duplicates, 1 forged, 5 attempts
    // processed.
    let (samples, text) = scrape(&url).await;
    let of = |series: &str| sample(&samples, series);
    assert_eq!(
        of("tower_webhook_deliveries_verified_total{source=stripe}"),
        10.0,
        "{text}"
    );
    assert_eq!(
        of("tower_webhook_duplicates_total{source=stripe}"),
        5.0,
        "{text}"
    );
    assert_eq!(
        of("tower_webhook_deliveries_rejected_total{reason=invalid_signature,source=stripe}"),
        1.0,
        "{text}"
    );
    assert_eq!(
        of("tower_webhook_inbox_attempts_total{outcome=processed,processor=default}"),
        5.0,
        "{text}"
    );
    assert_eq!(
        of("tower_webhook_store_operation_duration_seconds_count{operation=accept}"),
        10.0,
        "{text}"
    );
    // The worker's refresh serves the gauges too.
    assert!(
        text.lines()
            .any(|l| l == r#"tower_webhook_inbox_dead_rows{processor="default"} 0"#),
        "{text}"
    );
    child.kill().await.unwrap();
    let _ = std::fs::remove_file(&db);
}

/// `WEBHOOK_RATE=5/s` with a 100 ms processor: 8 events accepted at once start a fifth of
/// a second apart (8 starts span at least 1.4 s, less jitter; unpaced they would all start
/// together), each printing `handled <id>` as it starts and `finished <id>` after its delay.
#[tokio::test]
async fn receiver_in_inbox_mode_starts_events_at_its_rate_and_says_when_each_finished() {
    let db = fresh_db("rate");
    starts_events_at_its_rate(&db, &[("WEBHOOK_MODE", "inbox")]).await;
    let _ = std::fs::remove_file(&db);
}

/// The same in `amqp` mode.
#[tokio::test]
async fn receiver_in_amqp_mode_starts_events_at_its_rate_and_says_when_each_finished() {
    let names = AmqpNames::new("tw_test_rate");
    let db = fresh_db("amqp-rate");
    starts_events_at_its_rate(&db, &names.env()).await;
    names.delete().await;
    let _ = std::fs::remove_file(&db);
}

async fn starts_events_at_its_rate(db: &std::path::Path, mode: &[(&str, &str)]) {
    const SECRET: &str = "whsec_receiver_rate_0123456789";
    let mut env = vec![
        ("WEBHOOK_SCHEME", "stripe"),
        ("WEBHOOK_SECRETS", SECRET),
        ("WEBHOOK_RATE", "5/s"),
        ("WEBHOOK_HANDLER_DELAY_MS", "100"),
    ];
    env.extend_from_slice(mode);
    let (mut child, url, mut stdout) = start_receiver(db, &env).await;
    let ids: Vec<String> = (0..8).map(|i| format!("evt_rate_{i}")).collect();
    for id in &ids {
        let body = event_body(id, "payment_intent.succeeded", "pi_1");
        let headers = signed_headers(&Scheme::stripe(), SECRET, "", &body);
        assert_eq!(
            post(&url, headers, body).await.unwrap().0,
            StatusCode::NO_CONTENT
        );
    }
    let (mut started, mut finished) = (Vec::new(), Vec::new());
    while finished.len() < ids.len() {
        let line = next_raw_line(&mut stdout).await.unwrap();
        let at = std::time::Instant::now();
        match line.split_once(' ') {
            Some(("handled", id)) => started.push((at, id.to_owned())),
            Some(("finished", id)) => {
                assert!(
                    started.iter().any(|(_, s)| s == id),
                    "{id} finished before it started"
                );
                finished.push(id.to_owned());
            }
            _ => panic!("unexpected line {line:?}"),
        }
    }
    let span = started.last().unwrap().0 - started[0].0;
    assert!(span >= Duration::from_millis(1200), "8 starts in {span:?}");
    let mut handled: Vec<String> = started.into_iter().map(|(_, id)| id).collect();
    handled.sort();
    finished.sort();
    let mut expected = ids.clone();
    expected.sort();
    assert_eq!(handled, expected, "each started once");
    assert_eq!(finished, expected, "each finished once");
    child.kill().await.unwrap();
}

/// `WEBHOOK_MAX_LAG_SECS=1` on a receiver with no worker: once its oldest queued event has
/// waited past a second, a delivery is answered 503 and not stored; a second receiver on
/// the same file with a worker handles exactly the events stored.
#[tokio::test]
async fn receiver_in_inbox_mode_pushes_back_once_its_queue_lags() {
    const SECRET: &str = "whsec_receiver_lag_0123456789";
    let db = fresh_db("lag");
    let env = |workers| {
        [
            ("WEBHOOK_SCHEME", "stripe"),
            ("WEBHOOK_SECRETS", SECRET),
            ("WEBHOOK_MODE", "inbox"),
            ("WEBHOOK_MAX_LAG_SECS", "1"),
            ("WEBHOOK_WORKER_CONCURRENCY", workers),
        ]
    };
    let (mut front, url, _) = start_receiver(&db, &env("0")).await;
    let deliver = |id: String| {
        let url = url.clone();
        async move {
            let body = event_body(&id, "payment_intent.succeeded", "pi_1");
            let headers = signed_headers(&Scheme::stripe(), SECRET, "", &body);
            post(&url, headers, body).await.unwrap()
        }
    };
    let mut stored = Vec::new();
    for i in 0..2 {
        let id = format!("evt_lag_{i}");
        assert_eq!(deliver(id.clone()).await.0, StatusCode::NO_CONTENT);
        stored.push(format!("handled {id}"));
    }
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    for n in 0.. {
        let id = format!("evt_late_{n}");
        let (status, body) = deliver(id.clone()).await;
        if status == StatusCode::SERVICE_UNAVAILABLE {
            assert!(
                String::from_utf8_lossy(&body).contains("backlogged"),
                "{body:?}"
            );
            break;
        }
        assert_eq!(status, StatusCode::NO_CONTENT);
        stored.push(format!("handled {id}"));
        assert!(std::time::Instant::now() < deadline, "never pushed back");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    front.kill().await.unwrap();
    let (mut back, _, mut out) = start_receiver(&db, &env("4")).await;
    let mut handled = Vec::new();
    for _ in 0..stored.len() {
        handled.push(next_line(&mut out).await.unwrap());
    }
    handled.sort();
    stored.sort();
    assert_eq!(handled, stored, "exactly the events stored");
    assert!(
        tokio::time::timeout(Duration::from_millis(1000), next_line(&mut out))
            .await
            .is_err(),
        "the refused one was not stored"
    );
    back.kill().await.unwrap();
    let _ = std::fs::remove_file(&db);
}

/// `WEBHOOK_PER_OBJECT=1` with a 200 ms processor: three events of one object run one at a
/// time, in the order they came — each `finished` before the next is `handled` — while an
/// event of another object runs beside them.
#[tokio::test]
async fn receiver_in_inbox_mode_runs_one_objects_events_one_at_a_time() {
    let db = fresh_db("object");
    runs_one_objects_events_one_at_a_time(&db, &[("WEBHOOK_MODE", "inbox")]).await;
    let _ = std::fs::remove_file(&db);
}

/// The same in `amqp` mode.
#[tokio::test]
async fn receiver_in_amqp_mode_runs_one_objects_events_one_at_a_time() {
    let names = AmqpNames::new("tw_test_object");
    let db = fresh_db("amqp-object");
    runs_one_objects_events_one_at_a_time(&db, &names.env()).await;
    names.delete().await;
    let _ = std::fs::remove_file(&db);
}

async fn runs_one_objects_events_one_at_a_time(db: &std::path::Path, mode: &[(&str, &str)]) {
    const SECRET: &str = "whsec_receiver_object_0123456789";
    let mut env = vec![
        ("WEBHOOK_SCHEME", "stripe"),
        ("WEBHOOK_SECRETS", SECRET),
        ("WEBHOOK_PER_OBJECT", "1"),
        ("WEBHOOK_HANDLER_DELAY_MS", "200"),
    ];
    env.extend_from_slice(mode);
    let (mut child, url, mut stdout) = start_receiver(db, &env).await;
    for (id, object) in [
        ("evt_o1", "pi_1"),
        ("evt_o2", "pi_1"),
        ("evt_x", "pi_2"),
        ("evt_o3", "pi_1"),
    ] {
        let body = event_body(id, "payment_intent.succeeded", object);
        let headers = signed_headers(&Scheme::stripe(), SECRET, "", &body);
        assert_eq!(
            post(&url, headers, body).await.unwrap().0,
            StatusCode::NO_CONTENT
        );
    }
    let mut lines = Vec::new();
    while lines.len() < 8 {
        lines.push(next_raw_line(&mut stdout).await.unwrap());
    }
    let of_pi_1: Vec<&str> = lines
        .iter()
        .map(String::as_str)
        .filter(|l| !l.ends_with("evt_x"))
        .collect();
    assert_eq!(
        of_pi_1,
        [
            "handled evt_o1",
            "finished evt_o1",
            "handled evt_o2",
            "finished evt_o2",
            "handled evt_o3",
            "finished evt_o3"
        ],
        "{lines:?}"
    );
    let x = lines.iter().position(|l| l == "handled evt_x").unwrap();
    let o1_done = lines.iter().position(|l| l == "finished evt_o1").unwrap();
    assert!(x < o1_done, "another object runs beside: {lines:?}");
    child.kill().await.unwrap();
}

#[tokio::test]
async fn receiver_in_inbox_mode_serves_the_admin_api_to_pause_and_resume() {
    admin_api_pauses_and_resumes(&[("WEBHOOK_MODE", "inbox")]).await;
}

#[tokio::test]
async fn receiver_in_nats_mode_serves_the_admin_api_to_pause_and_resume() {
    let streams = NatsStreams::new("tw_test_admin");
    let env = [
        ("WEBHOOK_MODE", "nats"),
        ("NATS_URL", streams.url.as_str()),
        ("NATS_STREAM", streams.stream.as_str()),
    ];
    admin_api_pauses_and_resumes(&env).await;
    streams.delete().await;
}

#[tokio::test]
async fn receiver_in_amqp_mode_serves_the_admin_api_to_pause_and_resume() {
    let names = AmqpNames::new("tw_test_admin");
    admin_api_pauses_and_resumes(&names.env()).await;
    names.delete().await;
}

/// A stream name of a test's own for a receiver in `nats` mode, and what the receiver
/// makes of it — the stream, its dead and parked streams (every processor's) and its
/// buckets (`KV_<stream>-pauses`, `KV_<stream>-held`) — deleted at the test's end:
/// [`delete`](Self::delete) when it passes (which checks that none is left), on drop when
/// it fails (declare it before the receivers: they are killed first, as locals drop in
/// reverse order).
struct NatsStreams {
    url: String,
    stream: String,
    deleted: bool,
}

impl NatsStreams {
    fn new(prefix: &str) -> Self {
        Self {
            url: common::nats_url(),
            stream: format!("{prefix}_{}", uuid::Uuid::new_v4().simple()),
            deleted: false,
        }
    }

    async fn delete(mut self) {
        self.deleted = true;
        delete_streams(&self.url, &self.stream).await;
        let left = streams_of(&self.url, &self.stream).await;
        assert_eq!(left, Vec::<String>::new(), "streams left behind");
    }
}

impl Drop for NatsStreams {
    fn drop(&mut self) {
        if self.deleted {
            return;
        }
        let (url, stream) = (self.url.clone(), self.stream.clone());
        // Drop cannot wait on the test's runtime: a thread with a runtime of its own.
        let deleting = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(delete_streams(&url, &stream));
        });
        let _ = deleting.join();
    }
}

/// The JetStream streams made for `stream`: itself, `<stream>-…`, and the buckets'
/// `KV_<stream>-…`.
async fn streams_of(url: &str, stream: &str) -> Vec<String> {
    use futures_util::StreamExt;
    let js = async_nats::jetstream::new(async_nats::connect(url).await.unwrap());
    let ours = |name: &str| {
        name == stream
            || name
                .strip_prefix(stream)
                .is_some_and(|rest| rest.starts_with('-'))
    };
    let mut names = js.stream_names();
    let mut found = Vec::new();
    while let Some(Ok(name)) = names.next().await {
        if ours(&name) || name.strip_prefix("KV_").is_some_and(ours) {
            found.push(name);
        }
    }
    found.sort();
    found
}

async fn delete_streams(url: &str, stream: &str) {
    let js = async_nats::jetstream::new(async_nats::connect(url).await.unwrap());
    for name in streams_of(url, stream).await {
        let _ = js.delete_stream(name).await;
    }
}

/// `WEBHOOK_ADMIN_TOKEN` with `mode`: the operator API under `/admin`, 401 without the
/// bearer token; `POST /admin/pause?type=…` holds that type's events (accepted, not
/// handled) while another type's is handled, a second pause changes nothing, and
/// `POST /admin/resume?type=…` lets them through.
async fn admin_api_pauses_and_resumes(mode: &[(&str, &str)]) {
    const SECRET: &str = "whsec_receiver_admin_0123456789";
    const TOKEN: &str = "operator-token-0123456789abcdef";
    let db = fresh_db(&format!("admin-{}", mode[0].1));
    let mut env = vec![
        ("WEBHOOK_SCHEME", "stripe"),
        ("WEBHOOK_SECRETS", SECRET),
        ("WEBHOOK_ADMIN_TOKEN", TOKEN),
    ];
    env.extend_from_slice(mode);
    let (mut child, url, mut stdout) = start_receiver(&db, &env).await;
    let admin = |path: &str, token: Option<&str>| {
        let url = url.replace("/webhooks", &format!("/admin{path}"));
        let mut headers = HeaderMap::new();
        if let Some(token) = token {
            let value = HeaderValue::from_str(&format!("Bearer {token}")).unwrap();
            headers.insert(http::header::AUTHORIZATION, value);
        }
        async move { post(&url, headers, Vec::new()).await.unwrap() }
    };
    let deliver = |id: &'static str, event_type: &'static str| {
        let url = url.clone();
        async move {
            let body = event_body(id, event_type, "in_1");
            let headers = signed_headers(&Scheme::stripe(), SECRET, "", &body);
            post(&url, headers, body).await.unwrap().0
        }
    };
    let pause = "/pause?type=invoice.paid";
    assert_eq!(admin(pause, None).await.0, StatusCode::UNAUTHORIZED);
    assert_eq!(
        admin(pause, Some("a guess")).await.0,
        StatusCode::UNAUTHORIZED
    );
    let (status, body) = admin(pause, Some(TOKEN)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(&body[..], br#"{"changed":true}"#);
    assert_eq!(
        deliver("evt_held", "invoice.paid").await,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        deliver("evt_free", "charge.succeeded").await,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        next_line(&mut stdout).await.as_deref(),
        Some("handled evt_free")
    );
    assert!(
        tokio::time::timeout(Duration::from_millis(1500), next_line(&mut stdout))
            .await
            .is_err(),
        "the paused type was handled"
    );
    let (status, body) = admin(pause, Some(TOKEN)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(&body[..], br#"{"changed":false}"#, "paused already");
    let (status, _) = admin("/resume?type=invoice.paid", Some(TOKEN)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        next_line(&mut stdout).await.as_deref(),
        Some("handled evt_held")
    );
    child.kill().await.unwrap();
    let _ = std::fs::remove_file(&db);
}

/// Sends a request to `url` with `headers` (`method` GET or POST, `body` JSON when
/// given); returns the status, the headers and the body.
async fn ask(
    method: http::Method,
    url: &str,
    headers: &[(http::HeaderName, &str)],
    body: Option<&str>,
) -> (StatusCode, HeaderMap, String) {
    use http_body_util::{BodyExt, Full};
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<bytes::Bytes>>();
    let mut request = http::Request::builder().method(method).uri(url);
    for (name, value) in headers {
        request = request.header(name, *value);
    }
    if body.is_some() {
        request = request.header(http::header::CONTENT_TYPE, "application/json");
    }
    let body = Full::new(bytes::Bytes::from(body.unwrap_or_default().to_owned()));
    let response = client.request(request.body(body).unwrap()).await.unwrap();
    let (parts, body) = response.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    (
        parts.status,
        parts.headers,
        String::from_utf8_lossy(&bytes).into_owned(),
    )
}

/// `WEBHOOK_ADMIN_TOKEN` in inbox mode: the operator's page at `/admin/ui` answers 401
/// without a sign-in (and with a wrong token); `?token=<token>` sets an `HttpOnly`,
/// `SameSite=Strict` cookie and redirects to the same URL without the token; the cookie
/// then opens every page; it does not open the JSON API, which still takes the bearer.
#[tokio::test]
async fn receiver_in_inbox_mode_signs_a_browser_in_to_the_operators_page() {
    const TOKEN: &str = "operator-ui-token-0123456789abcdef";
    let db = fresh_db("ui-sign-in");
    let env = [
        ("WEBHOOK_SCHEME", "stripe"),
        ("WEBHOOK_SECRETS", "whsec_receiver_ui_0123456789"),
        ("WEBHOOK_MODE", "inbox"),
        ("WEBHOOK_ADMIN_TOKEN", TOKEN),
    ];
    let (mut child, url, _stdout) = start_receiver(&db, &env).await;
    let base = url.replace("/webhooks", "");
    let get = |path: &str, cookie: Option<&str>| {
        let url = format!("{base}{path}");
        let cookie = cookie.map(str::to_owned);
        async move {
            let headers: Vec<(http::HeaderName, &str)> = match &cookie {
                Some(cookie) => vec![(http::header::COOKIE, cookie.as_str())],
                None => Vec::new(),
            };
            ask(http::Method::GET, &url, &headers, None).await
        }
    };
    for path in [
        "/admin/ui",
        "/admin/ui/events?state=dead",
        "/admin/ui?token=a-guess",
    ] {
        let (status, _, text) = get(path, None).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{path}");
        assert!(
            text.contains("/admin/ui?token="),
            "says how to sign in: {text}"
        );
    }
    let (status, _, _) = get("/admin/ui", Some("tower_webhook_admin=YS1ndWVzcw")).await;
    assert_eq!(
        status,
        StatusCode::UNAUTHORIZED,
        "a cookie of another token"
    );

    let (status, headers, _) =
        get(&format!("/admin/ui/events?state=dead&token={TOKEN}"), None).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    assert_eq!(
        headers[http::header::LOCATION],
        "/admin/ui/events?state=dead"
    );
    let set = headers[http::header::SET_COOKIE].to_str().unwrap();
    let attributes: Vec<&str> = set.split("; ").collect();
    assert!(attributes[0].starts_with("tower_webhook_admin="), "{set}");
    assert!(!set.contains(TOKEN), "the token is encoded: {set}");
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/admin/ui"] {
        assert!(attributes.contains(&attribute), "{attribute}: {set}");
    }
    let (_, headers, _) = get(&format!("/admin/ui?token={TOKEN}"), None).await;
    assert_eq!(headers[http::header::LOCATION], "/admin/ui");
    let (status, headers, _) = get("/admin/ui/", None).await;
    assert_eq!(status, StatusCode::PERMANENT_REDIRECT, "a typed slash");
    assert_eq!(headers[http::header::LOCATION], "/admin/ui");

    let cookie = attributes[0];
    for path in [
        "/admin/ui",
        "/admin/ui/events?state=dead",
        "/admin/ui/events?state=failing",
    ] {
        let (status, headers, html) = get(path, Some(cookie)).await;
        assert_eq!(status, StatusCode::OK, "{path}");
        assert!(html.contains("Webhook inbox"), "{html}");
        assert!(headers.contains_key(http::header::CONTENT_SECURITY_POLICY));
    }
    let (status, _, _) = get("/admin/counts", Some(cookie)).await;
    assert_eq!(
        status,
        StatusCode::UNAUTHORIZED,
        "the JSON API takes the bearer only"
    );
    let bearer = format!("Bearer {TOKEN}");
    let (status, _, _) = ask(
        http::Method::GET,
        &format!("{base}/admin/counts"),
        &[(http::header::AUTHORIZATION, &bearer)],
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    child.kill().await.unwrap();
    let _ = std::fs::remove_file(&db);
}

/// `WEBHOOK_FAIL_TYPES` and `WEBHOOK_MAX_ATTEMPTS` in inbox mode: every attempt at an
/// event of a listed type fails (`failed <id>`) until it is dead after the maximum, while
/// other types are handled; requeued, it fails again.
#[tokio::test]
async fn receiver_in_inbox_mode_fails_the_fail_types_until_dead_and_again_when_requeued() {
    const SECRET: &str = "whsec_receiver_fails_0123456789";
    const TOKEN: &str = "operator-fails-token-0123456789";
    let db = fresh_db("fail-types");
    let env = [
        ("WEBHOOK_SCHEME", "stripe"),
        ("WEBHOOK_SECRETS", SECRET),
        ("WEBHOOK_MODE", "inbox"),
        ("WEBHOOK_ADMIN_TOKEN", TOKEN),
        (
            "WEBHOOK_FAIL_TYPES",
            "invoice.payment_failed, charge.disputed",
        ),
        ("WEBHOOK_MAX_ATTEMPTS", "2"),
    ];
    let (mut child, url, mut stdout) = start_receiver(&db, &env).await;
    for (id, event_type) in [
        ("evt_fails", "invoice.payment_failed"),
        ("evt_fine", "charge.succeeded"),
    ] {
        let body = event_body(id, event_type, "in_1");
        let headers = signed_headers(&Scheme::stripe(), SECRET, "", &body);
        assert_eq!(
            post(&url, headers, body).await.unwrap().0,
            StatusCode::NO_CONTENT
        );
    }
    let mut lines = Vec::new();
    for _ in 0..3 {
        lines.push(next_line(&mut stdout).await.unwrap());
    }
    lines.sort();
    assert_eq!(
        lines,
        ["failed evt_fails", "failed evt_fails", "handled evt_fine"]
    );
    let bearer = format!("Bearer {TOKEN}");
    let auth = [(http::header::AUTHORIZATION, bearer.as_str())];
    let admin = url.replace("/webhooks", "/admin");
    let event = format!("{admin}/events/stripe/evt_fails");
    let mut row = serde_json::Value::Null;
    for _ in 0..50 {
        let (_, _, json) = ask(http::Method::GET, &event, &auth, None).await;
        row = serde_json::from_str(&json).unwrap();
        if row["state"] == "dead" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(row["state"], "dead", "{row}");
    assert_eq!(row["attempts"], 2, "{row}");
    assert!(
        row["last_error"]
            .as_str()
            .unwrap()
            .contains("WEBHOOK_FAIL_TYPES"),
        "{row}"
    );

    let requeue = r#"{"source": "stripe", "id": "evt_fails"}"#;
    let (status, _, _) = ask(
        http::Method::POST,
        &format!("{admin}/requeue"),
        &auth,
        Some(requeue),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        next_line(&mut stdout).await.as_deref(),
        Some("failed evt_fails")
    );
    child.kill().await.unwrap();
    let _ = std::fs::remove_file(&db);
}

/// `WEBHOOK_WORKER_CONCURRENCY=0`: a receiver that only accepts (a front-door replica)
/// stores each event and handles none; a second receiver on the same file, with its worker
/// processing 2 at a time, handles each once.
#[tokio::test]
async fn receiver_in_inbox_mode_with_no_worker_only_accepts_and_another_handles() {
    let db = std::env::temp_dir().join(format!(
        "tower-webhook-receiver-front-{}.db",
        std::process::id()
    ));
    no_worker_only_accepts_and_another_handles(&db, &[("WEBHOOK_MODE", "inbox")]).await;
    let _ = std::fs::remove_file(&db);
}

/// The same in `amqp` mode: the front door publishes, the second receiver's worker (on
/// the same store) handles each event once.
#[tokio::test]
async fn receiver_in_amqp_mode_with_no_worker_only_accepts_and_another_handles() {
    let names = AmqpNames::new("tw_test_front");
    let db = fresh_db("amqp-front");
    no_worker_only_accepts_and_another_handles(&db, &names.env()).await;
    names.delete().await;
    let _ = std::fs::remove_file(&db);
}

async fn no_worker_only_accepts_and_another_handles(db: &std::path::Path, mode: &[(&str, &str)]) {
    const SECRET: &str = "whsec_receiver_inbox_0123456789";
    let env = |workers| {
        let mut env = vec![
            ("WEBHOOK_SCHEME", "stripe"),
            ("WEBHOOK_SECRETS", SECRET),
            ("WEBHOOK_WORKER_CONCURRENCY", workers),
        ];
        env.extend_from_slice(mode);
        env
    };
    let (mut front, url, mut front_out) = start_receiver(db, &env("0")).await;
    let ids: Vec<String> = (0..6).map(|i| format!("evt_front_{i}")).collect();
    for id in &ids {
        let body = event_body(id, "payment_intent.succeeded", "pi_1");
        let headers = signed_headers(&Scheme::stripe(), SECRET, "", &body);
        assert_eq!(
            post(&url, headers, body).await.unwrap().0,
            StatusCode::NO_CONTENT
        );
    }
    assert!(
        tokio::time::timeout(Duration::from_millis(1000), next_line(&mut front_out))
            .await
            .is_err(),
        "the front door handled an event"
    );
    let (mut back, _, mut back_out) = start_receiver(db, &env("2")).await;
    let mut handled = Vec::new();
    for _ in 0..ids.len() {
        handled.push(next_line(&mut back_out).await.unwrap());
    }
    handled.sort();
    let expected: Vec<String> = ids.iter().map(|id| format!("handled {id}")).collect();
    assert_eq!(handled, expected);
    front.kill().await.unwrap();
    back.kill().await.unwrap();
}

/// Two receivers in `nats` mode on one stream, each deduplicating in a SQLite file of its
/// own: each event is stored in the stream once, whichever receiver got it and however
/// often, and handled once by one of the two workers.
#[tokio::test]
async fn receivers_in_nats_mode_store_each_event_once_and_their_workers_handle_it_once() {
    const SECRET: &str = "whsec_receiver_nats_0123456789";
    let streams = NatsStreams::new("tw_test_receiver");
    let (nats, stream) = (streams.url.clone(), streams.stream.clone());
    let env = [
        ("WEBHOOK_SCHEME", "stripe"),
        ("WEBHOOK_SECRETS", SECRET),
        ("WEBHOOK_MODE", "nats"),
        ("NATS_URL", nats.as_str()),
        ("NATS_STREAM", stream.as_str()),
    ];
    let db = |n: u32| {
        std::env::temp_dir().join(format!(
            "tower-webhook-receiver-nats-{}-{n}.db",
            std::process::id()
        ))
    };
    let (mut a, url_a, out_a) = start_receiver(&db(1), &env).await;
    let (mut b, url_b, out_b) = start_receiver(&db(2), &env).await;
    let ids: Vec<String> = (0..6).map(|i| format!("evt_nats_{i}")).collect();
    // Every event to both receivers, and once more to the first.
    for url in [&url_a, &url_b, &url_a] {
        for id in &ids {
            let body = event_body(id, "payment_intent.succeeded", "pi_1");
            let headers = signed_headers(&Scheme::stripe(), SECRET, "", &body);
            assert_eq!(
                post(url, headers, body).await.unwrap().0,
                StatusCode::NO_CONTENT
            );
        }
    }
    let body = event_body("evt_forged", "payment_intent.succeeded", "pi_1");
    let headers = signed_headers(&Scheme::stripe(), "whsec_attacker_0123456789", "", &body);
    assert_eq!(
        post(&url_a, headers, body).await.unwrap().0,
        StatusCode::BAD_REQUEST
    );

    // Both workers' lines, until every event was handled and a while passed quietly.
    let (lines_tx, mut lines) = tokio::sync::mpsc::unbounded_channel();
    for mut out in [out_a, out_b] {
        let tx = lines_tx.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = out.next_line().await {
                let _ = tx.send(line);
            }
        });
    }
    let mut handled = Vec::new();
    let mut finished = Vec::new();
    while let Ok(Some(line)) = tokio::time::timeout(Duration::from_secs(3), lines.recv()).await {
        match line.strip_prefix("finished ") {
            Some(id) => finished.push(format!("handled {id}")),
            None => handled.push(line),
        }
    }
    handled.sort();
    finished.sort();
    let expected: Vec<String> = ids.iter().map(|id| format!("handled {id}")).collect();
    assert_eq!(handled, expected, "each event handled once, by one worker");
    assert_eq!(finished, expected, "and each finished");

    let js = async_nats::jetstream::new(async_nats::connect(&nats).await.unwrap());
    let mut info = js.get_stream(&stream).await.unwrap();
    assert_eq!(
        info.info().await.unwrap().state.messages,
        ids.len() as u64,
        "each event stored once"
    );
    a.kill().await.unwrap();
    b.kill().await.unwrap();
    streams.delete().await;
    for n in [1, 2] {
        let _ = std::fs::remove_file(db(n));
    }
}

/// Posts Stripe's `evt_sealed` (signed with `secret`) whose body holds a fresh canary to
/// the receiver at `url`, and waits for its `handled` line on `out`; answers the canary.
async fn deliver_canary(
    url: &str,
    secret: &str,
    out: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
) -> String {
    let canary = format!("canary{}", uuid::Uuid::new_v4().simple());
    let body = canary_body(&canary);
    let headers = signed_headers(&Scheme::stripe(), secret, "", &body);
    assert_eq!(
        post(url, headers, body).await.unwrap().0,
        StatusCode::NO_CONTENT
    );
    let line = tokio::time::timeout(Duration::from_secs(10), out.next_line()).await;
    assert_eq!(
        line.unwrap().unwrap().as_deref(),
        Some("handled evt_sealed")
    );
    canary
}

/// The body `deliver_canary` posts: the canary, and order lines that repeat themselves as
/// JSON does (a body the receiver compresses before sealing unless told not to).
fn canary_body(canary: &str) -> Vec<u8> {
    let lines = [r#"{"sku":"tea","qty":1}"#; 20].join(",");
    format!(
        r#"{{"id":"evt_sealed","type":"payment_intent.succeeded","livemode":false,"data":{{"object":{{"id":"pi_1","email":"{canary}@example.com","lines":[{lines}]}}}}}}"#
    )
    .into_bytes()
}

/// The length of the one body stored in the receiver's SQLite inbox at `db`.
async fn stored_body_length(db: &std::path::Path) -> usize {
    let store = tower_webhook::store::SqliteStore::open(db).await.unwrap();
    let stored: i64 = sqlx::query_scalar("SELECT length(body) FROM webhook_bodies")
        .fetch_one(store.pool())
        .await
        .unwrap();
    usize::try_from(stored).unwrap()
}

/// `WEBHOOK_ENCRYPTION_KEYS` in `nats` mode: the body is published sealed (the stream's
/// message, read raw, holds no byte of the event's canary, and names its key), and the
/// worker still handles the event.
#[tokio::test]
async fn receiver_in_nats_mode_with_encryption_keys_publishes_sealed_bodies_and_handles_them() {
    const SECRET: &str = "whsec_receiver_sealed_0123456789";
    let streams = NatsStreams::new("tw_test_receiver_sealed");
    let (nats, stream) = (streams.url.clone(), streams.stream.clone());
    let keys = "k2:AgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgI=,k1:AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=";
    let env = [
        ("WEBHOOK_SCHEME", "stripe"),
        ("WEBHOOK_SECRETS", SECRET),
        ("WEBHOOK_MODE", "nats"),
        ("NATS_URL", nats.as_str()),
        ("NATS_STREAM", stream.as_str()),
        ("WEBHOOK_ENCRYPTION_KEYS", keys),
    ];
    let db = std::env::temp_dir().join(format!(
        "tower-webhook-receiver-sealed-{}.db",
        std::process::id()
    ));
    let (mut receiver, url, mut out) = start_receiver(&db, &env).await;
    let canary = deliver_canary(&url, SECRET, &mut out).await;

    let js = async_nats::jetstream::new(async_nats::connect(&nats).await.unwrap());
    let stored = js
        .get_stream(&stream)
        .await
        .unwrap()
        .get_raw_message(1)
        .await
        .unwrap();
    assert_eq!(
        stored.headers.get("Webhook-Key-Id").map(|v| v.as_str()),
        Some("k2")
    );
    let holds = |bytes: &[u8]| bytes.windows(canary.len()).any(|w| w == canary.as_bytes());
    assert!(!holds(&stored.payload), "the canary in the stream");
    let values = stored.headers.iter().flat_map(|(_, values)| values);
    assert!(!values.into_iter().any(|v| holds(v.as_str().as_bytes())));
    receiver.kill().await.unwrap();
    streams.delete().await;
    let _ = std::fs::remove_file(db);

    // A malformed entry stops it at start, by position, never printing the key.
    let bad = "k1:AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=,k2:c2hvcnQ=";
    let env = [
        ("WEBHOOK_ENCRYPTION_KEYS", bad),
        ("WEBHOOK_MODE", "nats"),
        ("BIND", "127.0.0.1:0"),
    ];
    let output = run_with("receiver", &[], &env).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("entry 2"), "{stderr}");
    assert!(
        !stderr.contains("c2hvcnQ") && !stderr.contains("AQEB"),
        "{stderr}"
    );
}

/// `WEBHOOK_ENCRYPTION_KEYS` in `inbox` mode: the event's body and its stored headers are
/// sealed in the SQLite inbox (its file and WAL, read raw, hold no byte of the canary),
/// and the worker handles it with the plaintext, compressed first or not
/// (`WEBHOOK_ENCRYPTION_COMPRESS` unset or 0); in `dedupe` mode the receiver refuses to
/// start (nothing it stores is sealed), and so it does on a compression setting that is
/// not 0 or 1.
#[tokio::test]
async fn receiver_in_inbox_mode_with_encryption_keys_stores_sealed_bodies_and_handles_them() {
    const SECRET: &str = "whsec_receiver_sealed_0123456789";
    let keys = "k1:AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=";
    for compress in [None, Some("0")] {
        let mut env = vec![
            ("WEBHOOK_SCHEME", "stripe"),
            ("WEBHOOK_SECRETS", SECRET),
            ("WEBHOOK_MODE", "inbox"),
            ("WEBHOOK_ENCRYPTION_KEYS", keys),
        ];
        env.extend(compress.map(|c| ("WEBHOOK_ENCRYPTION_COMPRESS", c)));
        let db = std::env::temp_dir().join(format!(
            "tower-webhook-receiver-inbox-sealed-{}.db",
            uuid::Uuid::new_v4().simple()
        ));
        let (mut receiver, url, mut out) = start_receiver(&db, &env).await;
        let canary = deliver_canary(&url, SECRET, &mut out).await;
        receiver.kill().await.unwrap();
        let (stored, clear) = (stored_body_length(&db).await, canary_body(&canary).len());
        match compress {
            None => assert!(
                stored < clear / 2,
                "compressed, then sealed: {stored} of {clear}"
            ),
            _ => assert_eq!(
                stored,
                clear + 1 + 16,
                "sealed as it is: a frame byte and the tag"
            ),
        }
        let mut at_rest = Vec::new();
        for suffix in ["", "-wal"] {
            at_rest.extend(std::fs::read(format!("{}{suffix}", db.display())).unwrap_or_default());
        }
        assert!(at_rest.len() > 4096, "the inbox's file was read");
        assert!(
            !at_rest
                .windows(canary.len())
                .any(|w| w == canary.as_bytes()),
            "the canary at rest ({compress:?})"
        );
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", db.display()));
        }
    }

    for (mode, compress, refusal) in [
        ("dedupe", "1", "only inbox and nats mode"),
        ("inbox", "yes", "WEBHOOK_ENCRYPTION_COMPRESS: 0 or 1"),
    ] {
        let env = [
            ("WEBHOOK_ENCRYPTION_KEYS", keys),
            ("WEBHOOK_ENCRYPTION_COMPRESS", compress),
            ("WEBHOOK_MODE", mode),
            ("BIND", "127.0.0.1:0"),
        ];
        let output = run_with("receiver", &[], &env).await;
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{stderr}");
        assert!(stderr.contains(refusal), "{stderr}");
    }
}

/// Rotation through the receiver (inbox mode): an event sealed under k1, then the receiver
/// restarted with `k2,k1` rekeys it through `POST /admin/rekey` (the admin router has the
/// keyed inbox), a second call has nothing left; restarted without keys, 409.
#[tokio::test]
async fn receiver_in_inbox_mode_rekeys_through_the_admin_api() {
    const SECRET: &str = "whsec_receiver_rekey_0123456789";
    const TOKEN: &str = "operator-token-0123456789abcdef";
    const K1: &str = "k1:AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=";
    let rotated = format!("k2:AgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgI=,{K1}");
    let db = std::env::temp_dir().join(format!(
        "tower-webhook-receiver-rekey-{}.db",
        uuid::Uuid::new_v4().simple()
    ));
    let base = [
        ("WEBHOOK_SCHEME", "stripe"),
        ("WEBHOOK_SECRETS", SECRET),
        ("WEBHOOK_MODE", "inbox"),
        ("WEBHOOK_ADMIN_TOKEN", TOKEN),
    ];
    let with = |keys: Option<&str>| -> Vec<(&str, String)> {
        let mut env: Vec<(&str, String)> =
            base.iter().map(|(k, v)| (*k, (*v).to_owned())).collect();
        if let Some(keys) = keys {
            env.push(("WEBHOOK_ENCRYPTION_KEYS", keys.to_owned()));
        }
        env
    };
    let start = async |env: Vec<(&str, String)>| {
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        start_receiver(&db, &env).await
    };
    let rekey = async |url: &str| {
        let url = url.replace("/webhooks", "/admin/rekey");
        let mut headers = HeaderMap::new();
        let bearer = HeaderValue::from_str(&format!("Bearer {TOKEN}")).unwrap();
        headers.insert(http::header::AUTHORIZATION, bearer);
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        let (status, body) = post(&url, headers, b"{}".to_vec()).await.unwrap();
        (status, String::from_utf8_lossy(&body).into_owned())
    };

    let (mut receiver, url, mut out) = start(with(Some(K1))).await;
    deliver_canary(&url, SECRET, &mut out).await;
    receiver.kill().await.unwrap();
    let (mut receiver, url, _out) = start(with(Some(&rotated))).await;
    assert_eq!(
        rekey(&url).await,
        (StatusCode::OK, r#"{"rekeyed":1,"unreadable":0}"#.to_owned())
    );
    assert_eq!(
        rekey(&url).await,
        (StatusCode::OK, r#"{"rekeyed":0,"unreadable":0}"#.to_owned())
    );
    receiver.kill().await.unwrap();
    let (mut receiver, url, _out) = start(with(None)).await;
    assert_eq!(rekey(&url).await.0, StatusCode::CONFLICT);
    receiver.kill().await.unwrap();
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", db.display()));
    }
}

/// `WEBHOOK_BODY_RETENTION_SECS` in `inbox` mode: once the event is processed, the
/// receiver's tick expires its body (the operator API shows `body_state` `expired`, the
/// body empty) and its key stays (delivered again: acknowledged, not run); in `nats`
/// mode the receiver refuses to start, naming the stream's `max_age`.
#[tokio::test]
async fn receiver_in_inbox_mode_with_a_body_retention_expires_processed_bodies() {
    const SECRET: &str = "whsec_receiver_retention_0123456";
    const TOKEN: &str = "operator-token-0123456789";
    let env = [
        ("WEBHOOK_SCHEME", "stripe"),
        ("WEBHOOK_SECRETS", SECRET),
        ("WEBHOOK_MODE", "inbox"),
        ("WEBHOOK_BODY_RETENTION_SECS", "0"),
        ("WEBHOOK_ADMIN_TOKEN", TOKEN),
    ];
    let db = std::env::temp_dir().join(format!(
        "tower-webhook-receiver-retention-{}.db",
        uuid::Uuid::new_v4().simple()
    ));
    let (mut receiver, url, mut out) = start_receiver(&db, &env).await;
    let canary = deliver_canary(&url, SECRET, &mut out).await;
    let bearer = format!("Bearer {TOKEN}");
    let auth = [(http::header::AUTHORIZATION, bearer.as_str())];
    let event = url.replace("/webhooks", "/admin/events/stripe/evt_sealed");
    let mut row = serde_json::Value::Null;
    for _ in 0..50 {
        let (status, _, json) = ask(http::Method::GET, &event, &auth, None).await;
        assert_eq!(status, StatusCode::OK, "{json}");
        row = serde_json::from_str(&json).unwrap();
        if row["body_state"] == "expired" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(row["body_state"], "expired", "{row}");
    assert_eq!(row["body"], "", "{row}");
    assert!(!row.to_string().contains(&canary), "{row}");
    let finished = tokio::time::timeout(Duration::from_secs(5), out.next_line()).await;
    assert_eq!(
        finished.unwrap().unwrap().as_deref(),
        Some("finished evt_sealed")
    );
    // The key stays: delivered again, acknowledged, and nothing runs.
    let body = format!(
        r#"{{"id":"evt_sealed","type":"payment_intent.succeeded","livemode":false,"data":{{"object":{{"id":"pi_1","email":"{canary}@example.com"}}}}}}"#
    )
    .into_bytes();
    let headers = signed_headers(&Scheme::stripe(), SECRET, "", &body);
    assert_eq!(
        post(&url, headers, body).await.unwrap().0,
        StatusCode::NO_CONTENT
    );
    let again = tokio::time::timeout(Duration::from_secs(1), out.next_line()).await;
    assert!(again.is_err(), "the event ran again: {again:?}");
    receiver.kill().await.unwrap();
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", db.display()));
    }

    let env = [
        ("WEBHOOK_BODY_RETENTION_SECS", "60"),
        ("WEBHOOK_MODE", "nats"),
        ("BIND", "127.0.0.1:0"),
    ];
    let output = run_with("receiver", &[], &env).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("max_age"), "{stderr}");
}

#[tokio::test]
async fn receiver_slow_handler_keeps_its_claim_and_a_hang_up_never_reruns_it() {
    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let db = std::env::temp_dir().join(format!(
        "tower-webhook-receiver-slow-{}.db",
        std::process::id()
    ));
    // A 1 s lease and a handler that answers 3 s after its effect.
    let (mut child, url, mut stdout) = start_receiver(
        &db,
        &[
            ("WEBHOOK_SCHEME", "standard"),
            ("WEBHOOK_SECRETS", SECRET),
            ("WEBHOOK_LEASE_SECS", "1"),
            ("WEBHOOK_HANDLER_DELAY_MS", "3000"),
        ],
    )
    .await;
    let deliver = |id: &'static str| {
        let url = url.clone();
        async move {
            let body = event_body(id, "invoice.paid", "in_1");
            let headers = signed_headers(&Scheme::standard(), SECRET, id, &body);
            post(&url, headers, body).await.unwrap().0
        }
    };

    // The client hangs up half a second into the run (a provider's timeout).
    let hung_up = tokio::time::timeout(Duration::from_millis(500), deliver("evt_slow")).await;
    assert!(hung_up.is_err(), "the client gave up mid-handler");
    assert_eq!(
        next_line(&mut stdout).await.as_deref(),
        Some("handled evt_slow")
    );
    // Past the 1 s lease, still running: the lease was renewed, so the retry waits.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(deliver("evt_slow").await, StatusCode::CONFLICT);
    // After the run: recorded as done although nobody was listening for its answer.
    let mut status = StatusCode::CONFLICT;
    for _ in 0..40 {
        status = deliver("evt_slow").await;
        if status != StatusCode::CONFLICT {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(status, StatusCode::NO_CONTENT);
    // The next line is the next event's: `evt_slow` was handled once.
    let next = tokio::spawn(deliver("evt_after"));
    assert_eq!(
        next_line(&mut stdout).await.as_deref(),
        Some("handled evt_after")
    );
    assert_eq!(next.await.unwrap(), StatusCode::NO_CONTENT);
    child.kill().await.unwrap();
    let _ = std::fs::remove_file(&db);
}

/// Sends SIGTERM to `child`, as a supervisor (systemd, Kubernetes) does at a deploy.
fn terminate(child: &tokio::process::Child) {
    send_signal(child, "TERM");
}

/// Sends the signal `name` (`TERM`, `INT`: what Ctrl-C sends) to `child`.
fn send_signal(child: &tokio::process::Child, name: &str) {
    let pid = child.id().expect("still running").to_string();
    let sent = std::process::Command::new("kill")
        .args([&format!("-{name}"), &pid])
        .status()
        .unwrap();
    assert!(sent.success(), "kill -{name} {pid}");
}

/// The receiver in `mode` with a handler of `delay_ms` and a drain of `drain_secs`: one
/// event delivered (in dedupe mode its client hangs up mid-handler), SIGTERM once the
/// handler runs. Returns how the process ended, how long after the signal, the SQLite
/// file, and the lines printed after the signal.
async fn sigterm_mid_handler(
    mode: &str,
    id: &'static str,
    delay_ms: &str,
    drain_secs: &str,
) -> (std::process::ExitStatus, Duration, PathBuf, Vec<String>) {
    let db = std::env::temp_dir().join(format!(
        "tower-webhook-receiver-drain-{mode}-{}-{}.db",
        std::process::id(),
        id
    ));
    let _ = std::fs::remove_file(&db);
    let env = [
        ("WEBHOOK_SCHEME", "standard"),
        ("WEBHOOK_SECRETS", DRAIN_SECRET),
        ("WEBHOOK_MODE", mode),
        ("WEBHOOK_HANDLER_DELAY_MS", delay_ms),
        ("WEBHOOK_DRAIN_SECS", drain_secs),
    ];
    let (mut child, url, mut stdout) = start_receiver(&db, &env).await;
    let delivered = deliver_standard(&url, id);
    if mode == "dedupe" {
        let hung_up = tokio::time::timeout(Duration::from_millis(500), delivered).await;
        assert!(hung_up.is_err(), "the client gave up mid-handler");
    } else {
        assert_eq!(delivered.await, StatusCode::NO_CONTENT, "accepted");
    }
    let handled = format!("handled {id}");
    assert_eq!(next_line(&mut stdout).await, Some(handled));
    terminate(&child);
    let signalled = std::time::Instant::now();
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .expect("exits")
        .unwrap();
    let took = signalled.elapsed();
    eprintln!(
        "{mode}, handler {delay_ms} ms, drain {drain_secs} s: {status} {took:?} after SIGTERM"
    );
    let mut after = Vec::new();
    while let Some(line) = next_line(&mut stdout).await {
        after.push(line);
    }
    (status, took, db, after)
}

const DRAIN_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// A signed delivery of `id` (standard scheme) to `url`; its status.
async fn deliver_standard(url: &str, id: &str) -> StatusCode {
    let body = event_body(id, "invoice.paid", "in_1");
    let headers = signed_headers(&Scheme::standard(), DRAIN_SECRET, id, &body);
    post(url, headers, body).await.unwrap().0
}

/// SIGTERM while a handler of 2 s runs: the receiver waits for it, exits 0, and the
/// restarted receiver's redelivery gets 204 without running the handler again.
async fn receiver_on_sigterm_waits_for_the_running_handler(mode: &str, id: &'static str) {
    let (status, took, db, after) = sigterm_mid_handler(mode, id, "2000", "30").await;
    assert!(status.success(), "{status}");
    assert!(
        took >= Duration::from_millis(1000),
        "waited for the handler: {took:?}"
    );
    assert!(after.is_empty(), "{after:?}");
    let (mut child, url, mut stdout) = start_receiver(
        &db,
        &[
            ("WEBHOOK_SCHEME", "standard"),
            ("WEBHOOK_SECRETS", DRAIN_SECRET),
            ("WEBHOOK_MODE", mode),
        ],
    )
    .await;
    assert_eq!(deliver_standard(&url, id).await, StatusCode::NO_CONTENT);
    let again = tokio::time::timeout(Duration::from_secs(2), stdout.next_line()).await;
    assert!(again.is_err(), "the handler ran again: {again:?}");
    child.kill().await.unwrap();
    let _ = std::fs::remove_file(&db);
}

/// SIGTERM with a drain shorter than the handler: the receiver exits 0 within the bound,
/// the handler stopped and its claim (row) released, and the restarted receiver runs it.
async fn receiver_on_sigterm_past_the_drain_releases_the_handler_and_exits(
    mode: &str,
    id: &'static str,
) {
    let (status, took, db, _) = sigterm_mid_handler(mode, id, "6000", "1").await;
    assert!(status.success(), "{status}");
    assert!(took < Duration::from_secs(3), "within the bound: {took:?}");
    let (mut child, url, mut stdout) = start_receiver(
        &db,
        &[
            ("WEBHOOK_SCHEME", "standard"),
            ("WEBHOOK_SECRETS", DRAIN_SECRET),
            ("WEBHOOK_MODE", mode),
        ],
    )
    .await;
    // Released: runs at once, not after the 60 s lease.
    assert_eq!(deliver_standard(&url, id).await, StatusCode::NO_CONTENT);
    assert_eq!(next_line(&mut stdout).await, Some(format!("handled {id}")));
    child.kill().await.unwrap();
    let _ = std::fs::remove_file(&db);
}

#[tokio::test]
async fn receiver_in_dedupe_mode_on_sigterm_waits_for_a_hung_up_handler_and_exits_0() {
    receiver_on_sigterm_waits_for_the_running_handler("dedupe", "evt_term_dedupe").await;
}

#[tokio::test]
async fn receiver_in_inbox_mode_on_sigterm_waits_for_the_worker_and_exits_0() {
    receiver_on_sigterm_waits_for_the_running_handler("inbox", "evt_term_inbox").await;
}

#[tokio::test]
async fn receiver_in_dedupe_mode_past_the_drain_releases_the_handler_and_exits_0() {
    receiver_on_sigterm_past_the_drain_releases_the_handler_and_exits("dedupe", "evt_cut_dedupe")
        .await;
}

#[tokio::test]
async fn receiver_in_inbox_mode_past_the_drain_hands_the_row_back_and_exits_0() {
    receiver_on_sigterm_past_the_drain_releases_the_handler_and_exits("inbox", "evt_cut_inbox")
        .await;
}

const INBOX_CURRENT: &str = "whsec_inbox_example_current_0123";
const INBOX_OLD: &str = "whsec_inbox_example_old_01234567";
const INBOX_TOKEN: &str = "inbox-operator-token-0123456789";

/// The inbox example on the SQLite file `db`, its secrets rotating (the current one, then
/// the old): the child, its URL and its stdout, as [`start_receiver`] gives them.
async fn start_inbox_example(
    db: &std::path::Path,
) -> (
    tokio::process::Child,
    String,
    tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
) {
    let secrets = format!("{INBOX_CURRENT},{INBOX_OLD}");
    let env = [
        ("WEBHOOK_SECRETS", secrets.as_str()),
        ("WEBHOOK_ADMIN_TOKEN", INBOX_TOKEN),
    ];
    spawn_receiver(Command::new(example_binary("inbox")), db, &env).await
}

/// SIGTERM (a deploy) while the inbox example's worker runs a 3 s `demo.slow` event: it
/// stops accepting, lets the event finish and exits 0. Restarted on the same file, its
/// admin API shows the event processed by its one attempt, and a redelivery runs nothing.
/// An example that stopped on Ctrl-C only died of the signal mid-event (no exit code, the
/// row still leased, to run again after its 60 s lease).
#[tokio::test]
async fn inbox_example_on_sigterm_finishes_the_running_event_and_exits_0() {
    inbox_example_on_signal_finishes_the_running_event("TERM", "evt_inbox_term").await;
}

/// The same on Ctrl-C (SIGINT).
#[tokio::test]
async fn inbox_example_on_ctrl_c_finishes_the_running_event_and_exits_0() {
    inbox_example_on_signal_finishes_the_running_event("INT", "evt_inbox_int").await;
}

async fn inbox_example_on_signal_finishes_the_running_event(signal: &str, id: &'static str) {
    let db = fresh_db(&format!("inbox-example-{signal}"));
    let (mut child, url, mut stdout) = start_inbox_example(&db).await;
    let deliver = move |url: String, secret: &'static str| async move {
        let body = event_body(id, "demo.slow", "obj_1");
        let headers = signed_headers(&Scheme::stripe(), secret, "", &body);
        post(&url, headers, body).await.unwrap().0
    };
    // Signed with the old secret: still verified while the rotation lasts.
    assert_eq!(deliver(url, INBOX_OLD).await, StatusCode::NO_CONTENT);
    let started = format!("started {id} (attempt 1)");
    assert_eq!(next_raw_line(&mut stdout).await, Some(started));

    send_signal(&child, signal);
    let signalled = std::time::Instant::now();
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .expect("exits")
        .unwrap();
    let took = signalled.elapsed();
    eprintln!("inbox example: {status} {took:?} after SIG{signal}");
    assert_eq!(status.code(), Some(0), "{status}");
    assert!(
        took >= Duration::from_secs(2),
        "waited for the event: {took:?}"
    );
    let mut after = Vec::new();
    while let Some(line) = next_raw_line(&mut stdout).await {
        after.push(line);
    }
    assert_eq!(
        after,
        [format!("processed {id}")],
        "finished before the exit"
    );

    let (mut child, url, mut stdout) = start_inbox_example(&db).await;
    let bearer = format!("Bearer {INBOX_TOKEN}");
    let auth = [(http::header::AUTHORIZATION, bearer.as_str())];
    let event = url.replace("/webhooks", &format!("/admin/events/stripe/{id}"));
    let (status, _, json) = ask(http::Method::GET, &event, &auth, None).await;
    assert_eq!(status, StatusCode::OK, "{json}");
    let row: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(row["state"], "processed", "{row}");
    let history = row["history"].as_array().unwrap();
    assert_eq!(history.len(), 1, "one attempt: {row}");
    assert_eq!(history[0]["outcome"], "processed", "{row}");
    // Without the token the API is shut.
    let (status, _, _) = ask(http::Method::GET, &event, &[], None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    // Delivered again, with the current secret: acknowledged, and nothing runs.
    assert_eq!(deliver(url, INBOX_CURRENT).await, StatusCode::NO_CONTENT);
    let again = tokio::time::timeout(Duration::from_secs(2), stdout.next_line()).await;
    assert!(again.is_err(), "the event ran again: {again:?}");
    child.kill().await.unwrap();
    let _ = std::fs::remove_file(&db);
}

/// Writes `head` (and the first `sent` bytes of `body`) on a raw connection and returns
/// the status line the server answers with, however long the client keeps the rest back.
async fn raw_post(url: &str, head: &str, body: &[u8], sent: usize) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let authority = url.trim_start_matches("http://").split('/').next().unwrap();
    let mut stream = tokio::net::TcpStream::connect(authority).await.unwrap();
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(&body[..sent]).await.unwrap();
    let mut answer = vec![0; 256];
    let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut answer))
        .await
        .expect("answered while the body was held back")
        .unwrap();
    String::from_utf8_lossy(&answer[..n])
        .lines()
        .next()
        .unwrap_or("")
        .to_owned()
}

#[tokio::test]
async fn receiver_refuses_bad_headers_before_the_body_and_times_a_stalled_body_out() {
    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let db = std::env::temp_dir().join(format!(
        "tower-webhook-receiver-early-{}.db",
        std::process::id()
    ));
    let (mut child, url, mut stdout) = start_receiver(
        &db,
        &[
            ("WEBHOOK_SCHEME", "standard"),
            ("WEBHOOK_SECRETS", SECRET),
            ("WEBHOOK_BODY_TIMEOUT_SECS", "1"),
        ],
    )
    .await;
    // 1 MiB announced, no signature header: 400 before the client sends a byte of it.
    let head = "POST /webhooks HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\n\
                content-length: 1048576\r\n\r\n";
    let status = raw_post(&url, head, b"", 0).await;
    assert_eq!(status, "HTTP/1.1 400 Bad Request");

    // Signed, but the body stops halfway: 408 within the read timeout, no handler run.
    let body = event_body("evt_stalled", "invoice.paid", "in_1");
    let headers = signed_headers(&Scheme::standard(), SECRET, "evt_stalled", &body);
    let mut head = format!(
        "POST /webhooks HTTP/1.1\r\nhost: test\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (name, value) in &headers {
        head.push_str(&format!("{name}: {}\r\n", value.to_str().unwrap()));
    }
    head.push_str("\r\n");
    let started = std::time::Instant::now();
    let status = raw_post(&url, &head, &body, body.len() / 2).await;
    assert_eq!(status, "HTTP/1.1 408 Request Timeout");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );

    // The whole delivery still runs, once: the next line is its, not the stalled one's.
    let (status, _) = post(&url, headers, body).await.unwrap();
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(
        next_line(&mut stdout).await.as_deref(),
        Some("handled evt_stalled")
    );
    child.kill().await.unwrap();
    let _ = std::fs::remove_file(&db);
}

/// Waits until the server closes `stream` (end of stream, or a reset), at most `bound`.
async fn closed_within(stream: &mut tokio::net::TcpStream, bound: Duration) -> bool {
    use tokio::io::AsyncReadExt;
    let mut sink = [0; 1024];
    tokio::time::timeout(bound, async {
        loop {
            match stream.read(&mut sink).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {} // an answer (408 or 200): read on to the close
            }
        }
    })
    .await
    .is_ok()
}

#[tokio::test]
async fn receiver_closes_connections_that_hold_their_headers_back_so_deliveries_still_get_in() {
    use tokio::io::AsyncWriteExt;
    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let db = std::env::temp_dir().join(format!(
        "tower-webhook-receiver-slowloris-{}.db",
        std::process::id()
    ));
    // 256 file descriptors, as in the review that found it; 400 connections that never
    // finish their headers are more than it can hold at once.
    let mut shell = Command::new("sh");
    shell
        .arg("-c")
        .arg("ulimit -n 256 && exec \"$0\"")
        .arg(example_binary("receiver"));
    let (mut child, url, mut stdout) = spawn_receiver(
        shell,
        &db,
        &[
            ("WEBHOOK_SCHEME", "standard"),
            ("WEBHOOK_SECRETS", SECRET),
            ("WEBHOOK_HEADER_TIMEOUT_SECS", "1"),
        ],
    )
    .await;
    let authority = url.trim_start_matches("http://").split('/').next().unwrap();
    let mut stalled = Vec::new();
    for _ in 0..400 {
        let mut stream = tokio::net::TcpStream::connect(authority).await.unwrap();
        stream
            .write_all(b"POST /webhooks HTTP/1.1\r\nhost: test\r\n")
            .await
            .unwrap();
        stalled.push(stream);
    }

    // A signed delivery behind them gets in once the stalled ones are closed.
    let body = event_body("evt_after_slowloris", "invoice.paid", "in_1");
    let headers = signed_headers(&Scheme::standard(), SECRET, "evt_after_slowloris", &body);
    let answered = tokio::time::timeout(Duration::from_secs(15), post(&url, headers, body))
        .await
        .expect("a signed delivery is answered while 400 connections hold their headers back")
        .unwrap();
    assert_eq!(answered.0, StatusCode::NO_CONTENT);
    assert_eq!(
        next_line(&mut stdout).await.as_deref(),
        Some("handled evt_after_slowloris")
    );
    for (n, stream) in stalled.iter_mut().enumerate() {
        assert!(
            closed_within(stream, Duration::from_secs(10)).await,
            "stalled connection {n} is still open"
        );
    }

    // An idle keep-alive connection is closed after the same bound, not kept for minutes.
    let mut idle = tokio::net::TcpStream::connect(authority).await.unwrap();
    idle.write_all(b"GET /metrics HTTP/1.1\r\nhost: test\r\n\r\n")
        .await
        .unwrap();
    let started = std::time::Instant::now();
    assert!(closed_within(&mut idle, Duration::from_secs(5)).await);
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "closed before the bound: {:?}",
        started.elapsed()
    );
    child.kill().await.unwrap();
    let _ = std::fs::remove_file(&db);
}

#[tokio::test]
async fn receiver_runs_nothing_for_a_github_delivery_replayed_under_a_fresh_id() {
    const SECRET: &str = "github-receiver-secret-0123";
    let db = std::env::temp_dir().join(format!(
        "tower-webhook-receiver-github-{}.db",
        std::process::id()
    ));
    let (mut child, url, mut stdout) = start_receiver(
        &db,
        &[("WEBHOOK_SCHEME", "github"), ("WEBHOOK_SECRETS", SECRET)],
    )
    .await;
    let deliver = |delivery: &'static str, body: &'static [u8]| {
        let url = url.clone();
        async move {
            let mut headers = signed_headers(&Scheme::github(), SECRET, delivery, body);
            headers.insert("x-github-event", HeaderValue::from_static("push"));
            post(&url, headers, body.to_vec()).await.unwrap().0
        }
    };
    let push = br#"{"ref":"refs/heads/main","after":"abc"}"#;
    assert_eq!(deliver("delivery-1", push).await, StatusCode::NO_CONTENT);
    assert_eq!(
        next_line(&mut stdout).await.as_deref(),
        Some("handled delivery-1")
    );
    // Captured and re-sent under a fresh (unsigned) delivery id: acknowledged, not run.
    assert_eq!(deliver("delivery-2", push).await, StatusCode::NO_CONTENT);
    let next = br#"{"ref":"refs/heads/main","after":"def"}"#;
    assert_eq!(deliver("delivery-3", next).await, StatusCode::NO_CONTENT);
    assert_eq!(
        next_line(&mut stdout).await.as_deref(),
        Some("handled delivery-3"),
        "nothing ran for the replay"
    );
    child.kill().await.unwrap();
    let _ = std::fs::remove_file(&db);
}

#[tokio::test]
async fn receiver_answers_handshakes_and_dedupes_events_without_an_id() {
    let db = |name: &str| {
        std::env::temp_dir().join(format!(
            "tower-webhook-receiver-{name}-{}.db",
            std::process::id()
        ))
    };

    // Zoom: the signed URL validation is answered; an event without an id runs once.
    const ZOOM: &str = "zoom-secret-token-0123456789";
    let zoom_db = db("zoom");
    let (mut child, url, mut stdout) = start_receiver(
        &zoom_db,
        &[("WEBHOOK_SCHEME", "zoom"), ("WEBHOOK_SECRETS", ZOOM)],
    )
    .await;
    let send = |body: &'static [u8]| {
        let url = url.clone();
        async move {
            let headers = signed_headers(&Scheme::zoom(), ZOOM, "", body);
            post(&url, headers, body.to_vec()).await.unwrap()
        }
    };
    let validation = br#"{"event":"endpoint.url_validation","payload":{"plainToken":"qgg8vlvZRS6UYooatFL8Aw"},"event_ts":1654503849680}"#;
    let (status, body) = send(validation).await;
    assert_eq!(status, StatusCode::OK);
    let answer: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(answer["plainToken"], "qgg8vlvZRS6UYooatFL8Aw");
    assert_eq!(answer["encryptedToken"].as_str().unwrap().len(), 64);
    let started = br#"{"event":"meeting.started","event_ts":1700000000001,"payload":{}}"#;
    assert_eq!(send(started).await.0, StatusCode::NO_CONTENT);
    let first = next_line(&mut stdout).await.unwrap();
    assert!(first.starts_with("handled sha256:"), "{first}");
    assert_eq!(send(started).await.0, StatusCode::NO_CONTENT, "a retry");
    let ended = br#"{"event":"meeting.ended","event_ts":1700000000002,"payload":{}}"#;
    assert_eq!(send(ended).await.0, StatusCode::NO_CONTENT);
    let second = next_line(&mut stdout).await.unwrap();
    assert!(
        second.starts_with("handled sha256:") && second != first,
        "{second}"
    );
    child.kill().await.unwrap();
    let _ = std::fs::remove_file(&zoom_db);

    // Discord: PING answered, a bad signature 401.
    let discord_db = db("discord");
    let public = "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a";
    let seed = "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60";
    let (mut child, url, _stdout) = start_receiver(
        &discord_db,
        &[("WEBHOOK_SCHEME", "discord"), ("WEBHOOK_SECRETS", public)],
    )
    .await;
    let ping = br#"{"id":"787053080478613555","type":1,"version":1}"#;
    let headers = signed_headers(&Scheme::discord(), seed, "", ping);
    let (status, body) = post(&url, headers.clone(), ping.to_vec()).await.unwrap();
    assert_eq!((status, &body[..]), (StatusCode::OK, &br#"{"type":1}"#[..]));
    let forged = br#"{"id":"787053080478613555","type":1,"version":2}"#;
    let (status, _) = post(&url, headers, forged.to_vec()).await.unwrap();
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    child.kill().await.unwrap();
    let _ = std::fs::remove_file(&discord_db);

    // Meta: the GET handshake with the configured verify token, 403 with another.
    let meta_db = db("meta");
    let (mut child, url, _stdout) = start_receiver(
        &meta_db,
        &[
            ("WEBHOOK_SCHEME", "meta"),
            ("WEBHOOK_SECRETS", "0123456789abcdef0123456789abcdef"),
            ("WEBHOOK_VERIFY_TOKEN", "meatyhamhock"),
        ],
    )
    .await;
    let challenge = |token: &str| {
        format!("{url}?hub.mode=subscribe&hub.challenge=1158201444&hub.verify_token={token}")
    };
    let (status, body) = get(&challenge("meatyhamhock")).await.unwrap();
    assert_eq!((status, &body[..]), (StatusCode::OK, &b"1158201444"[..]));
    assert_eq!(
        get(&challenge("a-guess")).await.unwrap().0,
        StatusCode::FORBIDDEN
    );
    child.kill().await.unwrap();
    let _ = std::fs::remove_file(&meta_db);

    // Twilio behind a proxy: it signs the public URL, the receiver is told it.
    let twilio_db = db("twilio");
    const TOKEN: &str = "twilio-auth-token-0123456789abcd";
    const PUBLIC: &str = "https://hooks.example.com/webhooks";
    let (mut child, url, mut stdout) = start_receiver(
        &twilio_db,
        &[
            ("WEBHOOK_SCHEME", "twilio"),
            ("WEBHOOK_SECRETS", TOKEN),
            ("WEBHOOK_PUBLIC_URL", PUBLIC),
        ],
    )
    .await;
    let body = b"MessageSid=SM1&Body=hello&From=%2B14158675309".to_vec();
    let sign = |for_url: &str| {
        Scheme::twilio()
            .sign_request(
                [TOKEN],
                &http::Method::POST,
                for_url,
                "",
                std::time::SystemTime::now(),
                &body,
            )
            .unwrap()
    };
    let (status, _) = post(&url, sign(PUBLIC), body.clone()).await.unwrap();
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert!(next_line(&mut stdout)
        .await
        .unwrap()
        .starts_with("handled sha256:"));
    let (status, _) = post(&url, sign(&url), body.clone()).await.unwrap();
    assert_eq!(status, StatusCode::BAD_REQUEST, "signed for another URL");
    child.kill().await.unwrap();
    let _ = std::fs::remove_file(&twilio_db);
}

#[tokio::test]
async fn receiver_verifies_sns_paypal_and_graph_deliveries() {
    let db = |name: &str| {
        std::env::temp_dir().join(format!(
            "tower-webhook-receiver-{name}-{}.db",
            std::process::id()
        ))
    };
    // The published vectors are from 2017 and 2022: a window that reaches them.
    const YEARS: &str = "400000000";

    // SNS with AWS's published vector and its certificate pinned: handled once, by its
    // MessageId; another topic is refused.
    let sns_db = db("sns");
    let vector = include_str!("fixtures/sns/notification-2.json");
    let message: serde_json::Value = serde_json::from_str(vector).unwrap();
    let topic = message["TopicArn"].as_str().unwrap();
    let (mut child, url, mut stdout) = start_receiver(
        &sns_db,
        &[
            ("WEBHOOK_SCHEME", "sns"),
            ("WEBHOOK_SNS_TOPICS", topic),
            (
                "WEBHOOK_SECRETS",
                include_str!("fixtures/sns/certificate.pem"),
            ),
            ("WEBHOOK_TOLERANCE_SECS", YEARS),
        ],
    )
    .await;
    for _ in 0..2 {
        let (status, _) = post(&url, HeaderMap::new(), vector.as_bytes().to_vec())
            .await
            .unwrap();
        assert!(status.is_success(), "{status}");
    }
    assert_eq!(
        next_line(&mut stdout).await.unwrap(),
        format!("handled {}", message["MessageId"].as_str().unwrap())
    );
    let forged = vector.replace("Hello world", "Hello there");
    let (status, _) = post(&url, HeaderMap::new(), forged.into_bytes())
        .await
        .unwrap();
    assert_eq!(status, StatusCode::BAD_REQUEST);
    child.kill().await.unwrap();
    let _ = std::fs::remove_file(&sns_db);

    // SNS without a pinned certificate fetches it — but never from a URL off AWS's SNS
    // hosts: refused before any connection.
    let fetch_db = db("sns-fetch");
    let (mut child, url, _stdout) = start_receiver(
        &fetch_db,
        &[
            ("WEBHOOK_SCHEME", "sns"),
            ("WEBHOOK_SNS_TOPICS", topic),
            ("WEBHOOK_TOLERANCE_SECS", YEARS),
        ],
    )
    .await;
    let off_host = vector.replace("sns.us-east-2.amazonaws.com/Simple", "127.0.0.1/Simple");
    let (status, _) = post(&url, HeaderMap::new(), off_host.into_bytes())
        .await
        .unwrap();
    assert_eq!(status, StatusCode::BAD_REQUEST);
    child.kill().await.unwrap();
    let _ = std::fs::remove_file(&fetch_db);

    // PayPal with its SDK's vector and certificate pinned.
    let paypal_db = db("paypal");
    let (mut child, url, mut stdout) = start_receiver(
        &paypal_db,
        &[
            ("WEBHOOK_SCHEME", "paypal"),
            ("WEBHOOK_PAYPAL_WEBHOOK_ID", "96605875FF6516633"),
            (
                "WEBHOOK_SECRETS",
                include_str!("fixtures/paypal/certificate.pem"),
            ),
            ("WEBHOOK_TOLERANCE_SECS", YEARS),
        ],
    )
    .await;
    let mut headers = HeaderMap::new();
    for (name, value) in [
        ("paypal-cert-url", "https://api.sandbox.paypal.com/v1/notifications/test"),
        ("paypal-transmission-id", "071f7d20-1584-11e7-abf0-6b62a8a99ac4"),
        ("paypal-transmission-time", "2017-03-30T20:04:05Z"),
        ("paypal-auth-algo", "SHA256withRSA"),
        ("paypal-transmission-sig", "aBjgm5/xljRYu3G64Q0axISrP2xcy7WbW1u4UTCKnQvyprOZ1a1BBmqn2Jdr6ce8E76I3Ti/AL9y4VYSHyGSEaoE6dVQcCDebLbOXLH0fjTAbTc1/rmfdWmsk0DPltW84Y8W8jOHe3CLWDOwg5zmozyt+AceG2x5eOiw7mLSycaEoj/5RG+dOIWXnmWcLEArbG3VFshy0wuhZrKuGa9C/bD4Ku+Y9gK7Bv5I5IuGRVnTGpcFnVG0KxOyJxccLGyBVCIUMY5IZS7LkmJszQ3HZZFDTNihvgJHECSLwLhzUaysIye5G6CbbLdtAmeeb6wiDciEAvr2dFf+SplOR4Lrng=="),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    let body = include_bytes!("fixtures/paypal/billing-plan-created.json").to_vec();
    let (status, _) = post(&url, headers.clone(), body.clone()).await.unwrap();
    assert!(status.is_success(), "{status}");
    assert_eq!(
        next_line(&mut stdout).await.unwrap(),
        "handled WH-2MW4820926242972J-6SG447389E205703U"
    );
    let mut forged = body;
    forged[10] ^= 1;
    let (status, _) = post(&url, headers, forged).await.unwrap();
    assert_eq!(status, StatusCode::BAD_REQUEST);
    child.kill().await.unwrap();
    let _ = std::fs::remove_file(&paypal_db);

    // Microsoft Graph: the validation token is echoed; a batch with the client state is
    // handled (by digest), one without it refused.
    const STATE: &str = "graph-client-state-0123456789";
    let graph_db = db("graph");
    let (mut child, url, mut stdout) = start_receiver(
        &graph_db,
        &[
            ("WEBHOOK_SCHEME", "microsoft-graph"),
            ("WEBHOOK_SECRETS", STATE),
        ],
    )
    .await;
    let (status, text) = post(
        &format!("{url}?validationToken=Validation%3A%20reachability"),
        HeaderMap::new(),
        Vec::new(),
    )
    .await
    .unwrap();
    assert_eq!(
        (status, &text[..]),
        (StatusCode::OK, &b"Validation: reachability"[..])
    );
    let batch = format!(
        r#"{{"value":[{{"subscriptionId":"s-1","clientState":"{STATE}","changeType":"created","resource":"Users/1"}}]}}"#
    );
    let (status, _) = post(&url, HeaderMap::new(), batch.into_bytes())
        .await
        .unwrap();
    assert!(status.is_success(), "{status}");
    assert!(next_line(&mut stdout)
        .await
        .unwrap()
        .starts_with("handled sha256:"));
    let guessed =
        r#"{"value":[{"subscriptionId":"s-1","clientState":"guessed-state-0123456789"}]}"#;
    let (status, _) = post(&url, HeaderMap::new(), guessed.as_bytes().to_vec())
        .await
        .unwrap();
    assert_eq!(status, StatusCode::BAD_REQUEST);
    child.kill().await.unwrap();
    let _ = std::fs::remove_file(&graph_db);
}

#[tokio::test]
async fn receiver_without_secrets_explains_how_to_send_a_test_delivery() {
    let db = std::env::temp_dir().join(format!(
        "tower-webhook-receiver-dev-{}.db",
        std::process::id()
    ));
    let mut child = Command::new(example_binary("receiver"))
        .env_remove("DATABASE_URL")
        .env("WEBHOOK_SQLITE", &db)
        .env_remove("WEBHOOK_SECRETS")
        .env_remove("WEBHOOK_SCHEME")
        .env("BIND", "127.0.0.1:0")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut text = String::new();
    for _ in 0..4 {
        let line = tokio::time::timeout(Duration::from_secs(30), stderr.next_line())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        text.push_str(&line);
        text.push('\n');
    }
    assert!(text.contains("development secret"), "{text}");
    assert!(text.contains("cargo run --example send"), "{text}");
    let url = text
        .lines()
        .next()
        .unwrap()
        .split_whitespace()
        .last()
        .unwrap()
        .to_owned();

    // The send example, as the message says, gets the delivery handled.
    let output = Command::new(example_binary("send"))
        .env_remove("WEBHOOK_SECRETS")
        .env_remove("WEBHOOK_SCHEME")
        .arg(&url)
        .arg("evt_from_send")
        .output()
        .await
        .unwrap();
    assert!(output.status.success());
    assert!(String::from_utf8_lossy(&output.stdout).starts_with("204 No Content evt_from_send"));
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    assert_eq!(
        next_line(&mut stdout).await.as_deref(),
        Some("handled evt_from_send")
    );
    child.kill().await.unwrap();
}

/// Runs an example binary with `args` (and `env`), bounded at 60 s: its output.
async fn run_with(name: &str, args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let run = Command::new(example_binary(name))
        .args(args)
        .envs(env.iter().copied())
        .kill_on_drop(true)
        .output();
    tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .unwrap_or_else(|_| panic!("{name} {args:?} finishes within 60 s"))
        .unwrap()
}

#[tokio::test]
async fn help_on_send_demo_and_loadtest_exits_0_and_lists_every_flag() {
    for (name, listed) in [
        (
            "send",
            &[
                "[URL]",
                "[EVENT_ID]",
                "--id <EVENT_ID>",
                "--type <TYPE>",
                "--body <JSON>",
                "--body-file <PATH>",
                "--scheme <NAME>",
                "--secret <SECRET>",
                "[default: demo.ping]",
                "http://127.0.0.1:3000/webhooks",
            ][..],
        ),
        (
            "demo",
            &[
                "--events <N>",
                "--database-url <postgres://…>",
                "--nats <nats://…>",
                "--outage-secs <S>",
                "--json",
                "--seed <SEED>",
                "[default: 10000]",
                "[default: 3]",
                "[default: 7]",
            ][..],
        ),
        (
            "loadtest",
            &[
                "--events <N>",
                "--concurrency <C>",
                "--stores <STORE,…>",
                "--json",
                "[default: 5000]",
                "[default: 32]",
                "inbox-postgres",
            ][..],
        ),
    ] {
        for help in ["--help", "-h"] {
            let output = run_with(name, &[help], &[]).await;
            let stdout = String::from_utf8_lossy(&output.stdout);
            assert!(
                output.status.success(),
                "{name} {help}: {stdout}\n{}",
                String::from_utf8_lossy(&output.stderr)
            );
            assert!(
                stdout.contains(&format!("Usage: {name}")),
                "{name} {help}: {stdout}"
            );
            for flag in listed {
                assert!(
                    stdout.contains(flag),
                    "{name} {help}: {flag} missing:\n{stdout}"
                );
            }
        }
    }
}

#[tokio::test]
async fn help_on_every_example_exits_0_without_starting_anything() {
    let mut names: Vec<String> = std::fs::read_dir("examples")
        .unwrap()
        .filter_map(|entry| {
            let name = entry.unwrap().file_name().into_string().unwrap();
            name.strip_suffix(".rs").map(str::to_owned)
        })
        .collect();
    names.sort();
    assert!(names.len() >= 10, "{names:?}");
    assert!(names.iter().any(|n| n == "inbox"), "{names:?}");
    for name in &names {
        for help in ["--help", "-h"] {
            // A receiver that started would serve until killed: run_with's bound fails it.
            let output = run_with(name, &[help], &[("BIND", "127.0.0.1:0")]).await;
            let stdout = String::from_utf8_lossy(&output.stdout);
            assert!(
                output.status.success(),
                "{name} {help}: {stdout}\n{}",
                String::from_utf8_lossy(&output.stderr)
            );
            assert!(
                stdout.contains(&format!("Usage: {name}")),
                "{name} {help}: {stdout}"
            );
            assert!(
                output.stderr.is_empty(),
                "{name} {help} started: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
    }
}

/// The names of the environment variables `source` reads (`env::var("X")`,
/// `env_number("X", …)`, `env_list("X")`).
fn variables_read(source: &str) -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    for call in ["env::var(\"", "env_number(\"", "env_list(\""] {
        for (at, _) in source.match_indices(call) {
            let rest = &source[at + call.len()..];
            names.insert(rest[..rest.find('"').unwrap()].to_owned());
        }
    }
    names
}

#[tokio::test]
async fn receiver_help_and_the_readme_table_name_every_variable_it_reads() {
    let mut read = variables_read(&std::fs::read_to_string("examples/receiver.rs").unwrap());
    for support in ["examples/support/mod.rs", "examples/support/processors.rs"] {
        read.extend(variables_read(&std::fs::read_to_string(support).unwrap()));
    }
    assert!(read.len() >= 20, "{read:?}");
    let output = run_with("receiver", &["--help"], &[]).await;
    let help = String::from_utf8_lossy(&output.stdout);
    let readme = std::fs::read_to_string("README.md").unwrap();
    for name in &read {
        assert!(
            help.contains(&format!("  {name} [")),
            "--help lacks {name}:\n{help}"
        );
        assert!(
            readme.contains(&format!("| `{name}` |")),
            "README's receiver table lacks {name}"
        );
    }
}

/// The inbox example's `--help` names every variable its source reads.
#[tokio::test]
async fn inbox_help_names_every_variable_it_reads() {
    let read = variables_read(&std::fs::read_to_string("examples/inbox.rs").unwrap());
    assert!(read.len() >= 5, "{read:?}");
    let output = run_with("inbox", &["--help"], &[]).await;
    let help = String::from_utf8_lossy(&output.stdout);
    for name in &read {
        assert!(
            help.contains(&format!("  {name} [")),
            "--help lacks {name}:\n{help}"
        );
    }
}

#[tokio::test]
async fn send_help_posts_nothing_even_after_a_url() {
    let (listener, base) = listener().await;
    let url = format!("{base}/webhooks");
    for args in [
        &["--help"][..],
        &[&url, "--help"][..],
        &[&url, "evt_x", "-h"][..],
    ] {
        let output = run_with("send", args, &[]).await;
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "{args:?}: {stdout}");
        assert!(stdout.contains("Usage: send"), "{args:?}: {stdout}");
        assert!(!stdout.contains("No Content"), "{args:?} posted: {stdout}");
    }
    // Nobody connected to the URL given: nothing was posted.
    let connected = tokio::time::timeout(Duration::from_millis(200), listener.accept()).await;
    assert!(connected.is_err(), "send --help connected to {url}");
}

#[tokio::test]
async fn send_options_choose_the_type_body_scheme_and_secret() {
    const SECRET: &str = "whsec_stripe_secret_for_send_options";
    // The receiver verifies Stripe with this secret; send is told both by its options
    // (its environment says another scheme and secret, which must not be used).
    let env = [("WEBHOOK_SCHEME", "stripe"), ("WEBHOOK_SECRETS", SECRET)];
    let db = std::env::temp_dir().join(format!(
        "tower-webhook-receiver-send-options-{}.db",
        std::process::id()
    ));
    let (mut child, url, mut stdout) = start_receiver(&db, &env).await;
    let decoy = [
        ("WEBHOOK_SCHEME", "standard"),
        ("WEBHOOK_SECRETS", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
    ];
    let options = ["--scheme", "stripe", "--secret", SECRET];
    let file = db.with_extension("json");
    std::fs::write(&file, r#"{"id":"evt_from_file","type":"invoice.paid"}"#).unwrap();
    let file = file.to_str().unwrap();
    for (args, id) in [
        (
            &["--id", "evt_typed", "--type", "invoice.paid"][..],
            "evt_typed",
        ),
        (
            &[
                "--id",
                "evt_body",
                "--body",
                r#"{"id":"evt_body","type":"x"}"#,
            ][..],
            "evt_body",
        ),
        (
            &["--id", "evt_from_file", "--body-file", file][..],
            "evt_from_file",
        ),
    ] {
        let all: Vec<&str> = [&url[..]]
            .into_iter()
            .chain(options)
            .chain(args.iter().copied())
            .collect();
        let output = run_with("send", &all, &decoy).await;
        let printed = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success() && printed.starts_with("204"),
            "{args:?}: {printed}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert_eq!(
            next_line(&mut stdout).await.as_deref(),
            Some(&*format!("handled {id}"))
        );
    }
    // Without the options, the environment's scheme and secret: refused by this receiver.
    let output = run_with("send", &[&url, "--id", "evt_decoy"], &decoy).await;
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(printed.starts_with("400"), "{printed}");
    // A body and a type together are refused by the parser, before anything is sent.
    let output = run_with("send", &[&url, "--type", "a", "--body", "{}"], &decoy).await;
    assert!(!output.status.success());
    child.kill().await.unwrap();
    let _ = std::fs::remove_file(&db);
    let _ = std::fs::remove_file(file);
}

#[tokio::test]
async fn send_url_then_id_option_sends_that_id() {
    const SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";
    let env = [("WEBHOOK_SCHEME", "standard"), ("WEBHOOK_SECRETS", SECRET)];
    let db = std::env::temp_dir().join(format!(
        "tower-webhook-receiver-send-id-{}.db",
        std::process::id()
    ));
    let (mut child, url, mut stdout) = start_receiver(&db, &env).await;
    // Options after the URL parse as options; before it, too.
    for (args, id) in [
        (&[&url[..], "--id", "evt_by_flag"][..], "evt_by_flag"),
        (&["--id", "evt_flag_first", &url[..]][..], "evt_flag_first"),
        (&[&url[..], "evt_positional"][..], "evt_positional"),
    ] {
        let output = run_with("send", args, &env).await;
        let printed = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "{args:?}: {printed}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(
            printed.starts_with(&format!("204 No Content {id}")),
            "{args:?}: {printed}"
        );
        assert_eq!(
            next_line(&mut stdout).await.as_deref(),
            Some(&format!("handled {id}")[..]),
            "{args:?}"
        );
    }
    child.kill().await.unwrap();
    let _ = std::fs::remove_file(&db);
}

#[tokio::test]
async fn bad_command_lines_exit_2_with_clap_message_and_run_nothing() {
    let (listener, base) = listener().await;
    let url = format!("{base}/webhooks");
    for (name, args, message) in [
        ("send", &["--bogus"][..], "unexpected argument '--bogus'"),
        (
            "send",
            &[&url, "--idd", "x"][..],
            "unexpected argument '--idd'",
        ),
        (
            "send",
            &["--help-me"][..],
            "unexpected argument '--help-me'",
        ),
        ("send", &["127.0.0.1:3000/webhooks"][..], "not a URL"),
        ("send", &["/webhooks"][..], "not an absolute http:// URL"),
        (
            "send",
            &["ftp://127.0.0.1/webhooks"][..],
            "not an absolute http:// URL",
        ),
        ("send", &["http://"][..], "not a URL"),
        ("send", &["http://bad host/"][..], "not a URL"),
        (
            "send",
            &["https://127.0.0.1/webhooks"][..],
            "https is not supported",
        ),
        (
            "send",
            &[&url, "evt_a", "--id", "evt_b"][..],
            "cannot be used with",
        ),
        (
            "send",
            &[&url, "evt_a", "evt_b"][..],
            "unexpected argument 'evt_b'",
        ),
        ("demo", &["--bogus"][..], "unexpected argument '--bogus'"),
        (
            "demo",
            &["--events"][..],
            "a value is required for '--events <N>'",
        ),
        ("demo", &["--events", "many"][..], "invalid digit"),
        ("demo", &["--events", "0"][..], "0 is not in 1..=100000"),
        (
            "demo",
            &["--events", "100001"][..],
            "100001 is not in 1..=100000",
        ),
        ("demo", &["--outage-secs", "61"][..], "61 is not in 0..=60"),
        ("demo", &["--seed", "-1"][..], "unexpected argument '-1'"),
        (
            "loadtest",
            &["--bogus"][..],
            "unexpected argument '--bogus'",
        ),
        ("loadtest", &["--events", "0"][..], "0 is not in 1..=100000"),
        (
            "loadtest",
            &["--concurrency", "257"][..],
            "257 is not in 1..=256",
        ),
        (
            "loadtest",
            &["--stores", "memory,memcached"][..],
            "invalid value 'memcached'",
        ),
    ] {
        let output = run_with(name, args, &[]).await;
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{name} {args:?}: {stderr}");
        assert!(stderr.starts_with("error: "), "{name} {args:?}: {stderr}");
        assert!(
            stderr.contains(message),
            "{name} {args:?}: {message} missing:\n{stderr}"
        );
        assert!(stderr.contains("--help"), "{name} {args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{name} {args:?}: {stderr}");
        assert!(output.stdout.is_empty(), "{name} {args:?} ran");
    }
    let connected = tokio::time::timeout(Duration::from_millis(200), listener.accept()).await;
    assert!(connected.is_err(), "a refused command line posted to {url}");
}

/// The receiver's next line of output, waiting at most 10 s.
/// A SQLite file path of this test's own (`name`), none there yet.
/// `WEBHOOK_PROCESSORS` with a type filter, and a processor failing every attempt: each
/// event runs once in each processor whose filter takes it, and `flaky` fails it twice
/// (`WEBHOOK_MAX_ATTEMPTS=2`) without holding the others.
#[tokio::test]
async fn receiver_in_inbox_mode_runs_each_event_once_per_processor_its_filter_takes() {
    let db = fresh_db("processors");
    receiver_fans_out(&db, &[("WEBHOOK_MODE", "inbox")]).await;
    let _ = std::fs::remove_file(&db);
}

#[tokio::test]
async fn receiver_in_nats_mode_runs_each_event_once_per_processor_its_filter_takes() {
    let streams = NatsStreams::new("tw_test_processors");
    let db = fresh_db("processors-nats");
    let env = [
        ("WEBHOOK_MODE", "nats"),
        ("NATS_URL", streams.url.as_str()),
        ("NATS_STREAM", streams.stream.as_str()),
    ];
    receiver_fans_out(&db, &env).await;
    streams.delete().await;
    let _ = std::fs::remove_file(&db);
}

/// In `amqp` mode a queue per processor (`<queue>-<name>`), bound to the exchange: the
/// same lines as the other modes.
#[tokio::test]
async fn receiver_in_amqp_mode_runs_each_event_once_per_processor_its_filter_takes() {
    let names = AmqpNames::new("tw_test_processors");
    let db = fresh_db("processors-amqp");
    receiver_fans_out(&db, &names.env()).await;
    names
        .delete_fanned_out(&["billing", "email", "flaky"])
        .await;
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", db.display()));
    }
}

/// Two invoices and two payments, to `billing=invoice.*`, `email` and `flaky`: the lines
/// printed are exactly one `handled` and `finished` per (event, processor) the filters
/// take, and two `failed` per event from `flaky`; `GET /admin/counts` counts the four
/// dead for `flaky` alone.
async fn receiver_fans_out(db: &std::path::Path, mode: &[(&str, &str)]) {
    const SECRET: &str = "whsec_receiver_processors_012345";
    const TOKEN: &str = "operator-fan-out-token-0123456789";
    let mut env = vec![
        ("WEBHOOK_SCHEME", "stripe"),
        ("WEBHOOK_SECRETS", SECRET),
        ("WEBHOOK_ADMIN_TOKEN", TOKEN),
        ("WEBHOOK_PROCESSORS", "billing=invoice.*,email,flaky"),
        ("WEBHOOK_FAIL_PROCESSORS", "flaky"),
        ("WEBHOOK_MAX_ATTEMPTS", "2"),
    ];
    env.extend_from_slice(mode);
    let (mut child, url, mut stdout) = start_receiver(db, &env).await;
    let events = [
        ("evt_fan_in_1", "invoice.paid"),
        ("evt_fan_in_2", "invoice.payment_failed"),
        ("evt_fan_pi_1", "payment_intent.succeeded"),
        ("evt_fan_pi_2", "payment_intent.created"),
    ];
    for (id, event_type) in events {
        let body = event_body(id, event_type, "obj_1");
        let headers = signed_headers(&Scheme::stripe(), SECRET, "", &body);
        assert_eq!(
            post(&url, headers, body).await.unwrap().0,
            StatusCode::NO_CONTENT
        );
    }
    let mut expected = Vec::new();
    for (id, event_type) in events {
        let mut processors = vec!["email"];
        if event_type.starts_with("invoice.") {
            processors.push("billing");
        }
        for processor in processors {
            expected.push(format!("handled {id} {processor}"));
            expected.push(format!("finished {id} {processor}"));
        }
        expected.extend([format!("failed {id} flaky"), format!("failed {id} flaky")]);
    }
    expected.sort();
    // Every line expected (the retries come after 1 s), then a quiet while: nothing more.
    let mut lines = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while lines.len() < expected.len() {
        match tokio::time::timeout_at(deadline, stdout.next_line()).await {
            Ok(Ok(Some(line))) => lines.push(line),
            _ => break,
        }
    }
    while let Ok(Ok(Some(line))) =
        tokio::time::timeout(Duration::from_millis(2500), stdout.next_line()).await
    {
        lines.push(line);
    }
    lines.sort();
    assert_eq!(lines, expected);
    let counts_url = url.replace("/webhooks", "/admin/counts");
    let bearer = format!("Bearer {TOKEN}");
    let auth = [(http::header::AUTHORIZATION, bearer.as_str())];
    let mut counts = serde_json::Value::Null;
    for _ in 0..50 {
        let (status, _, json) = ask(http::Method::GET, &counts_url, &auth, None).await;
        assert_eq!(status, StatusCode::OK, "{json}");
        counts = serde_json::from_str(&json).unwrap();
        if counts["processors"]["flaky"]["dead"] == 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let dead = |p: &str| counts["processors"][p]["dead"].clone();
    assert_eq!(
        [
            dead("flaky"),
            dead("email"),
            dead("billing"),
            counts["dead"].clone()
        ],
        [4, 0, 0, 4].map(|n| serde_json::json!(n)),
        "{counts}"
    );
    child.kill().await.unwrap();
}

/// A processor named in `WEBHOOK_FAIL_PROCESSORS` or `WEBHOOK_PROCESSOR_DELAY_MS` that
/// `WEBHOOK_PROCESSORS` does not configure is a typo that would test nothing: refused.
#[tokio::test]
async fn receiver_refuses_to_start_with_a_name_that_is_not_a_processor() {
    for (mode, variable, value) in [
        ("inbox", "WEBHOOK_FAIL_PROCESSORS", "emial"),
        ("nats", "WEBHOOK_FAIL_PROCESSORS", "emial"),
        ("inbox", "WEBHOOK_PROCESSOR_DELAY_MS", "emial:100"),
        ("inbox", "WEBHOOK_FAIL_PROCESSORS", "billing"),
    ] {
        let processors = if value == "billing" {
            ""
        } else {
            "billing,email"
        };
        let db = fresh_db("processors-refused");
        let env = [
            ("WEBHOOK_MODE", mode),
            ("WEBHOOK_SQLITE", db.to_str().unwrap()),
            ("BIND", "127.0.0.1:0"),
            ("WEBHOOK_PROCESSORS", processors),
            (variable, value),
        ];
        let output = run_with("receiver", &[], &env).await;
        let stderr = String::from_utf8_lossy(&output.stderr);
        let name = value.split(':').next().unwrap();
        assert!(!output.status.success(), "{env:?} started: {stderr}");
        assert!(
            stderr.contains(&format!("{variable}: '{name}' is not a processor")),
            "{env:?}: {stderr}"
        );
        assert!(!stderr.contains("receiving"), "{env:?} listened: {stderr}");
        let _ = std::fs::remove_file(&db);
    }
}

fn fresh_db(name: &str) -> PathBuf {
    let db = std::env::temp_dir().join(format!(
        "tower-webhook-receiver-{name}-{}.db",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&db);
    db
}

/// The receiver's next `handled` line (the `finished` lines its worker prints in the
/// queue modes are passed over: `next_raw_line` reads them).
async fn next_line(
    lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
) -> Option<String> {
    loop {
        let line = next_raw_line(lines).await;
        if !line.as_deref().is_some_and(|l| l.starts_with("finished ")) {
            return line;
        }
    }
}

async fn next_raw_line(
    lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
) -> Option<String> {
    tokio::time::timeout(Duration::from_secs(10), lines.next_line())
        .await
        .unwrap()
        .unwrap()
}

const GH_SECRET: &str = "github-example-secret-0123";

#[tokio::test]
async fn axum_example_verifies_its_route_and_leaves_others_alone() {
    let (listener, base) = listener().await;
    let verifier = Verifier::new(Scheme::github(), [GH_SECRET]).unwrap();
    tokio::spawn(async move { axum::serve(listener, axum_example::app(verifier)).await });

    let body = br#"{"zen":"Keep it logically awesome."}"#.to_vec();
    let mut headers = signed_headers(&Scheme::github(), GH_SECRET, "d-1", &body);
    headers.insert("x-github-event", HeaderValue::from_static("ping"));
    let (status, text) = post(&format!("{base}/webhooks/github"), headers, body.clone())
        .await
        .unwrap();
    assert_eq!(
        (status, text.as_ref()),
        (StatusCode::OK, &b"handled ping d-1"[..])
    );

    let (status, _) = post(&format!("{base}/webhooks/github"), HeaderMap::new(), body)
        .await
        .unwrap();
    assert_eq!(status, StatusCode::BAD_REQUEST);

    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Empty<bytes::Bytes>>();
    let health = client
        .get(format!("{base}/health").parse().unwrap())
        .await
        .unwrap();
    assert_eq!(health.status(), StatusCode::OK);
}

#[tokio::test]
async fn event_extractor_without_the_layer_is_a_500_that_names_the_fix() {
    use axum::routing::post as route_post;
    let (listener, base) = listener().await;
    let app = axum::Router::new()
        .route(
            "/forgot",
            route_post(|_: tower_webhook::Event| async { "never" }),
        )
        .route(
            "/optional",
            route_post(|e: Option<tower_webhook::Event>| async move { format!("{}", e.is_some()) }),
        );
    tokio::spawn(async move { axum::serve(listener, app).await });
    let (status, text) = post(&format!("{base}/forgot"), HeaderMap::new(), b"{}".to_vec())
        .await
        .unwrap();
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(std::str::from_utf8(&text)
        .unwrap()
        .contains("VerifyWebhookLayer"));
    let (status, text) = post(
        &format!("{base}/optional"),
        HeaderMap::new(),
        b"{}".to_vec(),
    )
    .await
    .unwrap();
    assert_eq!((status, text.as_ref()), (StatusCode::OK, &b"false"[..]));
}

#[tokio::test]
async fn hyper_example_serves_verified_deliveries() {
    let (listener, base) = listener().await;
    let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let verifier = Verifier::new(Scheme::standard(), [secret]).unwrap();
    tokio::spawn(hyper_example::serve(listener, verifier));
    let body = event_body("msg_hyper", "x", "o").to_vec();
    let len = body.len();
    let headers = signed_headers(&Scheme::standard(), secret, "msg_hyper", &body);
    let (status, text) = post(&format!("{base}/anything"), headers, body.clone())
        .await
        .unwrap();
    assert_eq!(status, StatusCode::OK);
    assert_eq!(text, format!("handled msg_hyper ({len} bytes)"));
    let headers = signed_headers(
        &Scheme::standard(),
        "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD",
        "msg_hyper",
        &body,
    );
    let (status, _) = post(&format!("{base}/anything"), headers, body)
        .await
        .unwrap();
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn tonic_example_serves_grpc_health_and_verified_webhooks_on_one_port() {
    let (listener, base) = listener().await;
    let secret = "whsec_tonic_example_0123456789";
    let verifier = Verifier::new(Scheme::stripe(), [secret]).unwrap();
    tokio::spawn(tonic_example::serve(listener, verifier));

    let body = event_body("evt_tonic", "x", "o");
    let headers = signed_headers(&Scheme::stripe(), secret, "", &body);
    let (status, text) = post(&format!("{base}/webhooks"), headers, body.clone())
        .await
        .unwrap();
    assert_eq!(
        (status, text.as_ref()),
        (StatusCode::OK, &b"handled evt_tonic"[..])
    );
    let (status, _) = post(&format!("{base}/webhooks"), HeaderMap::new(), body)
        .await
        .unwrap();
    assert_eq!(status, StatusCode::BAD_REQUEST);

    let channel = tonic::transport::Endpoint::from_shared(base)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let reply = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap();
    assert_eq!(
        reply.into_inner().status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
}

#[tokio::test]
async fn loadtest_handles_every_event_exactly_once_on_every_store() {
    let output = Command::new(example_binary("loadtest"))
        .args(["--events", "300", "--concurrency", "16", "--json"])
        .output()
        .await
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let reports: Vec<serde_json::Value> = serde_json::from_slice(&output.stdout).unwrap();
    let deduped: Vec<_> = reports
        .iter()
        .filter(|r| r["scenario"].as_str().unwrap().contains("dedupe"))
        .collect();
    assert_eq!(
        deduped.len(),
        5,
        "memory, sqlite, postgres, postgres-tx, redis"
    );
    let bare = &reports[0];
    let deliveries = bare["deliveries"].as_u64().unwrap();
    assert!(
        (400..460).contains(&deliveries),
        "about 30 % duplicates: {bare}"
    );
    for r in deduped {
        assert_eq!(r["double_effects"], 0, "{r}");
        assert_eq!(r["lost"], 0, "{r}");
        assert_eq!(r["handled"], 300, "{r}");
        assert_eq!(r["deliveries"], deliveries, "{r}");
        for status in r["statuses"].as_object().unwrap().keys() {
            assert!(
                ["204", "409"].contains(&status.as_str()),
                "only 204s and 409s: {r}"
            );
        }
    }
    // The inbox's accept stores each event once and answers every delivery 204.
    let inboxes: Vec<_> = reports
        .iter()
        .filter(|r| r["scenario"].as_str().unwrap().contains("inbox accept"))
        .collect();
    assert_eq!(inboxes.len(), 2, "inbox-sqlite, inbox-postgres");
    for r in inboxes {
        assert_eq!(r["handled"], 300, "stored once each: {r}");
        assert_eq!(r["lost"], 0, "{r}");
        assert_eq!(r["statuses"].as_object().unwrap().len(), 1, "{r}");
        assert_eq!(r["statuses"]["204"], deliveries, "{r}");
    }
    // Without dedupe, every duplicate runs the handler again: what the layer prevents.
    assert_eq!(
        bare["double_effects"].as_u64(),
        Some(deliveries - 300),
        "{bare}"
    );
}

/// The worst day at a small scale: every effect exactly once, the forged and stale ones
/// refused, every object left in its newest event's state, on the embedded store and on
/// PostgreSQL.
async fn demo(extra: &[&str]) -> serde_json::Value {
    // Bounded: a demo that hangs (a worker that never drains) fails here, not CI's clock.
    let run = Command::new(example_binary("demo"))
        .args(["--events", "400", "--json"])
        .args(extra)
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(240), run)
        .await
        .expect("the demo finishes within 4 min")
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let table: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    for key in [
        "sent",
        "accepted",
        "duplicates",
        "rejected",
        "processed",
        "dead",
        "double_effects",
        "lost",
        "moved_back",
        "outage_seconds",
        "unavailable",
        "seconds",
        "processors",
    ] {
        assert!(table.get(key).is_some(), "{key} missing: {table}");
    }
    // A row per processor: each (event, processor) its filter takes exactly once, and
    // `billing` never ran a refund (one event in five), which its filter excludes.
    for (processor, expected) in [("ledger", 400), ("billing", 320), ("email", 400)] {
        let row = &table["processors"][processor];
        assert_eq!(row["expected"], expected, "{processor}: {table}");
        // JetStream's `processed` for a processor with a filter is the stream's messages
        // less those it passed unrun. The passes are counted in memory the moment they are
        // acknowledged and written by a task of their own (`passes.rs`), and this process's
        // reads add what is not written yet: a batch can no longer go missing (billing read
        // 377 of 320 once while a write was still under way). A pass whose acknowledgement
        // NATS took but whose answer the outage swallowed is handed back and never passed
        // again: off by one each.
        let processed = row["processed"].as_i64().unwrap();
        match extra.contains(&"--nats") && processor == "billing" {
            true => assert!(
                (expected - 2..=expected + 2).contains(&processed),
                "{processor}: {table}"
            ),
            false => assert_eq!(processed, expected, "{processor}: {table}"),
        }
        for zero in ["dead", "double_effects", "lost", "excluded_runs"] {
            assert_eq!(row[zero], 0, "{processor} {zero}: {table}");
        }
    }
    assert_eq!(table["processors"].as_object().unwrap().len(), 3, "{table}");
    assert_eq!(table["double_effects"], 0, "{table}");
    assert_eq!(table["lost"], 0, "{table}");
    assert_eq!(table["moved_back"], 0, "late events never win: {table}");
    // The events, not the routes (1 120 over the three processors).
    assert_eq!(table["accepted"], 400, "{table}");
    assert_eq!(
        table["dead"],
        0,
        "{table}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(table["processed"], 400, "{table}");
    let sent = table["sent"].as_u64().unwrap();
    let rejected = table["rejected"].as_u64().unwrap();
    let duplicates = table["duplicates"].as_u64().unwrap();
    assert_eq!(
        400 + duplicates + rejected,
        sent,
        "every delivery accounted for: {table}"
    );
    assert!(duplicates > 400, "1–5 deliveries per event: {table}");
    assert_eq!(table["outage_seconds"], 3.0, "{table}");
    assert!(
        table["unavailable"].as_u64().unwrap() > 0,
        "the store outage turned deliveries away (503), and they were retried: {table}"
    );
    table
}

#[tokio::test]
async fn demo_on_sqlite_holds_exactly_once() {
    demo(&[]).await;
}

#[tokio::test]
async fn demo_on_postgres_holds_exactly_once() {
    let url = common::fresh_pg_url().await;
    demo(&["--database-url", &url]).await;
}

/// The same day with the events handed to NATS JetStream (deduplicated in SQLite in front
/// for the long tail), and NATS cut off for the outage.
#[tokio::test]
async fn demo_on_nats_jetstream_holds_exactly_once() {
    let url = common::nats_url();
    demo(&["--nats", &url]).await;
}

/// Runs an example that checks itself; its standard output, once it succeeded.
async fn run_example(name: &str) -> String {
    let output = Command::new(example_binary(name)).output().await.unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

#[tokio::test]
async fn tenants_example_verifies_each_tenant_with_its_own_secret_from_sqlite() {
    let stdout = run_example("tenants").await;
    assert!(
        stdout.contains("handler ran: stripe/acme evt_1, stripe/globex evt_1, stripe/acme evt_4"),
        "{stdout}"
    );
    assert!(!stdout.contains("whsec_"), "no secret printed: {stdout}");
}

/// The guide's shop: the example checks its own rules and fails when one breaks; here its
/// table is read too.
#[tokio::test]
async fn orders_example_fulfils_once_closes_cancelled_and_ignores_test_mode() {
    let stdout = run_example("orders").await;
    for row in [
        "| 1 | fulfilled | 1 | 1 |",
        "| 2 | closed | 0 | 0 |",
        "| 3 | pending | 0 | 0 |",
        "| 4 | fulfilled | 1 | 1 |",
        "customer cus_1: new@example.com",
        "every rule held",
    ] {
        assert!(stdout.contains(row), "{row} missing:\n{stdout}");
    }
}

/// A sender's W3C trace context: its trace id and span id (hex), and the header.
const SENDER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const SENDER_SPAN: &str = "00f067aa0ba902b7";

/// Posts a signed Stripe delivery of `id` that carries the sender's `traceparent`.
async fn deliver_traced(url: &str, secret: &str, id: &str, event_type: &str) {
    let body = event_body(id, event_type, "in_1");
    let mut headers = signed_headers(&Scheme::stripe(), secret, "", &body);
    let traceparent = format!("00-{SENDER_TRACE}-{SENDER_SPAN}-01");
    headers.insert("traceparent", HeaderValue::from_str(&traceparent).unwrap());
    assert_eq!(
        post(url, headers, body).await.unwrap().0,
        StatusCode::NO_CONTENT
    );
}

/// With `WEBHOOK_TRUST_TRACEPARENT=1`: `id`'s one accept span is the child of the sender's
/// span (from [`deliver_traced`]) and its attempt is the accept's child, in the sender's trace.
fn assert_trusted_trace(spans: &[opentelemetry_proto::tonic::trace::v1::Span], id: &str) {
    use common::otlp::spans_of;
    let sender_trace = hex::decode(SENDER_TRACE).unwrap();
    let accept = spans_of(spans, "webhook.accept", id);
    assert_eq!(accept.len(), 1);
    assert_eq!(
        (&accept[0].trace_id, &accept[0].parent_span_id),
        (&sender_trace, &hex::decode(SENDER_SPAN).unwrap()),
        "trusted: the sender's span is the accept's parent"
    );
    // Not under the delivery's span: the source and type are its own.
    let attribute = |key| common::otlp::attribute(accept[0], key);
    assert_eq!(attribute("source").as_deref(), Some("stripe"));
    assert!(attribute("event_type").is_some());
    let attempt = spans_of(spans, "webhook.process", id)[0];
    assert_eq!(attempt.trace_id, sender_trace);
    assert_eq!(attempt.parent_span_id, accept[0].span_id);
}

/// With `OTEL_EXPORTER_OTLP_ENDPOINT`, the receiver exports over OTLP/HTTP (protobuf by
/// default) a PRODUCER span per accept and a CONSUMER span per attempt, each with
/// `messaging.message.id`: attempt 1 is the accept's child; a retry (attempt 2) is a new
/// trace linked to the accept; the sender's `traceparent` is a link, never the parent.
#[tokio::test]
async fn receiver_exports_each_accept_and_attempt_over_otlp_in_the_accepts_trace() {
    use common::otlp::{attribute, collector, spans_of};
    const SECRET: &str = "whsec_receiver_otel_0123456789";
    let collector = collector().await;
    let db = fresh_db("otel");
    let (mut child, url, _stdout) = start_receiver(
        &db,
        &[
            ("WEBHOOK_SCHEME", "stripe"),
            ("WEBHOOK_SECRETS", SECRET),
            ("WEBHOOK_MODE", "inbox"),
            ("WEBHOOK_FAIL_TYPES", "invoice.payment_failed"),
            ("WEBHOOK_MAX_ATTEMPTS", "2"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &collector.url),
            ("OTEL_SERVICE_NAME", "receiver-under-test"),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ],
    )
    .await;
    deliver_traced(&url, SECRET, "evt_traced", "charge.succeeded").await;
    deliver_traced(&url, SECRET, "evt_retried", "invoice.payment_failed").await;
    // Attempts: evt_traced once, evt_retried twice (the retry a second later).
    let spans = collector
        .spans_when(|spans| {
            spans_of(spans, "webhook.process", "evt_traced").len() == 1
                && spans_of(spans, "webhook.process", "evt_retried").len() == 2
                && spans_of(spans, "webhook.accept", "evt_retried").len() == 1
        })
        .await;
    let sender_trace = hex::decode(SENDER_TRACE).unwrap();
    let sender_span = hex::decode(SENDER_SPAN).unwrap();
    const PRODUCER: i32 = 4;
    const CONSUMER: i32 = 5;
    for id in ["evt_traced", "evt_retried"] {
        let accept = spans_of(&spans, "webhook.accept", id);
        assert_eq!(accept.len(), 1, "one accept of {id}");
        let accept = accept[0];
        assert_eq!(accept.kind, PRODUCER, "{accept:?}");
        // Under the delivery's span, which has the source and type.
        let delivery = spans
            .iter()
            .find(|s| s.span_id == accept.parent_span_id)
            .expect("the accept's parent exported");
        assert_eq!(delivery.name, "webhook.delivery");
        assert_eq!(attribute(delivery, "source").as_deref(), Some("stripe"));
        assert_eq!(attribute(accept, "source"), None);
        // Not in the sender's trace: linked to it.
        assert_ne!(accept.trace_id, sender_trace);
        assert!(
            accept
                .links
                .iter()
                .any(|l| l.trace_id == sender_trace && l.span_id == sender_span),
            "the sender's context linked: {accept:?}"
        );
        let mut attempts = spans_of(&spans, "webhook.process", id);
        attempts.sort_by_key(|s| attribute(s, "attempt"));
        let first = attempts[0];
        assert_eq!(first.kind, CONSUMER, "{first:?}");
        assert_eq!(attribute(first, "attempt").as_deref(), Some("1"));
        assert_eq!(
            (&first.trace_id, &first.parent_span_id),
            (&accept.trace_id, &accept.span_id),
            "attempt 1 is the accept's child"
        );
        for retry in &attempts[1..] {
            assert_eq!(retry.kind, CONSUMER);
            assert_ne!(
                retry.trace_id, accept.trace_id,
                "a retry starts a new trace"
            );
            assert!(
                retry
                    .links
                    .iter()
                    .any(|l| l.trace_id == accept.trace_id && l.span_id == accept.span_id),
                "a retry is linked to the accept: {retry:?}"
            );
        }
    }
    assert!(collector
        .content_types()
        .iter()
        .all(|t| t == "application/x-protobuf"));
    assert!(collector
        .services()
        .iter()
        .all(|s| s == "receiver-under-test"));
    terminate(&child);
    assert!(child.wait().await.unwrap().success());
    let _ = std::fs::remove_file(&db);
}

/// The receiver's batch defaults (2048 spans an export, 16384 queued) apply only where
/// the standard variables are unset: 300 deliveries (600 spans with their accepts alone,
/// past the SDK's 512) export nothing before the schedule, all of them at shutdown; with
/// `OTEL_BSP_MAX_EXPORT_BATCH_SIZE=2`, one delivery's spans go at once.
#[tokio::test]
async fn receiver_exports_in_batches_of_2048_unless_the_variable_says_otherwise() {
    use common::otlp::collector;
    use futures_util::StreamExt;
    const SECRET: &str = "whsec_receiver_batches_0123456789";
    let hour = ("OTEL_BSP_SCHEDULE_DELAY", "3600000"); // no export by the schedule
    let db = fresh_db("otel-batches");
    let collector_default = collector().await;
    // Not this test's environment's (a developer's shell may set them).
    let receiver = || {
        let mut command = Command::new(example_binary("receiver"));
        for name in [
            "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
            "OTEL_BSP_MAX_QUEUE_SIZE",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        ] {
            command.env_remove(name);
        }
        command
    };
    let (child, url, _stdout) = spawn_receiver(
        receiver(),
        &db,
        &[
            ("WEBHOOK_SCHEME", "stripe"),
            ("WEBHOOK_SECRETS", SECRET),
            ("WEBHOOK_MODE", "inbox"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &collector_default.url),
            hour,
        ],
    )
    .await;
    futures_util::stream::iter(0..300)
        .for_each_concurrent(16, |i| {
            let url = &url;
            async move {
                let body = event_body(&format!("evt_batch_{i}"), "invoice.paid", "in_1");
                let headers = signed_headers(&Scheme::stripe(), SECRET, "", &body);
                assert_eq!(
                    post(url, headers, body).await.unwrap().0,
                    StatusCode::NO_CONTENT
                );
            }
        })
        .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        collector_default.content_types().is_empty(),
        "an export before 2048 spans or the schedule"
    );
    terminate(&child);
    let mut child = child;
    assert!(child.wait().await.unwrap().success());
    // Shutdown flushes the batch: every delivery's accept, none dropped.
    let accepts = |spans: &[opentelemetry_proto::tonic::trace::v1::Span]| {
        spans.iter().filter(|s| s.name == "webhook.accept").count()
    };
    collector_default
        .spans_when(|spans| accepts(spans) == 300)
        .await;

    let collector_two = collector().await;
    let db_two = fresh_db("otel-batches-2");
    let (mut child, url, _stdout) = spawn_receiver(
        receiver(),
        &db_two,
        &[
            ("WEBHOOK_SCHEME", "stripe"),
            ("WEBHOOK_SECRETS", SECRET),
            ("WEBHOOK_MODE", "inbox"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &collector_two.url),
            ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "2"),
            hour,
        ],
    )
    .await;
    let body = event_body("evt_batch_two", "invoice.paid", "in_1");
    let headers = signed_headers(&Scheme::stripe(), SECRET, "", &body);
    assert_eq!(
        post(&url, headers, body).await.unwrap().0,
        StatusCode::NO_CONTENT
    );
    collector_two.spans_when(|spans| accepts(spans) == 1).await;
    terminate(&child);
    assert!(child.wait().await.unwrap().success());
    let _ = std::fs::remove_file(&db);
    let _ = std::fs::remove_file(&db_two);
}

/// `WEBHOOK_TRUST_TRACEPARENT=1` (here in nats mode, over OTLP/HTTP JSON): a verified
/// delivery's `traceparent` is the accept's parent, so the attempt is in the sender's trace.
#[tokio::test]
async fn receiver_trusting_traceparent_continues_the_senders_trace_over_otlp_json() {
    use common::otlp::{collector, spans_of};
    const SECRET: &str = "whsec_receiver_trusted_0123456789";
    let collector = collector().await;
    let db = fresh_db("otel-trusted");
    let streams = NatsStreams::new("otel_trusted");
    let (mut child, url, _stdout) = start_receiver(
        &db,
        &[
            ("WEBHOOK_SCHEME", "stripe"),
            ("WEBHOOK_SECRETS", SECRET),
            ("WEBHOOK_MODE", "nats"),
            ("NATS_URL", &streams.url),
            ("NATS_STREAM", &streams.stream),
            ("WEBHOOK_TRUST_TRACEPARENT", "1"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &collector.url),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ],
    )
    .await;
    deliver_traced(&url, SECRET, "evt_trusted", "charge.succeeded").await;
    let spans = collector
        .spans_when(|spans| spans_of(spans, "webhook.process", "evt_trusted").len() == 1)
        .await;
    assert_trusted_trace(&spans, "evt_trusted");
    assert!(collector
        .content_types()
        .iter()
        .all(|t| t == "application/json"));
    terminate(&child);
    assert!(child.wait().await.unwrap().success());
    let _ = std::fs::remove_file(&db);
}

/// The same in `amqp` mode: the accept's span, the sender's child, travels in the
/// message's headers to the attempt; SIGTERM then drains and exits 0.
#[tokio::test]
async fn receiver_in_amqp_mode_trusting_traceparent_continues_the_senders_trace() {
    use common::otlp::{collector, spans_of};
    const SECRET: &str = "whsec_receiver_trusted_0123456789";
    let collector = collector().await;
    let db = fresh_db("amqp-otel-trusted");
    let names = AmqpNames::new("tw_test_trusted");
    let mut env = vec![
        ("WEBHOOK_SCHEME", "stripe"),
        ("WEBHOOK_SECRETS", SECRET),
        ("WEBHOOK_TRUST_TRACEPARENT", "1"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", &collector.url),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
    ];
    env.extend_from_slice(&names.env());
    let (mut child, url, _stdout) = start_receiver(&db, &env).await;
    deliver_traced(&url, SECRET, "evt_trusted", "charge.succeeded").await;
    let spans = collector
        .spans_when(|spans| spans_of(spans, "webhook.process", "evt_trusted").len() == 1)
        .await;
    assert_trusted_trace(&spans, "evt_trusted");
    terminate(&child);
    assert!(child.wait().await.unwrap().success());
    names.delete().await;
    let _ = std::fs::remove_file(&db);
}

/// A protocol this build cannot speak stops the receiver at start, naming the variable.
#[tokio::test]
async fn receiver_refuses_an_otlp_protocol_it_cannot_speak() {
    let out = Command::new(example_binary("receiver"))
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        .env("WEBHOOK_SQLITE", fresh_db("otel-grpc"))
        .env("BIND", "127.0.0.1:0")
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("OTEL_EXPORTER_OTLP_PROTOCOL"), "{stderr}");
}

/// `WEBHOOK_SCHEMAS` in `inbox` mode (the fixtures' schema folder): a Stripe event its
/// schema takes runs; one it refuses is answered 204, never runs, and the operator API
/// counts and lists it `invalid` with its error's JSON pointer. A folder holding a schema
/// that does not compile stops the receiver at start, naming the file; set in `dedupe`
/// mode, the receiver refuses to start.
#[tokio::test]
async fn receiver_in_inbox_mode_with_schemas_keeps_invalid_events_apart() {
    let folder = schemas_fixtures().join("schemas");
    let db = std::env::temp_dir().join(format!(
        "tower-webhook-receiver-schemas-{}.db",
        uuid::Uuid::new_v4().simple()
    ));
    schemas_keep_invalid_events_apart(&db, &[("WEBHOOK_MODE", "inbox")]).await;
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", db.display()));
    }

    // A schema that does not compile: the receiver does not start, and names the file.
    let broken = std::env::temp_dir().join(format!(
        "tower-webhook-schemas-{}",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::create_dir_all(&broken).unwrap();
    std::fs::write(
        broken.join("invoice.paid.json"),
        r#"{"type": "no such type"}"#,
    )
    .unwrap();
    let env = [
        ("WEBHOOK_MODE", "inbox"),
        ("WEBHOOK_SCHEMAS", broken.to_str().unwrap()),
        ("BIND", "127.0.0.1:0"),
    ];
    let output = run_with("receiver", &[], &env).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("invoice.paid.json"), "{stderr}");
    std::fs::remove_dir_all(&broken).unwrap();

    let env = [
        ("WEBHOOK_MODE", "dedupe"),
        ("WEBHOOK_SCHEMAS", folder.to_str().unwrap()),
        ("BIND", "127.0.0.1:0"),
    ];
    let output = run_with("receiver", &[], &env).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("WEBHOOK_SCHEMAS"), "{stderr}");
}

/// The same in `nats` mode (a stream of its own): the invalid event is kept in
/// `<stream>-invalid`, and the operator API counts, lists and requeues it as in `inbox`
/// mode.
#[tokio::test]
async fn receiver_in_nats_mode_with_schemas_keeps_invalid_events_apart() {
    let streams = NatsStreams::new("tw_test_schemas");
    let env = [
        ("WEBHOOK_MODE", "nats"),
        ("NATS_URL", streams.url.as_str()),
        ("NATS_STREAM", streams.stream.as_str()),
    ];
    let db = fresh_db("schemas-nats");
    schemas_keep_invalid_events_apart(&db, &env).await;
    let _ = std::fs::remove_file(&db);
    streams.delete().await;
}

fn schemas_fixtures() -> PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/schemas")
}

/// A receiver in `mode` with the fixtures' schemas and an operator token: of two Stripe
/// deliveries, the one its schema refuses (delivered first) is answered 204 and never
/// handled; `GET /admin/counts` has it as `invalid`, `GET /admin/events?state=invalid`
/// lists it with `state: "invalid"` and its error's JSON pointer, and `POST
/// /admin/requeue {"invalid": true}` checks it again: still invalid (the schemas did not
/// change), and still not handled.
async fn schemas_keep_invalid_events_apart(db: &std::path::Path, mode: &[(&str, &str)]) {
    const SECRET: &str = "whsec_receiver_schemas_01234567";
    const TOKEN: &str = "operator-token-0123456789";
    let fixtures = schemas_fixtures();
    let folder = fixtures.join("schemas");
    let mut env = vec![
        ("WEBHOOK_SCHEME", "stripe"),
        ("WEBHOOK_SECRETS", SECRET),
        ("WEBHOOK_SCHEMAS", folder.to_str().unwrap()),
        ("WEBHOOK_ADMIN_TOKEN", TOKEN),
    ];
    env.extend_from_slice(mode);
    let (mut receiver, url, mut out) = start_receiver(db, &env).await;
    for fixture in ["stripe_invoice_paid_renamed", "stripe_invoice_paid"] {
        let path = fixtures.join("payloads").join(format!("{fixture}.json"));
        let body = std::fs::read(path).unwrap();
        let headers = signed_headers(&Scheme::stripe(), SECRET, "", &body);
        let (status, _) = post(&url, headers, body).await.unwrap();
        assert_eq!(status, StatusCode::NO_CONTENT, "{fixture}");
    }
    // Only the valid one runs: the invalid one came first and never shows.
    let line = tokio::time::timeout(Duration::from_secs(10), out.next_line()).await;
    assert_eq!(
        line.unwrap().unwrap().as_deref(),
        Some("handled evt_1PkValid0001")
    );
    let bearer = format!("Bearer {TOKEN}");
    let auth = [(http::header::AUTHORIZATION, bearer.as_str())];
    let admin = url.replace("/webhooks", "/admin");
    let (status, _, counts) = ask(http::Method::GET, &format!("{admin}/counts"), &auth, None).await;
    assert_eq!(status, StatusCode::OK, "{counts}");
    let counts: serde_json::Value = serde_json::from_str(&counts).unwrap();
    assert_eq!(counts["invalid"], 1, "{counts}");
    let listing = format!("{admin}/events?state=invalid");
    let (status, _, listed) = ask(http::Method::GET, &listing, &auth, None).await;
    assert_eq!(status, StatusCode::OK, "{listed}");
    let listed: serde_json::Value = serde_json::from_str(&listed).unwrap();
    assert_eq!(listed["events"][0]["id"], "evt_1PkInvalid001", "{listed}");
    assert_eq!(listed["events"][0]["state"], "invalid", "{listed}");
    let path = &listed["events"][0]["validation_errors"][0]["path"];
    assert_eq!(path, "/data/object/amount_paid", "{listed}");
    let requeue = format!("{admin}/requeue");
    let body = Some(r#"{"invalid": true}"#);
    let (status, _, done) = ask(http::Method::POST, &requeue, &auth, body).await;
    assert_eq!(status, StatusCode::OK, "{done}");
    let done: serde_json::Value = serde_json::from_str(&done).unwrap();
    assert_eq!(
        done,
        serde_json::json!({"requeued": 0, "still_invalid": 1}),
        "{done}"
    );
    let more = tokio::time::timeout(Duration::from_millis(500), out.next_line()).await;
    assert!(
        more.as_ref()
            .map_or(true, |l| !format!("{l:?}").contains("evt_1PkInvalid001")),
        "the invalid event ran: {more:?}"
    );
    receiver.kill().await.unwrap();
}

/// An exchange and queue of a test's own for a receiver in `amqp` mode (`AMQP_EXCHANGE`,
/// `AMQP_QUEUE`), deleted with everything the receiver made beside them (dead exchange and
/// queue, delay queues) by [`delete`](Self::delete) at the test's end.
struct AmqpNames {
    url: String,
    name: String,
}

impl AmqpNames {
    fn new(prefix: &str) -> Self {
        Self {
            url: common::amqp_url(),
            name: format!("{prefix}_{}", uuid::Uuid::new_v4().simple()),
        }
    }

    /// The receiver's variables for them.
    fn env(&self) -> [(&str, &str); 4] {
        [
            ("WEBHOOK_MODE", "amqp"),
            ("AMQP_URL", self.url.as_str()),
            ("AMQP_EXCHANGE", self.name.as_str()),
            ("AMQP_QUEUE", self.name.as_str()),
        ]
    }

    async fn delete(self) {
        self.delete_fanned_out(&[]).await;
    }

    /// Deletes them with the queues of `processors` (none: `default`'s alone).
    async fn delete_fanned_out(self, processors: &[&str]) {
        let mut builder = tower_webhook::inbox::amqp::Amqp::builder(&self.url)
            .with_exchange(&self.name)
            .unwrap()
            .with_queue(&self.name)
            .unwrap();
        if !processors.is_empty() {
            let specs = processors
                .iter()
                .map(|p| tower_webhook::inbox::ProcessorSpec::new(*p).unwrap());
            builder = builder.with_processors(specs).unwrap();
        }
        let amqp = builder.build().await.unwrap();
        amqp.delete().await.unwrap();
    }
}

/// Two receivers in `amqp` mode on one queue, deduplicating in one SQLite file (the store
/// the dedupe layer and the workers' claims share): each event is published once, whichever
/// receiver got it and however often, and handled once by one of the two workers; a
/// forged one is refused.
#[tokio::test]
async fn receivers_in_amqp_mode_publish_each_event_once_and_their_workers_handle_it_once() {
    const SECRET: &str = "whsec_receiver_amqp_0123456789";
    let names = AmqpNames::new("tw_test_receiver");
    let mut env = vec![("WEBHOOK_SCHEME", "stripe"), ("WEBHOOK_SECRETS", SECRET)];
    env.extend_from_slice(&names.env());
    let db = fresh_db("amqp-shared");
    let (mut a, url_a, out_a) = start_receiver(&db, &env).await;
    let (mut b, url_b, out_b) = start_receiver(&db, &env).await;
    let ids: Vec<String> = (0..6).map(|i| format!("evt_amqp_{i}")).collect();
    // Every event to both receivers, and once more to the first.
    for url in [&url_a, &url_b, &url_a] {
        for id in &ids {
            let body = event_body(id, "payment_intent.succeeded", "pi_1");
            let headers = signed_headers(&Scheme::stripe(), SECRET, "", &body);
            assert_eq!(
                post(url, headers, body).await.unwrap().0,
                StatusCode::NO_CONTENT
            );
        }
    }
    let body = event_body("evt_forged", "payment_intent.succeeded", "pi_1");
    let headers = signed_headers(&Scheme::stripe(), "whsec_attacker_0123456789", "", &body);
    assert_eq!(
        post(&url_a, headers, body).await.unwrap().0,
        StatusCode::BAD_REQUEST
    );

    // Both workers' lines, until every event was handled and a while passed quietly.
    let (lines_tx, mut lines) = tokio::sync::mpsc::unbounded_channel();
    for mut out in [out_a, out_b] {
        let tx = lines_tx.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = out.next_line().await {
                let _ = tx.send(line);
            }
        });
    }
    let mut handled = Vec::new();
    let mut finished = Vec::new();
    while let Ok(Some(line)) = tokio::time::timeout(Duration::from_secs(3), lines.recv()).await {
        match line.strip_prefix("finished ") {
            Some(id) => finished.push(format!("handled {id}")),
            None => handled.push(line),
        }
    }
    handled.sort();
    finished.sort();
    let expected: Vec<String> = ids.iter().map(|id| format!("handled {id}")).collect();
    assert_eq!(handled, expected, "each event handled once, by one worker");
    assert_eq!(finished, expected, "and each finished");
    a.kill().await.unwrap();
    b.kill().await.unwrap();
    names.delete().await;
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", db.display()));
    }
}

/// `WEBHOOK_FAIL_TYPES` and `WEBHOOK_MAX_ATTEMPTS` in `amqp` mode: every attempt at an
/// event of a listed type fails (`failed <id>`) until it is dead after the maximum, while
/// other types are handled; `GET /admin/counts` (behind `WEBHOOK_ADMIN_TOKEN`) counts it
/// dead. With `WEBHOOK_MAX_LAG_SECS` it refuses to start.
#[tokio::test]
async fn receiver_in_amqp_mode_fails_the_fail_types_until_dead_and_counts_them() {
    const SECRET: &str = "whsec_receiver_amqp_fails_012345";
    const TOKEN: &str = "operator-amqp-token-0123456789";
    let names = AmqpNames::new("tw_test_fails");
    let mut env = vec![
        ("WEBHOOK_SCHEME", "stripe"),
        ("WEBHOOK_SECRETS", SECRET),
        ("WEBHOOK_ADMIN_TOKEN", TOKEN),
        ("WEBHOOK_FAIL_TYPES", "invoice.payment_failed"),
        ("WEBHOOK_MAX_ATTEMPTS", "2"),
    ];
    env.extend_from_slice(&names.env());
    let db = fresh_db("amqp-fail-types");
    let (mut child, url, mut stdout) = start_receiver(&db, &env).await;
    for (id, event_type) in [
        ("evt_fails", "invoice.payment_failed"),
        ("evt_fine", "charge.succeeded"),
    ] {
        let body = event_body(id, event_type, "in_1");
        let headers = signed_headers(&Scheme::stripe(), SECRET, "", &body);
        assert_eq!(
            post(&url, headers, body).await.unwrap().0,
            StatusCode::NO_CONTENT
        );
    }
    let mut lines = Vec::new();
    for _ in 0..3 {
        lines.push(next_line(&mut stdout).await.unwrap());
    }
    lines.sort();
    assert_eq!(
        lines,
        ["failed evt_fails", "failed evt_fails", "handled evt_fine"]
    );
    let admin = url.replace("/webhooks", "/admin");
    let counts_url = format!("{admin}/counts");
    let (status, _, _) = ask(http::Method::GET, &counts_url, &[], None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let bearer = format!("Bearer {TOKEN}");
    let auth = [(http::header::AUTHORIZATION, bearer.as_str())];
    let mut counts = serde_json::Value::Null;
    for _ in 0..50 {
        let (status, _, json) = ask(http::Method::GET, &counts_url, &auth, None).await;
        assert_eq!(status, StatusCode::OK, "{json}");
        counts = serde_json::from_str(&json).unwrap();
        if counts["dead"] == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        (&counts["dead"], &counts["queued"]),
        (&serde_json::json!(1), &serde_json::json!(0)),
        "{counts}"
    );
    assert!(
        tokio::time::timeout(Duration::from_millis(1500), next_line(&mut stdout))
            .await
            .is_err(),
        "a dead event ran again"
    );
    child.kill().await.unwrap();
    names.delete().await;
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", db.display()));
    }

    for (name, value) in [("WEBHOOK_MAX_LAG_SECS", "5")] {
        let env = [
            ("WEBHOOK_MODE", "amqp"),
            ("AMQP_URL", "amqp://guest:guest@127.0.0.1:1/%2f"),
            (name, value),
            ("BIND", "127.0.0.1:0"),
        ];
        let output = run_with("receiver", &[], &env).await;
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{stderr}");
        assert!(stderr.contains(name), "{stderr}");
    }
}
