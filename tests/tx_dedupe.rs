//! `TxDedupeLayer` against a real PostgreSQL: the handler's writes and the event's row
//! commit together on a 2xx, or vanish together.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::routing::post;
use axum::Router;
use common::{fresh_pg_url, post as http_post, signed_headers};
use http::{HeaderMap, HeaderValue, StatusCode};
use tower::ServiceBuilder;
use tower_webhook::dedupe::{PgTx, TxDedupeLayer};
use tower_webhook::{Event, Scheme, Verifier, VerifyWebhookLayer};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// A server whose handler records one effect per call in the event's transaction, then
/// behaves as `x-behave` says.
async fn server(pool: sqlx::PgPool, calls: Arc<AtomicUsize>, max_wait: Option<Duration>) -> String {
    sqlx::query("CREATE TABLE effects (event_id TEXT NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    let handler = move |event: Event, tx: PgTx, headers: HeaderMap| {
        let calls = calls.clone();
        async move {
            calls.fetch_add(1, Ordering::SeqCst);
            {
                let mut tx = tx.lock().await;
                sqlx::query("INSERT INTO effects (event_id) VALUES ($1)")
                    .bind(event.id().unwrap())
                    .execute(&mut **tx)
                    .await
                    .unwrap();
            }
            match headers.get("x-behave").and_then(|v| v.to_str().ok()) {
                Some("fail") => StatusCode::INTERNAL_SERVER_ERROR,
                // A statement fails, the handler ignores it and answers 2xx anyway.
                Some("swallow") => {
                    let mut tx = tx.lock().await;
                    let _ = sqlx::query("SELECT 1/0").execute(&mut **tx).await;
                    StatusCode::NO_CONTENT
                }
                Some("panic") => panic!("handler panicked"),
                Some("slow") => {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    StatusCode::NO_CONTENT
                }
                // 204 only if the handler runs under the session's own lock_timeout.
                Some("lock-timeout") => {
                    let mut tx = tx.lock().await;
                    let setting: String =
                        sqlx::query_scalar("SELECT current_setting('lock_timeout')")
                            .fetch_one(&mut **tx)
                            .await
                            .unwrap();
                    if setting == "0" {
                        StatusCode::NO_CONTENT
                    } else {
                        StatusCode::INTERNAL_SERVER_ERROR
                    }
                }
                Some("slower") => {
                    tokio::time::sleep(Duration::from_millis(1500)).await;
                    StatusCode::NO_CONTENT
                }
                _ => StatusCode::NO_CONTENT,
            }
        }
    };
    let app = Router::new().route(
        "/webhooks",
        post(handler).layer(
            ServiceBuilder::new()
                .layer(VerifyWebhookLayer::new(
                    Verifier::new(Scheme::standard(), [SECRET]).unwrap(),
                ))
                .layer(match max_wait {
                    Some(wait) => TxDedupeLayer::new(pool)
                        .await
                        .unwrap()
                        .with_max_wait(wait)
                        .unwrap(),
                    None => TxDedupeLayer::new(pool).await.unwrap(),
                }),
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/webhooks", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

async fn deliver(url: &str, id: &str, behave: &str) -> StatusCode {
    let body = format!(r#"{{"type":"order.paid","data":{{"id":"{id}"}}}}"#).into_bytes();
    let mut headers = signed_headers(&Scheme::standard(), SECRET, id, &body);
    headers.insert("x-behave", HeaderValue::from_str(behave).unwrap());
    match http_post(url, headers, body).await {
        Ok((status, _)) => status,
        Err(_) => StatusCode::BAD_GATEWAY, // the connection died with a panicking handler
    }
}

async fn effects(pool: &sqlx::PgPool, id: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM effects WHERE event_id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn setup() -> (sqlx::PgPool, String, Arc<AtomicUsize>) {
    let pool = sqlx::PgPool::connect(&fresh_pg_url().await).await.unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let url = server(pool.clone(), calls.clone(), None).await;
    (pool, url, calls)
}

#[tokio::test]
async fn a_duplicate_waits_at_most_max_wait_then_gets_409() {
    let pool = sqlx::PgPool::connect(&fresh_pg_url().await).await.unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let url = server(
        pool.clone(),
        calls.clone(),
        Some(Duration::from_millis(200)),
    )
    .await;
    let first = tokio::spawn({
        let url = url.clone();
        async move { deliver(&url, "evt_tx_wait", "slower").await }
    });
    // The first attempt's handler runs: its transaction holds the row.
    while calls.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Unbounded, it would wait for the first attempt's commit and get 204.
    assert_eq!(
        deliver(&url, "evt_tx_wait", "ok").await,
        StatusCode::CONFLICT
    );
    assert_eq!(first.await.unwrap(), StatusCode::NO_CONTENT);
    assert_eq!(
        deliver(&url, "evt_tx_wait", "ok").await,
        StatusCode::NO_CONTENT
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(effects(&pool, "evt_tx_wait").await, 1);
    assert_eq!(
        deliver(&url, "evt_tx_setting", "lock-timeout").await,
        StatusCode::NO_CONTENT,
        "the bound covers the insert, not the handler's statements"
    );
}

#[tokio::test]
async fn duplicate_after_commit_gets_204_and_the_effect_happened_once() {
    let (pool, url, calls) = setup().await;
    assert_eq!(
        deliver(&url, "evt_tx_1", "ok").await,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        deliver(&url, "evt_tx_1", "ok").await,
        StatusCode::NO_CONTENT
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(effects(&pool, "evt_tx_1").await, 1);
    let processed: bool = sqlx::query_scalar(
        "SELECT processed_at IS NOT NULL FROM webhook_events WHERE event_id = 'evt_tx_1'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(processed);
}

/// A key the stores refuse (an id over 1 KiB: random hex, which PostgreSQL's index cannot
/// compress under its row limit) is a 500, not a 503 the provider would retry for days;
/// the handler never runs.
#[tokio::test]
async fn a_key_the_store_refuses_gets_500_and_the_handler_never_runs() {
    let (pool, url, calls) = setup().await;
    let long: String = (0..125)
        .map(|_| uuid::Uuid::new_v4().simple().to_string())
        .collect();
    assert_eq!(
        deliver(&url, &long, "ok").await,
        StatusCode::INTERNAL_SERVER_ERROR
    );
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    assert_eq!(effects(&pool, &long).await, 0);
}

#[tokio::test]
async fn failed_or_panicking_handler_rolls_back_its_writes_and_the_retry_runs() {
    let (pool, url, calls) = setup().await;
    assert_eq!(
        deliver(&url, "evt_tx_2", "fail").await,
        StatusCode::INTERNAL_SERVER_ERROR
    );
    assert_eq!(
        effects(&pool, "evt_tx_2").await,
        0,
        "rolled back with the event's row"
    );
    let _ = deliver(&url, "evt_tx_2", "panic").await;
    assert_eq!(effects(&pool, "evt_tx_2").await, 0);
    assert_eq!(
        deliver(&url, "evt_tx_2", "ok").await,
        StatusCode::NO_CONTENT
    );
    assert_eq!(effects(&pool, "evt_tx_2").await, 1);
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    assert_eq!(
        deliver(&url, "evt_tx_2", "ok").await,
        StatusCode::NO_CONTENT
    );
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn concurrent_duplicates_wait_on_the_index_and_the_effect_happens_once() {
    let (pool, url, calls) = setup().await;
    let tasks: Vec<_> = (0..20)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move { deliver(&url, "evt_tx_storm", "slow").await })
        })
        .collect();
    for task in tasks {
        assert_eq!(task.await.unwrap(), StatusCode::NO_CONTENT);
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(effects(&pool, "evt_tx_storm").await, 1);
}

#[tokio::test]
async fn unreachable_database_gets_503_and_the_handler_never_runs() {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .acquire_timeout(Duration::from_secs(1))
        .connect_lazy("postgres://postgres@127.0.0.1:1/postgres")
        .unwrap();
    assert!(
        TxDedupeLayer::new(pool.clone()).await.is_err(),
        "migrating needs the server"
    );

    let calls = Arc::new(AtomicUsize::new(0));
    let counter = calls.clone();
    let app = Router::new().route(
        "/webhooks",
        post(move |_: PgTx| {
            counter.fetch_add(1, Ordering::SeqCst);
            async { StatusCode::NO_CONTENT }
        })
        .layer(
            ServiceBuilder::new()
                .layer(VerifyWebhookLayer::new(
                    Verifier::new(Scheme::standard(), [SECRET]).unwrap(),
                ))
                .layer(TxDedupeLayer::from_migrated_pool(pool)),
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/webhooks", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    assert_eq!(
        deliver(&url, "evt_tx_down", "ok").await,
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_2xx_over_a_failed_statement_is_not_acknowledged_and_nothing_commits() {
    let (pool, url, calls) = setup().await;
    assert_eq!(
        deliver(&url, "evt_tx_3", "swallow").await,
        StatusCode::INTERNAL_SERVER_ERROR
    );
    assert_eq!(effects(&pool, "evt_tx_3").await, 0);
    assert_eq!(
        deliver(&url, "evt_tx_3", "ok").await,
        StatusCode::NO_CONTENT
    );
    assert_eq!(effects(&pool, "evt_tx_3").await, 1);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn shares_the_table_with_pg_store_claims() {
    use tower_webhook::store::{Claim, DedupeStore, Delivery, PgStore, Token};
    let (pool, url, calls) = setup().await;
    let store = PgStore::from_migrated_pool(pool.clone());
    let d = Delivery::new("standard", "evt_tx_mixed");
    let token = Token::new();
    assert_eq!(
        store
            .claim(d.clone(), token, Duration::from_secs(30))
            .await
            .unwrap(),
        Claim::New(token)
    );
    // A lease-based attempt is running: the transactional form does not run it too.
    assert_eq!(
        deliver(&url, "evt_tx_mixed", "ok").await,
        StatusCode::CONFLICT
    );
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    // It failed and released its claim: the transactional form takes the row over.
    store.release(d, token).await.unwrap();
    assert_eq!(
        deliver(&url, "evt_tx_mixed", "ok").await,
        StatusCode::NO_CONTENT
    );
    assert_eq!(effects(&pool, "evt_tx_mixed").await, 1);
    assert_eq!(
        deliver(&url, "evt_tx_mixed", "ok").await,
        StatusCode::NO_CONTENT
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_client_that_hangs_up_mid_handler_neither_rolls_back_nor_reruns_it() {
    let (pool, url, calls) = setup().await;
    // The client gives up 100 ms into a 300 ms handler: the work goes on and commits.
    let hung_up = tokio::time::timeout(
        Duration::from_millis(100),
        deliver(&url, "evt_hangup", "slow"),
    )
    .await;
    assert!(hung_up.is_err(), "the client gave up mid-handler");
    let mut status = StatusCode::CONFLICT;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        status = deliver(&url, "evt_hangup", "ok").await;
        if status == StatusCode::NO_CONTENT && calls.load(Ordering::SeqCst) == 1 {
            break;
        }
    }
    assert_eq!(status, StatusCode::NO_CONTENT, "the retry is a duplicate");
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the handler ran once");
    assert_eq!(
        effects(&pool, "evt_hangup").await,
        1,
        "its writes committed"
    );
}
