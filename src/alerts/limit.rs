//! [`Alerts`]: the handle the worker engine and the verify layer report to. It decides
//! what is worth an alert, holds back all but one per interval, and sends on a task of
//! its own, so a slow or broken alerter never slows the caller.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::time::Instant;

use super::alert::{Alert, AlertKind};
use super::throttle::{Rejections, Streaks, Throttle};
use super::Alerter;
use crate::ConfigError;

/// How many alerts may be on their way at once; more are dropped, and counted in the
/// next one sent ([`Alert::dropped`]).
pub(crate) const MAX_IN_FLIGHT: usize = 16;

/// How long one alert may take to send before it is abandoned (its future dropped): a
/// [`JsonPost`](super::JsonPost) with its retries takes about 32 s at worst.
pub(crate) const SEND_DEADLINE: Duration = Duration::from_secs(60);

/// Raises [`Alert`]s and hands them to an [`Alerter`], at most one per interval per
/// [`AlertKind`] and source: see the [module docs](super).
///
/// Each call takes a lock for a few map operations and returns: the alert is sent on a
/// tokio task, at most 16 at once and each for at most 60 s; past that, alerts are
/// dropped and counted in the next one sent ([`Alert::dropped`]). Calls made outside a
/// tokio runtime send nothing (they are counted as dropped).
///
/// Cloning is cheap and shares the state; a setting changed on a clone applies to that
/// clone only, so configure it before handing it out.
#[derive(Clone)]
#[must_use]
pub struct Alerts {
    config: Arc<Config>,
    shared: Arc<Shared>,
}

#[derive(Debug, Clone)]
pub(super) struct Config {
    interval: Duration,
    rejections: (u32, Duration),
    max_lag: Duration,
}

/// What every clone shares: the alerter and the bookkeeping.
pub(super) struct Shared {
    alerter: Arc<dyn Alerter>,
    state: Mutex<State>,
    in_flight: Arc<Semaphore>,
    /// Alerts dropped since the last one sent.
    dropped: AtomicU64,
}

#[derive(Debug)]
struct State {
    throttle: Throttle,
    streaks: Streaks,
    rejections: Rejections,
}

/// The defaults: one alert per kind and source every 5 minutes; 20 rejections within a
/// minute; a queue lagging by 5 minutes.
const INTERVAL: Duration = Duration::from_secs(300);
const REJECTIONS: (u32, Duration) = (20, Duration::from_secs(60));
const MAX_LAG: Duration = Duration::from_secs(300);

impl Alerts {
    /// Alerts handed to `alerter` (a [`JsonPost`](super::JsonPost), your own
    /// [`Alerter`], or a closure): at most one per kind and source every 5 minutes, on
    /// 20 rejected deliveries of a source within a minute, and on a queue whose oldest
    /// due event has waited more than 5 minutes.
    pub fn new(alerter: impl Alerter) -> Self {
        let config = Config {
            interval: INTERVAL,
            rejections: REJECTIONS,
            max_lag: MAX_LAG,
        };
        let state = State::new(&config);
        Self {
            config: Arc::new(config),
            shared: Arc::new(Shared {
                alerter: Arc::new(alerter),
                state: Mutex::new(state),
                in_flight: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
                dropped: AtomicU64::new(0),
            }),
        }
    }

    /// Replaces how often an alert of one kind about one source may go out (default
    /// 5 minutes); those held back meanwhile are counted in the next ([`Alert::suppressed`]).
    ///
    /// # Errors
    ///
    /// When `interval` is zero (every failure an alert: the storm this prevents).
    pub fn with_interval(mut self, interval: Duration) -> Result<Self, ConfigError> {
        if interval.is_zero() {
            return Err(ConfigError::duration(
                "an alert interval",
                interval,
                "above 0",
            ));
        }
        Arc::make_mut(&mut self.config).interval = interval;
        Ok(self.reset())
    }

