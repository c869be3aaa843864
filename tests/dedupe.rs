//! `DedupeLayer` on every store, against real servers: each event's handler runs once
//! under duplicates, concurrency, failures, crashes and two server instances.

mod common;

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::{at, fresh_pg_url, redis_url, request, verifier, NOW};
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use std::error::Error as _;
use tower::util::BoxCloneSyncService;
use tower::{service_fn, ServiceBuilder, ServiceExt};
use tower_webhook::once::{Once, Ran};
use tower_webhook::response::{Rejection, RejectionKind};
use tower_webhook::store::{
    Claim, Completed, DedupeStore, Delivery, MemoryStore, PgStore, RedisStore, Renewed, Retention,
    SqliteStore, StoreErrorKind, StoreFuture, Token,
};
use tower_webhook::{DedupeLayer, Event, Scheme, VerifyWebhookLayer};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

type Svc = BoxCloneSyncService<Request<Full<Bytes>>, Response<Bytes>, std::io::Error>;

/// How many times the handler ran, per event id.
#[derive(Clone, Default)]
struct Calls(Arc<Mutex<HashMap<String, usize>>>);

impl Calls {
    fn of(&self, id: &str) -> usize {
        self.0.lock().unwrap().get(id).copied().unwrap_or(0)
    }
}

/// Verify + dedupe on `store` + a handler that obeys `x-behave` (`ok`, `fail`, `error`,
/// `panic`, `slow` (300 ms), `slower` (1.2 s)).
fn stack(store: Arc<dyn DedupeStore>, lease: Duration, calls: Calls) -> Svc {
    let handler = service_fn(move |req: Request<Full<Bytes>>| {
        let calls = calls.clone();
        async move {
            let id = req
                .extensions()
                .get::<Event>()
                .unwrap()
                .id()
                .unwrap()
                .to_owned();
            *calls.0.lock().unwrap().entry(id).or_default() += 1;
            let behave = req
                .headers()
                .get("x-behave")
                .map(|v| v.to_str().unwrap().to_owned());
            match behave.as_deref() {
                Some("fail") => Ok(Response::builder()
                    .status(500)
                    .body(Full::new(Bytes::new()))
                    .unwrap()),
                Some("error") => Err(std::io::Error::other("handler error")),
                Some("panic") => panic!("handler panicked"),
                Some("slow") => {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    Ok(Response::new(Full::new(Bytes::from_static(b"handled"))))
                }
                Some("slower") => {
                    tokio::time::sleep(Duration::from_millis(1200)).await;
                    Ok(Response::new(Full::new(Bytes::from_static(b"handled"))))
                }
                _ => Ok(Response::new(Full::new(Bytes::from_static(b"handled")))),
            }
        }
    });
    let svc = ServiceBuilder::new()
        .layer(VerifyWebhookLayer::new(verifier(
            Scheme::standard(),
            &[SECRET],
        )))
        .layer(DedupeLayer::from_arc(store).with_lease(lease).unwrap())
        .service(handler);
    // Errors become 500s here, as a server would answer them; bodies are collected.
    type Body =
        tower_webhook::response::ResponseBody<tower_webhook::response::ResponseBody<Full<Bytes>>>;
    BoxCloneSyncService::new(ServiceExt::<Request<Full<Bytes>>>::then(
        svc,
        |result: Result<Response<Body>, std::io::Error>| async move {
            Ok::<_, std::io::Error>(match result {
                Ok(response) => {
                    let (parts, body) = response.into_parts();
                    let bytes = body
                        .collect()
                        .await
                        .map(|c| c.to_bytes())
                        .unwrap_or_default();
                    Response::from_parts(parts, bytes)
                }
                Err(_) => Response::builder().status(500).body(Bytes::new()).unwrap(),
            })
        },
    ))
}

