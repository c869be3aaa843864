//! Model G: clock jumps, where the crate reads a clock it lets a test replace.
//!
//! - **SQLite's leases** (`SqliteStore::with_clock`): the store on a virtual clock that
//!   moves only when the model says — small ticks, and jumps of up to 5 s forward or back
//!   (the lease is 300 ms). The model is the `DedupeStore` contract on that clock, exact:
//!   a key is `Free | Claimed { holder, until } | Done { by }`, a claim is granted only
//!   when the key is free or its lease ended by the store's clock, renewed and completed
//!   only by its holder. So a lease is never granted twice because of a jump: a jump back
//!   only lengthens the live claim (a second claim answers "in flight"); a jump forward
//!   past a lease's end frees it — what `SqliteStore`'s "Clocks" section documents, and
//!   why a renewing attempt keeps two thirds of its lease in hand.
//! - **The verifier's clock** (`Verifier::with_clock`): jumps of up to an hour either way
//!   between deliveries signed at times near the tests' "now"; a delivery verifies
//!   exactly when its signed time lies within the tolerance (5 min) of the verifier's
//!   clock *now* — never of the clock before a jump.
//!
//! PostgreSQL and Redis are not here: their leases run on the server's clock
//! (`now()`/`clock_timestamp()`, Redis's `PX` expiry), which a test cannot step without
//! stepping the host's; model A runs them on their real clocks. The memory store's
//! leases use the monotonic `Instant`, which does not jump.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use proptest::prelude::*;
use proptest_state_machine::{ReferenceStateMachine, StateMachineTest};
use tower_webhook::store::{Claim, Completed, DedupeStore, Delivery, Renewed, SqliteStore, Token};
use tower_webhook::Scheme;

use crate::run::{block_on, check, config};

const KEYS: usize = 2;
const TOKENS: usize = 3;
const LEASE_MS: i64 = 300;
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

#[derive(Clone, Debug)]
pub enum Step {
    Claim {
        key: usize,
        tok: usize,
    },
    Renew {
        key: usize,
        tok: usize,
    },
    Complete {
        key: usize,
        tok: usize,
    },
    Release {
        key: usize,
        tok: usize,
    },
    /// The clock moves by `ms` (negative: back).
    Clock {
        ms: i64,
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
        let kt = (0..KEYS, 0..TOKENS);
        prop_oneof![
            4 => kt.clone().prop_map(|(key, tok)| Step::Claim { key, tok }),
            2 => kt.clone().prop_map(|(key, tok)| Step::Renew { key, tok }),
            1 => kt.clone().prop_map(|(key, tok)| Step::Complete { key, tok }),
            1 => kt.prop_map(|(key, tok)| Step::Release { key, tok }),
            2 => (1..120i64).prop_map(|ms| Step::Clock { ms }),
            2 => prop_oneof![-5_000..-1i64, 1..5_000i64].prop_map(|ms| Step::Clock { ms }),
        ]
        .boxed()
    }

    fn apply(_: (), _: &Step) {}
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Key {
    Free,
    Claimed { holder: usize, until: i64 },
    Done { by: usize },
}

pub struct Sut {
    store: SqliteStore,
    now: Arc<AtomicI64>,
    source: String,
    tokens: [[Token; TOKENS]; KEYS],
    keys: [Key; KEYS],
}

impl Sut {
    fn delivery(&self, key: usize) -> Delivery {
        Delivery::new(self.source.clone(), format!("k{key}"))
    }

    async fn step(&mut self, step: &Step) {
        let lease = Duration::from_millis(LEASE_MS as u64);
        let now = self.now.load(Ordering::SeqCst);
        match *step {
            Step::Clock { ms } => {
                self.now.fetch_add(ms, Ordering::SeqCst);
            }
            Step::Claim { key, tok } => {
                let token = self.tokens[key][tok];
                let answer = self
                    .store
                    .claim(self.delivery(key), token, lease)
                    .await
                    .unwrap();
                let state = self.keys[key];
                match (state, answer) {
                    (Key::Free, Claim::New(t)) => assert_eq!(t, token),
                    (Key::Done { .. }, Claim::Done) => {}
                    (Key::Claimed { until, .. }, Claim::InFlight { retry_after }) => {
                        assert!(now <= until, "claim k{key} t{tok} at {now}: in flight, but the lease ended ({state:?})");
                        assert!(
                            retry_after <= Duration::from_millis((until - now) as u64 + 1),
                            "claim k{key}: retry after {retry_after:?} at {now}, past the lease's end ({state:?})"
                        );
                    }
                    (Key::Claimed { until, .. }, Claim::New(t)) => {
                        assert_eq!(t, token);
                        assert!(
                            now >= until,
                            "claim k{key} t{tok} at {now}: granted while the lease is live by \
                             the store's clock ({state:?}): granted twice"
                        );
                    }
                    (state, answer) => {
                        panic!("claim k{key} t{tok} at {now}: {answer:?}, but the key is {state:?}")
                    }
                }
                if let Claim::New(_) = answer {
                    self.keys[key] = Key::Claimed {
                        holder: tok,
                        until: now + LEASE_MS,
                    };
                }
            }
            Step::Renew { key, tok } => {
                let token = self.tokens[key][tok];
                let answer = self
                    .store
                    .renew(self.delivery(key), token, lease)
                    .await
                    .unwrap();
                let state = self.keys[key];
                match (state, answer) {
                    (Key::Claimed { holder, .. }, Renewed::Held) if holder == tok => {
                        self.keys[key] = Key::Claimed {
                            holder,
                            until: now + LEASE_MS,
                        };
                    }
                    (Key::Claimed { holder, .. }, Renewed::Fenced) if holder != tok => {}
                    (Key::Free | Key::Done { .. }, Renewed::Fenced) => {}
                    (state, answer) => {
                        panic!("renew k{key} t{tok} at {now}: {answer:?}, but the key is {state:?}")
                    }
                }
            }
            Step::Complete { key, tok } => {
                let token = self.tokens[key][tok];
                let answer = self
                    .store
                    .complete(self.delivery(key), token)
                    .await
                    .unwrap();
                let state = self.keys[key];
                match (state, answer) {
                    (Key::Claimed { holder, .. }, Completed::Done) if holder == tok => {
                        self.keys[key] = Key::Done { by: tok };
                    }
                    (Key::Done { by }, Completed::Done) if by == tok => {}
                    (Key::Done { by }, Completed::Fenced) if by != tok => {}
                    (Key::Claimed { holder, .. }, Completed::Fenced) if holder != tok => {}
                    (Key::Free, Completed::Fenced) => {}
                    (state, answer) => panic!(
                        "complete k{key} t{tok} at {now}: {answer:?}, but the key is {state:?}"
                    ),
                }
            }
            Step::Release { key, tok } => {
                let token = self.tokens[key][tok];
                self.store.release(self.delivery(key), token).await.unwrap();
                if let Key::Claimed { holder, .. } = self.keys[key] {
                    if holder == tok {
                        self.keys[key] = Key::Free;
                    }
                }
            }
        }
    }
}

static OPS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

pub struct SqliteClockTest;

impl StateMachineTest for SqliteClockTest {
    type SystemUnderTest = Sut;
    type Reference = Reference;

