//! The helpers for the application's own rules: `Once` (an action once per key, on every
//! store), `EventFilterLayer` (unknown types and test-mode events acknowledged, never
//! handled) and `latest` (a late event never moves an object's state back).

mod common;

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use common::{at, fresh_pg_url, redis_url, request, verifier, NOW};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use tower::{service_fn, ServiceBuilder, ServiceExt};
use tower_webhook::filter::{EventFilterLayer, Livemode};
use tower_webhook::latest::{self, Order};
use tower_webhook::once::{Once, OnceErrorKind, Ran};
use tower_webhook::response::{Rejection, RejectionKind};
use tower_webhook::store::{DedupeStore, MemoryStore, PgStore, RedisStore, Retention, SqliteStore};
use tower_webhook::{Scheme, VerifyWebhookLayer};

async fn once_runs_an_action_once_per_key(store: Arc<dyn DedupeStore>) {
    let fulfil = Once::from_arc(store, "fulfil-order");
    let runs = Arc::new(AtomicUsize::new(0));
    let action = || {
        let runs = runs.clone();
        move |_| async move {
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
        .run("order-8", |_| async {
            Err::<(), _>(std::io::Error::other("warehouse down"))
        })
        .await;
    let failed = failed.unwrap_err();
    assert_eq!(failed.kind(), OnceErrorKind::Action);
    assert!(failed.store_error().is_none());
    assert_eq!(failed.to_string(), "action failed: warehouse down");
    assert_eq!(failed.into_action().unwrap().to_string(), "warehouse down");
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
                    .run("order-9", |_| async move {
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
                .run("order-10", |_| async {
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
            .run("order-10", |_| async { Ok::<_, std::io::Error>(()) })
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

/// `Once` keys are business keys: the event keys' prune leaves them, `Once::prune` deletes
/// them by name (and only its own namespace's).
async fn once_keys_outlive_event_pruning_and_are_pruned_by_name(store: Arc<dyn DedupeStore>) {
    let fulfil = Once::from_arc(store.clone(), "fulfil-order");
    let refund = Once::from_arc(store.clone(), "refund");
    let ok = |_| async { Ok::<_, std::io::Error>(()) };
    assert_eq!(fulfil.run("order-1", ok).await.unwrap(), Ran::Now(()));
    assert_eq!(refund.run("order-1", ok).await.unwrap(), Ran::Now(()));
    tokio::time::sleep(Duration::from_millis(100)).await;
    store
        .prune(Retention::shorter(Duration::from_millis(10)))
        .await
        .unwrap();
    assert_eq!(
        fulfil.run("order-1", ok).await.unwrap(),
        Ran::Already,
        "an event-key prune never frees a business key"
    );
    assert_eq!(fulfil.prune(Duration::from_secs(3600)).await.unwrap(), 0);
    assert_eq!(fulfil.prune(Duration::from_millis(10)).await.unwrap(), 1);
    assert_eq!(fulfil.run("order-1", ok).await.unwrap(), Ran::Now(()));
    assert_eq!(
        refund.run("order-1", ok).await.unwrap(),
        Ran::Already,
        "another namespace's keys stay"
    );
}

#[tokio::test]
async fn memory_store_keeps_once_keys_past_its_event_retention() {
    let store = MemoryStore::new().with_retention(Retention::shorter(Duration::from_millis(10)));
    let once = Once::new(store.clone(), "fulfil-order");
    let ok = |_| async { Ok::<_, std::io::Error>(()) };
    assert_eq!(once.run("order-1", ok).await.unwrap(), Ran::Now(()));
    let d = tower_webhook::store::Delivery::new("standard", "evt_1");
    let token = tower_webhook::store::Token::new();
    store
        .claim(d.clone(), token, Duration::from_secs(5))
        .await
        .unwrap();
    store.complete(d.clone(), token).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        matches!(
            store
                .claim(
                    d,
                    tower_webhook::store::Token::new(),
                    Duration::from_secs(5)
                )
                .await,
            Ok(tower_webhook::store::Claim::New(_))
        ),
        "the event key expired with the retention"
    );
    assert_eq!(once.run("order-1", ok).await.unwrap(), Ran::Already);
}

macro_rules! once_suite {
    ($name:ident, $make:expr) => {
        mod $name {
            use super::*;

            #[tokio::test]
            async fn keys_outlive_event_pruning_and_are_pruned_by_name() {
                once_keys_outlive_event_pruning_and_are_pruned_by_name($make).await;
            }
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
) -> (StatusCode, Option<RejectionKind>, bool) {
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
    let skipped = response
        .extensions()
        .get::<Rejection>()
        .map(Rejection::kind);
    (response.status(), skipped, ran.load(Ordering::SeqCst) == 1)
}

#[tokio::test]
async fn filter_acknowledges_unwanted_types_and_test_mode_events_without_the_handler() {
    let shop = || {
        EventFilterLayer::new()
            .add_type("payment_intent.*")
            .add_type("charge.refunded")
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
            (
                StatusCode::NO_CONTENT,
                Some(RejectionKind::SkippedType),
                false,
            ),
        ),
        (
            shop(),
            "customer.created",
            Some(true),
            (
                StatusCode::NO_CONTENT,
                Some(RejectionKind::SkippedType),
                false,
            ),
        ),
        (
            shop(),
            "payment_intent.succeeded",
            Some(false),
            (
                StatusCode::NO_CONTENT,
                Some(RejectionKind::SkippedLivemode),
                false,
            ),
        ),
        (
            shop(),
            "payment_intent.succeeded",
            None,
            (
                StatusCode::NO_CONTENT,
                Some(RejectionKind::SkippedLivemode),
                false,
            ),
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
            (
                StatusCode::NO_CONTENT,
                Some(RejectionKind::SkippedLivemode),
                false,
            ),
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

/// Event times for the ordering guard: `day` days into a month.
/// Shopify signs the body, not `X-Shopify-Topic`: a captured `orders/create` body re-sent
/// as `orders/paid` must not pass `add_type("orders/paid")` on the header's word.
#[tokio::test]
async fn filter_refuses_to_trust_an_unsigned_type_header_unless_told_to() {
    let secret = "shopify-filter-secret-0123";
    let send = |filter: EventFilterLayer| async move {
        let ran = Arc::new(AtomicUsize::new(0));
        let counter = ran.clone();
        let svc = ServiceBuilder::new()
            .layer(VerifyWebhookLayer::new(verifier(
                Scheme::shopify(),
                &[secret],
            )))
            .layer(filter)
            .service(service_fn(move |_: Request<Full<Bytes>>| {
                counter.fetch_add(1, Ordering::SeqCst);
                async { Ok::<_, Infallible>(Response::new(Full::new(Bytes::new()))) }
            }));
        let body = br#"{"id":820982911946154508,"financial_status":"pending"}"#;
        let mut headers = Scheme::shopify()
            .sign([secret], "webhook-1", at(NOW), body)
            .unwrap();
        headers.insert(
            "x-shopify-topic",
            http::HeaderValue::from_static("orders/paid"),
        );
        let response = svc.oneshot(request(headers, &body[..])).await.unwrap();
        let text = response.into_body().collect().await.unwrap().to_bytes();
        (
            String::from_utf8(text.to_vec()).unwrap(),
            ran.load(Ordering::SeqCst),
        )
    };
    let (text, ran) = send(EventFilterLayer::new().add_type("orders/paid")).await;
    assert!(text.contains("trust_unsigned_type"), "{text}");
    assert_eq!(ran, 0, "the header's word alone let nothing through");
    let trusting = EventFilterLayer::new()
        .add_type("orders/paid")
        .trust_unsigned_type();
    assert_eq!(send(trusting).await.1, 1, "told to: filtered on it");
    // Without type rules the type is not read, so there is nothing to refuse.
    assert_eq!(send(EventFilterLayer::new()).await.1, 1);
}

fn day(day: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_700_000_000 + day * 86_400)
}

/// `latest::advance` in a transaction of its own, committed.
async fn advance_committed<DB: sqlx::Database>(
    pool: &sqlx::Pool<DB>,
    object: &str,
    at: SystemTime,
) -> Order
where
    DB::Connection: latest::Connection,
{
    advance_in(pool, "stripe", object, at).await
}

/// `latest::advance` of `namespace`'s `object` in a transaction of its own, committed.
async fn advance_in<DB: sqlx::Database>(
    pool: &sqlx::Pool<DB>,
    namespace: &str,
    object: &str,
    at: SystemTime,
) -> Order
where
    DB::Connection: latest::Connection,
{
    let mut tx = pool.begin().await.unwrap();
    let order = latest::advance(&mut *tx, namespace, object, at)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    order
}

async fn latest_drops_events_older_than_the_last_applied<DB: sqlx::Database>(pool: sqlx::Pool<DB>)
where
    DB::Connection: latest::Connection,
{
    assert_eq!(
        advance_committed(&pool, "cus_1", day(3)).await,
        Order::Newest
    );
    assert_eq!(
        advance_committed(&pool, "cus_1", day(1)).await,
        Order::Stale,
        "Monday's event after Wednesday's is dropped"
    );
    assert_eq!(
        advance_committed(&pool, "cus_1", day(3)).await,
        Order::Newest,
        "an equal time is not older: both apply"
    );
    assert_eq!(
        advance_committed(&pool, "cus_2", day(1)).await,
        Order::Newest,
        "objects are independent"
    );

    // A rollback undoes the advance with the rest of the transaction.
    let mut tx = pool.begin().await.unwrap();
    assert_eq!(
        latest::advance(&mut *tx, "stripe", "cus_1", day(9))
            .await
            .unwrap(),
        Order::Newest
    );
    tx.rollback().await.unwrap();
    assert_eq!(
        advance_committed(&pool, "cus_1", day(5)).await,
        Order::Newest
    );

    // A concurrent older event waits for the newer one's transaction, then is dropped.
    let mut newer = pool.begin().await.unwrap();
    assert_eq!(
        latest::advance(&mut *newer, "stripe", "cus_3", day(7))
            .await
            .unwrap(),
        Order::Newest
    );
    let p = pool.clone();
    let older = tokio::spawn(async move { advance_committed(&p, "cus_3", day(6)).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !older.is_finished(),
        "the object is locked until the newer event commits"
    );
    newer.commit().await.unwrap();
    assert_eq!(older.await.unwrap(), Order::Stale);
}

/// Two tenants (or providers) whose object ids collide keep a clock each: neither's first
/// event is dropped as older than the other's.
async fn latest_keeps_a_clock_per_namespace<DB: sqlx::Database>(pool: sqlx::Pool<DB>)
where
    DB::Connection: latest::Connection,
{
    assert_eq!(
        advance_in(&pool, "tenant-a", "cus_1", day(3)).await,
        Order::Newest
    );
    assert_eq!(
        advance_in(&pool, "tenant-b", "cus_1", day(1)).await,
        Order::Newest,
        "another tenant's first event of the same object id is its own"
    );
    assert_eq!(
        advance_in(&pool, "tenant-b", "cus_1", day(2)).await,
        Order::Newest
    );
    assert_eq!(
        advance_in(&pool, "tenant-a", "cus_1", day(2)).await,
        Order::Stale,
        "each clock still orders its own events"
    );
    assert_eq!(
        advance_in(&pool, "tenant-b", "cus_1", day(1)).await,
        Order::Stale
    );
}

#[tokio::test]
async fn sqlite_latest_keeps_a_clock_per_namespace() {
    let path = std::env::temp_dir().join(format!("latest-{}.db", uuid::Uuid::new_v4()));
    let store = SqliteStore::open(&path).await.unwrap();
    latest_keeps_a_clock_per_namespace(store.pool().clone()).await;
    let _ = std::fs::remove_file(path);
}

#[tokio::test]
async fn postgres_latest_keeps_a_clock_per_namespace() {
    let store = PgStore::connect(&fresh_pg_url().await).await.unwrap();
    latest_keeps_a_clock_per_namespace(store.pool().clone()).await;
}

#[tokio::test]
async fn sqlite_latest_drops_events_older_than_the_last_applied() {
    let path = std::env::temp_dir().join(format!("latest-{}.db", uuid::Uuid::new_v4()));
    let store = SqliteStore::open(&path).await.unwrap();
    latest_drops_events_older_than_the_last_applied(store.pool().clone()).await;
    let _ = std::fs::remove_file(path);
}

#[tokio::test]
async fn postgres_latest_drops_events_older_than_the_last_applied() {
    let store = PgStore::connect(&fresh_pg_url().await).await.unwrap();
    latest_drops_events_older_than_the_last_applied(store.pool().clone()).await;
}

#[test]
fn once_runs_without_a_tokio_runtime() {
    use std::future::Future;
    // A minimal executor: the memory store answers at once.
    let once = Once::new(MemoryStore::new(), "no-runtime");
    let mut run = Box::pin(once.run("k", |_| async { Ok::<_, std::io::Error>(7) }));
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    let std::task::Poll::Ready(ran) = run.as_mut().poll(&mut cx) else {
        panic!("the memory store answers at once");
    };
    assert_eq!(ran.unwrap(), Ran::Now(7));
    let mut again = Box::pin(once.run("k", |_| async { Ok::<_, std::io::Error>(8) }));
    assert!(matches!(
        again.as_mut().poll(&mut cx),
        std::task::Poll::Ready(Ok(Ran::Already))
    ));
}
