//! Serving a `Router` with the connection's own bounds, which `axum::serve` does not set:
//! hyper's header-read timeout closes a connection that has not sent a request's headers
//! in time — a slow client's first request, or a keep-alive connection left idle — so
//! connections that never finish their headers cannot hold the file descriptors a genuine
//! delivery needs. `VerifyWebhookLayer` bounds the body; the headers are the server's.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tower::ServiceExt;

/// Serves `router` on `listener` until `shutdown` completes, then waits for the open
/// connections to finish their requests (each is told to close after the one it serves).
/// Each request carries the client's address as axum's `ConnectInfo<SocketAddr>`.
pub async fn serve_until(
    listener: TcpListener,
    router: Router,
    header_timeout: Duration,
    shutdown: impl Future<Output = ()>,
) {
    let mut http = hyper::server::conn::http1::Builder::new();
    // The timer starts when a connection opens and again once a response is sent, so the
    // same bound closes idle keep-alive connections.
    http.timer(TokioTimer::new())
        .header_read_timeout(header_timeout);
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, client) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors, or a connection reset before it was taken:
                    // wait a moment (timed-out connections free descriptors) and go on.
                    eprintln!("accept: {error}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let service = router
            .clone()
            .map_request(move |mut request: http::Request<Incoming>| {
                request
                    .extensions_mut()
                    .insert(ConnectInfo::<SocketAddr>(client));
                request
            });
        let connection =
            http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(service));
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            // A client that never sent its headers in time ends here, closed.
            let _ = connection.await;
        });
    }
    drop(listener); // stop accepting before the drain
    graceful.shutdown().await;
}