    /// Replaces when rejected deliveries raise [`AlertKind::Rejections`]: `n` of one source
    /// within one `window` (default 20 within a minute). A window begins with the first
    /// rejection after the last window ended.
    ///
    /// # Errors
    ///
    /// When `n` or `window` is zero.
    pub fn with_rejections(mut self, n: u32, window: Duration) -> Result<Self, ConfigError> {
        if n == 0 {
            return Err(ConfigError::new(
                crate::ConfigErrorKind::InvalidValue,
                "a rejection threshold must be at least 1",
            ));
        }
        if window.is_zero() {
            return Err(ConfigError::duration(
                "a rejection window",
                window,
                "above 0",
            ));
        }
        Arc::make_mut(&mut self.config).rejections = (n, window);
        Ok(self.reset())
    }

    /// Replaces how long the queue's oldest due event may wait before
    /// [`AlertKind::Lagging`] (default 5 minutes).
    ///
    /// # Errors
    ///
    /// When `max_lag` is zero.
    pub fn with_max_lag(mut self, max_lag: Duration) -> Result<Self, ConfigError> {
        if max_lag.is_zero() {
            return Err(ConfigError::duration("a maximum lag", max_lag, "above 0"));
        }
        Arc::make_mut(&mut self.config).max_lag = max_lag;
        Ok(self)
    }

    /// Starts the bookkeeping again under the current settings.
    fn reset(self) -> Self {
        *self.shared.state.lock().expect("not poisoned") = State::new(&self.config);
        self
    }

    /// An attempt at an event of `source` failed with `error` (its text, with its source
    /// chain). The first failure after successes raises [`AlertKind::Failing`]; later ones
    /// count toward the [`AlertKind::Recovered`] that ends the streak.
    pub fn failed(
        &self,
        source: &str,
        event_id: &str,
        event_type: Option<&str>,
        attempt: u32,
        error: &str,
    ) {
        let begins = self.state().streaks.fail(source);
        if !begins {
            return;
        }
        let summary = format!(
            "{source}: processing started failing: event {event_id}{} failed attempt {attempt}",
            type_suffix(event_type)
        );
        let alert = Alert::new(AlertKind::Failing, Some(source), &summary)
            .with_event(Some(event_id), event_type)
            .with_details(error)
            .with_count(u64::from(attempt));
        self.raise(alert);
    }

    /// An attempt at an event of `source` succeeded. The first success after a failing
    /// streak raises [`AlertKind::Recovered`], with how many attempts failed in it.
    pub fn succeeded(&self, source: &str) {
        let Some(failures) = self.state().streaks.succeed(source) else {
            return;
        };
        let summary = format!("{source}: processing recovered after {failures} failed attempts");
        self.raise(Alert::new(AlertKind::Recovered, Some(source), &summary).with_count(failures));
    }

    /// An event of `source` gave up after its last attempt failed with `error`: raises
    /// [`AlertKind::Dead`]. Call it instead of [`failed`](Self::failed) for that attempt:
    /// it counts toward the source's failing streak (and begins one, without a
    /// [`AlertKind::Failing`] of its own), so the next success raises
    /// [`AlertKind::Recovered`].
    pub fn dead(&self, source: &str, event_id: &str, event_type: Option<&str>, error: &str) {
        self.state().streaks.fail(source);
        let summary = format!(
            "{source}: event {event_id}{} is dead",
            type_suffix(event_type)
        );
        let alert = Alert::new(AlertKind::Dead, Some(source), &summary)
            .with_event(Some(event_id), event_type)
            .with_details(error);
        self.raise(alert);
    }

    /// An event of `source` failed its type's schema at accept and was kept invalid, with
    /// `errors` (paths and messages): raises [`AlertKind::Invalid`]. The inbox and
    /// JetStream call it for each new invalid event when given the alerts
    /// (`with_alerts`); a duplicate of one is not new.
    pub fn invalid(&self, source: &str, event_id: &str, event_type: Option<&str>, errors: &str) {
        let summary = format!(
            "{source}: event {event_id}{} failed its schema and is kept invalid",
            type_suffix(event_type)
        );
        let alert = Alert::new(AlertKind::Invalid, Some(source), &summary)
            .with_event(Some(event_id), event_type)
            .with_details(errors);
        self.raise(alert);
    }