fn delivery(id: &str, behave: &str) -> Request<Full<Bytes>> {
    let body = format!(r#"{{"type":"order.paid","data":{{"id":"{id}"}}}}"#);
    let mut headers: HeaderMap = Scheme::standard()
        .sign([SECRET], id, at(NOW), body.as_bytes())
        .unwrap();
    headers.insert("x-behave", HeaderValue::from_str(behave).unwrap());
    request(headers, body)
}

async fn send(svc: &Svc, id: &str, behave: &str) -> Response<Bytes> {
    svc.clone().oneshot(delivery(id, behave)).await.unwrap()
}

// ---- the suite, run on every store ----

async fn duplicate_after_success_gets_204_without_calling_handler(store: Arc<dyn DedupeStore>) {
    let calls = Calls::default();
    let svc = stack(store, Duration::from_secs(30), calls.clone());
    let first = send(&svc, "evt_dup", "ok").await;
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(first.body(), "handled");
    for _ in 0..3 {
        let again = send(&svc, "evt_dup", "ok").await;
        assert_eq!(again.status(), StatusCode::NO_CONTENT);
        assert_eq!(
            again.extensions().get::<Rejection>().map(Rejection::kind),
            Some(RejectionKind::Duplicate)
        );
    }
    assert_eq!(calls.of("evt_dup"), 1);
    // Another id is another event.
    assert_eq!(send(&svc, "evt_other", "ok").await.status(), StatusCode::OK);
    assert_eq!(calls.of("evt_other"), 1);
}

async fn hundred_concurrent_deliveries_run_the_handler_once(store: Arc<dyn DedupeStore>) {
    let calls = Calls::default();
    let svc = stack(store, Duration::from_secs(30), calls.clone());
    let tasks: Vec<_> = (0..100)
        .map(|_| {
            let svc = svc.clone();
            tokio::spawn(async move { send(&svc, "evt_storm", "slow").await.status() })
        })
        .collect();
    let mut statuses = HashMap::<StatusCode, usize>::new();
    for task in tasks {
        *statuses.entry(task.await.unwrap()).or_default() += 1;
    }
    assert_eq!(calls.of("evt_storm"), 1, "{statuses:?}");
    assert_eq!(statuses.get(&StatusCode::OK), Some(&1), "{statuses:?}");
    let others: usize = statuses
        .iter()
        .filter(|(s, _)| **s == StatusCode::CONFLICT || **s == StatusCode::NO_CONTENT)
        .map(|(_, n)| n)
        .sum();
    assert_eq!(others, 99, "{statuses:?}");
}

async fn in_flight_duplicate_gets_409_with_retry_after(store: Arc<dyn DedupeStore>) {
    let calls = Calls::default();
    let svc = stack(store, Duration::from_secs(30), calls.clone());
    let slow = tokio::spawn({
        let svc = svc.clone();
        async move { send(&svc, "evt_409", "slow").await.status() }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let dup = send(&svc, "evt_409", "ok").await;
    assert_eq!(dup.status(), StatusCode::CONFLICT);
    let retry_after: u64 = dup.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=30).contains(&retry_after), "{retry_after}");
    assert_eq!(slow.await.unwrap(), StatusCode::OK);
    assert_eq!(
        send(&svc, "evt_409", "ok").await.status(),
        StatusCode::NO_CONTENT
    );
    assert_eq!(calls.of("evt_409"), 1);
}

async fn failed_attempts_release_so_the_retry_runs(store: Arc<dyn DedupeStore>) {
    let calls = Calls::default();
    let svc = stack(store, Duration::from_secs(30), calls.clone());
    assert_eq!(
        send(&svc, "evt_retry", "fail").await.status(),
        StatusCode::INTERNAL_SERVER_ERROR
    );
    assert_eq!(
        send(&svc, "evt_retry", "error").await.status(),
        StatusCode::INTERNAL_SERVER_ERROR
    );
    // A panic unwinds through the middleware; the claim is released in the background.
    let panicked = tokio::spawn({
        let svc = svc.clone();
        async move { send(&svc, "evt_retry", "panic").await }
    })
    .await;
    assert!(panicked.unwrap_err().is_panic());
    let mut status = StatusCode::CONFLICT;
    for _ in 0..50 {
        status = send(&svc, "evt_retry", "ok").await.status();
        if status != StatusCode::CONFLICT {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        calls.of("evt_retry"),
        4,
        "fail, error, panic, then the retry that succeeded"
    );
    assert_eq!(
        send(&svc, "evt_retry", "ok").await.status(),
        StatusCode::NO_CONTENT
    );
}

async fn a_client_that_hangs_up_mid_handler_never_reruns_it(store: Arc<dyn DedupeStore>) {
    let calls = Calls::default();
    let svc = stack(store, Duration::from_secs(30), calls.clone());
    // The client hangs up while the handler runs (300 ms): the handler's work goes on.
    let hung_up =
        tokio::time::timeout(Duration::from_millis(100), send(&svc, "evt_drop", "slow")).await;
    assert!(hung_up.is_err(), "the client gave up mid-handler");
    // The provider's retry while the first attempt still runs: 409, not a second run.
    assert_eq!(
        send(&svc, "evt_drop", "ok").await.status(),
        StatusCode::CONFLICT
    );
    // Once the first attempt has finished, its outcome is recorded: the retry is a duplicate.
    let mut status = StatusCode::CONFLICT;
    for _ in 0..50 {
        status = send(&svc, "evt_drop", "ok").await.status();
        if status != StatusCode::CONFLICT {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(calls.of("evt_drop"), 1, "the handler ran once");
}

async fn a_slow_handler_renews_its_lease_so_no_duplicate_runs_beside_it(
    store: Arc<dyn DedupeStore>,
) {
    let calls = Calls::default();
    // The handler runs four times the lease.
    let svc = stack(store, Duration::from_millis(300), calls.clone());
    let first = tokio::spawn({
        let svc = svc.clone();
        async move { send(&svc, "evt_renewed", "slower").await.status() }
    });
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(
        send(&svc, "evt_renewed", "ok").await.status(),
        StatusCode::CONFLICT,
        "past the first lease, the claim is still held"
    );
    assert_eq!(first.await.unwrap(), StatusCode::OK);
    assert_eq!(
        send(&svc, "evt_renewed", "ok").await.status(),
        StatusCode::NO_CONTENT
    );
    assert_eq!(calls.of("evt_renewed"), 1);
}

async fn completion_is_idempotent_and_renewal_is_fenced(store: Arc<dyn DedupeStore>) {
    let d = Delivery::new("standard", "evt_idem");
    let lease = Duration::from_secs(30);
    let Claim::New(token) = store.claim(d.clone(), Token::new(), lease).await.unwrap() else {
        panic!("new")
    };
    assert_eq!(
        store.renew(d.clone(), token, lease).await.unwrap(),
        Renewed::Held
    );
    assert_eq!(
        store.renew(d.clone(), Token::new(), lease).await.unwrap(),
        Renewed::Fenced,
        "another token renews nothing"
    );
    assert_eq!(
        store.complete(d.clone(), token).await.unwrap(),
        Completed::Done
    );
    // The first acknowledgement was lost: the retry is not mistaken for fencing.
    assert_eq!(
        store.complete(d.clone(), token).await.unwrap(),
        Completed::Done
    );
    assert_eq!(
        store.complete(d.clone(), Token::new()).await.unwrap(),
        Completed::Fenced,
        "another token still cannot complete it"
    );
    store.release(d.clone(), token).await.unwrap(); // a late release undoes nothing
    assert_eq!(
        store.renew(d.clone(), token, lease).await.unwrap(),
        Renewed::Fenced,
        "a done key is not renewed"
    );
    assert_eq!(
        store.claim(d, Token::new(), lease).await.unwrap(),
        Claim::Done
    );

    // Taken over after its lease ran out: the old token's renewal is fenced.
    let d = Delivery::new("standard", "evt_taken");
    let short = Duration::from_millis(200);
    let Claim::New(old) = store.claim(d.clone(), Token::new(), short).await.unwrap() else {
        panic!("new")
    };
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(matches!(
        store.claim(d.clone(), Token::new(), lease).await.unwrap(),
        Claim::New(_)
    ));
    assert_eq!(store.renew(d, old, lease).await.unwrap(), Renewed::Fenced);
}

async fn crashed_claim_frees_itself_when_the_lease_runs_out(store: Arc<dyn DedupeStore>) {
    let calls = Calls::default();
    let svc = stack(store.clone(), Duration::from_secs(30), calls.clone());
    // A process claimed it and died: nothing will complete or release it.
    let crashed = store
        .claim(
            Delivery::new("standard", "evt_crash"),
            Token::new(),
            Duration::from_millis(400),
        )
        .await
        .unwrap();
    assert!(matches!(crashed, Claim::New(_)));
    assert_eq!(
        send(&svc, "evt_crash", "ok").await.status(),
        StatusCode::CONFLICT
    );
    assert_eq!(calls.of("evt_crash"), 0);
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(send(&svc, "evt_crash", "ok").await.status(), StatusCode::OK);
    assert_eq!(calls.of("evt_crash"), 1);
}

async fn a_stale_attempt_cannot_complete_a_newer_claim(store: Arc<dyn DedupeStore>) {
    let d = Delivery::new("standard", "evt_fence");
    let Claim::New(old) = store
        .claim(d.clone(), Token::new(), Duration::from_millis(200))
        .await
        .unwrap()
    else {
        panic!("first claim is new")
    };
    tokio::time::sleep(Duration::from_millis(400)).await;
    let Claim::New(new) = store
        .claim(d.clone(), Token::new(), Duration::from_secs(30))
        .await
        .unwrap()
    else {
        panic!("an expired claim can be taken over")
    };
    assert_ne!(old, new);
    assert_eq!(
        store.complete(d.clone(), old).await.unwrap(),
        Completed::Fenced
    );
    store.release(d.clone(), old).await.unwrap(); // a stale release changes nothing either
    assert!(matches!(
        store
            .claim(d.clone(), Token::new(), Duration::from_secs(30))
            .await
            .unwrap(),
        Claim::InFlight { .. }
    ));
    assert_eq!(
        store.complete(d.clone(), new).await.unwrap(),
        Completed::Done
    );
    assert_eq!(
        store
            .claim(d, Token::new(), Duration::from_secs(30))
            .await
            .unwrap(),
        Claim::Done
    );
}

/// A claim whose lease ran out with no other attempt taking it over is still its
/// attempt's: completing it marks the key done (the work succeeded), so the provider's
/// retry is a duplicate rather than a second run.
async fn a_completion_after_the_lease_ran_out_untaken_is_done(store: Arc<dyn DedupeStore>) {
    let d = Delivery::new("standard", "evt_late_done");
    let Claim::New(token) = store
        .claim(d.clone(), Token::new(), Duration::from_millis(200))
        .await
        .unwrap()
    else {
        panic!("first claim is new")
    };
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        store.complete(d.clone(), token).await.unwrap(),
        Completed::Done,
        "nobody took it over: the late completion lands"
    );
    assert_eq!(
        store.complete(d.clone(), token).await.unwrap(),
        Completed::Done,
        "and is idempotent"
    );
    assert_eq!(
        store.complete(d.clone(), Token::new()).await.unwrap(),
        Completed::Fenced,
        "another token still cannot complete it"
    );
    assert_eq!(
        store
            .claim(d, Token::new(), Duration::from_secs(30))
            .await
            .unwrap(),
        Claim::Done,
        "the retry is a duplicate"
    );
}

/// A key no store can keep alike (an id over 1 KiB; a NUL) is invalid input: 500 without
/// `Retry-After` (a retry would be refused again), and the handler never runs.
async fn a_key_the_store_refuses_gets_500_and_the_handler_never_runs(store: Arc<dyn DedupeStore>) {
    let calls = Calls::default();
    let svc = stack(store.clone(), Duration::from_secs(30), calls.clone());
    // Random hex: PostgreSQL's index cannot compress it under its row limit.
    let long: String = (0..125)
        .map(|_| uuid::Uuid::new_v4().simple().to_string())
        .collect();
    let response = send(&svc, &long, "ok").await;
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert!(!response.headers().contains_key("retry-after"));
    assert_eq!(
        response
            .extensions()
            .get::<Rejection>()
            .map(Rejection::kind),
        Some(RejectionKind::StoreRefused)
    );
    assert_eq!(calls.of(&long), 0);
    let lease = Duration::from_secs(30);
    for (source, id) in [
        ("stripe", "evt_\0x"),
        ("stripe\0", "evt_1"),
        ("s", &long[..]),
    ] {
        let refused = store
            .claim(Delivery::new(source, id), Token::new(), lease)
            .await
            .unwrap_err();
        assert_eq!(refused.kind(), StoreErrorKind::InvalidInput, "{source:?}");
    }
    let widest = "e".repeat(1024);
    assert!(matches!(
        store
            .claim(Delivery::new("s".repeat(1024), widest), Token::new(), lease)
            .await
            .unwrap(),
        Claim::New(_)
    ));
}

async fn unavailable_store_gets_503_and_the_handler_never_runs(store: Arc<dyn DedupeStore>) {
    let calls = Calls::default();
    let svc = stack(store, Duration::from_secs(30), calls.clone());
    let response = send(&svc, "evt_down", "ok").await;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(response.headers().contains_key("retry-after"));
    assert_eq!(
        response
            .extensions()
            .get::<Rejection>()
            .map(Rejection::kind),
        Some(RejectionKind::StoreUnavailable)
    );
    assert_eq!(response.body(), "webhook store unavailable");
    assert_eq!(calls.of("evt_down"), 0);
}

async fn two_instances_sharing_the_store_run_each_event_once(
    a: Arc<dyn DedupeStore>,
    b: Arc<dyn DedupeStore>,
) {
    let calls = Calls::default();
    let one = stack(a, Duration::from_secs(30), calls.clone());
    let two = stack(b, Duration::from_secs(30), calls.clone());
    let mut tasks = Vec::new();
    for i in 0..40 {
        for copy in 0..4 {
            let svc = if (i + copy) % 2 == 0 {
                one.clone()
            } else {
                two.clone()
            };
            tasks.push(tokio::spawn(async move {
                send(&svc, &format!("evt_shared_{i}"), "ok").await.status()
            }));
        }
    }
    for task in tasks {
        let status = task.await.unwrap();
        assert!(matches!(status.as_u16(), 200 | 204 | 409), "{status}");
    }
    for i in 0..40 {
        assert_eq!(calls.of(&format!("evt_shared_{i}")), 1, "evt_shared_{i}");
    }
}

macro_rules! suite {
    ($store:ident, $make:expr) => {
        mod $store {
            use super::*;

            #[tokio::test]
            async fn duplicate_after_success_gets_204_without_calling_handler() {
                super::duplicate_after_success_gets_204_without_calling_handler($make).await;
            }
            #[tokio::test]
            async fn hundred_concurrent_deliveries_run_the_handler_once() {
                super::hundred_concurrent_deliveries_run_the_handler_once($make).await;
            }
            #[tokio::test]
            async fn in_flight_duplicate_gets_409_with_retry_after() {
                super::in_flight_duplicate_gets_409_with_retry_after($make).await;
            }
            #[tokio::test]
            async fn failed_attempts_release_so_the_retry_runs() {
                super::failed_attempts_release_so_the_retry_runs($make).await;
            }
            #[tokio::test]
            async fn a_client_that_hangs_up_mid_handler_never_reruns_it() {
                super::a_client_that_hangs_up_mid_handler_never_reruns_it($make).await;
            }
            #[tokio::test]
            async fn a_slow_handler_renews_its_lease_so_no_duplicate_runs_beside_it() {
                super::a_slow_handler_renews_its_lease_so_no_duplicate_runs_beside_it($make).await;
            }
            #[tokio::test]
            async fn completion_is_idempotent_and_renewal_is_fenced() {
                super::completion_is_idempotent_and_renewal_is_fenced($make).await;
            }
            #[tokio::test]
            async fn crashed_claim_frees_itself_when_the_lease_runs_out() {
                super::crashed_claim_frees_itself_when_the_lease_runs_out($make).await;
            }
            #[tokio::test]
            async fn a_stale_attempt_cannot_complete_a_newer_claim() {
                super::a_stale_attempt_cannot_complete_a_newer_claim($make).await;
            }
            #[tokio::test]
            async fn a_completion_after_the_lease_ran_out_untaken_is_done() {
                super::a_completion_after_the_lease_ran_out_untaken_is_done($make).await;
            }
            #[tokio::test]
            async fn a_key_the_store_refuses_gets_500_and_the_handler_never_runs() {
                super::a_key_the_store_refuses_gets_500_and_the_handler_never_runs($make).await;
            }
        }
    };
}

/// Concurrent claims of the same and of different keys — gathered into batches by the SQL
/// stores' group commit — each get their own answer: one `New` per key, and the others
/// `InFlight`; completions answer each attempt; a later claim of each key is `Done`.
async fn concurrent_claims_each_get_their_own_answer(store: Arc<dyn DedupeStore>) {
    let lease = Duration::from_secs(30);
    let claims = (0..48).map(|i| {
        let store = store.clone();
        tokio::spawn(async move {
            let d = Delivery::new("standard", format!("evt_batch_{}", i % 12));
            let token = Token::new();
            (
                d.id().to_owned(),
                token,
                store.claim(d, token, lease).await.unwrap(),
            )
        })
    });
    let mut won: std::collections::HashMap<String, Token> = Default::default();
    for claim in claims.collect::<Vec<_>>() {
        let (id, token, claim) = claim.await.unwrap();
        match claim {
            Claim::New(t) => {
                assert_eq!(t, token, "the winner is answered with its own token");
                assert!(
                    won.insert(id.clone(), token).is_none(),
                    "{id} claimed twice"
                );
            }
            Claim::InFlight { .. } => {}
            other => panic!("{id}: {other:?}"),
        }
    }
    assert_eq!(won.len(), 12, "every key claimed once");
    let completes = won.iter().map(|(id, token)| {
        let (store, d, token) = (store.clone(), Delivery::new("standard", id.clone()), *token);
        tokio::spawn(async move { store.complete(d, token).await.unwrap() })
    });
    for done in completes.collect::<Vec<_>>() {
        assert_eq!(done.await.unwrap(), Completed::Done);
    }
    // A stale token completes nothing, even in the same batch as good ones.
    let stale = store
        .complete(Delivery::new("standard", "evt_batch_0"), Token::new())
        .await
        .unwrap();
    assert_eq!(stale, Completed::Fenced);
    for i in 0..12 {
        let d = Delivery::new("standard", format!("evt_batch_{i}"));
        assert_eq!(
            store.claim(d, Token::new(), lease).await.unwrap(),
            Claim::Done
        );
    }
}

/// A store that cannot write answers every one of many concurrent claims with an error:
/// a failed batch never answers any of its writes as granted.
async fn a_failed_batch_answers_each_of_its_writes_with_an_error(store: Arc<dyn DedupeStore>) {
    let claims = (0..24).map(|i| {
        let store = store.clone();
        tokio::spawn(async move {
            let d = Delivery::new("standard", format!("evt_down_{i}"));
            store.claim(d, Token::new(), Duration::from_secs(30)).await
        })
    });
    for claim in claims.collect::<Vec<_>>() {
        assert!(claim.await.unwrap().is_err());
    }
}

#[tokio::test]
async fn sqlite_concurrent_claims_each_get_their_own_answer() {
    concurrent_claims_each_get_their_own_answer(sqlite().await).await;
}

#[tokio::test]
async fn postgres_concurrent_claims_each_get_their_own_answer() {
    concurrent_claims_each_get_their_own_answer(postgres().await).await;
}

#[tokio::test]
async fn memory_and_redis_concurrent_claims_each_get_their_own_answer() {
    concurrent_claims_each_get_their_own_answer(memory()).await;
    concurrent_claims_each_get_their_own_answer(redis().await).await;
}

#[tokio::test]
async fn sqlite_a_failed_batch_answers_each_of_its_writes_with_an_error() {
    let store = SqliteStore::open(temp_sqlite_path()).await.unwrap();
    store.pool().close().await;
    a_failed_batch_answers_each_of_its_writes_with_an_error(Arc::new(store)).await;
}

#[tokio::test]
async fn postgres_a_failed_batch_answers_each_of_its_writes_with_an_error() {
    let url = fresh_pg_url().await;
    let store = PgStore::connect(&url).await.unwrap();
    // The table gone from under the store: every statement fails.
    sqlx::query("DROP TABLE webhook_events")
        .execute(store.pool())
        .await
        .unwrap();
    a_failed_batch_answers_each_of_its_writes_with_an_error(Arc::new(store)).await;
}

fn memory() -> Arc<dyn DedupeStore> {
    Arc::new(MemoryStore::new())
}

fn temp_sqlite_path() -> std::path::PathBuf {
    std::env::temp_dir().join(format!(
        "tower-webhook-test-{}.db",
        uuid::Uuid::new_v4().simple()
    ))
}

async fn sqlite() -> Arc<dyn DedupeStore> {
    // Leases as short as 300 ms: the busy timeout under a quarter of that.
    let store = SqliteStore::open(temp_sqlite_path()).await.unwrap();
    Arc::new(store.with_busy_timeout(Duration::from_millis(50)))
}

async fn postgres() -> Arc<dyn DedupeStore> {
    Arc::new(PgStore::connect(&fresh_pg_url().await).await.unwrap())
}

#[test]
fn a_service_url_is_probed_at_its_host_and_port_and_printed_without_its_password() {
    assert_eq!(
        common::redact("postgres://operator:s3cr3t@db:5432/x"),
        "postgres://operator:***@db:5432/x"
    );
    assert_eq!(
        common::redact("redis://127.0.0.1:6379"),
        "redis://127.0.0.1:6379"
    );
    // Nothing listens on port 1.
    let why = common::probe("postgres://operator:s3cr3t@127.0.0.1:1/x").unwrap_err();
    assert!(why.starts_with("127.0.0.1:1: "), "{why}");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    common::probe(&format!("redis://127.0.0.1:{port}")).unwrap();
}

/// A prefix of its own per test, on the shared server.
async fn redis() -> Arc<dyn DedupeStore> {
    let prefix = format!("tower-webhook-test:{}:", uuid::Uuid::new_v4().simple());
    Arc::new(
        RedisStore::connect(&redis_url())
            .await
            .expect("Redis must be running (.ci/services starts it)")
            .with_prefix(&prefix),
    )
}

suite!(memory_store, memory());
suite!(sqlite_store, sqlite().await);
suite!(postgres_store, postgres().await);
suite!(redis_store, redis().await);

#[tokio::test]
async fn memory_store_full_gets_503() {
    let store = MemoryStore::with_capacity(1);
    let svc = stack(Arc::new(store), Duration::from_secs(30), Calls::default());
    assert_eq!(send(&svc, "evt_a", "ok").await.status(), StatusCode::OK);
    unavailable_store_gets_503_and_the_handler_never_runs(Arc::new(
        MemoryStore::with_capacity(1).tap_full().await,
    ))
    .await;
}

trait TapFull: Sized {
    async fn tap_full(self) -> Self;
}

impl TapFull for MemoryStore {
    /// Fills the one place with a done key.
    async fn tap_full(self) -> Self {
        let d = Delivery::new("standard", "evt_filler");
        let Claim::New(t) = self
            .claim(d.clone(), Token::new(), Duration::from_secs(30))
            .await
            .unwrap()
        else {
            panic!()
        };
        self.complete(d, t).await.unwrap();
        self
    }
}

#[tokio::test]
async fn sqlite_store_closed_gets_503() {
    let store = SqliteStore::open(temp_sqlite_path()).await.unwrap();
    store.pool().close().await;
    unavailable_store_gets_503_and_the_handler_never_runs(Arc::new(store)).await;
}

#[tokio::test]
async fn postgres_store_unreachable_gets_503() {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .acquire_timeout(Duration::from_secs(1))
        .connect_lazy("postgres://postgres@127.0.0.1:1/postgres")
        .unwrap();
    unavailable_store_gets_503_and_the_handler_never_runs(Arc::new(PgStore::from_migrated_pool(
        pool,
    )))
    .await;
}

#[tokio::test]
async fn redis_store_unreachable_gets_503() {
    let store = RedisStore::connect_lazy("redis://127.0.0.1:1").unwrap();
    unavailable_store_gets_503_and_the_handler_never_runs(Arc::new(store)).await;
}

#[tokio::test]
async fn sqlite_store_keeps_done_keys_across_a_restart() {
    let path = temp_sqlite_path();
    let calls = Calls::default();
    let store = SqliteStore::open(&path).await.unwrap();
    let svc = stack(
        Arc::new(store.clone()),
        Duration::from_secs(30),
        calls.clone(),
    );
    assert_eq!(
        send(&svc, "evt_restart", "ok").await.status(),
        StatusCode::OK
    );
    drop(svc);
    store.pool().close().await;

    let reopened = SqliteStore::open(&path).await.unwrap();
    let svc = stack(Arc::new(reopened), Duration::from_secs(30), calls.clone());
    assert_eq!(
        send(&svc, "evt_restart", "ok").await.status(),
        StatusCode::NO_CONTENT
    );
    assert_eq!(calls.of("evt_restart"), 1);
}

#[tokio::test]
async fn sqlite_two_pools_on_one_file_run_each_event_once() {
    let path = temp_sqlite_path();
    let a = SqliteStore::open(&path).await.unwrap();
    let b = SqliteStore::open(&path).await.unwrap();
    two_instances_sharing_the_store_run_each_event_once(Arc::new(a), Arc::new(b)).await;
}

#[tokio::test]
async fn postgres_two_pools_run_each_event_once() {
    let url = fresh_pg_url().await;
    let a = PgStore::connect(&url).await.unwrap();
    let b = PgStore::connect(&url).await.unwrap();
    two_instances_sharing_the_store_run_each_event_once(Arc::new(a), Arc::new(b)).await;
}

#[tokio::test]
async fn redis_two_connections_run_each_event_once() {
    let prefix = format!("tower-webhook-test:{}:", uuid::Uuid::new_v4().simple());
    let a = RedisStore::connect(&redis_url())
        .await
        .unwrap()
        .with_prefix(&prefix);
    let b = RedisStore::connect(&redis_url())
        .await
        .unwrap()
        .with_prefix(&prefix);
    two_instances_sharing_the_store_run_each_event_once(Arc::new(a), Arc::new(b)).await;
}

#[tokio::test]
async fn postgres_store_records_the_key_without_the_body_and_prunes() {
    let store = PgStore::connect(&fresh_pg_url().await).await.unwrap();
    let svc = stack(
        Arc::new(store.clone()),
        Duration::from_secs(30),
        Calls::default(),
    );
    assert_eq!(send(&svc, "evt_audit", "ok").await.status(), StatusCode::OK);
    let (event_type, object_id, body, processed): (Option<String>, Option<String>, Option<Vec<u8>>, bool) = sqlx::query_as(
        "SELECT event_type, object_id, body, processed_at IS NOT NULL FROM webhook_events WHERE event_id = 'evt_audit'",
    )
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!(event_type.as_deref(), Some("order.paid"));
    assert_eq!(object_id.as_deref(), Some("evt_audit"));
    assert_eq!(body, None, "a claim row keeps no body (payload protection)");
    assert!(processed);
    assert_eq!(
        store
            .prune(Retention::shorter(Duration::from_secs(3600)))
            .await
            .unwrap(),
        0
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        store
            .prune(Retention::shorter(Duration::from_millis(10)))
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        send(&svc, "evt_audit", "ok").await.status(),
        StatusCode::OK,
        "pruned keys are forgotten"
    );
}

/// Prune deletes done keys and keys failed attempts gave back, once old; a key an
/// attempt holds now stays, and so do keys younger than the cutoff.
async fn sql_store_prunes_done_and_abandoned_keys(store: Arc<dyn DedupeStore>) {
    let svc = stack(store.clone(), Duration::from_secs(30), Calls::default());
    assert_eq!(send(&svc, "evt_done", "ok").await.status(), StatusCode::OK);
    let failed = send(&svc, "evt_failed", "fail").await.status();
    assert_eq!(failed, StatusCode::INTERNAL_SERVER_ERROR);
    let live = Delivery::new("standard", "evt_live");
    let held = store
        .claim(live.clone(), Token::new(), Duration::from_secs(30))
        .await
        .unwrap();
    assert!(matches!(held, Claim::New(_)));
    assert_eq!(
        store
            .prune(Retention::shorter(Duration::from_secs(3600)))
            .await
            .unwrap(),
        0
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        store
            .prune(Retention::shorter(Duration::from_millis(10)))
            .await
            .unwrap(),
        2,
        "the done key and the given-back one; not the held one"
    );
    let again = store
        .claim(live, Token::new(), Duration::from_secs(30))
        .await
        .unwrap();
    assert!(matches!(again, Claim::InFlight { .. }), "still held");
}

#[tokio::test]
async fn sqlite_store_prunes_done_and_abandoned_keys() {
    let path = std::env::temp_dir().join(format!("prune-{}.db", uuid::Uuid::new_v4()));
    let store = SqliteStore::open(&path).await.unwrap();
    sql_store_prunes_done_and_abandoned_keys(Arc::new(store)).await;
    let _ = std::fs::remove_file(path);
}

#[tokio::test]
async fn postgres_store_prunes_done_and_abandoned_keys() {
    let store = PgStore::connect(&fresh_pg_url().await).await.unwrap();
    sql_store_prunes_done_and_abandoned_keys(Arc::new(store)).await;
}

#[tokio::test]
async fn without_the_verify_layer_dedupe_is_a_500_that_names_the_fix() {
    let svc = ServiceBuilder::new()
        .layer(DedupeLayer::new(MemoryStore::new()))
        .service(service_fn(|_: Request<Full<Bytes>>| async {
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
        }));
    let response = svc
        .oneshot(Request::new(Full::new(Bytes::new())))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let text = response.into_body().collect().await.unwrap().to_bytes();
    assert!(std::str::from_utf8(&text)
        .unwrap()
        .contains("VerifyWebhookLayer"));
}

#[tokio::test]
async fn a_key_from_the_request_dedupes_without_the_verify_layer() {
    let calls = Arc::new(Mutex::new(0));
    let counter = calls.clone();
    let svc = ServiceBuilder::new()
        .layer(DedupeLayer::new(MemoryStore::new()).with_key(|parts| {
            let id = parts.headers.get("x-delivery-id")?.to_str().ok()?;
            Some(Delivery::new("internal", id))
        }))
        .service(service_fn(move |_: Request<Full<Bytes>>| {
            *counter.lock().unwrap() += 1;
            async { Ok::<_, Infallible>(Response::new(Full::new(Bytes::new()))) }
        }));
    let req = |id: Option<&str>| {
        let mut r = Request::new(Full::new(Bytes::new()));
        if let Some(id) = id {
            r.headers_mut()
                .insert("x-delivery-id", HeaderValue::from_str(id).unwrap());
        }
        r
    };
    assert_eq!(
        svc.clone().oneshot(req(Some("d1"))).await.unwrap().status(),
        StatusCode::OK
    );
    assert_eq!(
        svc.clone().oneshot(req(Some("d1"))).await.unwrap().status(),
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        svc.oneshot(req(None)).await.unwrap().status(),
        StatusCode::BAD_REQUEST
    );
    assert_eq!(*calls.lock().unwrap(), 1);
}

#[tokio::test]
async fn request_dropped_while_claiming_releases_the_claim_it_never_heard_of() {
    let memory = MemoryStore::new();
    let calls = Calls::default();
    let svc = stack(
        Arc::new(SlowClaims::answering_late(memory.clone())),
        Duration::from_secs(30),
        calls.clone(),
    );
    let dropped =
        tokio::time::timeout(Duration::from_millis(50), send(&svc, "evt_hangup", "ok")).await;
    assert!(
        dropped.is_err(),
        "the client gave up while the claim was on the wire"
    );
    // Released once the claim's answer comes (300 ms); without the release, the key
    // would stay claimed for the 30 s lease (409).
    tokio::time::sleep(Duration::from_millis(400)).await;
    let fast = stack(Arc::new(memory), Duration::from_secs(30), calls.clone());
    assert_eq!(
        send(&fast, "evt_hangup", "ok").await.status(),
        StatusCode::OK
    );
    assert_eq!(calls.of("evt_hangup"), 1);
}

/// A store whose claims are slow in one of two ways, counting the claims asked for:
/// - answering late: a claim takes effect at once but its answer comes 300 ms later, so a
///   request dropped while it waits has a claim it never heard of;
/// - landing late: a claim takes effect 150 ms later whether or not anyone still waits
///   for it, as a database runs a statement it was sent when the caller stops listening.
#[derive(Clone)]
struct SlowClaims {
    store: MemoryStore,
    lands_late: bool,
    asked: Arc<std::sync::atomic::AtomicUsize>,
}

impl SlowClaims {
    fn answering_late(store: MemoryStore) -> Self {
        Self {
            store,
            lands_late: false,
            asked: Arc::default(),
        }
    }

    fn landing_late(store: MemoryStore) -> Self {
        Self {
            lands_late: true,
            ..Self::answering_late(store)
        }
    }
}

impl DedupeStore for SlowClaims {
    fn claim(&self, delivery: Delivery, token: Token, lease: Duration) -> StoreFuture<Claim> {
        self.asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if !self.lands_late {
            let claim = self.store.claim(delivery, token, lease); // the memory store acts now
            return Box::pin(async move {
                tokio::time::sleep(Duration::from_millis(300)).await;
                claim.await
            });
        }
        let store = self.store.clone();
        let landing = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(150)).await;
            store.claim(delivery, token, lease).await
        });
        Box::pin(async move { landing.await.expect("the claim task ran") })
    }
    fn renew(&self, delivery: Delivery, token: Token, lease: Duration) -> StoreFuture<Renewed> {
        self.store.renew(delivery, token, lease)
    }
    fn complete(&self, delivery: Delivery, token: Token) -> StoreFuture<Completed> {
        self.store.complete(delivery, token)
    }
    fn release(&self, delivery: Delivery, token: Token) -> StoreFuture<()> {
        self.store.release(delivery, token)
    }
    fn prune(&self, older_than: Retention) -> StoreFuture<u64> {
        self.store.prune(older_than)
    }
    fn prune_once(&self, namespace: &str, older_than: Duration) -> StoreFuture<u64> {
        self.store.prune_once(namespace, older_than)
    }
}

