//! axum: verify GitHub webhooks on one route, with the `Event` extractor; other routes are
//! untouched.
//!
//! ```text
//! GITHUB_WEBHOOK_SECRET=... cargo run --example axum
//! ```

use axum::routing::{get, post};
use axum::Router;
use tower_webhook::{Event, Scheme, Verifier, VerifyWebhookLayer};

pub fn app(verifier: Verifier) -> Router {
    Router::new()
        .route(
            "/webhooks/github",
            post(github).layer(VerifyWebhookLayer::new(verifier)),
        )
        .route("/health", get(|| async { "ok" }))
}

/// Only authentic deliveries get here. Answer 2xx to event types you do not handle.
async fn github(event: Event) -> String {
    format!(
        "handled {} {}",
        event.event_type().unwrap_or("?"),
        event.id().unwrap_or("?")
    )
}

/// `--help` and `-h` say what it does and exit 0; it takes no arguments.
#[derive(clap::Parser)]
#[command(
    name = "axum",
    about = "Verifies GitHub webhooks on POST /webhooks/github with the Event extractor, beside an untouched GET /health, on 127.0.0.1:3000.",
    after_help = "Environment:\n  GITHUB_WEBHOOK_SECRET [a development secret]: the webhook's secret"
)]
struct Args {}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    <Args as clap::Parser>::parse();
    let secret = std::env::var("GITHUB_WEBHOOK_SECRET")
        .unwrap_or_else(|_| "dev-secret-do-not-use-in-production".into());
    let verifier = Verifier::new(Scheme::github(), [secret])?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    eprintln!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app(verifier)).await?;
    Ok(())
}
