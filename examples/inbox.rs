//! The inbox in an axum server, whole: Stripe deliveries verified against a list of
//! secrets (rotate without downtime), stored in SQLite and answered 204 at once; a worker
//! that processes each event; the operator API and page behind the crate's door; and, on
//! SIGTERM (what a deploy sends) or Ctrl-C, a shutdown that stops accepting, lets the
//! running events finish (for at most `WEBHOOK_DRAIN_SECS`) and exits 0.
//!
//! ```text
//! WEBHOOK_ADMIN_TOKEN=operator-token-0123456789 cargo run --example inbox
//! cargo run --example send -- --scheme stripe --type demo.slow   # in another terminal
//! ```
//!
//! `--help` lists the environment it reads.

mod support;

use std::time::Duration;

use axum::routing::post_service;
use axum::Router;
use tower_webhook::admin::{self, OperatorDoor};
use tower_webhook::inbox::Attempt;
use tower_webhook::store::SqliteStore;
use tower_webhook::{Event, Inbox, Scheme, Verifier, VerifyWebhookLayer, Worker};

/// `--help` and `-h` print what it does and the environment it reads, and exit 0.
#[derive(clap::Parser)]
#[command(
    name = "inbox",
    about = "Stripe webhooks into a SQLite inbox and a worker, with the operator API and \
        page behind a token, on an axum server that drains on SIGTERM or Ctrl-C.",
    after_help = ENVIRONMENT
)]
struct Args {}

const ENVIRONMENT: &str = "\
Environment (variable [default]: what it does):
  WEBHOOK_SECRETS [a development secret]: Stripe's signing secrets (whsec_...),
      comma-separated, the current one first: during a rotation each one verifies
  WEBHOOK_ADMIN_TOKEN [required]: the operators' token, at least 16 characters: the JSON
      API under /admin (Authorization: Bearer <token>) and the page at /admin/ui (open
      /admin/ui?token=<token> once to sign in)
  WEBHOOK_SQLITE [webhooks.db]: the SQLite file the inbox lives in
  BIND [127.0.0.1:3000]: the address to listen on
  WEBHOOK_DRAIN_SECS [30]: on SIGTERM or Ctrl-C, how long running events may take to
      finish; past it they are stopped, and run again at the next start

It serves POST /webhooks, /admin and /admin/ui. The processor prints `started <event id>`
and `processed <event id>` for each event; one of type demo.slow takes 3 s in between (a
long event, to try the shutdown on).";

/// The application's work, once per event (an `Err` is retried later, with backoff).
async fn process(event: Event, attempt: Attempt) -> Result<(), String> {
    let id = event.id().unwrap_or(event.dedupe_id());
    println!("started {id} (attempt {})", attempt.number());
    if event.event_type() == Some("demo.slow") {
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    println!("processed {id}");
    Ok(())
}

/// `WEBHOOK_SECRETS`, or the development secret (published: never in production).
fn stripe_secrets() -> Vec<String> {
    match std::env::var("WEBHOOK_SECRETS") {
        Ok(list) => list.split(',').map(|s| s.trim().to_owned()).collect(),
        Err(_) => vec![support::dev_secret(&Scheme::stripe()).to_owned()],
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    <Args as clap::Parser>::parse();
    let verifier = Verifier::new(Scheme::stripe(), stripe_secrets())
        .map_err(|e| format!("WEBHOOK_SECRETS: {e}"))?;
    let token = std::env::var("WEBHOOK_ADMIN_TOKEN")
        .map_err(|_| "WEBHOOK_ADMIN_TOKEN: set the operators' token (16 characters or more)")?;
    // Refuses a token under 16 bytes; the error never shows the token.
    let door = OperatorDoor::new(token).map_err(|e| format!("WEBHOOK_ADMIN_TOKEN: {e}"))?;
    let path = std::env::var("WEBHOOK_SQLITE").unwrap_or_else(|_| "webhooks.db".into());
    let bind = std::env::var("BIND").unwrap_or_else(|_| "127.0.0.1:3000".into());
    let drain = match std::env::var("WEBHOOK_DRAIN_SECS") {
        Ok(secs) => Duration::from_secs(secs.parse().map_err(|_| "WEBHOOK_DRAIN_SECS: seconds")?),
        Err(_) => Duration::from_secs(30),
    };

    let inbox = Inbox::sqlite(&SqliteStore::open(&path).await?);
    // Runs until `shutdown()`, which lets running events finish for at most `drain`.
    let worker = Worker::new(&inbox, process).with_grace(drain).spawn();

    let app = Router::new()
        .route(
            "/webhooks",
            post_service(inbox.accept_service()).layer(VerifyWebhookLayer::new(verifier)),
        )
        // The page: `?token=` once, then a session cookie; `nest_service` also serves
        // `/admin/ui/` (the door redirects it).
        .nest_service("/admin/ui", admin::ui(inbox.clone()).layer(door.sign_in()))
        // The JSON API: `Authorization: Bearer <token>`, else 401.
        .nest("/admin", admin::router(inbox).layer(door.bearer()));

    let listener = tokio::net::TcpListener::bind(&bind).await?;
    let addr = listener.local_addr()?;
    // Installed before the address is printed: whoever reads it may send SIGTERM at once.
    let shutdown = support::signal::shutdown_signal();
    eprintln!("receiving Stripe webhooks on http://{addr}/webhooks");
    eprintln!("inbox in {path}; operators: http://{addr}/admin/ui?token=<WEBHOOK_ADMIN_TOKEN>");

    // Serves (with the client's address, which the door's throttle counts by) until the
    // signal; then stops accepting and returns once the open requests are answered.
    let header_timeout = Duration::from_secs(10);
    support::connections::serve_until(listener, app, header_timeout, shutdown).await;
    eprintln!("shutting down: waiting for running events, at most {drain:?}");
    worker.shutdown().await;
    eprintln!("worker stopped");
    Ok(())
}
