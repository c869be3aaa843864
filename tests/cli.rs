//! The `tower-webhook` command run as a process against a SQLite file and a fresh
//! PostgreSQL database, each seeded with dead, failing, queued and processed rows:
//! tables and `--json` (the router's JSON), pages, bodies, requeue then a worker
//! processes the rows, exit codes, `--help` everywhere, and no password in any output.

mod common;

use std::time::Duration;

use common::seed::{body, deliver, eventually, seed, standard, DEAD_ERROR};
use http::StatusCode;
use serde_json::{json, Value};
use tower_webhook::inbox::{Attempt, Counts, Inbox, Listing, ProcessorSpec, State, Worker};
use tower_webhook::store::{PgStore, SqliteStore};
use tower_webhook::Event;

/// What a run of the command gave.
#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn json(&self) -> Value {
        assert_eq!(self.code, 0, "{self:?}");
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("{e}: {self:?}"))
    }
}

/// Runs the command with `args`, the environment's `DATABASE_URL` removed (or `env`'s).
async fn run_with(args: &[&str], env: Option<&str>) -> Run {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_tower-webhook"));
    command
        .args(args)
        .env_remove("DATABASE_URL")
        .env_remove("WEBHOOK_ENCRYPTION_KEYS");
    if let Some(url) = env {
        command.env("DATABASE_URL", url);
    }
    ended(command).await
}

/// Runs `command` to its end (at most a minute).
async fn ended(mut command: tokio::process::Command) -> Run {
    let output = tokio::time::timeout(Duration::from_secs(60), command.output())
        .await
        .expect("the command ends")
        .unwrap();
    Run {
        code: output.status.code().expect("exited"),
        stdout: String::from_utf8(output.stdout).unwrap(),
        stderr: String::from_utf8(output.stderr).unwrap(),
    }
}

/// Runs the command against `db`.
async fn run(db: &str, args: &[&str]) -> Run {
    let mut all = vec!["--database-url", db];
    all.extend_from_slice(args);
    run_with(&all, None).await
}

