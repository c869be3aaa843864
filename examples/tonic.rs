//! tonic: a verified webhook route served beside a gRPC service (the standard health
//! service) on one tonic server and one port.
//!
//! ```text
//! cargo run --example tonic
//! ```

use axum::routing::post;
use tokio::net::TcpListener;
use tonic::service::Routes;
use tonic::transport::server::TcpIncoming;
use tonic::transport::Server;
use tower_webhook::{Event, Scheme, Verifier, VerifyWebhookLayer};

async fn webhook(event: Event) -> String {
    format!("handled {}", event.id().unwrap_or("?"))
}

/// Serves gRPC health and `POST /webhooks` on `listener`.
pub async fn serve(
    listener: TcpListener,
    verifier: Verifier,
) -> Result<(), tonic::transport::Error> {
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_serving::<tonic_health::pb::health_server::HealthServer<tonic_health::server::HealthService>>()
        .await;
    let webhooks = axum::Router::new().route(
        "/webhooks",
        post(webhook).layer(VerifyWebhookLayer::new(verifier)),
    );
    let routes = Routes::from(webhooks).add_service(health);
    Server::builder()
        .accept_http1(true) // webhook senders speak HTTP/1.1; gRPC clients HTTP/2
        .add_routes(routes)
        .serve_with_incoming(TcpIncoming::from(listener))
        .await
}

/// `--help` and `-h` say what it does and exit 0; it takes no arguments.
#[derive(clap::Parser)]
#[command(
    name = "tonic",
    about = "Serves gRPC health and a verified Stripe webhook route (POST /webhooks) on one tonic server, on 127.0.0.1:3000, with a development secret."
)]
struct Args {}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    <Args as clap::Parser>::parse();
    let verifier = Verifier::new(
        Scheme::stripe(),
        ["whsec_dev_secret_do_not_use_in_production"],
    )?;
    let listener = TcpListener::bind("127.0.0.1:3000").await?;
    eprintln!(
        "gRPC health and POST /webhooks on {}",
        listener.local_addr()?
    );
    serve(listener, verifier).await?;
    Ok(())
}
