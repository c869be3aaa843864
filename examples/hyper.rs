//! hyper without a framework: `VerifyWebhookLayer` around a `service_fn`, served by hyper 1.
//!
//! ```text
//! cargo run --example hyper
//! ```

use std::convert::Infallible;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
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
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let verifier = Verifier::new(
        Scheme::standard(),
        ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"],
    )?;
    let listener = TcpListener::bind("127.0.0.1:3000").await?;
    eprintln!("listening on http://{}", listener.local_addr()?);
    serve(listener, verifier).await?;
    Ok(())
}
