//! The operator's page in headless Chromium: runs tests/browser/ui.test.mjs (Playwright,
//! node's own test runner) against the receiver example in inbox mode, on a fresh SQLite
//! file and on a fresh PostgreSQL database.
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

#[tokio::test]
#[ignore = "needs Chromium and `npm ci` in tests/browser: .ci/run runs it"]
async fn operators_page_in_chromium_on_sqlite() {
    let db = std::env::temp_dir().join(format!("tower-webhook-browser-{}.db", std::process::id()));
    let _ = std::fs::remove_file(&db);
    browser_test("sqlite", &[("WEBHOOK_SQLITE", db.to_str().unwrap())]).await;
    let _ = std::fs::remove_file(&db);
}

#[tokio::test]
#[ignore = "needs Chromium and `npm ci` in tests/browser: .ci/run runs it"]
async fn operators_page_in_chromium_on_postgres() {
    let url = common::fresh_pg_url().await;
    browser_test("postgres", &[("DATABASE_URL", url.as_str())]).await;
}
