//! The operator's page in headless Chromium: runs tests/browser/ui.test.mjs (Playwright,
//! node's own test runner) against the receiver example in inbox mode, on a fresh SQLite
//! file and on a fresh PostgreSQL database; then reads that database by SQL: the body the
//! page erased is gone, its event row (the key) stays.
//!
//! Ignored by plain `cargo test`: they need Chromium (`/usr/bin/chromium`, or `CHROMIUM`)
//! and `npm ci` in tests/browser. `.ci/run` installs both and runs them:
//!
//! ```text
//! cargo build --all-features --examples
//! (cd tests/browser && npm ci)
//! cargo test --all-features --test browser -- --ignored
//! ```
//!
//! With `SCREENSHOTS=<folder>`, the runs save the overview's and an event's screenshots
//! there (the README's are taken this way).

mod common;

use std::path::Path;
use std::time::Duration;

use tokio::process::Command;

use common::sql_db::Db;

/// Runs the browser test with `env` (the database), failing with its report.
async fn browser_test(name: &str, env: &[(&str, &str)]) {
    let folder = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser");
    assert!(
        folder.join("node_modules/playwright-core").exists(),
        "playwright-core is missing: run `npm ci` in {}",
        folder.display()
    );
    let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    assert!(
        Path::new(&chromium).exists(),
        "{chromium} is missing: install Debian's chromium (`apt-get install chromium`) or set CHROMIUM"
    );
    let mut command = Command::new("node");
    command
        .args(["--test", "--test-reporter=spec", "ui.test.mjs"])
        .current_dir(&folder)
        .env("RECEIVER_BIN", common::example_binary("receiver"))
        .env("CHROMIUM", &chromium)
        .env_remove("DATABASE_URL")
        .env_remove("WEBHOOK_SQLITE")
        .envs(env.iter().copied())
        .kill_on_drop(true);
    if let Ok(folder) = std::env::var("SCREENSHOTS") {
        command.env("SCREENSHOTS", Path::new(&folder).join(name));
    }
    let output = tokio::time::timeout(Duration::from_secs(240), command.output())
        .await
        .expect("the browser test finishes within 4 min")
        .expect("node runs (is Node.js installed?)");
    let report = String::from_utf8_lossy(&output.stdout);
    println!("{report}{}", String::from_utf8_lossy(&output.stderr));
    assert!(
        output.status.success(),
        "the browser test failed on {name}: see its report above"
    );
}

/// What the page's "Erase body" left in the receiver's database: no body row of the
/// erased event (body and headers gone), its event row kept and marked erased (the key
/// that stopped the redelivery), another event's body row still there.
async fn erased_at_rest(db: &Db) {
    let rows = |table: &str, id: &str, extra: &str| {
        format!("SELECT count(*) FROM {table} WHERE source = 'stripe' AND event_id = '{id}'{extra}")
    };
    assert_eq!(
        db.number(&rows("webhook_bodies", "evt_erased", "")).await,
        0,
        "its body row is deleted"
    );
    let erased = rows("webhook_events", "evt_erased", " AND body_state = 'erased'");
    assert_eq!(
        db.number(&erased).await,
        1,
        "its event row stays, marked erased"
    );
    assert_eq!(
        db.number(&rows("webhook_bodies", "evt_markup", "")).await,
        1,
        "another event's body stays"
    );
}

#[tokio::test]
#[ignore = "needs Chromium and `npm ci` in tests/browser: .ci/run runs it"]
async fn operators_page_in_chromium_on_sqlite() {
    let path =
        std::env::temp_dir().join(format!("tower-webhook-browser-{}.db", std::process::id()));
    let _ = std::fs::remove_file(&path);
    browser_test("sqlite", &[("WEBHOOK_SQLITE", path.to_str().unwrap())]).await;
    let db = Db::open_sqlite(&path).await;
    erased_at_rest(&db).await;
    db.drop_database().await;
}

#[tokio::test]
#[ignore = "needs Chromium and `npm ci` in tests/browser: .ci/run runs it"]
async fn operators_page_in_chromium_on_postgres() {
    let url = common::fresh_pg_url().await;
    browser_test("postgres", &[("DATABASE_URL", url.as_str())]).await;
    let db = Db::open_postgres(&url).await;
    erased_at_rest(&db).await;
    db.drop_database().await;
}
