//! The `tower-webhook` command run as a process against a SQLite file and a fresh
//! PostgreSQL database, each seeded with dead, failing, queued and processed rows:
//! tables and `--json` (the router's JSON), pages, bodies, requeue then a worker
//! processes the rows, exit codes, `--help` everywhere, and no password in any output.

mod common;

use std::time::Duration;

use common::seed::{body, eventually, seed, DEAD_ERROR};
use serde_json::Value;
use tower_webhook::inbox::{Attempt, Inbox, Listing, Worker};
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
    command.args(args).env_remove("DATABASE_URL");
    if let Some(url) = env {
        command.env("DATABASE_URL", url);
    }
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
    let lines: Vec<&str> = table.stdout.lines().collect();
    assert_eq!(
        lines[0].split_whitespace().collect::<Vec<_>>(),
        ["STATE", "ROWS"]
    );
    assert!(lines.contains(&"dead        3"), "{}", table.stdout);
    assert!(lines.contains(&"processed   1"), "{}", table.stdout);

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
    let table = run(db, &["show", "standard", "evt_dead_1"]).await;
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
    assert_eq!(replay.json(), serde_json::json!({"requeued": 1}));
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