    fn init_test(_: &()) -> Sut {
        let now = Arc::new(AtomicI64::new(1_700_000_000_000));
        let clock = now.clone();
        let store = block_on(async {
            crate::common::stores::sqlite().await.with_clock(move || {
                UNIX_EPOCH + Duration::from_millis(clock.load(Ordering::SeqCst) as u64)
            })
        });
        Sut {
            store,
            now,
            source: format!("clock-{}", uuid::Uuid::new_v4().simple()),
            tokens: std::array::from_fn(|_| std::array::from_fn(|_| Token::new())),
            keys: [Key::Free; KEYS],
        }
    }

    fn apply(mut sut: Sut, _: &(), step: Step) -> Sut {
        block_on(async {
            tokio::time::timeout(Duration::from_secs(30), sut.step(&step))
                .await
                .unwrap_or_else(|_| panic!("{step:?}: not within 30 s"));
        });
        OPS.fetch_add(1, Ordering::Relaxed);
        sut
    }
}

#[test]
fn sqlite_leases() {
    check::<SqliteClockTest>(
        "clock::sqlite_leases",
        "tests/proptest-regressions/model-clock-sqlite.txt",
        (24, 1..40),
        "clock jumps | SQLite leases",
        || format!("ops={}", OPS.load(Ordering::Relaxed)),
    );
}

/// The verifier on a clock that jumps: each delivery signed `signed` s from the tests'
/// "now", verified after the clock moved by the jumps so far.
#[test]
fn verifier_clock() {
    let started = std::time::Instant::now();
    let name = "clock::verifier_clock";
    let config = config(
        name,
        "tests/proptest-regressions/model-clock-verifier.txt",
        64,
    );
    let tolerance = 300i64;
    let mut runner = proptest::test_runner::TestRunner::new(config.clone());
    let steps = prop::collection::vec(
        (
            prop_oneof![Just(0i64), -3_600..3_600i64, -400..400i64],
            prop_oneof![
                -400..400i64,
                Just(-tolerance),
                Just(tolerance),
                Just(tolerance + 1)
            ],
        ),
        1..20,
    );
    let deliveries = std::sync::atomic::AtomicUsize::new(0);
    let result = runner.run(&steps, |steps| {
        let offset = Arc::new(AtomicI64::new(0));
        let clock = offset.clone();
        let base = crate::common::NOW as i64;
        let verifier = tower_webhook::Verifier::new(Scheme::standard(), [SECRET])
            .unwrap()
            .with_tolerance(Duration::from_secs(tolerance as u64))
            .with_clock(move || {
                UNIX_EPOCH + Duration::from_secs((base + clock.load(Ordering::SeqCst)) as u64)
            });
        for (i, (jump, signed)) in steps.iter().enumerate() {
            let now = offset.fetch_add(*jump, Ordering::SeqCst) + jump;
            let at = base + signed;
            let body = format!(r#"{{"n":{i}}}"#);
            let headers = Scheme::standard()
                .sign(
                    [SECRET],
                    &format!("msg_{i}"),
                    UNIX_EPOCH + Duration::from_secs(at as u64),
                    body.as_bytes(),
                )
                .unwrap();
            let verified = verifier.verify(&headers, body.into());
            deliveries.fetch_add(1, Ordering::Relaxed);
            let within = (at - (base + now)).abs() <= tolerance;
            prop_assert_eq!(
                verified.is_ok(),
                within,
                "delivery {} signed at now{:+} s, the clock at now{:+} s: {:?}",
                i,
                signed,
                now,
                verified.err()
            );
        }
        Ok(())
    });
    eprintln!(
        "MODEL | clock jumps | verifier | cases={} | deliveries={} | {:.1?}",
        config.cases,
        deliveries.load(Ordering::Relaxed),
        started.elapsed()
    );
    if let Err(e) = result {
        panic!("{name}: {e}");
    }
}