async fn the_command_reads_and_requeues_what_the_library_sees(inbox: Inbox, db: &str) {
    seed(&inbox, 3).await;

    // counts: the same JSON as the router's, and a table.
    let counts = run(db, &["counts", "--json"]).await.json();
    let expected = serde_json::to_value(inbox.counts().await.unwrap()).unwrap();
    assert_eq!(counts["dead"], 3);
    assert_eq!(counts["queued"], 2);
    assert_eq!(
        (&counts["processed"], &counts["dead"]),
        (&expected["processed"], &expected["dead"])
    );
    let table = run(db, &["counts"]).await;
    assert_eq!(table.code, 0, "{table:?}");
    // One processor: exactly the table before fan-out, no processor in it.
    let (states, lag) = table.stdout.split_once("oldest due: ").unwrap();
    assert_eq!(
        states,
        "STATE       ROWS\nqueued      2\nprocessing  0\nprocessed   1\ndead        3\npaused      0\ninvalid     0\n"
    );
    assert!(
        lag.ends_with(" s\n") && lag.lines().count() == 1,
        "{}",
        table.stdout
    );
    assert!(!counts.as_object().unwrap().contains_key("processors"));

    // list: pages, with the library's own cursor.
    let first = run(db, &["list", "--state", "dead", "--limit", "2", "--json"])
        .await
        .json();
    let page = inbox.list(&Listing::dead().with_limit(2)).await.unwrap();
    assert_eq!(
        first,
        serde_json::to_value(&page).unwrap(),
        "the router's JSON"
    );
    let next = first["next"].as_str().expect("a second page").to_owned();
    let second = run(db, &["list", "--state", "dead", "--after", &next, "--json"])
        .await
        .json();
    assert_eq!(second["events"].as_array().unwrap().len(), 1);
    assert_eq!(second["next"], Value::Null);
    let table = run(db, &["list", "--state", "dead"]).await;
    assert_eq!(table.code, 0, "{table:?}");
    let header: Vec<&str> = table
        .stdout
        .lines()
        .next()
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(header[..3], ["SOURCE", "ID", "TYPE"]);
    assert!(!table.stdout.contains("PROCESSOR"), "{}", table.stdout);
    assert!(first["events"][0].get("processor").is_none(), "{first}");
    for i in 1..=3 {
        let line = table
            .stdout
            .lines()
            .find(|l| l.contains(&format!("evt_dead_{i} ")))
            .unwrap_or_else(|| panic!("evt_dead_{i} in {}", table.stdout));
        assert!(line.starts_with("standard"), "{line}");
        assert!(
            line.contains(" dead ") && line.ends_with(DEAD_ERROR),
            "{line}"
        );
    }
    assert!(
        table.stdout.ends_with("(3 rows, the last page)\n"),
        "{}",
        table.stdout
    );
    let failing = run(db, &["list", "--state", "failing", "--oldest", "--json"])
        .await
        .json();
    assert_eq!(failing["events"][0]["id"], "evt_failing");

    // show: the body as the provider sent it.
    let shown = run(db, &["show", "standard", "evt_dead_1", "--json"])
        .await
        .json();
    assert_eq!(shown["body"], body("evt_dead_1"));
    assert_eq!(shown["state"], "dead");
    assert!(shown.get("routes").is_none(), "one processor: {shown}");
    assert!(shown["history"][0].get("processor").is_none(), "{shown}");
    let table = run(db, &["show", "standard", "evt_dead_1"]).await;
    assert!(!table.stdout.contains("PROCESSOR"), "{}", table.stdout);
    let history = table.stdout.lines().find(|l| l.starts_with("ATTEMPT"));
    assert_eq!(
        history.map(|l| l.split_whitespace().collect::<Vec<_>>()),
        Some(vec!["ATTEMPT", "STARTED", "TOOK", "OUTCOME", "ERROR"])
    );
    assert!(
        table.stdout.contains(&body("evt_dead_1")),
        "{}",
        table.stdout
    );
    assert!(
        table.stdout.contains("last error    order not found"),
        "{}",
        table.stdout
    );
    assert!(
        table.stdout.contains("ATTEMPT") && table.stdout.contains("dead"),
        "every attempt: {}",
        table.stdout
    );
    assert!(
        table.stdout.contains("webhook-id: evt_dead_1"),
        "the stored headers: {}",
        table.stdout
    );
    let missing = run(db, &["show", "standard", "evt_never"]).await;
    assert_eq!(missing.code, 3, "{missing:?}");
    assert_eq!(missing.stderr, "error: the inbox has no such event\n");

    // requeue: the dead rows go back in the queue, and a worker processes them.
    let requeued = run(db, &["requeue", "--dead"]).await;
    assert_eq!(
        (requeued.code, requeued.stdout.as_str()),
        (0, "requeued 3\n"),
        "{requeued:?}"
    );
    let row = inbox
        .event("standard", "evt_dead_1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!((row.summary.attempts, row.summary.last_error), (0, None));
    let worker = Worker::new(&inbox, |_: Event, _: Attempt| async { Ok::<_, String>(()) })
        .with_poll_interval(Duration::from_millis(20))
        .unwrap()
        .spawn();
    eventually("the requeued rows processed", async || {
        inbox.counts().await.unwrap().processed == 5
    })
    .await;
    worker.shutdown().await;
    let replay = run(db, &["requeue", "--id", "standard/evt_dead_1", "--json"]).await;
    assert_eq!(
        replay.json(),
        serde_json::json!({"requeued": 1, "without_body": 0})
    );
    let window = run(
        db,
        &[
            "requeue",
            "--type",
            "order.paid",
            "--from",
            "2100-01-01T00:00:00Z",
        ],
    )
    .await;
    assert_eq!(window.stdout, "requeued 0\n", "{window:?}");
    assert_eq!(
        inbox.counts().await.unwrap().queued,
        2,
        "evt_failing and the replay"
    );

    // A processed event whose body expired is left out, and said so.
    let expiring = inbox.clone().with_body_retention(Duration::ZERO);
    assert_eq!(
        expiring.expire_bodies(100).await.unwrap(),
        4,
        "the processed ones: evt_done, evt_queued, evt_dead_2, evt_dead_3"
    );
    let left = run(db, &["requeue", "--id", "standard/evt_done"]).await;
    assert_eq!(
        (left.code, left.stdout.as_str()),
        (
            0,
            "requeued 0\nleft out 1: the body expired or was erased\n"
        ),
        "{left:?}"
    );
    let left = run(db, &["requeue", "--id", "standard/evt_done", "--json"]).await;
    assert_eq!(
        left.json(),
        serde_json::json!({"requeued": 0, "without_body": 1})
    );
}

/// Input clap or the command refuses: exit 2, a message, and nothing done.
async fn bad_usage_exits_2_and_changes_nothing(inbox: Inbox, db: &str) {
    seed(&inbox, 1).await;
    let rows = async || {
        let c = inbox.counts().await.unwrap();
        (c.queued, c.processing, c.processed, c.dead)
    };
    let before = rows().await;
    for args in [
        &["list"][..],
        &["list", "--state", "processed"],
        &["list", "--state", "dead", "--limit", "0"],
        &["list", "--state", "dead", "--limit", "1001"],
        &["list", "--state", "dead", "--after", "garbage"],
        &["show", "standard"],
        &["requeue"],
        &["requeue", "--id", "no-slash"],
        &["requeue", "--id", "standard/evt_dead_1", "--dead"],
        &["requeue", "--all", "--type", "order.paid"],
        &["requeue", "--dead", "--from", "yesterday"],
        &[
            "requeue",
            "--dead",
            "--from",
            "2026-01-02T00:00:00Z",
            "--before",
            "2026-01-01T00:00:00Z",
        ],
        &["frobnicate"],
    ] {
        let out = run(db, args).await;
        assert_eq!(out.code, 2, "{args:?}: {out:?}");
        assert!(out.stderr.starts_with("error: "), "{args:?}: {out:?}");
        assert_eq!(out.stdout, "", "{args:?}");
    }
    assert_eq!(rows().await, before);
}

/// `pause`, `pauses` and `resume` change what the library sees, and say whether they
/// changed anything.
async fn the_command_pauses_and_resumes_what_the_library_sees(inbox: Inbox, db: &str) {
    let out = run(
        db,
        &["pause", "--source", "stripe", "--type", "invoice.paid"],
    )
    .await;
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (0, "paused source stripe, type invoice.paid\n")
    );
    let again = run(
        db,
        &[
            "pause",
            "--source",
            "stripe",
            "--type",
            "invoice.paid",
            "--json",
        ],
    )
    .await;
    assert_eq!(again.json()["changed"], false);
    assert_eq!(run(db, &["pause"]).await.code, 0, "the whole inbox");
    let pauses = inbox.pauses().await.unwrap();
    let named: Vec<_> = pauses
        .iter()
        .map(|p| (p.source.as_deref(), p.event_type.as_deref()))
        .collect();
    assert_eq!(
        named,
        [(None, None), (Some("stripe"), Some("invoice.paid"))]
    );
    let listed = run(db, &["pauses", "--json"]).await.json();
    assert_eq!(listed[1]["source"], "stripe");
    assert_eq!(listed[0]["type"], Value::Null);
    let text = run(db, &["pauses"]).await.stdout;
    assert!(text.contains("stripe") && text.contains("any"), "{text}");
    assert!(text.starts_with("SOURCE  "), "no processor column: {text}");
    let out = run(db, &["resume"]).await;
    assert_eq!(out.stdout, "resumed source any, type any\n");
    let out = run(db, &["resume"]).await;
    assert_eq!(out.stdout, "not paused: source any, type any\n");
    assert_eq!(inbox.pauses().await.unwrap().len(), 1);
}

