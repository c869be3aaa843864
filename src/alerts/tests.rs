//! [`Alerts`] as the worker and the verify layer use it: what goes out, what is held back,
//! and that a stuck alerter costs the caller nothing.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use super::limit::{MAX_IN_FLIGHT, SEND_DEADLINE};
use super::*;
use crate::ConfigErrorKind;

const MINUTE: Duration = Duration::from_secs(60);

/// Alerts whose alerter records what it is handed.
fn recording() -> (Alerts, mpsc::UnboundedReceiver<Alert>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let alerts = Alerts::new(move |alert: Alert| {
        let _ = tx.send(alert);
        std::future::ready(())
    });
    (alerts, rx)
}

/// What was sent so far, once the send tasks ran.
async fn sent(rx: &mut mpsc::UnboundedReceiver<Alert>) -> Vec<Alert> {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    let mut alerts = Vec::new();
    while let Ok(alert) = rx.try_recv() {
        alerts.push(alert);
    }
    alerts
}

fn kinds(alerts: &[Alert]) -> Vec<(AlertKind, Option<&str>)> {
    alerts.iter().map(|a| (a.kind(), a.source())).collect()
}

#[tokio::test(start_paused = true)]
async fn the_first_failure_and_the_first_success_after_it_are_alerted_once() {
    let (alerts, mut rx) = recording();
    alerts.succeeded("stripe");
    assert!(sent(&mut rx).await.is_empty(), "a success alone is no news");

    alerts.failed(
        "stripe",
        "evt_1",
        Some("invoice.paid"),
        1,
        "crm down\nretry later",
    );
    alerts.failed("stripe", "evt_1", Some("invoice.paid"), 2, "crm down");
    alerts.failed("stripe", "evt_2", None, 1, "crm down");
    let failing = sent(&mut rx).await;
    assert_eq!(kinds(&failing), [(AlertKind::Failing, Some("stripe"))]);
    let failing = &failing[0];
    assert_eq!(failing.event_id(), Some("evt_1"));
    assert_eq!(failing.event_type(), Some("invoice.paid"));
    assert_eq!(failing.count(), 1, "the attempt");
    assert_eq!(failing.details(), Some("crm down retry later"));
    assert_eq!(
        failing.summary(),
        "stripe: processing started failing: event evt_1 (invoice.paid) failed attempt 1"
    );

    alerts.succeeded("stripe");
    alerts.succeeded("stripe");
    let recovered = sent(&mut rx).await;
    assert_eq!(kinds(&recovered), [(AlertKind::Recovered, Some("stripe"))]);
    assert_eq!(recovered[0].count(), 3, "failed attempts in the streak");

    // Another streak within the interval: held back, then counted.
    alerts.failed("stripe", "evt_3", None, 1, "crm down");
    alerts.succeeded("stripe");
    assert!(sent(&mut rx).await.is_empty(), "within the interval");
    tokio::time::advance(5 * MINUTE).await;
    alerts.failed("stripe", "evt_4", None, 1, "crm down");
    let again = sent(&mut rx).await;
    assert_eq!(kinds(&again), [(AlertKind::Failing, Some("stripe"))]);
    assert_eq!(again[0].suppressed(), 1);
    assert!(again[0]
        .summary()
        .ends_with("(+1 more since the last alert)"));
}

#[tokio::test(start_paused = true)]
async fn dead_events_are_alerted_once_per_interval_per_source_and_count_toward_recovery() {
    let (alerts, mut rx) = recording();
    let alerts = alerts.with_interval(MINUTE).unwrap();
    for i in 0..5 {
        alerts.dead("stripe", &format!("evt_{i}"), None, "gave up");
    }
    alerts.dead("github", "d1", Some("push"), "gave up");
    let first = sent(&mut rx).await;
    assert_eq!(
        kinds(&first),
        [
            (AlertKind::Dead, Some("stripe")),
            (AlertKind::Dead, Some("github"))
        ]
    );
    assert_eq!(first[0].event_id(), Some("evt_0"));
    assert_eq!(first[1].summary(), "github: event d1 (push) is dead");

    tokio::time::advance(MINUTE).await;
    alerts.dead("stripe", "evt_9", None, "gave up");
    let next = sent(&mut rx).await;
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].suppressed(), 4);

    // Dead began a streak without a `Failing` of its own: the next success recovers it.
    alerts.succeeded("stripe");
    let recovered = sent(&mut rx).await;
    assert_eq!(kinds(&recovered), [(AlertKind::Recovered, Some("stripe"))]);
    assert_eq!(recovered[0].count(), 6);
}

#[tokio::test(start_paused = true)]
async fn lag_is_alerted_past_the_bound_only_once_per_interval() {
    let (alerts, mut rx) = recording();
    let alerts = alerts.with_max_lag(Duration::from_secs(30)).unwrap();
    alerts.lagging(Duration::from_secs(30));
    assert!(
        sent(&mut rx).await.is_empty(),
        "at the bound is not past it"
    );
    alerts.lagging(Duration::from_secs(31));
    alerts.lagging(Duration::from_secs(32));
    let lagging = sent(&mut rx).await;
    assert_eq!(kinds(&lagging), [(AlertKind::Lagging, None)]);
    assert_eq!(lagging[0].lag(), Some(Duration::from_secs(31)));
    tokio::time::advance(5 * MINUTE).await;
    alerts.lagging(Duration::from_secs(400));
    assert_eq!(sent(&mut rx).await[0].suppressed(), 1);
}