#[tokio::test]
async fn a_claim_landing_after_its_request_was_dropped_is_released_when_it_lands() {
    let memory = MemoryStore::new();
    let calls = Calls::default();
    let svc = stack(
        Arc::new(SlowClaims::landing_late(memory.clone())),
        Duration::from_secs(30),
        calls.clone(),
    );
    let dropped =
        tokio::time::timeout(Duration::from_millis(30), send(&svc, "evt_late", "ok")).await;
    assert!(
        dropped.is_err(),
        "the client gave up before the claim landed"
    );
    // The claim lands at 150 ms; released then, not at the end of its 30 s lease.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let fast = stack(
        Arc::new(memory.clone()),
        Duration::from_secs(30),
        calls.clone(),
    );
    assert_eq!(send(&fast, "evt_late", "ok").await.status(), StatusCode::OK);
    assert_eq!(calls.of("evt_late"), 1);

    // The same for `Once`, dropped mid-claim (a worker stopped mid-event).
    let late = Once::new(SlowClaims::landing_late(memory.clone()), "fulfil");
    let action = |_| async { Ok::<_, std::io::Error>(()) };
    let stopped =
        tokio::time::timeout(Duration::from_millis(30), late.run("order-7", action)).await;
    assert!(stopped.is_err());
    tokio::time::sleep(Duration::from_millis(400)).await;
    let once = Once::new(memory, "fulfil");
    assert!(
        matches!(once.run("order-7", action).await, Ok(Ran::Now(()))),
        "the key is free: the action was never run"
    );
}