#[tokio::test]
async fn sqlite_the_command_pauses_and_resumes_what_the_library_sees() {
    let (inbox, path) = sqlite().await;
    the_command_pauses_and_resumes_what_the_library_sees(inbox, &path).await;
}

#[tokio::test]
async fn postgres_the_command_pauses_and_resumes_what_the_library_sees() {
    let (inbox, url) = postgres().await;
    the_command_pauses_and_resumes_what_the_library_sees(inbox, &url).await;
}

/// The words of the lines of the table under the header `header` (up to a blank line).
fn rows_under(text: &str, header: &[&str]) -> Vec<Vec<String>> {
    let words = |l: &str| -> Vec<String> { l.split_whitespace().map(str::to_owned).collect() };
    let mut lines = text.lines().skip_while(|l| words(l) != header);
    assert!(lines.next().is_some(), "a table under {header:?} in {text}");
    lines.take_while(|l| !l.is_empty()).map(words).collect()
}

/// With fan-out (processors `a` and `b`, `b`'s route of evt_1 dead): counts per
/// processor, an event's routes and whose each attempt was, and listings, requeues and
/// pauses narrowed to one processor's routes; a processor without routes is bad input
/// (exit 2) and changes nothing.
async fn the_command_works_per_processor_with_fan_out(inbox: Inbox, db: &str) {
    let inbox = inbox
        .with_processors([
            ProcessorSpec::new("a").unwrap(),
            ProcessorSpec::new("b").unwrap(),
        ])
        .unwrap();
    for id in ["evt_1", "evt_2"] {
        assert_eq!(deliver(&inbox, id).await, StatusCode::NO_CONTENT);
    }
    let worker = |name: &'static str| {
        Worker::processor(&inbox, name, move |e: Event, _: Attempt| async move {
            match name == "b" && e.id() == Some("evt_1") {
                true => Err(DEAD_ERROR),
                false => Ok(()),
            }
        })
        .unwrap()
        .with_max_attempts(1)
        .unwrap()
        .with_poll_interval(Duration::from_millis(20))
        .unwrap()
        .spawn()
    };
    let (a, b) = (worker("a"), worker("b"));
    let of = async |name: &str| inbox.counts_by_processor().await.unwrap()[name];
    eventually("a's routes processed, b's of evt_1 dead", async || {
        let (of_a, of_b) = (of("a").await, of("b").await);
        (of_a.processed, of_b.processed, of_b.dead) == (2, 1, 1)
    })
    .await;
    a.shutdown().await;
    b.shutdown().await;

    // counts: the sum, and each processor's.
    let counts = run(db, &["counts", "--json"]).await.json();
    assert_eq!(
        (&counts["processed"], &counts["dead"]),
        (&json!(3), &json!(1))
    );
    let names: Vec<&String> = counts["processors"].as_object().unwrap().keys().collect();
    assert_eq!(names, ["a", "b"], "{counts}");
    assert_eq!(counts["processors"]["b"]["dead"], 1);
    let table = run(db, &["counts"]).await;
    assert!(
        table.stdout.contains("\ndead        1\n"),
        "{}",
        table.stdout
    );
    let header = [
        "PROCESSOR",
        "QUEUED",
        "PROCESSING",
        "PROCESSED",
        "DEAD",
        "PAUSED",
        "OLDEST-DUE",
    ];
    assert_eq!(
        rows_under(&table.stdout, &header),
        [
            ["a", "0", "0", "2", "0", "0", "-"],
            ["b", "0", "0", "1", "1", "0", "-"]
        ],
        "{}",
        table.stdout
    );

    // show: each processor's route, and whose each attempt was.
    let table = run(db, &["show", "standard", "evt_1"]).await;
    assert_eq!(table.code, 0, "{table:?}");
    let header = [
        "PROCESSOR",
        "STATE",
        "ATTEMPTS",
        "NEXT",
        "PROCESSED",
        "LAST-ERROR",
    ];
    let routes = rows_under(&table.stdout, &header);
    assert_eq!(routes.len(), 2, "{}", table.stdout);
    assert_eq!(routes[0][..4], ["a", "processed", "1", "-"], "{routes:?}");
    assert_eq!(routes[0][5], "-", "{routes:?}");
    assert_eq!(routes[1][..5], ["b", "dead", "1", "-", "-"], "{routes:?}");
    assert_eq!(routes[1][5..].join(" "), DEAD_ERROR, "{routes:?}");
    let header = [
        "PROCESSOR",
        "ATTEMPT",
        "STARTED",
        "TOOK",
        "OUTCOME",
        "ERROR",
    ];
    let mut history = rows_under(&table.stdout, &header);
    history.sort();
    assert_eq!(history.len(), 2, "{}", table.stdout);
    assert_eq!([&history[0][0], &history[0][5]], ["a", "processed"]);
    assert_eq!([&history[1][0], &history[1][5]], ["b", "dead"]);
    let shown = run(db, &["show", "standard", "evt_1", "--json"])
        .await
        .json();
    assert_eq!(shown["state"], "dead", "the most urgent route");
    assert_eq!(shown["routes"][1]["processor"], "b");
    assert_eq!(shown["routes"][1]["state"], "dead");
    assert_eq!(shown["routes"][1].get("orphaned"), None);
    let whose: Vec<&Value> = shown["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| &h["processor"])
        .collect();
    assert!(
        whose.contains(&&Value::from("b")) && whose.len() == 2,
        "{shown}"
    );

    // list: every processor's dead routes, or one processor's.
    let table = run(db, &["list", "--state", "dead"]).await;
    let line = table.stdout.lines().nth(1).unwrap();
    assert_eq!(
        line.split_whitespace().take(4).collect::<Vec<_>>(),
        ["standard", "evt_1", "b", "order.paid"]
    );
    assert!(
        table.stdout.starts_with("SOURCE    ID     PROCESSOR  TYPE"),
        "{}",
        table.stdout
    );
    let listed = run(
        db,
        &["list", "--state", "dead", "--processor", "b", "--json"],
    )
    .await
    .json();
    assert_eq!(listed["events"].as_array().unwrap().len(), 1, "{listed}");
    let row = &listed["events"][0];
    assert_eq!(
        (&row["id"], &row["processor"]),
        (&json!("evt_1"), &json!("b"))
    );
    let none = run(db, &["list", "--state", "dead", "--processor", "a"]).await;
    assert!(
        none.stdout.ends_with("(0 rows, the last page)\n"),
        "{none:?}"
    );

    // requeue: b's route of evt_1 alone; a's stays processed, not run again.
    let before = inbox.event("standard", "evt_1").await.unwrap().unwrap();
    let out = run(db, &["requeue", "--dead", "--processor", "a"]).await;
    assert_eq!(out.stdout, "requeued 0\n", "{out:?}");
    let out = run(
        db,
        &["requeue", "--id", "standard/evt_1", "--processor", "b"],
    )
    .await;
    assert_eq!(out.stdout, "requeued 1\n", "{out:?}");
    let after = inbox.event("standard", "evt_1").await.unwrap().unwrap();
    assert_eq!(after.routes[0], before.routes[0], "a's route untouched");
    assert_eq!(after.routes[1].processor, "b");
    assert_eq!(
        (after.routes[1].state, after.routes[1].attempts),
        (State::Queued, 0)
    );

    // pause and resume one processor.
    let out = run(db, &["pause", "--processor", "b"]).await;
    assert_eq!(
        out.stdout, "paused processor b, source any, type any\n",
        "{out:?}"
    );
    let pauses = inbox.pauses().await.unwrap();
    assert_eq!(pauses.len(), 1);
    assert_eq!(
        (pauses[0].processor.as_deref(), &pauses[0].source),
        (Some("b"), &None)
    );
    assert_eq!(
        (of("a").await.paused, of("b").await.paused),
        (0, 1),
        "b's queued route held"
    );
    let table = run(db, &["pauses"]).await;
    assert_eq!(
        rows_under(&table.stdout, &["PROCESSOR", "SOURCE", "TYPE"]),
        [["b", "any", "any"]]
    );
    let out = run(db, &["resume", "--processor", "b", "--json"]).await;
    assert_eq!(out.json()["changed"], true);
    assert!(inbox.pauses().await.unwrap().is_empty());

    // A processor with no routes: bad input, nothing done.
    let rows = async || {
        let by = inbox.counts_by_processor().await.unwrap();
        let of = |c: &Counts| (c.queued, c.processing, c.processed, c.dead, c.paused);
        by.values().map(of).collect::<Vec<_>>()
    };
    let before = rows().await;
    for args in [
        &["list", "--state", "dead", "--processor", "nope"][..],
        &["requeue", "--all", "--processor", "nope"],
        &["pause", "--processor", "nope"],
        &["resume", "--processor", "nope"],
    ] {
        let out = run(db, args).await;
        assert_eq!(out.code, 2, "{args:?}: {out:?}");
        assert!(
            out.stderr.starts_with(
                "error: no routes of the processor \"nope\" in this database (a, b have routes)"
            ),
            "{args:?}: {out:?}"
        );
        assert_eq!(out.stdout, "", "{args:?}");
    }
    assert_eq!(rows().await, before);
    assert!(inbox.pauses().await.unwrap().is_empty());
}

