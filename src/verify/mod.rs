//! Verify webhook deliveries before they reach a service.
//!
//! [`VerifyWebhookLayer`] buffers the request body under a limit (1 MiB by default),
//! verifies the signature over the exact raw bytes against a list of secrets with a
//! [`Verifier`](crate::Verifier), and only then calls the inner service — with the same
//! bytes as its body and the verified [`Event`](crate::Event) in the request's extensions.
//!
//! The cheapest rejections come first: a method the provider never sends (405), a
//! `Content-Length` over the limit, then the headers
//! (a missing, repeated or malformed one, no signature of the scheme's length, a signed
//! timestamp outside the tolerance) are refused before a byte of the body is read; the
//! body must arrive within a read timeout (10 s by default); only then is a MAC computed.
//! The inner service's readiness is taken once a delivery is verified, so unauthenticated
//! requests never hold a place in a concurrency limit or a buffer behind the layer.
//!
//! | the request | response | body read? | inner service called? |
//! |---|---|---|---|
//! | authentic and fresh | the inner service's | yes | yes |
//! | a method other than POST (a health check's GET): GET too for Meta, Twilio, HubSpot and schemes that sign the method | 405 + `Allow: POST` (or `GET, POST`) | no | no |
//! | `Content-Length` over the limit | 413 | no | no |
//! | a header missing, repeated or malformed | 400 | no | no |
//! | signed timestamp outside the tolerance | 400 | no | no |
//! | no signature of the scheme's length (`v1,` alone) | 400 | no | no |
//! | the body over the limit as it streams | 413 | up to the limit | no |
//! | the body not received within the read timeout | 408 | until then | no |
//! | no signature matches any secret | 400 (Discord: 401) | yes | no |
//! | a set-up handshake, signed (Slack, Zoom, Discord PING, Twitch) | the provider's expected answer | yes | no |
//! | Meta's `GET ?hub.mode=subscribe` handshake | the challenge, or 403 without the verify token | no | no |
//! | a URL-signing scheme without a [`PublicUrl`](crate::PublicUrl) | 500 | yes | no |
//! | per tenant: no tenant, or one the source does not know | 400 | path/header: no | no |
//! | per tenant: the secret source fails | 503 | yes | no |
//! | per tenant: the tenant's secrets do not decode | 500 | yes | no |
//! | SNS, PayPal: a certificate URL off the provider's HTTPS hosts | 400, nothing fetched | yes (PayPal: no) | no |
//! | SNS, PayPal: the certificate cannot be fetched now, or 20 fetches started this minute | 503 | yes | no |
//! | PayPal: a second body under a transmission id already seen (this process, or the [transmission store][VerifyWebhookLayer::with_transmission_store]) | 400 | yes | no |
//! | PayPal: the transmission store cannot be reached | 503 | yes | no |
//! | Microsoft Graph's `POST ?validationToken=…` | 200, the token as text | no | no |
//! | SNS `SubscriptionConfirmation`, with [`Certificates`] | 200 once its `SubscribeURL` is visited; 503 if that fails | yes | no |
//!
//! Handshakes are answered by the layer, before deduplication and the handler (see the
//! presets' docs). [`VerifyWebhookLayer::per_tenant`] verifies each tenant's deliveries
//! with that tenant's secrets ([`Tenants`]); [`VerifyWebhookLayer::from_certificates`]
//! verifies SNS and PayPal deliveries under the certificate each names, fetched from the
//! provider ([`Certificates`]).
//!
//! Rejections are responses, never errors (an error from HTTP middleware drops the
//! connection), and never 410 (which makes Standard Webhooks senders disable the
//! endpoint). Their body is a short fixed text; the [`VerifyError`](crate::VerifyError)
//! rides in the response's extensions and, with the `tracing` feature, is logged at
//! `warn`. Replace the response with [`VerifyWebhookLayer::with_rejection`].
//!
//! # Example
//!
//! ```
//! use std::time::SystemTime;
//! use bytes::Bytes;
//! use http::{Request, Response, StatusCode};
//! use http_body_util::Full;
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//! use tower_webhook::{Event, Scheme, Verifier, VerifyWebhookLayer};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
//! let verifier = Verifier::new(Scheme::standard(), [secret])?;
//! let service = ServiceBuilder::new()
//!     .layer(VerifyWebhookLayer::new(verifier))
//!     .service(service_fn(|req: Request<Full<Bytes>>| async move {
//!         let event = req.extensions().get::<Event>().expect("verified");
//!         println!("handled {}", event.id().unwrap_or("?"));
//!         Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::new())))
//!     }));
//!
//! // A forged delivery never reaches the handler.
//! let forged = Request::post("/webhooks")
//!     .header("webhook-id", "msg_1")
//!     .header("webhook-timestamp", "1614265330")
//!     .header("webhook-signature", "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=")
//!     .body(Full::new(Bytes::from_static(b"{}")))?;
//! let response = service.clone().oneshot(forged).await?;
//! assert_eq!(response.status(), StatusCode::BAD_REQUEST);
//!
//! // A signed one does.
//! let body = b"{\"type\":\"ping\"}";
//! let mut request = Request::post("/webhooks").body(Full::new(Bytes::from_static(body)))?;
//! *request.headers_mut() = Scheme::standard().sign([secret], "msg_2", SystemTime::now(), body)?;
//! let response = service.oneshot(request).await?;
//! assert_eq!(response.status(), StatusCode::OK);
//! # Ok(())
//! # }
//! ```
//!
#![cfg_attr(
    feature = "dedupe",
    doc = "[VerifyWebhookLayer::with_transmission_store]: VerifyWebhookLayer::with_transmission_store"
)]
#![cfg_attr(
    not(feature = "dedupe"),
    doc = "[VerifyWebhookLayer::with_transmission_store]: crate#features"
)]

mod certificate;
mod collect;
mod future;
mod handshake;
mod layer;
mod method;
mod response;
mod service;
mod tenant;
#[cfg(feature = "dedupe")]
mod transmission;

#[doc(hidden)]
pub use self::certificate::certificate_url_shape;
pub use self::certificate::{Certificates, Fetch, FetchFuture};
pub use self::future::ResponseFuture;
pub use self::layer::VerifyWebhookLayer;
pub use self::service::VerifyWebhook;
pub use self::tenant::{SecretSource, SecretsFuture, TenantFrom, Tenants};