#[tokio::test]
async fn a_response_future_dropped_unpolled_claims_nothing() {
    use tower::Layer;
    let store = SlowClaims::landing_late(MemoryStore::new());
    let verifier = verifier(Scheme::standard(), &[SECRET]);
    let request = delivery("evt_unpolled", "ok");
    let (parts, body) = request.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    let event = verifier.verify(&parts.headers, body.clone()).unwrap();
    let mut request = Request::from_parts(parts, body);
    request.extensions_mut().insert(event);
    let mut svc = DedupeLayer::new(store.clone()).layer(service_fn(|_: Request<Bytes>| async {
        Ok::<_, Infallible>(Response::new(Bytes::new()))
    }));
    let future = tower::Service::call(&mut svc, request);
    drop(future); // never polled: the request was cancelled before it started
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(store.asked.load(std::sync::atomic::Ordering::SeqCst), 0);
}

#[tokio::test]
async fn events_without_an_id_are_keyed_on_their_body_never_refused_or_shared() {
    // Zoom, Meta and SendGrid send no event id: each distinct body is its own key, and a
    // retry of the same body is a duplicate.
    let calls = Arc::new(Mutex::new(Vec::new()));
    let seen = calls.clone();
    let secret = "zoom_secret_token_0001";
    let svc = ServiceBuilder::new()
        .layer(VerifyWebhookLayer::new(verifier(Scheme::zoom(), &[secret])))
        .layer(DedupeLayer::new(MemoryStore::new()))
        .service(service_fn(move |req: Request<Full<Bytes>>| {
            let event = req.extensions().get::<Event>().unwrap().clone();
            seen.lock().unwrap().push(event.dedupe_id().to_owned());
            async { Ok::<_, Infallible>(Response::new(Full::new(Bytes::new()))) }
        }));
    let deliver = |body: &'static [u8]| {
        let headers = Scheme::zoom().sign([secret], "", at(NOW), body).unwrap();
        svc.clone().oneshot(request(headers, body))
    };
    let started = br#"{"event":"meeting.started","event_ts":1700000000001,"payload":{}}"#;
    let ended = br#"{"event":"meeting.ended","event_ts":1700000000002,"payload":{}}"#;
    assert_eq!(deliver(started).await.unwrap().status(), StatusCode::OK);
    assert_eq!(deliver(ended).await.unwrap().status(), StatusCode::OK);
    assert_eq!(
        deliver(started).await.unwrap().status(),
        StatusCode::NO_CONTENT,
        "the provider's retry of the same body"
    );
    let calls = calls.lock().unwrap();
    assert_eq!(calls.len(), 2);
    assert_ne!(calls[0], calls[1]);
    assert!(calls[0].starts_with("sha256:"));
}