    /// The queue's oldest due event has waited `oldest_due_age`: beyond the bound
    /// ([`with_max_lag`](Self::with_max_lag)), raises [`AlertKind::Lagging`] — once per
    /// interval while it stays beyond. [`watch_lag`](Self::watch_lag) calls it.
    pub fn lagging(&self, oldest_due_age: Duration) {
        if oldest_due_age <= self.config.max_lag {
            return;
        }
        let summary = format!(
            "queue lagging: the oldest due event has waited {}s (bound {}s)",
            oldest_due_age.as_secs(),
            self.config.max_lag.as_secs()
        );
        self.raise(Alert::new(AlertKind::Lagging, None, &summary).with_lag(oldest_due_age));
    }

    /// A delivery of `source` was rejected for `kind` (`InvalidSignature`, …): at the
    /// threshold within a window, raises [`AlertKind::Rejections`].
    /// [`VerifyWebhookLayer::with_alerts`](crate::VerifyWebhookLayer::with_alerts) calls it
    /// for every rejection but a 405 (a health check's GET is no delivery).
    pub fn rejected(&self, source: &str, kind: &str) {
        let now = Instant::now();
        let Some((count, kinds)) = self.state().rejections.reject(source, kind, now) else {
            return;
        };
        let window = self.config.rejections.1;
        let summary = format!(
            "{source}: {count} deliveries rejected within {}s",
            window.as_secs_f32()
        );
        self.raise(
            Alert::new(AlertKind::Rejections, Some(source), &summary)
                .with_details(&kinds)
                .with_count(count),
        );
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.shared.state.lock().expect("not poisoned")
    }

    /// Sends `alert` unless one of its kind and source went out within the interval.
    fn raise(&self, alert: Alert) {
        let now = Instant::now();
        let Some(suppressed) = self
            .state()
            .throttle
            .admit(alert.kind(), alert.source(), now)
        else {
            return;
        };
        let dropped = self.shared.dropped.swap(0, Ordering::AcqRel);
        let alert = alert.held_back(suppressed, dropped);
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return self.drop_alert(&alert);
        };
        let Ok(permit) = self.shared.in_flight.clone().try_acquire_owned() else {
            return self.drop_alert(&alert);
        };
        let alerter = self.shared.alerter.clone();
        runtime.spawn(async move {
            // Abandoned past the deadline: the permit comes back either way.
            let _ = tokio::time::timeout(SEND_DEADLINE, alerter.alert(alert)).await;
            drop(permit);
        });
    }

    /// Counts `alert` (and the drops it carried) for the next one sent.
    fn drop_alert(&self, alert: &Alert) {
        self.shared
            .dropped
            .fetch_add(1 + alert.dropped(), Ordering::AcqRel);
    }

    /// What the lag watcher holds: the settings, and the state weakly.
    #[cfg(any(
        feature = "sqlite",
        feature = "postgres",
        feature = "nats",
        feature = "amqp"
    ))]
    pub(super) fn parts(&self) -> (&Arc<Config>, &Arc<Shared>) {
        (&self.config, &self.shared)
    }

    #[cfg(any(
        feature = "sqlite",
        feature = "postgres",
        feature = "nats",
        feature = "amqp"
    ))]
    pub(super) fn from_parts(config: Arc<Config>, shared: Arc<Shared>) -> Self {
        Self { config, shared }
    }
}

impl State {
    fn new(config: &Config) -> Self {
        let (n, window) = config.rejections;
        Self {
            throttle: Throttle::new(config.interval),
            streaks: Streaks::default(),
            rejections: Rejections::new(n, window, Instant::now()),
        }
    }
}

/// ` (type)` when the event has a type.
fn type_suffix(event_type: Option<&str>) -> String {
    event_type.map(|t| format!(" ({t})")).unwrap_or_default()
}

impl std::fmt::Debug for Alerts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Alerts")
            .field("interval", &self.config.interval)
            .field("rejections", &self.config.rejections)
            .field("max_lag", &self.config.max_lag)
            .field("dropped", &self.shared.dropped.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}
