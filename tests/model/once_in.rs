//! Model E′: `Once::run_in`, the business key recorded in the event's PostgreSQL
//! transaction, behind `VerifyWebhookLayer` + `TxDedupeLayer` (the only way a `PgTx` is
//! made; `run_in` is PostgreSQL's alone — SQLite has no transactional variant).
//!
//! A case is a `Once` namespace of its own and a random sequence of bursts: one to three
//! concurrent deliveries of one of four events, each about one of two business keys
//! ("order-0", "order-1"); the handler calls `run_in`, whose action writes the effect row
//! in the transaction after 0–150 ms and succeeds or fails, and the handler then answers
//! 2xx (commit) or 500 (rollback); some clients hang up mid-request. At the end each key
//! is delivered in a fresh event until it answers 2xx.
//!
//! The model is each key's committed effect: none, or one row. Checked after every step:
//! at most one effect row committed per key; `Already` only once the key's effect is
//! committed (so a rolled-back transaction took its key with it); a delivery whose action
//! succeeded and whose transaction committed leaves exactly one row. At the end exactly
//! one row per key that was delivered.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use axum::routing::post;
use axum::Router;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode};
use proptest::prelude::*;
use proptest_state_machine::{ReferenceStateMachine, StateMachineTest};
use tower::{ServiceBuilder, ServiceExt};
use tower_webhook::dedupe::{PgTx, TxDedupeLayer};
use tower_webhook::once::{Once, Ran};
use tower_webhook::store::PgStore;
use tower_webhook::{Event, Scheme, VerifyWebhookLayer};

use crate::run::{block_on, check};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const EVENTS: usize = 4;
const KEYS: usize = 2;

#[derive(Clone, Debug)]
pub enum Step {
    Deliver {
        event: usize,
        copies: usize,
        action_ok: bool,
        commit: bool,
        work: u64,
        hang_up: Option<u64>,
    },
}

pub struct Reference;

impl ReferenceStateMachine for Reference {
    type State = ();
    type Transition = Step;

    fn init_state() -> BoxedStrategy<()> {
        Just(()).boxed()
    }

    fn transitions(_: &()) -> BoxedStrategy<Step> {
        (
            0..EVENTS,
            1..=3usize,
            prop::bool::weighted(0.7),
            prop::bool::weighted(0.7),
            prop_oneof![Just(0u64), 0..150u64],
            prop::option::weighted(0.2, 0..200u64),
        )
            .prop_map(
                |(event, copies, action_ok, commit, work, hang_up)| Step::Deliver {
                    event,
                    copies,
                    action_ok,
                    commit,
                    work,
                    hang_up,
                },
            )
            .boxed()
    }

    fn apply(_: (), _: &Step) {}
}

/// `run_in`'s answers the handlers saw: (namespace, key) → answers.
type Answers = Arc<Mutex<Vec<(String, String, String)>>>;

struct Shared {
    pool: sqlx::PgPool,
    app: Router,
    answers: Answers,
}

static SHARED: OnceLock<Shared> = OnceLock::new();

fn shared() -> &'static Shared {
    SHARED.get_or_init(|| {
        block_on(async {
            let store = crate::common::stores::postgres().await;
            let pool = store.pool().clone();
            sqlx::query("CREATE TABLE once_effects (ns TEXT NOT NULL, key TEXT NOT NULL)")
                .execute(&pool)
                .await
                .unwrap();
            let answers: Answers = Arc::default();
            let handler = {
                let (pool, answers) = (pool.clone(), answers.clone());
                move |_event: Event, tx: PgTx, headers: HeaderMap| {
                    let (pool, answers) = (pool.clone(), answers.clone());
                    async move {
                        let h = |name: &str| headers[name].to_str().unwrap().to_owned();
                        let (ns, key) = (h("x-ns"), h("x-key"));
                        let (action_ok, commit) = (h("x-action") == "ok", h("x-commit") == "yes");
                        let work: u64 = h("x-work").parse().unwrap();
                        let once = Once::new(PgStore::from_migrated_pool(pool), &ns);
                        let ran = once
                            .run_in(&tx, &key, |_idempotency_key| {
                                let (tx, ns, key) = (tx.clone(), ns.clone(), key.clone());
                                async move {
                                    tokio::time::sleep(Duration::from_millis(work)).await;
                                    sqlx::query("INSERT INTO once_effects VALUES ($1, $2)")
                                        .bind(&ns)
                                        .bind(&key)
                                        .execute(&mut **tx.lock().await)
                                        .await
                                        .map_err(|e| e.to_string())?;
                                    if action_ok {
                                        Ok(())
                                    } else {
                                        Err("the action failed (the model asked it to)".to_owned())
                                    }
                                }
                            })
                            .await;
                        let answer = match &ran {
                            Ok(Ran::Now(())) => "now",
                            Ok(Ran::Already) => "already",
                            Ok(_) => "other",
                            Err(_) => "error",
                        };
                        answers.lock().unwrap().push((ns, key, answer.to_owned()));
                        match (ran.is_ok(), commit) {
                            (true, true) => StatusCode::NO_CONTENT,
                            _ => StatusCode::INTERNAL_SERVER_ERROR,
                        }
                    }
                }
            };
            let app = Router::new().route(
                "/webhooks",
                post(handler).layer(
                    ServiceBuilder::new()
                        .layer(VerifyWebhookLayer::new(
                            tower_webhook::Verifier::new(Scheme::standard(), [SECRET]).unwrap(),
                        ))
                        .layer(TxDedupeLayer::from_migrated_pool(pool.clone())),
                ),
            );
            Shared { pool, app, answers }
        })
    })
}