#[tokio::test]
async fn sqlite_the_command_works_per_processor_with_fan_out() {
    let (inbox, path) = sqlite().await;
    the_command_works_per_processor_with_fan_out(inbox, &path).await;
}

#[tokio::test]
async fn postgres_the_command_works_per_processor_with_fan_out() {
    let (inbox, url) = postgres().await;
    the_command_works_per_processor_with_fan_out(inbox, &url).await;
}

/// `backfill` reads the processor's globs from the registry the application's inbox
/// wrote, and refuses an unknown processor or one with a predicate; `drop-processor`
/// deletes an orphaned processor's routes, only with `--yes`.
async fn the_command_backfills_and_drops_processors(inbox: Inbox, db: &str) {
    let source = standard("shop");
    let old = inbox
        .clone()
        .with_processors([ProcessorSpec::new("legacy").unwrap()])
        .unwrap();
    for (id, ty) in [
        ("e1", "invoice.paid"),
        ("e2", "customer.created"),
        ("e3", "invoice.paid"),
    ] {
        let body = format!(r#"{{"type":"{ty}"}}"#);
        old.ingest(&source, Some(id), body).await.unwrap();
    }
    let app = inbox
        .with_processors([
            ProcessorSpec::new("billing")
                .unwrap()
                .with_types(["invoice.*"])
                .unwrap(),
            ProcessorSpec::new("audit")
                .unwrap()
                .with_predicate(|_| true),
        ])
        .unwrap();
    // The application's first write registers its processors.
    let e4 = r#"{"type":"invoice.paid"}"#;
    app.ingest(&source, Some("e4"), e4).await.unwrap();
    let queued = async |name: &str| {
        let by = app.counts_by_processor().await.unwrap();
        by.get(name).map(|c| c.queued)
    };
    assert_eq!(queued("billing").await, Some(1));

    let later = [
        "backfill",
        "--processor",
        "billing",
        "--from",
        "2999-01-01T00:00:00Z",
    ];
    assert_eq!(run(db, &later).await.stdout, "created 0\n");
    let out = run(db, &["backfill", "--processor", "billing"]).await;
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (0, "created 2\n"),
        "{out:?}"
    );
    let again = run(db, &["backfill", "--processor", "billing", "--json"]).await;
    assert_eq!(again.json()["created"], 0);
    assert_eq!(queued("billing").await, Some(3), "e1, e3 and e4; not e2");
    let out = run(db, &["backfill", "--processor", "audit"]).await;
    assert_eq!(out.code, 2, "{out:?}");
    assert!(out.stderr.contains("/admin/backfill"), "{out:?}");
    let out = run(db, &["backfill", "--processor", "nope"]).await;
    assert_eq!(out.code, 2, "{out:?}");
    assert!(out.stderr.contains("registered"), "{out:?}");
    let backwards = [
        "backfill",
        "--processor",
        "billing",
        "--from",
        "2026-12-02T00:00:00Z",
        "--before",
        "2026-12-01T00:00:00Z",
    ];
    assert_eq!(run(db, &backwards).await.code, 2);

    let out = run(db, &["drop-processor", "legacy"]).await;
    assert_eq!(out.code, 2, "{out:?}");
    assert!(out.stderr.contains("--yes"), "{out:?}");
    assert_eq!(queued("legacy").await, Some(3), "orphaned, untouched");
    let out = run(db, &["drop-processor", "legacy", "--yes"]).await;
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (0, "deleted 3 routes of legacy\n"),
        "{out:?}"
    );
    assert_eq!(queued("legacy").await, None);
    assert_eq!(queued("billing").await, Some(3));
}