#[test]
fn leases_and_run_times_are_validated_when_built() {
    use tower_webhook::inbox::{Attempt, Inbox, Worker};
    use tower_webhook::ConfigErrorKind;
    let layer = || DedupeLayer::new(MemoryStore::new());
    for bad in [
        Duration::ZERO,
        Duration::from_millis(99),
        Duration::from_secs(2 * 86_400),
    ] {
        let err = layer().with_lease(bad).unwrap_err();
        assert_eq!(err.kind(), ConfigErrorKind::InvalidDuration, "{bad:?}");
        assert!(err.to_string().contains("lease"), "{err}");
        let once = Once::new(MemoryStore::new(), "n").with_lease(bad);
        assert_eq!(once.unwrap_err().kind(), ConfigErrorKind::InvalidDuration);
    }
    assert!(layer().with_lease(Duration::from_millis(100)).is_ok());
    // Retentions: beyond the longest provider retry window (about 75 h) unless meant.
    let two_days = Duration::from_secs(2 * 86_400);
    let err = Retention::new(two_days).unwrap_err();
    assert_eq!(err.kind(), ConfigErrorKind::InvalidDuration);
    assert!(err.to_string().contains("4 days"), "{err}");
    let standard_webhooks_window = Duration::from_secs(75 * 3600);
    assert!(Retention::MIN > standard_webhooks_window);
    assert!(Retention::new(standard_webhooks_window).is_err());
    assert_eq!(
        Retention::new(Retention::MIN).unwrap().get(),
        Retention::MIN
    );
    assert_eq!(Retention::shorter(two_days).get(), two_days);
    assert_eq!(Retention::default().get(), Duration::from_secs(7 * 86_400));
    assert!(layer().with_max_run(Duration::from_millis(999)).is_err());
    assert!(layer().with_max_run(Duration::from_secs(1)).is_ok());
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let inbox = runtime.block_on(async {
        let path = temp_sqlite_path();
        Inbox::sqlite(&SqliteStore::open(path).await.unwrap())
    });
    let worker = || Worker::new(&inbox, |_: Event, _: Attempt| async { Ok::<_, String>(()) });
    assert!(worker().with_lease(Duration::ZERO).is_err());
    assert!(worker().with_max_run(Duration::ZERO).is_err());
    assert!(worker().with_lease(Duration::from_secs(20)).is_ok());
}

