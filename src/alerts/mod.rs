//! Alerts: be told when webhooks stop working, without being flooded.
//!
//! An [`Alerts`] handle raises an [`Alert`] when
//!
//! - a source's processor starts failing ([`AlertKind::Failing`]: the first failed attempt
//!   after successes), and when it works again ([`AlertKind::Recovered`]: the first success
//!   after the streak, with how many attempts failed meanwhile);
//! - an event goes dead after its last attempt ([`AlertKind::Dead`]);
//! - the queue's oldest due event has waited longer than a bound ([`AlertKind::Lagging`],
//!   from [`Alerts::watch_lag`]);
//! - more deliveries of a source were rejected within a window than a threshold
//!   ([`AlertKind::Rejections`], from
//!   [`VerifyWebhookLayer::with_alerts`](crate::VerifyWebhookLayer::with_alerts)): forged
//!   requests, or a secret the provider no longer signs with;
//! - an event failed its type's JSON Schema and was kept invalid ([`AlertKind::Invalid`],
//!   from the inbox's or JetStream's `with_alerts`, feature `schemas`): a provider's
//!   payload changed shape.
//!
//! At most one alert of a kind goes out per source and interval (5 minutes unless
//! [`with_interval`](Alerts::with_interval)); the ones held back are counted in the next
//! ([`Alert::suppressed`]). An alert is handed to an [`Alerter`] on a task of its own, so
//! the worker or the request that raised it never waits for it: [`JsonPost`] POSTs it as
//! Slack-compatible JSON, a closure does anything else.
//!
//! What is tracked per source is capped (1024 sources per map): sources sprayed by an
//! attacker cannot grow memory, and past the cap they share one throttle.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use tower_webhook::alerts::{Alert, AlertKind, Alerts};
//!
//! let (sent, mut received) = tokio::sync::mpsc::unbounded_channel();
//! let alerts = Alerts::new(move |alert: Alert| {
//!     let _ = sent.send(alert); // or page someone, or `JsonPost`
//!     std::future::ready(())
//! });
//!
//! // What the worker reports: two attempts fail, then one succeeds.
//! alerts.failed("stripe", "evt_1", Some("invoice.paid"), 1, "crm: 502 bad gateway");
//! alerts.failed("stripe", "evt_1", Some("invoice.paid"), 2, "crm: 502 bad gateway");
//! alerts.succeeded("stripe");
//!
//! let failing = received.recv().await.unwrap();
//! assert_eq!(failing.kind(), AlertKind::Failing);
//! assert_eq!(failing.source(), Some("stripe"));
//! assert_eq!(failing.details(), Some("crm: 502 bad gateway"));
//! let recovered = received.recv().await.unwrap();
//! assert_eq!(recovered.kind(), AlertKind::Recovered);
//! assert_eq!(recovered.count(), 2); // attempts failed in the streak
//! assert_eq!(recovered.summary(), "stripe: processing recovered after 2 failed attempts");
//! # Ok(())
//! # }
//! ```
//!
//! # Security
//!
//! An alert holds the processor's error text (at most 1 KiB, control characters
//! removed), event ids and types — never an event's body. A [`JsonPost`] URL is treated as
//! a secret: `Debug` and logs show its host only.

mod alert;
#[cfg(any(
    feature = "sqlite",
    feature = "postgres",
    feature = "nats",
    feature = "amqp"
))]
mod lag;
mod limit;
mod post;
#[cfg(test)]
mod tests;
mod throttle;

use std::future::Future;
use std::pin::Pin;

pub use self::alert::{Alert, AlertKind};
#[cfg(any(
    feature = "sqlite",
    feature = "postgres",
    feature = "nats",
    feature = "amqp"
))]
pub use self::lag::Queue;
pub use self::limit::Alerts;
pub use self::post::JsonPost;

/// Where [`Alerts`] sends an [`Alert`]: [`JsonPost`], your own type, or any
/// `Fn(Alert) -> impl Future<Output = ()>` closure.
///
/// It runs on a tokio task of its own, at most 16 at once, and is abandoned after 60 s;
/// it should handle its own failures (log them, retry a little) and return.
pub trait Alerter: Send + Sync + 'static {
    /// Sends one alert.
    fn alert(&self, alert: Alert) -> Pin<Box<dyn Future<Output = ()> + Send>>;
}

impl<F, Fut> Alerter for F
where
    F: Fn(Alert) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    fn alert(&self, alert: Alert) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        Box::pin(self(alert))
    }
}