#[tokio::test]
async fn sqlite_the_command_backfills_and_drops_processors() {
    let (inbox, path) = sqlite().await;
    the_command_backfills_and_drops_processors(inbox, &path).await;
}

#[tokio::test]
async fn postgres_the_command_backfills_and_drops_processors() {
    let (inbox, url) = postgres().await;
    the_command_backfills_and_drops_processors(inbox, &url).await;
}

/// The key ring of the sealed-inbox test: `k1`, 32 bytes of 7, as the environment gives it.
const KEYS: &str = "k1:BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc=";

/// Runs the command against `db` with `WEBHOOK_ENCRYPTION_KEYS` set to `keys`.
async fn run_keyed(db: &str, keys: &str, args: &[&str]) -> Run {
    run_with_env(db, &[("WEBHOOK_ENCRYPTION_KEYS", keys)], args).await
}

/// Runs the command against `db` with `env` set.
async fn run_with_env(db: &str, env: &[(&str, &str)], args: &[&str]) -> Run {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_tower-webhook"));
    command
        .args(["--database-url", db])
        .args(args)
        .env_remove("DATABASE_URL")
        .envs(env.iter().copied());
    ended(command).await
}

/// An inbox that seals its bodies (issue 34): `show` without the keys says the body is
/// unreadable and names its key, printing no ciphertext as a body; with
/// `WEBHOOK_ENCRYPTION_KEYS` it shows the body opened (table and JSON); a malformed value
/// is exit 2, naming the entry and not its text, and shows nothing.
async fn the_command_opens_a_sealed_inbox_with_its_keys(inbox: Inbox, db: &str) {
    let inbox = inbox.with_keys(tower_webhook::seal::KeyRing::parse(KEYS).unwrap());
    assert_eq!(deliver(&inbox, "evt_sealed").await, StatusCode::NO_CONTENT);
    let plain = body("evt_sealed");
    let args = ["show", "standard", "evt_sealed"];

    let without = run(db, &args).await;
    assert_eq!(without.code, 0, "{without:?}");
    assert!(
        without
            .stdout
            .contains("body: unreadable (sealed under key \"k1\")"),
        "{without:?}"
    );
    // The object id is metadata, in clear; the body's text is not shown.
    assert!(!without.stdout.contains("\"data\""), "{without:?}");

    let with = run_keyed(db, KEYS, &args).await;
    assert_eq!(with.code, 0, "{with:?}");
    assert!(
        with.stdout
            .contains(&format!("body ({} bytes):\n{plain}", plain.len())),
        "{with:?}"
    );
    let json = run_keyed(db, KEYS, &["show", "standard", "evt_sealed", "--json"])
        .await
        .json();
    assert_eq!(json["body_state"], "stored", "{json}");
    assert_eq!(json["key_id"], "k1", "{json}");
    assert_eq!(json["body"], plain, "{json}");

    let secret = "k2:not-base64-but-secret";
    let bad = run_keyed(db, &format!("{KEYS},{secret}"), &args).await;
    assert_eq!(bad.code, 2, "{bad:?}");
    assert!(bad.stderr.contains("WEBHOOK_ENCRYPTION_KEYS"), "{bad:?}");
    assert!(bad.stderr.contains("entry 2"), "names the entry: {bad:?}");
    assert!(!bad.stderr.contains("not-base64-but-secret"), "{bad:?}");
    assert!(!bad.stderr.contains("BwcH"), "{bad:?}");
    assert!(bad.stdout.is_empty(), "{bad:?}");
}

#[tokio::test]
async fn sqlite_the_command_opens_a_sealed_inbox_with_its_keys() {
    let (inbox, path) = sqlite().await;
    the_command_opens_a_sealed_inbox_with_its_keys(inbox, &path).await;
}

