//! The HTTPS GET the application supplies, with its own client, to fetch certificates.

use std::future::Future;
use std::pin::Pin;

use bytes::Bytes;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The future a [`Fetch`] returns: the response body of a successful (2xx) GET.
pub type FetchFuture = Pin<Box<dyn Future<Output = Result<Bytes, BoxError>> + Send>>;

/// An HTTPS GET to a provider's host, made by your HTTP client: fetching a signing
/// certificate, visiting an SNS `SubscribeURL`. Only URLs that passed the provider's host
/// check are given to it. Answer `Err` for anything but a 2xx response.
///
/// **Do not follow redirects** — the host check covers the URL given, not where a
/// redirect leads — and bound what you read (a certificate is a few KiB; more than
/// 64 KiB is refused anyway). Implemented for closures
/// `Fn(String) -> impl Future<Output = Result<Bytes, E>>`; with `reqwest`, for example:
///
/// ```text
/// let client = reqwest::Client::builder()
///     .redirect(reqwest::redirect::Policy::none())
///     .https_only(true)
///     .build()?;
/// let fetch = move |url: String| {
///     let client = client.clone();
///     async move {
///         let mut response = client.get(url).send().await?.error_for_status()?;
///         let mut body = Vec::new();
///         while let Some(chunk) = response.chunk().await? {
///             body.extend_from_slice(&chunk);
///             if body.len() > 64 * 1024 { return Err("too large".into()); }
///         }
///         Ok::<_, Box<dyn std::error::Error + Send + Sync>>(bytes::Bytes::from(body))
///     }
/// };
/// ```
///
/// (The receiver example's, on `hyper-rustls`, follows no redirect and reads at most
/// 64 KiB.)
pub trait Fetch: Send + Sync + 'static {
    /// GETs `url`.
    fn get(&self, url: String) -> FetchFuture;
}

impl<F, Fut, E> Fetch for F
where
    F: Fn(String) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Bytes, E>> + Send + 'static,
    E: Into<BoxError>,
{
    fn get(&self, url: String) -> FetchFuture {
        let future = self(url);
        Box::pin(async move { future.await.map_err(Into::into) })
    }
}