/// A Redis of its own on a free port, with the given eviction policy; stopped on drop.
struct PrivateRedis(std::process::Child, u16);

impl PrivateRedis {
    fn start(policy: &str) -> Self {
        Self::start_with(&["--maxmemory-policy", policy])
    }

    fn start_with(args: &[&str]) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = std::process::Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args(["--save", "", "--appendonly", "no"])
            // A replica writes the primary's snapshot to disk: not into the work tree.
            .args(["--dir", &std::env::temp_dir().to_string_lossy()])
            .args(["--dbfilename", &format!("tower-webhook-{port}.rdb")])
            .args(args)
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-server is installed (.ci/services installs it)");
        Self(child, port)
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.1)
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn redis_store_refuses_a_server_that_may_evict_its_keys() {
    let redis = PrivateRedis::start("allkeys-lru");
    let mut refused = None;
    for _ in 0..100 {
        match RedisStore::connect(&redis.url()).await {
            // Refused for its policy; a refused connection (still starting) is not that.
            Err(e)
                if e.source()
                    .is_some_and(|s| s.to_string().contains("noeviction")) =>
            {
                refused = Some(e);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await, // still starting
            Ok(_) => panic!("an evicting Redis was accepted"),
        }
    }
    let refused = refused.expect("the private Redis answered");
    assert_eq!(refused.to_string(), "redis connect");
    let why = std::error::Error::source(&refused).unwrap().to_string();
    assert!(
        why.contains("allkeys-lru") && why.contains("noeviction"),
        "{why}"
    );
    // Accepting the risk knowingly: a connection built by hand is not checked.
    let client = redis::Client::open(redis.url()).unwrap();
    let connection = redis::aio::ConnectionManager::new(client).await.unwrap();
    let store = RedisStore::from_connection(connection);
    assert_eq!(store.eviction_policy().await.unwrap(), "allkeys-lru");
}

/// SQLite leases follow the wall clock: a running attempt renews every third of its lease,
/// so a forward step below two thirds of the lease never frees its claim (the documented
/// bound); a larger one does, and the late attempt is then fenced; a backward step only
/// delays a takeover.
#[tokio::test]
async fn sqlite_leases_hold_through_a_clock_step_below_two_thirds_of_the_lease() {
    use std::sync::atomic::{AtomicI64, Ordering};
    let offset_ms = Arc::new(AtomicI64::new(0));
    let clock = {
        let offset_ms = offset_ms.clone();
        move || {
            let offset = offset_ms.load(Ordering::SeqCst);
            let base = at(NOW);
            if offset >= 0 {
                base + Duration::from_millis(offset.unsigned_abs())
            } else {
                base - Duration::from_millis(offset.unsigned_abs())
            }
        }
    };
    let store = SqliteStore::open(temp_sqlite_path())
        .await
        .unwrap()
        .with_clock(clock);
    let (lease, d) = (
        Duration::from_secs(3),
        Delivery::new("standard", "evt_step"),
    );
    let Claim::New(token) = store.claim(d.clone(), Token::new(), lease).await.unwrap() else {
        panic!("new")
    };
    // A third of the lease later the attempt renews (the heartbeat's schedule).
    offset_ms.store(1_000, Ordering::SeqCst);
    assert_eq!(
        store.renew(d.clone(), token, lease).await.unwrap(),
        Renewed::Held
    );
    // The clock steps forward by just under two thirds of the lease, before the next beat.
    offset_ms.store(1_000 + 1_999, Ordering::SeqCst);
    assert!(matches!(
        store.claim(d.clone(), Token::new(), lease).await.unwrap(),
        Claim::InFlight { .. }
    ));
    // A backward step of a whole lease: still held, a retry only waits longer.
    offset_ms.store(-2_000, Ordering::SeqCst);
    assert!(matches!(
        store.claim(d.clone(), Token::new(), lease).await.unwrap(),
        Claim::InFlight { .. }
    ));
    // Past the bound (a step beyond the renewed lease): another attempt takes the key,
    // and the first one's outcome is fenced.
    offset_ms.store(1_000 + 3_001, Ordering::SeqCst);
    assert!(matches!(
        store.claim(d.clone(), Token::new(), lease).await.unwrap(),
        Claim::New(_)
    ));
    assert_eq!(
        store.renew(d.clone(), token, lease).await.unwrap(),
        Renewed::Fenced
    );
    assert_eq!(store.complete(d, token).await.unwrap(), Completed::Fenced);
}

#[tokio::test]
async fn redis_store_with_replicas_waits_for_them_and_refuses_without() {
    let primary = PrivateRedis::start("noeviction");
    let mut store = None;
    for _ in 0..100 {
        if let Ok(s) = RedisStore::connect(&primary.url()).await {
            store = Some(s.with_replicas(1, Duration::from_millis(200)));
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await; // still starting
    }
    let store: Arc<dyn DedupeStore> = Arc::new(store.expect("the private Redis answered"));
    // No replica: a claim no replica acknowledged is a store error, so the handler never
    // runs and the provider is told to retry.
    let calls = Calls::default();
    let svc = stack(store.clone(), Duration::from_secs(30), calls.clone());
    let response = send(&svc, "evt_replicated", "ok").await;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(calls.of("evt_replicated"), 0);

    let port = primary.1.to_string();
    let replica = PrivateRedis::start_with(&["--replicaof", "127.0.0.1", &port]);
    let mut status = StatusCode::SERVICE_UNAVAILABLE;
    for _ in 0..100 {
        // The 503 above released nothing it had not claimed; the key frees with its lease,
        // so each try uses a fresh id until the replica has synced.
        status = send(&svc, "evt_after_sync", "ok").await.status();
        if status == StatusCode::OK {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(status, StatusCode::OK, "the replica acknowledged the claim");
    assert_eq!(
        send(&svc, "evt_after_sync", "ok").await.status(),
        StatusCode::NO_CONTENT
    );
    assert_eq!(calls.of("evt_after_sync"), 1);
    // The done key is on the replica.
    let client = redis::Client::open(replica.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*evt_after_sync")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(keys.len(), 1, "{keys:?}");
    let value: String = redis::cmd("GET")
        .arg(&keys[0])
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(value.starts_with("done:"), "{value}");
}

/// Keys completed by versions before renewals hold the value `done`: still done.
#[tokio::test]
async fn redis_store_reads_a_done_key_of_an_earlier_version_as_done() {
    let prefix = format!("tower-webhook-test:{}:", uuid::Uuid::new_v4().simple());
    let store = RedisStore::connect(&redis_url())
        .await
        .unwrap()
        .with_prefix(&prefix);
    let client = redis::Client::open(redis_url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let key = format!("{prefix}8:standard:evt_legacy");
    let _: () = redis::cmd("SET")
        .arg(&key)
        .arg("done")
        .query_async(&mut conn)
        .await
        .unwrap();
    let claim = store.claim(
        Delivery::new("standard", "evt_legacy"),
        Token::new(),
        Duration::from_secs(30),
    );
    assert_eq!(claim.await.unwrap(), Claim::Done);
    let _: () = redis::cmd("DEL")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
}

/// A database migrated before the `kind` column: `Once` keys (sources `once:…`) become
/// business keys, so the event keys' prune never deletes them.
#[tokio::test]
async fn sqlite_migration_marks_earlier_once_keys_as_business_keys() {
    let path = temp_sqlite_path();
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(&path)
        .create_if_missing(true);
    let pool = sqlx::SqlitePool::connect_with(options).await.unwrap();
    for sql in [
        include_str!("../migrations/sqlite/20261130000001_webhook_events.sql"),
        include_str!("../migrations/sqlite/20261130000002_webhook_objects.sql"),
    ] {
        sqlx::raw_sql(sql).execute(&pool).await.unwrap();
    }
    sqlx::query(
        "INSERT INTO webhook_events (source, event_id, received_at, attempts, processed_at)
         VALUES ('once:fulfil', 'order-7', 0, 1, 0), ('standard', 'evt_1', 0, 1, 0)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let store = SqliteStore::from_pool(pool.clone()).await.unwrap();
    let kinds: Vec<(String, String)> =
        sqlx::query_as("SELECT event_id, kind FROM webhook_events ORDER BY event_id")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(
        kinds,
        vec![
            ("evt_1".to_owned(), "event".to_owned()),
            ("order-7".to_owned(), "once".to_owned())
        ]
    );
    assert_eq!(
        store
            .prune(Retention::shorter(Duration::ZERO))
            .await
            .unwrap(),
        1,
        "the event key only"
    );
    let once = Once::new(store, "fulfil");
    let ran = once.run("order-7", |_| async { Ok::<_, std::io::Error>(()) });
    assert_eq!(ran.await.unwrap(), Ran::Already);
}

/// A duplicate answered by the middleware never waits for a place in the inner service:
/// readiness is taken only once the event is claimed.
#[tokio::test]
async fn a_duplicate_in_flight_gets_409_without_waiting_for_the_inner_services_slot() {
    use tower::Service;
    let release = Arc::new(tokio::sync::Notify::new());
    let started = Arc::new(tokio::sync::Notify::new());
    let handler = service_fn({
        let (release, started) = (release.clone(), started.clone());
        move |_req: Request<Full<Bytes>>| {
            let (release, started) = (release.clone(), started.clone());
            async move {
                started.notify_one();
                release.notified().await;
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
            }
        }
    });
    let svc = ServiceBuilder::new()
        .layer(VerifyWebhookLayer::new(verifier(
            Scheme::standard(),
            &[SECRET],
        )))
        .layer(DedupeLayer::new(MemoryStore::new()))
        .concurrency_limit(1)
        .service(handler);
    let mut first = svc.clone();
    let running = tokio::spawn(async move {
        std::future::poll_fn(|cx| Service::<Request<Full<Bytes>>>::poll_ready(&mut first, cx))
            .await
            .unwrap();
        first.call(delivery("evt_slot", "ok")).await
    });
    started.notified().await; // the first attempt holds the limit's one slot
    let duplicate = tokio::time::timeout(
        Duration::from_secs(2),
        svc.oneshot(delivery("evt_slot", "ok")),
    )
    .await
    .expect("answered without a place in the inner service")
    .unwrap();
    assert_eq!(duplicate.status(), StatusCode::CONFLICT);
    release.notify_one();
    assert_eq!(running.await.unwrap().unwrap().status(), StatusCode::OK);
}

/// GitHub signs the body only: a captured delivery re-sent under a fresh
/// `X-GitHub-Delivery` verifies — and is a duplicate, keyed on the signed body's digest.
#[tokio::test]
async fn a_github_delivery_replayed_with_a_fresh_delivery_id_is_a_duplicate() {
    let secret = "github-replay-secret-0123";
    let runs = Arc::new(Mutex::new(Vec::new()));
    let seen = runs.clone();
    let svc = ServiceBuilder::new()
        .layer(VerifyWebhookLayer::new(verifier(
            Scheme::github(),
            &[secret],
        )))
        .layer(DedupeLayer::new(MemoryStore::new()))
        .service(service_fn(move |req: Request<Full<Bytes>>| {
            let event = req.extensions().get::<Event>().unwrap().clone();
            seen.lock().unwrap().push(event);
            async { Ok::<_, Infallible>(Response::new(Full::new(Bytes::new()))) }
        }));
    let deliver = |delivery_id: &str, body: &'static [u8]| {
        let mut headers = Scheme::github()
            .sign([secret], delivery_id, at(NOW), body)
            .unwrap();
        headers.insert("x-github-event", HeaderValue::from_static("push"));
        svc.clone().oneshot(request(headers, body))
    };
    let push = br#"{"ref":"refs/heads/main","after":"abc"}"#;
    assert_eq!(deliver("d-1", push).await.unwrap().status(), StatusCode::OK);
    assert_eq!(
        deliver("d-2-fresh", push).await.unwrap().status(),
        StatusCode::NO_CONTENT,
        "the same signed body under a fresh delivery id"
    );
    let other = br#"{"ref":"refs/heads/main","after":"def"}"#;
    assert_eq!(
        deliver("d-3", other).await.unwrap().status(),
        StatusCode::OK
    );
    let runs = runs.lock().unwrap();
    assert_eq!(runs.len(), 2);
    assert_eq!(runs[0].id(), Some("d-1"), "the id is still the provider's");
    assert!(!runs[0].id_is_signed() && !runs[0].type_is_signed());
    assert!(runs[0].dedupe_id().starts_with("sha256:"));
    assert_ne!(runs[0].dedupe_id(), runs[1].dedupe_id());
}

#[tokio::test]
async fn signed_ids_and_types_are_keys_as_they_are() {
    let body = br#"{"type":"invoice.paid"}"#;
    let headers = Scheme::standard()
        .sign([SECRET], "msg_1", at(NOW), body)
        .unwrap();
    let event = verifier(Scheme::standard(), &[SECRET])
        .verify(&headers, Bytes::from_static(body))
        .unwrap();
    assert!(event.id_is_signed() && event.type_is_signed());
    assert_eq!(event.dedupe_id(), "msg_1");
}