#[tokio::test(start_paused = true)]
async fn rejections_above_the_threshold_within_the_window_raise_one_alert() {
    let (alerts, mut rx) = recording();
    let alerts = alerts.with_rejections(3, MINUTE).unwrap();
    alerts.rejected("stripe", "InvalidSignature");
    alerts.rejected("stripe", "InvalidSignature");
    assert!(sent(&mut rx).await.is_empty());
    for _ in 0..50 {
        alerts.rejected("stripe", "TimestampTooOld");
    }
    let alert = sent(&mut rx).await;
    assert_eq!(kinds(&alert), [(AlertKind::Rejections, Some("stripe"))]);
    assert_eq!(alert[0].count(), 3);
    assert_eq!(
        alert[0].details(),
        Some("InvalidSignature: 2, TimestampTooOld: 1")
    );
    assert_eq!(
        alert[0].summary(),
        "stripe: 3 deliveries rejected within 60s"
    );
}

#[tokio::test(start_paused = true)]
async fn a_stuck_alerter_never_blocks_the_caller_and_the_drops_are_counted() {
    // Each alert handed over is recorded by how many drops it reports; none is answered.
    let handed = Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = handed.clone();
    let alerts = Alerts::new(move |alert: Alert| {
        record.lock().unwrap().push(alert.dropped());
        std::future::pending::<()>()
    });
    let started = std::time::Instant::now();
    for i in 0..MAX_IN_FLIGHT + 4 {
        alerts.dead(&format!("source-{i}"), "evt", None, "gave up");
    }
    assert!(started.elapsed() < Duration::from_secs(1));
    sent(&mut mpsc::unbounded_channel().1).await; // let the send tasks run
    assert_eq!(
        handed.lock().unwrap().len(),
        MAX_IN_FLIGHT,
        "the rest dropped"
    );

    // Past the deadline the stuck sends are abandoned; the next alert says what was lost.
    tokio::time::advance(SEND_DEADLINE).await;
    sent(&mut mpsc::unbounded_channel().1).await;
    alerts.dead("source-last", "evt", None, "gave up");
    sent(&mut mpsc::unbounded_channel().1).await;
    let handed = handed.lock().unwrap();
    assert_eq!(handed.len(), MAX_IN_FLIGHT + 1);
    assert_eq!(handed.last(), Some(&4));
}

#[test]
fn alerts_outside_a_runtime_are_dropped_not_a_panic() {
    let (alerts, _rx) = recording();
    alerts.dead("stripe", "evt_1", None, "gave up");
    assert!(format!("{alerts:?}").contains("dropped: 1"), "{alerts:?}");
}

#[test]
fn settings_that_would_storm_or_never_fire_are_refused() {
    let (alerts, _rx) = recording();
    let interval = alerts.clone().with_interval(Duration::ZERO).unwrap_err();
    assert_eq!(interval.kind(), ConfigErrorKind::InvalidDuration);
    let n = alerts.clone().with_rejections(0, MINUTE).unwrap_err();
    assert_eq!(n.kind(), ConfigErrorKind::InvalidValue);
    assert!(alerts.clone().with_rejections(5, Duration::ZERO).is_err());
    assert!(alerts.with_max_lag(Duration::ZERO).is_err());
}

#[tokio::test(start_paused = true)]
async fn invalid_events_raise_one_alert_per_source_and_interval() {
    let (alerts, mut rx) = recording();
    alerts.invalid(
        "stripe",
        "evt_1",
        Some("invoice.paid"),
        "/data/object/amount_paid: \"12\" is not of type \"integer\"",
    );
    alerts.invalid("stripe", "evt_2", Some("invoice.paid"), "(body): bad");
    alerts.invalid("shop", "ord_1", None, "/total: missing");
    let mut first = sent(&mut rx).await;
    first.sort_by(|a, b| b.source().cmp(&a.source())); // stripe, then shop
    assert_eq!(
        kinds(&first),
        [
            (AlertKind::Invalid, Some("stripe")),
            (AlertKind::Invalid, Some("shop"))
        ]
    );
    assert_eq!(first[0].event_id(), Some("evt_1"));
    assert_eq!(
        first[0].summary(),
        "stripe: event evt_1 (invoice.paid) failed its schema and is kept invalid"
    );
    assert_eq!(
        first[0].details(),
        Some("/data/object/amount_paid: \"12\" is not of type \"integer\"")
    );
    assert_eq!(first[0].kind().as_str(), "invalid");
    tokio::time::advance(5 * MINUTE).await;
    alerts.invalid("stripe", "evt_3", Some("invoice.paid"), "(body): bad");
    let next = sent(&mut rx).await;
    assert_eq!(kinds(&next), [(AlertKind::Invalid, Some("stripe"))]);
    assert_eq!(next[0].suppressed(), 1, "evt_2 was held back");
}
