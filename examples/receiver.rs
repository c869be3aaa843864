//! A webhook receiver, configured by environment:
//!
//! - `WEBHOOK_SCHEME`: `standard` (default), `stripe`, `github`, `slack` or `shopify`;
//! - `WEBHOOK_SECRETS`: comma-separated, the first is current (default: a development
//!   secret, printed with how to send a test delivery);
//! - `WEBHOOK_TOLERANCE_SECS`: timestamp tolerance, both ways (default 300);
//! - `BIND`: the address to listen on (default `127.0.0.1:3000`).
//!
//! It serves `POST /webhooks` and prints `handled <event id>` each time its handler runs.
//!
//! ```text
//! cargo run --example receiver
//! ```

mod support;

use std::io::Write;
use std::time::Duration;

use axum::routing::post;
use axum::Router;
use tower_webhook::{Event, Verifier, VerifyWebhookLayer};

pub fn app(verifier: Verifier) -> Router {
    Router::new().route(
        "/webhooks",
        post(handle).layer(VerifyWebhookLayer::new(verifier)),
    )
}

async fn handle(event: Event) -> http::StatusCode {
    let mut out = std::io::stdout().lock();
    // Flushed per line: a supervisor or test reading the pipe sees each one at once.
    let _ = writeln!(out, "handled {}", event.id().unwrap_or("<no id>"));
    let _ = out.flush();
    http::StatusCode::NO_CONTENT
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (scheme, secrets, dev) = support::scheme_and_secrets()?;
    let tolerance: u64 = match std::env::var("WEBHOOK_TOLERANCE_SECS") {
        Ok(v) => v
            .parse()
            .map_err(|_| "WEBHOOK_TOLERANCE_SECS: not a whole number")?,
        Err(_) => 300,
    };
    let bind = std::env::var("BIND").unwrap_or_else(|_| "127.0.0.1:3000".into());
    let scheme_name = scheme.name().to_owned();
    let verifier = Verifier::new(scheme, &secrets)?.with_tolerance(Duration::from_secs(tolerance));

    let listener = tokio::net::TcpListener::bind(&bind).await?;
    let addr = listener.local_addr()?;
    eprintln!("receiving {scheme_name} webhooks on http://{addr}/webhooks");
    if dev {
        eprintln!(
            "no WEBHOOK_SECRETS: using a development secret. Send a signed test delivery with\n  \
             WEBHOOK_SCHEME={scheme_name} cargo run --example send -- http://{addr}/webhooks"
        );
    }
    axum::serve(listener, app(verifier))
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
