//! hyper without a framework: `VerifyWebhookLayer` around a `service_fn`, served by hyper 1.
//!
//! ```text
//! cargo run --example hyper
//! ```

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tower::{service_fn, ServiceBuilder};
use tower_webhook::{Event, Scheme, Verifier, VerifyWebhookLayer};

/// The handler: the verified event is in the extensions, the raw bytes in the body.
async fn handle(req: Request<Full<Bytes>>) -> Result<Response<Full<Bytes>>, Infallible> {
    let event = req.extensions().get::<Event>().cloned();
    let body = req.into_body().collect().await?.to_bytes();
    let text = match event {
        Some(event) => format!(
            "handled {} ({} bytes)",
            event.id().unwrap_or("?"),
            body.len()
        ),
        None => unreachable!("VerifyWebhookLayer inserts the event before calling us"),
    };
    let mut response = Response::new(Full::new(Bytes::from(text)));
    *response.status_mut() = StatusCode::OK;
    Ok(response)
}

/// Serves connections from `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, verifier: Verifier) -> std::io::Result<()> {
    let service = ServiceBuilder::new()
        .layer(VerifyWebhookLayer::new(verifier))
        .service(service_fn(handle));
    loop {
        let (stream, _) = listener.accept().await?;
        let service = TowerToHyperService::new(service.clone());
        tokio::spawn(async move {
            let mut builder = auto::Builder::new(TokioExecutor::new());
            // The layer bounds the body; the headers are the server's to bound: a
            // connection that has not sent a request's headers within 10 s (a slow
            // client, or an idle keep-alive connection) is closed.
            builder
                .http1()
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_secs(10));
            let _ = builder
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// `--help` and `-h` say what it does and exit 0; it takes no arguments.
#[derive(clap::Parser)]
#[command(
    name = "hyper",
    about = "Verifies Standard Webhooks deliveries (any path) with VerifyWebhookLayer around a hyper service_fn, on 127.0.0.1:3000, with a development secret."
)]
struct Args {}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    <Args as clap::Parser>::parse();
    let verifier = Verifier::new(
        Scheme::standard(),
        ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"],
    )?;
    let listener = TcpListener::bind("127.0.0.1:3000").await?;
    eprintln!("listening on http://{}", listener.local_addr()?);
    serve(listener, verifier).await?;
    Ok(())
}
