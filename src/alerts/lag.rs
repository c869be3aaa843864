//! [`Alerts::watch_lag`]: a task that reads a queue's lag the way backpressure does (in
//! the background, every 500 ms) and raises [`AlertKind::Lagging`](super::AlertKind) past
//! the bound.

use std::sync::{Arc, Weak};

use super::Alerts;
use crate::inbox::accept::Destination;
use crate::inbox::backpressure::{LagReader, READ_EVERY};

/// A queue whose lag [`Alerts::watch_lag`] can watch: made from an
/// [`Inbox`](crate::Inbox) or a [`JetStream`](crate::inbox::jetstream::JetStream) with
/// `From`.
#[derive(Clone)]
pub struct Queue {
    destination: Arc<dyn Destination>,
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
impl From<&crate::Inbox> for Queue {
    fn from(inbox: &crate::Inbox) -> Self {
        Self {
            destination: Arc::new(inbox.clone()),
        }
    }
}

#[cfg(feature = "nats")]
impl From<&crate::inbox::jetstream::JetStream> for Queue {
    fn from(jetstream: &crate::inbox::jetstream::JetStream) -> Self {
        Self {
            destination: Arc::new(jetstream.clone()),
        }
    }
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue").finish_non_exhaustive()
    }
}

impl Alerts {
    /// Watches `queue`'s lag on a task of its own: every 500 ms it reads how long the
    /// oldest due event has waited ([`Counts::oldest_due`](crate::inbox::Counts)) and
    /// calls [`lagging`](Self::lagging) with it, so [`AlertKind::Lagging`](super::AlertKind)
    /// goes out once per interval while the lag stays past the bound. A read that fails is
    /// skipped (the store's own errors tell of it). The task ends when the last clone of
    /// these `Alerts` is dropped.
    ///
    /// ```no_run
    /// # async fn run(inbox: tower_webhook::Inbox) -> Result<(), tower_webhook::ConfigError> {
    /// use std::time::Duration;
    /// use tower_webhook::alerts::{Alerts, JsonPost};
    ///
    /// let alerts = Alerts::new(JsonPost::new("http://alert-relay:8080/hook")?)
    ///     .with_max_lag(Duration::from_secs(600))?;
    /// alerts.watch_lag(&inbox);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime.
    pub fn watch_lag(&self, queue: impl Into<Queue>) {
        let destination = queue.into().destination;
        let (config, shared) = self.parts();
        let (config, shared) = (config.clone(), Arc::downgrade(shared));
        tokio::spawn(async move {
            let reader = Arc::new(LagReader::new());
            let mut every = tokio::time::interval(READ_EVERY);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                every.tick().await;
                let Some(shared) = Weak::upgrade(&shared) else {
                    return; // every `Alerts` is gone
                };
                if let Some(Some(lag)) = reader.latest_counts(&destination).map(|c| c.oldest_due) {
                    Alerts::from_parts(config.clone(), shared).lagging(lag);
                }
            }
        });
    }
}