#[tokio::test]
async fn postgres_the_command_opens_a_sealed_inbox_with_its_keys() {
    let (inbox, url) = postgres().await;
    the_command_opens_a_sealed_inbox_with_its_keys(inbox, &url).await;
}

/// A second key, `k2` (32 bytes of 8): the rotation's new one.
const K2: &str = "k2:CAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAg=";

/// `rekey`: refused without the keys (exit 2) and for a bad batch; with `k2,k1` it
/// rewrites a body sealed under k1 and one stored in clear (JSON, then the table's
/// "rekeyed 0"); then k2 alone shows both opened.
async fn the_command_rekeys_a_sealed_inbox(inbox: Inbox, db: &str) {
    let k1 = tower_webhook::seal::KeyRing::parse(KEYS).unwrap();
    assert_eq!(deliver(&inbox, "evt_clear").await, StatusCode::NO_CONTENT);
    let sealed = inbox.clone().with_keys(k1);
    assert_eq!(deliver(&sealed, "evt_sealed").await, StatusCode::NO_CONTENT);

    let without = run(db, &["rekey"]).await;
    assert_eq!(without.code, 2, "{without:?}");
    assert!(
        without.stderr.contains("WEBHOOK_ENCRYPTION_KEYS"),
        "{without:?}"
    );
    let rotated = format!("{K2},{KEYS}");
    let bad = run_keyed(db, &rotated, &["rekey", "--batch", "0"]).await;
    assert_eq!(bad.code, 2, "{bad:?}");
    let keys = ("WEBHOOK_ENCRYPTION_KEYS", rotated.as_str());
    let bad = run_with_env(
        db,
        &[keys, ("WEBHOOK_ENCRYPTION_COMPRESS", "yes")],
        &["rekey"],
    )
    .await;
    assert_eq!(bad.code, 2, "{bad:?}");
    assert!(
        bad.stderr.contains("WEBHOOK_ENCRYPTION_COMPRESS: 0 or 1"),
        "{bad:?}"
    );
    let show = ["show", "standard", "evt_sealed", "--json"];
    assert_eq!(run_keyed(db, &rotated, &show).await.json()["key_id"], "k1");

    // Uncompressed: these bodies are too short to compress anyway; `0` is taken.
    let uncompressed = [keys, ("WEBHOOK_ENCRYPTION_COMPRESS", "0")];
    let args = ["rekey", "--batch", "1", "--json"];
    let done = run_with_env(db, &uncompressed, &args).await;
    assert_eq!(done.json(), json!({"rekeyed": 2, "unreadable": 0}));
    let again = run_keyed(db, &rotated, &["rekey"]).await;
    assert_eq!(
        (again.code, again.stdout.as_str()),
        (0, "rekeyed 0\n"),
        "{again:?}"
    );
    for id in ["evt_sealed", "evt_clear"] {
        let shown = run_keyed(db, K2, &["show", "standard", id, "--json"])
            .await
            .json();
        assert_eq!(shown["key_id"], "k2", "{shown}");
        assert_eq!(shown["body_state"], "stored", "{shown}");
        assert_eq!(shown["body"], body(id), "{shown}");
    }
    // k1 removed: what it sealed is gone from the database, so k2 alone opens all.
    let left = run_keyed(db, K2, &["rekey"]).await;
    assert_eq!(left.stdout, "rekeyed 0\n", "{left:?}");
}

#[tokio::test]
async fn sqlite_the_command_rekeys_a_sealed_inbox() {
    let (inbox, path) = sqlite().await;
    the_command_rekeys_a_sealed_inbox(inbox, &path).await;
}

#[tokio::test]
async fn postgres_the_command_rekeys_a_sealed_inbox() {
    let (inbox, url) = postgres().await;
    the_command_rekeys_a_sealed_inbox(inbox, &url).await;
}

/// `erase SOURCE ID` (as `show` takes it): refused without `--yes` (exit 2, nothing erased), then the body is
/// erased (`show` says so, the queued route is dead with the reason); again is harmless;
/// an unknown event is exit 3; an id missing exit 2. Sealed or not alike.
async fn the_command_erases_a_body(inbox: Inbox, db: &str) {
    assert_eq!(deliver(&inbox, "evt_erase").await, StatusCode::NO_CONTENT);
    let unconfirmed = run(db, &["erase", "standard", "evt_erase"]).await;
    assert_eq!(unconfirmed.code, 2, "{unconfirmed:?}");
    assert!(unconfirmed.stderr.contains("--yes"), "{unconfirmed:?}");
    let shown = run(db, &["show", "standard", "evt_erase", "--json"]).await;
    assert_eq!(shown.json()["body_state"], "stored");

    let done = run(db, &["erase", "standard", "evt_erase", "--yes", "--json"]).await;
    assert_eq!(done.json(), json!({"erased": true}));
    let shown = run(db, &["show", "standard", "evt_erase", "--json"])
        .await
        .json();
    assert_eq!(shown["body_state"], "erased", "{shown}");
    assert_eq!(shown["body"], "", "{shown}");
    assert_eq!(shown["state"], "dead", "{shown}");
    assert_eq!(
        shown["last_error"], "the body was erased before the event was processed",
        "{shown}"
    );
    let again = run(db, &["erase", "standard", "evt_erase", "--yes"]).await;
    assert_eq!(
        (again.code, again.stdout.as_str()),
        (0, "erased standard evt_erase\n"),
        "{again:?}"
    );
    let unknown = run(db, &["erase", "standard", "evt_nope", "--yes"]).await;
    assert_eq!(unknown.code, 3, "{unknown:?}");
    let malformed = run(db, &["erase", "standard", "--yes"]).await;
    assert_eq!(malformed.code, 2, "{malformed:?}");
}