pub struct Sut {
    ns: String,
    /// A round of fresh event ids per settle redelivery.
    fresh: usize,
    deliveries: usize,
}

impl Sut {
    fn key_of(event: usize) -> String {
        format!("order-{}", event % KEYS)
    }

    async fn effects(&self, key: &str) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM once_effects WHERE ns = $1 AND key = $2")
            .bind(&self.ns)
            .bind(key)
            .fetch_one(&shared().pool)
            .await
            .unwrap()
    }

    async fn deliver(
        &self,
        event: &str,
        key: &str,
        action_ok: bool,
        commit: bool,
        work: u64,
        hang_up: Option<u64>,
    ) -> Option<StatusCode> {
        let body = format!(r#"{{"type":"order.paid","data":{{"id":"{event}"}}}}"#);
        let mut headers =
            crate::common::signed_headers(&Scheme::standard(), SECRET, event, body.as_bytes());
        for (name, value) in [
            ("x-ns", self.ns.clone()),
            ("x-key", key.to_owned()),
            ("x-action", if action_ok { "ok" } else { "fail" }.to_owned()),
            ("x-commit", if commit { "yes" } else { "no" }.to_owned()),
            ("x-work", work.to_string()),
        ] {
            headers.insert(name, HeaderValue::from_str(&value).unwrap());
        }
        let req = crate::common::request(headers, Bytes::from(body));
        let call = shared().app.clone().oneshot(req);
        let response = match hang_up {
            Some(ms) => tokio::time::timeout(Duration::from_millis(ms), call)
                .await
                .ok()?,
            None => call.await,
        };
        Some(response.expect("infallible").status())
    }

    /// At most one effect per key; `Already` only for a key whose effect is committed.
    async fn check(&self, when: &str) {
        for k in 0..KEYS {
            let key = format!("order-{k}");
            let n = self.effects(&key).await;
            assert!(n <= 1, "{when}: {key}'s effect committed {n} times");
            let already = shared()
                .answers
                .lock()
                .unwrap()
                .iter()
                .any(|(ns, kk, a)| *ns == self.ns && *kk == key && a == "already");
            if already {
                assert_eq!(
                    n, 1,
                    "{when}: {key} answered Already, but no effect is committed"
                );
            }
        }
    }

    async fn step(&mut self, step: &Step) {
        let Step::Deliver {
            event,
            copies,
            action_ok,
            commit,
            work,
            hang_up,
        } = *step;
        let key = Self::key_of(event);
        let id = format!("{}-evt{event}", self.ns);
        self.deliveries += copies;
        let calls = (0..copies).map(|_| self.deliver(&id, &key, action_ok, commit, work, hang_up));
        let statuses = futures_util::future::join_all(calls).await;
        for status in statuses.into_iter().flatten() {
            assert!(
                [200, 204, 409, 500].contains(&status.as_u16()),
                "{id}: status {status}"
            );
            if status.is_success() {
                assert_eq!(
                    self.effects(&key).await,
                    1,
                    "{id}: 2xx, but {key} has no effect committed"
                );
            }
        }
    }

    /// Hung-up requests end; then each key delivered in fresh events until a 2xx.
    async fn settle(&mut self) {
        tokio::time::sleep(Duration::from_millis(400)).await;
        for k in 0..KEYS {
            let key = format!("order-{k}");
            let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
            loop {
                self.fresh += 1;
                let id = format!("{}-settle{}", self.ns, self.fresh);
                let status = self
                    .deliver(&id, &key, true, true, 0, None)
                    .await
                    .expect("no hang-up");
                if status.is_success() {
                    break;
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "{key}: no 2xx ({status})"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            assert_eq!(self.effects(&key).await, 1, "{key}: settled");
        }
        self.check("settled").await;
    }
}

static DELIVERIES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

pub struct OnceInTest;

impl StateMachineTest for OnceInTest {
    type SystemUnderTest = Sut;
    type Reference = Reference;

    fn init_test(_: &()) -> Sut {
        let _ = shared(); // opened here, outside the runtime's `block_on`
        Sut {
            ns: format!("m{}", uuid::Uuid::new_v4().simple()),
            fresh: 0,
            deliveries: 0,
        }
    }

    fn apply(mut sut: Sut, _: &(), step: Step) -> Sut {
        block_on(async {
            tokio::time::timeout(Duration::from_secs(30), sut.step(&step))
                .await
                .unwrap_or_else(|_| panic!("{step:?}: not within 30 s"));
            sut.check(&format!("after {step:?}")).await;
        });
        sut
    }

    fn teardown(mut sut: Sut, _: ()) {
        block_on(sut.settle());
        DELIVERIES.fetch_add(sut.deliveries, std::sync::atomic::Ordering::Relaxed);
    }
}

#[test]
fn postgres_in_transaction() {
    check::<OnceInTest>(
        "once_in::postgres_in_transaction",
        "tests/proptest-regressions/model-once-in-postgres.txt",
        (8, 1..12),
        "once in a transaction | PostgreSQL",
        || {
            format!(
                "deliveries={}",
                DELIVERIES.load(std::sync::atomic::Ordering::Relaxed)
            )
        },
    );
}
