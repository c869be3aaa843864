//! The helpers for the application's own rules: `Once` (an action once per key, on every
//! store) and `EventFilterLayer` (unknown types and test-mode events acknowledged, never
//! handled).

mod common;

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::{at, fresh_pg_url, redis_url, request, verifier, NOW};
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tower::{service_fn, ServiceBuilder, ServiceExt};
use tower_webhook::filter::{EventFilterLayer, Livemode, Skipped};
use tower_webhook::once::{Once, OnceError, Ran};
use tower_webhook::store::{DedupeStore, MemoryStore, PgStore, RedisStore, SqliteStore};
use tower_webhook::{Scheme, VerifyWebhookLayer};

async fn once_runs_an_action_once_per_key(store: Arc<dyn DedupeStore>) {
    let fulfil = Once::from_arc(store, "fulfil-order");
    let runs = Arc::new(AtomicUsize::new(0));
    let action = || {
        let runs = runs.clone();
        move || async move {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, std::io::Error>("shipped")
        }
    };
    assert_eq!(
        fulfil.run("order-7", action()).await.unwrap(),
        Ran::Now("shipped")
    );
    // A different event about the same order: the goods are not handed over again.
    assert_eq!(fulfil.run("order-7", action()).await.unwrap(), Ran::Already);
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // A failing action releases its key: the next attempt runs it.
    let failed = fulfil
        .run("order-8", || async {
            Err::<(), _>(std::io::Error::other("warehouse down"))
        })
        .await;
    assert!(matches!(failed, Err(OnceError::Action(_))));
    assert_eq!(
        fulfil.run("order-8", action()).await.unwrap(),
        Ran::Now("shipped")
    );

    // Twenty concurrent attempts for one order: one runs.
    let tasks: Vec<_> = (0..20)
        .map(|_| {
            let (fulfil, runs) = (fulfil.clone(), runs.clone());
            tokio::spawn(async move {
                fulfil
                    .run("order-9", || async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        Ok::<_, std::io::Error>(())
                    })
                    .await
                    .unwrap()
            })
        })
        .collect();
    let mut now = 0;
    for task in tasks {
        match task.await.unwrap() {
            Ran::Now(()) => now += 1,
            Ran::Already | Ran::InProgress { .. } => {}
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(now, 1);
    assert_eq!(
        runs.load(Ordering::SeqCst),
        3,
        "order-7, order-8's retry, order-9"
    );
}

async fn once_releases_the_key_of_a_panicking_action(store: Arc<dyn DedupeStore>) {
    let fulfil = Once::from_arc(store, "fulfil-order");
    let panicked = tokio::spawn({
        let fulfil = fulfil.clone();
        async move {
            fulfil
                .run("order-10", || async {
                    panic!("crashed mid-action") as Result<(), std::io::Error>
                })
                .await
        }
    })
    .await;
    assert!(panicked.unwrap_err().is_panic());
    // The release happens in the background; the key frees well before the 60 s lease.
    for _ in 0..50 {
        let outcome = fulfil
            .run("order-10", || async { Ok::<_, std::io::Error>(()) })
            .await
            .unwrap();
        if !matches!(outcome, Ran::InProgress { .. }) {
            assert_eq!(outcome, Ran::Now(()));
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the panicked action's key was never released");
}

macro_rules! once_suite {
    ($name:ident, $make:expr) => {
        mod $name {
            use super::*;

            #[tokio::test]
            async fn runs_an_action_once_per_key() {
                once_runs_an_action_once_per_key($make).await;
            }

            #[tokio::test]
            async fn releases_the_key_of_a_panicking_action() {
                once_releases_the_key_of_a_panicking_action($make).await;
            }
        }
    };
}

once_suite!(once_memory, Arc::new(MemoryStore::new()));
once_suite!(
    once_sqlite,
    Arc::new(
        SqliteStore::open(std::env::temp_dir().join(format!(
            "tower-webhook-once-{}.db",
            uuid::Uuid::new_v4().simple()
        )))
        .await
        .unwrap()
    )
);
once_suite!(
    once_postgres,
    Arc::new(PgStore::connect(&fresh_pg_url().await).await.unwrap())
);
once_suite!(
    once_redis,
    Arc::new(
        RedisStore::connect(&redis_url())
            .await
            .unwrap()
            .with_prefix(&format!(
                "tower-webhook-test:{}:",
                uuid::Uuid::new_v4().simple()
            ))
    )
);

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// Sends an event of `event_type` with `livemode` through verify + `filter` + a counting
/// handler; returns the status, the skip reason and whether the handler ran.
async fn filtered(
    filter: EventFilterLayer,
    event_type: &str,
    livemode: Option<bool>,
) -> (StatusCode, Option<Skipped>, bool) {
    let ran = Arc::new(AtomicUsize::new(0));
    let counter = ran.clone();
    let svc = ServiceBuilder::new()
        .layer(VerifyWebhookLayer::new(verifier(
            Scheme::standard(),
            &[SECRET],
        )))
        .layer(filter)
        .service(service_fn(move |_: Request<Full<Bytes>>| {
            counter.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, Infallible>(Response::new(Full::new(Bytes::new()))) }
        }));
    let livemode = livemode.map_or(String::new(), |l| format!(r#","livemode":{l}"#));
    let body = format!(r#"{{"type":"{event_type}"{livemode}}}"#);
    let headers = Scheme::standard()
        .sign([SECRET], "msg_f", at(NOW), body.as_bytes())
        .unwrap();
    let response = svc.oneshot(request(headers, body)).await.unwrap();
    let skipped = response.extensions().get::<Skipped>().copied();
    (response.status(), skipped, ran.load(Ordering::SeqCst) == 1)
}

#[tokio::test]
async fn filter_acknowledges_unwanted_types_and_test_mode_events_without_the_handler() {
    let shop = || {
        EventFilterLayer::new()
            .allow_type("payment_intent.*")
            .allow_type("charge.refunded")
            .with_livemode(Livemode::LiveOnly)
    };
    let ok = (StatusCode::OK, None, true);
    let cases = [
        (shop(), "payment_intent.succeeded", Some(true), ok),
        (shop(), "charge.refunded", Some(true), ok),
        (
            shop(),
            "charge.refunded.extra",
            Some(true),
            (StatusCode::NO_CONTENT, Some(Skipped::Type), false),
        ),
        (
            shop(),
            "customer.created",
            Some(true),
            (StatusCode::NO_CONTENT, Some(Skipped::Type), false),
        ),
        (
            shop(),
            "payment_intent.succeeded",
            Some(false),
            (StatusCode::NO_CONTENT, Some(Skipped::Livemode), false),
        ),
        (
            shop(),
            "payment_intent.succeeded",
            None,
            (StatusCode::NO_CONTENT, Some(Skipped::Livemode), false),
        ),
        (
            EventFilterLayer::new().with_livemode(Livemode::TestOnly),
            "x",
            Some(false),
            ok,
        ),
        (
            EventFilterLayer::new().with_livemode(Livemode::TestOnly),
            "x",
            Some(true),
            (StatusCode::NO_CONTENT, Some(Skipped::Livemode), false),
        ),
        (EventFilterLayer::new(), "anything.at.all", None, ok),
    ];
    for (filter, event_type, livemode, expected) in cases {
        assert_eq!(
            filtered(filter, event_type, livemode).await,
            expected,
            "{event_type} {livemode:?}"
        );
    }
}