#[tokio::test]
async fn sqlite_the_command_erases_a_body() {
    let (inbox, path) = sqlite().await;
    the_command_erases_a_body(inbox, &path).await;
}

#[tokio::test]
async fn postgres_the_command_erases_a_body() {
    let (inbox, url) = postgres().await;
    the_command_erases_a_body(inbox, &url).await;
}

/// A SQLite file of its own: its path, and an inbox on it.
async fn sqlite() -> (Inbox, String) {
    let path = std::env::temp_dir().join(format!(
        "tower-webhook-cli-{}.db",
        uuid::Uuid::new_v4().simple()
    ));
    let inbox = Inbox::sqlite(&SqliteStore::open(&path).await.unwrap());
    (inbox, path.to_string_lossy().into_owned())
}

/// A fresh PostgreSQL database: its URL, and an inbox on it.
async fn postgres() -> (Inbox, String) {
    let url = common::fresh_pg_url().await;
    (Inbox::postgres(&PgStore::connect(&url).await.unwrap()), url)
}

#[tokio::test]
async fn sqlite_the_command_reads_and_requeues_what_the_library_sees() {
    let (inbox, path) = sqlite().await;
    the_command_reads_and_requeues_what_the_library_sees(inbox, &path).await;
}

#[tokio::test]
async fn sqlite_url_names_the_same_file() {
    let (inbox, path) = sqlite().await;
    seed(&inbox, 1).await;
    for db in [format!("sqlite://{path}"), format!("sqlite:{path}")] {
        assert_eq!(
            run(&db, &["counts", "--json"]).await.json()["dead"],
            1,
            "{db}"
        );
    }
    // And from the environment.
    let out = run_with(&["counts", "--json"], Some(&path)).await;
    assert_eq!(out.json()["dead"], 1);
}

#[tokio::test]
async fn postgres_the_command_reads_and_requeues_what_the_library_sees() {
    let (inbox, url) = postgres().await;
    the_command_reads_and_requeues_what_the_library_sees(inbox, &url).await;
}

#[tokio::test]
async fn sqlite_bad_usage_exits_2_and_changes_nothing() {
    let (inbox, path) = sqlite().await;
    bad_usage_exits_2_and_changes_nothing(inbox, &path).await;
}

#[tokio::test]
async fn postgres_bad_usage_exits_2_and_changes_nothing() {
    let (inbox, url) = postgres().await;
    bad_usage_exits_2_and_changes_nothing(inbox, &url).await;
}

#[tokio::test]
async fn help_works_on_every_subcommand_and_never_shows_the_url() {
    let secret_url = "postgres://operator:s3cr3t-pw@127.0.0.1:5432/inbox";
    for args in [
        &["--help"][..],
        &["counts", "--help"],
        &["list", "--help"],
        &["show", "--help"],
        &["requeue", "--help"],
        &["pause", "--help"],
        &["resume", "--help"],
        &["pauses", "--help"],
        &["backfill", "--help"],
        &["drop-processor", "--help"],
        &["erase", "--help"],
        &["help", "requeue"],
    ] {
        let out = run_with(args, Some(secret_url)).await;
        assert_eq!(out.code, 0, "{args:?}: {out:?}");
        assert!(
            out.stdout.contains("Usage: tower-webhook"),
            "{args:?}: {out:?}"
        );
        assert!(out.stdout.contains("DATABASE_URL"), "{args:?}");
        assert!(!out.stdout.contains("s3cr3t"), "{args:?}: {}", out.stdout);
    }
    let out = run_with(&["--version"], None).await;
    assert_eq!(
        out.stdout,
        format!("tower-webhook {}\n", env!("CARGO_PKG_VERSION"))
    );
}

#[tokio::test]
async fn no_database_is_exit_2_and_a_missing_sqlite_file_is_not_created() {
    let out = run_with(&["counts"], None).await;
    assert_eq!(out.code, 2, "{out:?}");
    assert!(
        out.stderr.contains("--database-url or DATABASE_URL"),
        "{out:?}"
    );

    let path = std::env::temp_dir().join(format!(
        "tower-webhook-cli-missing-{}.db",
        uuid::Uuid::new_v4().simple()
    ));
    let out = run(&path.to_string_lossy(), &["counts"]).await;
    assert_eq!(out.code, 1, "{out:?}");
    assert!(
        out.stderr.starts_with("error: no SQLite database at "),
        "{out:?}"
    );
    assert!(!path.exists(), "an operator's typo creates no database");
}

#[tokio::test]
async fn a_database_that_refuses_is_exit_1_without_the_password() {
    // Refused at once (nothing listens on port 1), then refused by the server itself.
    let base = common::database_url();
    let authority = &base[base.find("://").unwrap() + 3..];
    let host = &authority[authority.find('@').map_or(0, |at| at + 1)..];
    let host = &host[..host.find('/').unwrap_or(host.len())];
    for url in [
        "postgres://operator:s3cr3t%2Dpw@127.0.0.1:1/inbox".to_owned(),
        format!("postgres://no_such_role_here:s3cr3t-pw@{host}/postgres"),
    ] {
        let out = run(&url, &["counts"]).await;
        assert_eq!(out.code, 1, "{out:?}");
        assert!(
            out.stderr.starts_with("error: postgres connect: "),
            "{out:?}"
        );
        assert!(!out.stderr.contains("s3cr3t"), "{out:?}");
        assert_eq!(out.stdout, "");
    }
}

#[tokio::test]
async fn a_database_url_that_does_not_parse_is_exit_2_without_the_password() {
    let out = run(
        "postgres://operator:s3cr3t-pw@127.0.0.1:no_port/inbox",
        &["counts"],
    )
    .await;
    assert_eq!(out.code, 2, "{out:?}");
    assert!(
        out.stderr.starts_with("error: postgres connect: "),
        "{out:?}"
    );
    assert!(!out.stderr.contains("s3cr3t"), "{out:?}");
    assert_eq!(out.stdout, "");
}

#[tokio::test]
async fn text_from_the_database_cannot_drive_the_terminal() {
    let (inbox, path) = sqlite().await;
    // A processor's error and an event type carrying escape sequences.
    let hostile = "{\"type\":\"order.\\u001b]0;pwned\\u0007paid\"}";
    inbox
        .ingest(
            &common::seed::standard("standard"),
            Some("evt_hostile"),
            hostile,
        )
        .await
        .unwrap();
    let worker = Worker::new(&inbox, |_: Event, _: Attempt| async {
        Err::<(), _>("boom \u{1b}[2J\u{1b}[31mred")
    })
    .with_max_attempts(1)
    .unwrap()
    .with_poll_interval(Duration::from_millis(20))
    .unwrap()
    .spawn();
    eventually("dead", async || inbox.counts().await.unwrap().dead == 1).await;
    worker.shutdown().await;
    for args in [
        &["list", "--state", "dead"][..],
        &["show", "standard", "evt_hostile"],
    ] {
        let out = run(&path, args).await;
        assert_eq!(out.code, 0, "{out:?}");
        assert!(
            !out.stdout.contains('\u{1b}') && !out.stdout.contains('\u{7}'),
            "{out:?}"
        );
        assert!(out.stdout.contains("boom \\u{1b}[2J"), "{}", out.stdout);
    }
    // The JSON keeps the text exactly (escaped by JSON itself).
    let json = run(&path, &["show", "standard", "evt_hostile", "--json"])
        .await
        .json();
    assert_eq!(json["last_error"], "boom \u{1b}[2J\u{1b}[31mred");
    assert_eq!(json["type"], "order.\u{1b}]0;pwned\u{7}paid");
}

/// Invalid events (issue 36): `counts` has them, `list --state invalid` lists them with
/// their errors, `show` prints the errors beside the row, and `requeue --invalid
/// --schemas DIR` checks them again against that folder: the valid ones are queued.
async fn the_command_counts_lists_shows_and_requeues_invalid_events(inbox: Inbox, db: &str) {
    let id_is_a_number = json!({"properties": {"data": {"properties": {"object": {
        "properties": {"id": {"type": "integer"}}
    }}}}});
    let schemas = tower_webhook::schemas::Schemas::new()
        .with_schema("order.paid", &id_is_a_number)
        .unwrap();
    let checked = inbox.clone().with_schemas(schemas);
    let verifier = standard("standard");
    let stored = checked.ingest(&verifier, Some("evt_bad"), body("evt_bad"));
    stored.await.unwrap();
    let counts = run(db, &["--json", "counts"]).await.json();
    assert_eq!(
        (counts["invalid"].as_u64(), counts["queued"].as_u64()),
        (Some(1), Some(0))
    );
    let text = run(db, &["counts"]).await.stdout;
    assert!(
        text.lines()
            .any(|l| l.split_whitespace().eq(["invalid", "1"])),
        "{text}"
    );

    let listed = run(db, &["--json", "list", "--state", "invalid"])
        .await
        .json();
    assert_eq!(listed["events"][0]["id"], "evt_bad", "{listed}");
    assert_eq!(listed["events"][0]["state"], "invalid", "{listed}");
    assert_eq!(
        listed["events"][0]["validation_errors"][0]["path"],
        "/data/object/id"
    );
    let text = run(db, &["list", "--state", "invalid"]).await.stdout;
    assert!(
        text.contains("evt_bad") && text.contains("/data/object/id"),
        "{text}"
    );
    let shown = run(db, &["show", "standard", "evt_bad"]).await;
    assert_eq!(shown.code, 0, "{shown:?}");
    assert!(shown.stdout.contains("invalid"), "{shown:?}");
    let errors = rows_under(&shown.stdout, &["PATH", "SCHEMA-ERROR"]);
    assert_eq!(errors[0][0], "/data/object/id", "{shown:?}");
    let message = errors[0][1..].join(" ");
    assert!(
        !message.contains("pi_evt_bad"),
        "no payload value in {message}"
    );

    let refused = run(db, &["requeue", "--invalid"]).await;
    assert_eq!(refused.code, 2, "--invalid needs --schemas: {refused:?}");
    let dir = std::env::temp_dir().join(format!(
        "tower-webhook-cli-schemas-{}",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("order.paid.json"), r#"{"type": "object"}"#).unwrap();
    let dir_arg = dir.to_str().unwrap();
    let done = run(db, &["requeue", "--invalid", "--schemas", dir_arg]).await;
    assert_eq!(done.stdout, "requeued 1\nstill invalid 0\n", "{done:?}");
    std::fs::remove_dir_all(&dir).unwrap();
    let counts = inbox.counts().await.unwrap();
    assert_eq!((counts.invalid, counts.queued), (0, 1));
}

#[tokio::test]
async fn sqlite_the_command_counts_lists_shows_and_requeues_invalid_events() {
    let (inbox, path) = sqlite().await;
    the_command_counts_lists_shows_and_requeues_invalid_events(inbox, &path).await;
}

#[tokio::test]
async fn postgres_the_command_counts_lists_shows_and_requeues_invalid_events() {
    let (inbox, url) = postgres().await;
    the_command_counts_lists_shows_and_requeues_invalid_events(inbox, &url).await;
}
