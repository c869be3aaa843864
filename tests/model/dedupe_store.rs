//! Model A: the [`DedupeStore`] contract, run against every store.
//!
//! Random sequences of operations on three keys of a case's own source, each claimed
//! under up to four attempt tokens: claims (alone, and several at once), renewals,
//! completions, releases, each sometimes sent twice (the first answer lost: the retry
//! must answer as the contract says), stale tokens (fenced), leases of 300 ms left to run
//! out, `prune`, and `Once` business keys beside the event keys (`Once::run`, pruned only
//! by `Once::prune`).
//!
//! The model is a map from key to `Free | Claimed { holder, lease end } | Done { by }`. The
//! stores run on wall clocks (PostgreSQL and Redis on the server's), so a lease's end is
//! known as a window: from the call's start plus the lease to its answer plus the lease
//! (and a margin for clock granularity). An operation that lands before the window is
//! answered as if the claim were live, one after it as if it had run out, and one within
//! it may get either answer: the model follows the store's. Every answer is compared with
//! the model's as it comes.
//!
//! proptest-state-machine's reference state only steers generation (which token last
//! claimed a key, so renewals and completions hit the holder often); the model that
//! judges the answers is [`Model`], which needs the times the calls really took.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use proptest::prelude::*;
use proptest_state_machine::{ReferenceStateMachine, StateMachineTest};
use tokio::time::Instant;
use tower_webhook::once::{Once, OnceErrorKind, Ran};
use tower_webhook::store::{Claim, Completed, DedupeStore, Delivery, Renewed, Retention, Token};

use crate::common::stores::Kind;
use crate::run::{block_on, check, shared_store};

const KEYS: usize = 3;
const TOKENS: usize = 4;
const LEASE: Duration = Duration::from_millis(300);
/// The lease of racing claims: long, so that every racer lands within it however slow the
/// store is under load (one lease granted twice in a race is then a bug, never a lease
/// that ran out between two racers).
const RACE_LEASE: Duration = Duration::from_secs(30);
/// Clock granularity between the process, the database and Redis (milliseconds, rounded).
const MARGIN: Duration = Duration::from_millis(15);

/// One step.
#[derive(Clone, Debug)]
pub enum Step {
    /// `claim` under token `tok`.
    Claim {
        key: usize,
        tok: usize,
    },
    /// `claim` under each token at once.
    Race {
        key: usize,
        toks: Vec<usize>,
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
    /// The operation twice: the first answer is lost to the caller, who retries.
    Twice(Box<Step>),
    /// Lets time pass (leases run out).
    Sleep {
        ms: u64,
    },
    /// `prune` of every done event key (a zero retention).
    Prune,
    /// `Once::run` of business key `key`, its action succeeding or failing.
    OnceRun {
        key: usize,
        ok: bool,
    },
    /// `Once::prune` of every done business key.
    OncePrune,
}

/// Generation only: which token last claimed each key.
#[derive(Clone, Debug, Default)]
pub struct Steer {
    last: [Option<usize>; KEYS],
}

pub struct Reference;

impl ReferenceStateMachine for Reference {
    type State = Steer;
    type Transition = Step;

    fn init_state() -> BoxedStrategy<Steer> {
        Just(Steer::default()).boxed()
    }

    fn transitions(state: &Steer) -> BoxedStrategy<Step> {
        let last = state.last;
        // The holder half of the time, any token otherwise.
        let tok_for = move |key: usize| {
            let holder = last[key];
            (any::<bool>(), 0..TOKENS).prop_map(move |(pick, t)| match (pick, holder) {
                (true, Some(h)) => h,
                _ => t,
            })
        };
        let key = 0..KEYS;
        let keyed = move |f: fn(usize, usize) -> Step| {
            key.clone()
                .prop_flat_map(move |k| tok_for(k).prop_map(move |t| f(k, t)))
        };
        let claim = keyed(|key, tok| Step::Claim { key, tok });
        let renew = keyed(|key, tok| Step::Renew { key, tok });
        let complete = keyed(|key, tok| Step::Complete { key, tok });
        let release = keyed(|key, tok| Step::Release { key, tok });
        let once_run =
            (0..KEYS, prop::bool::weighted(0.8)).prop_map(|(key, ok)| Step::OnceRun { key, ok });
        let race = (0..KEYS, prop::collection::vec(0..TOKENS, 2..=TOKENS))
            .prop_map(|(key, toks)| Step::Race { key, toks });
        let twice = prop_oneof![
            complete.clone(),
            renew.clone(),
            release.clone(),
            claim.clone()
        ]
        .prop_map(|s| Step::Twice(Box::new(s)));
        let sleep =
            prop_oneof![Just(60u64), Just(200), Just(400)].prop_map(|ms| Step::Sleep { ms });
        prop_oneof![
            6 => claim,
            2 => race,
            4 => renew,
            4 => complete,
            3 => release,
            3 => twice,
            3 => sleep,
            1 => Just(Step::Prune),
            2 => once_run,
            1 => Just(Step::OncePrune),
        ]
        .boxed()
    }

    fn apply(mut state: Steer, step: &Step) -> Steer {
        match step {
            Step::Claim { key, tok } => state.last[*key] = Some(*tok),
            Step::Race { key, toks } => state.last[*key] = toks.first().copied(),
            Step::Twice(inner) => return Self::apply(state, inner),
            _ => {}
        }
        state
    }
}

/// A key's state in the model.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Key {
    /// Never claimed, released, or pruned.
    Free,
    /// Held by token `holder`; the lease ends between `lo` and `hi`. `pruned`: a prune ran
    /// while the lease may have run out (SQL stores delete such a row, memory keeps it).
    Claimed {
        holder: usize,
        lo: Instant,
        hi: Instant,
        pruned: bool,
    },
    /// Completed by token `by`.
    Done { by: usize },
}

/// Whether a lease ending within `[lo, hi]` is live for a store that read its clock
/// between `t0` and `t1`: `Some(true)` live for sure, `Some(false)` run out for sure,
/// `None` either.
fn live(lo: Instant, hi: Instant, t0: Instant, t1: Instant) -> Option<bool> {
    if t1 < lo {
        Some(true)
    } else if t0 >= hi {
        Some(false)
    } else {
        None
    }
}

fn lease_window(t0: Instant, t1: Instant, lease: Duration) -> (Instant, Instant) {
    (t0 + lease - MARGIN, t1 + lease + MARGIN)
}

/// The reference model, and the store beside it.
pub struct Model {
    kind: Kind,
    store: Arc<dyn DedupeStore>,
    source: String,
    tokens: [[Token; TOKENS]; KEYS],
    keys: [Key; KEYS],
    once: Once,
    once_done: [bool; KEYS],
    /// Operations run, for the report.
    ops: usize,
}

impl Model {
    fn delivery(&self, key: usize) -> Delivery {
        Delivery::new(self.source.clone(), format!("k{key}"))
    }

    /// Claims `key` under `tok`; checks the answer against the model and follows it.
    async fn claim(&mut self, key: usize, tok: usize) {
        let token = self.tokens[key][tok];
        let t0 = Instant::now();
        let answer = self.store.claim(self.delivery(key), token, LEASE).await;
        let t1 = Instant::now();
        self.ops += 1;
        let answer = answer.unwrap_or_else(|e| panic!("claim k{key} t{tok}: {e:?}"));
        self.judge_claim(key, tok, (t0, t1), LEASE, answer);
    }

    fn judge_claim(
        &mut self,
        key: usize,
        tok: usize,
        (t0, t1): (Instant, Instant),
        lease: Duration,
        answer: Claim,
    ) {
        let state = self.keys[key];
        let new = |m: &mut Model| {
            let (lo, hi) = lease_window(t0, t1, lease);
            m.keys[key] = Key::Claimed {
                holder: tok,
                lo,
                hi,
                pruned: false,
            };
        };
        match (state, answer) {
            (Key::Free, Claim::New(t)) => {
                assert_eq!(
                    t, self.tokens[key][tok],
                    "claim k{key}: the token asked for"
                );
                new(self);
            }
            (Key::Done { .. }, Claim::Done) => {}
            (Key::Claimed { lo, hi, .. }, Claim::InFlight { retry_after }) => {
                assert_ne!(
                    live(lo, hi, t0, t1),
                    Some(false),
                    "claim k{key} t{tok}: in flight, but the lease ran out ({state:?})"
                );
                assert!(
                    retry_after <= hi.saturating_duration_since(t0) + MARGIN,
                    "claim k{key}: retry after {retry_after:?}, past the lease's end ({state:?})"
                );
            }
            (Key::Claimed { lo, hi, .. }, Claim::New(t)) => {
                assert_eq!(
                    t, self.tokens[key][tok],
                    "claim k{key}: the token asked for"
                );
                assert_ne!(
                    live(lo, hi, t0, t1),
                    Some(true),
                    "claim k{key} t{tok}: taken over while the lease was live ({state:?})"
                );
                new(self);
            }
            (state, answer) => panic!("claim k{key} t{tok}: {answer:?}, but the key is {state:?}"),
        }
    }

    async fn race(&mut self, key: usize, toks: &[usize]) {
        let t0 = Instant::now();
        let calls = toks.iter().map(|&tok| {
            let store = self.store.clone();
            let (d, token) = (self.delivery(key), self.tokens[key][tok]);
            async move { store.claim(d, token, RACE_LEASE).await }
        });
        let answers = futures_util::future::join_all(calls).await;
        let t1 = Instant::now();
        self.ops += toks.len();
        let answers: Vec<Claim> = answers
            .into_iter()
            .map(|a| a.unwrap_or_else(|e| panic!("race k{key}: {e:?}")))
            .collect();
        let winners: Vec<usize> = answers
            .iter()
            .enumerate()
            .filter(|(_, a)| matches!(a, Claim::New(_)))
            .map(|(i, _)| i)
            .collect();
        assert!(
            winners.len() <= 1,
            "race k{key} {toks:?}: {} claims granted at once: {answers:?}",
            winners.len()
        );
        // The winner first, then the losers, as if one after the other.
        let order = winners
            .iter()
            .copied()
            .chain((0..toks.len()).filter(|i| !winners.contains(i)));
        for i in order {
            let before = self.keys[key];
            match (before, answers[i]) {
                // A loser that raced the winner's claim: in flight under the winner's.
                (Key::Claimed { .. }, Claim::InFlight { .. }) if !winners.is_empty() => {}
                _ => self.judge_claim(key, toks[i], (t0, t1), RACE_LEASE, answers[i]),
            }
        }
        if let (Key::Free, true) = (self.keys[key], winners.is_empty()) {
            panic!("race k{key} {toks:?}: a free key, and no claim granted: {answers:?}");
        }
    }

    async fn renew(&mut self, key: usize, tok: usize) {
        let token = self.tokens[key][tok];
        let t0 = Instant::now();
        let answer = self.store.renew(self.delivery(key), token, LEASE).await;
        let t1 = Instant::now();
        self.ops += 1;
        let answer = answer.unwrap_or_else(|e| panic!("renew k{key} t{tok}: {e:?}"));
        let state = self.keys[key];
        match (state, answer) {
            (Key::Claimed { holder, .. }, Renewed::Held) if holder == tok => {
                let (lo, hi) = lease_window(t0, t1, LEASE);
                self.keys[key] = Key::Claimed {
                    holder,
                    lo,
                    hi,
                    pruned: false,
                };
            }
            // A prune may have deleted the row whose lease had run out (SQL stores).
            (
                Key::Claimed {
                    holder,
                    lo,
                    hi,
                    pruned: true,
                },
                Renewed::Fenced,
            ) if holder == tok && live(lo, hi, t0, t1) != Some(true) => {
                self.keys[key] = Key::Free;
            }
            (Key::Claimed { holder, .. }, Renewed::Fenced) if holder != tok => {}
            // Redis drops a key when its lease runs out (memory may sweep it): a late
            // renewal finds nothing to renew (the completion still marks it done, below).
            (Key::Claimed { lo, hi, .. }, Renewed::Fenced)
                if self.kind.forgets_lapsed_claims() && live(lo, hi, t0, t1) != Some(true) => {}
            (Key::Free | Key::Done { .. }, Renewed::Fenced) => {}
            (state, answer) => panic!(
                "renew k{key} t{tok}: {answer:?}, but the key is {state:?} (a claim is \
                 renewed while its token holds it, even past its lease when nobody took it)"
            ),
        }
    }

    async fn complete(&mut self, key: usize, tok: usize) {
        let token = self.tokens[key][tok];
        let t0 = Instant::now();
        let answer = self.store.complete(self.delivery(key), token).await;
        let t1 = Instant::now();
        self.ops += 1;
        let answer = answer.unwrap_or_else(|e| panic!("complete k{key} t{tok}: {e:?}"));
        let state = self.keys[key];
        match (state, answer) {
            (Key::Claimed { holder, .. }, Completed::Done) if holder == tok => {
                self.keys[key] = Key::Done { by: tok };
            }
            (
                Key::Claimed {
                    holder,
                    lo,
                    hi,
                    pruned: true,
                },
                Completed::Fenced,
            ) if holder == tok && live(lo, hi, t0, t1) != Some(true) => {
                self.keys[key] = Key::Free;
            }
            (Key::Done { by }, Completed::Done) if by == tok => {}
            (Key::Done { by }, Completed::Fenced) if by != tok => {}
            (Key::Claimed { holder, .. }, Completed::Fenced) if holder != tok => {}
            (Key::Free, Completed::Fenced) => {}
            // Memory and Redis forget a claim whose lease ran out: a completion that finds
            // nothing takes it for its own lapsed claim and marks the key done (the layers
            // complete only keys they claimed, so nothing else completes an absent key).
            (Key::Free, Completed::Done) if self.kind.forgets_lapsed_claims() => {
                self.keys[key] = Key::Done { by: tok };
            }
            (Key::Claimed { lo, hi, .. }, Completed::Done)
                if self.kind.forgets_lapsed_claims() && live(lo, hi, t0, t1) != Some(true) =>
            {
                self.keys[key] = Key::Done { by: tok };
            }
            (state, answer) => panic!(
                "complete k{key} t{tok}: {answer:?}, but the key is {state:?} (completing \
                 is idempotent under the token that holds or completed the key, fenced \
                 otherwise)"
            ),
        }
    }

    async fn release(&mut self, key: usize, tok: usize) {
        let token = self.tokens[key][tok];
        let answer = self.store.release(self.delivery(key), token).await;
        self.ops += 1;
        answer.unwrap_or_else(|e| panic!("release k{key} t{tok}: {e:?}"));
        if let Key::Claimed { holder, .. } = self.keys[key] {
            if holder == tok {
                self.keys[key] = Key::Free;
            }
        }
    }

    async fn prune(&mut self) {
        // Everything done before it is done at least this long ago (the stores compare
        // with `<` in milliseconds).
        tokio::time::sleep(Duration::from_millis(5)).await;
        self.store
            .prune(Retention::shorter(Duration::ZERO))
            .await
            .unwrap_or_else(|e| panic!("prune: {e:?}"));
        self.ops += 1;
        for key in &mut self.keys {
            match key {
                Key::Done { .. } if self.kind.prunes() => *key = Key::Free,
                Key::Claimed { pruned, .. } => *pruned = true,
                _ => {}
            }
        }
    }

    async fn once_run(&mut self, key: usize, ok: bool) {
        let ran = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = ran.clone();
        let answer = self
            .once
            .run(&format!("k{key}"), move |_| async move {
                flag.store(true, std::sync::atomic::Ordering::SeqCst);
                if ok {
                    Ok(())
                } else {
                    Err("the action failed")
                }
            })
            .await;
        self.ops += 1;
        let ran = ran.load(std::sync::atomic::Ordering::SeqCst);
        match (self.once_done[key], answer) {
            (false, Ok(Ran::Now(()))) if ok && ran => self.once_done[key] = true,
            (false, Err(e)) if !ok && ran && e.kind() == OnceErrorKind::Action => {}
            (true, Ok(Ran::Already)) if !ran => {}
            (done, answer) => panic!(
                "once k{key} (done: {done}, action ok: {ok}): {answer:?}, the action ran: {ran}"
            ),
        }
    }

    async fn once_prune(&mut self) {
        tokio::time::sleep(Duration::from_millis(5)).await;
        self.once
            .prune(Duration::ZERO)
            .await
            .unwrap_or_else(|e| panic!("once prune: {e:?}"));
        self.ops += 1;
        self.once_done = [false; KEYS];
    }

    async fn step(&mut self, step: Step) {
        match step {
            Step::Claim { key, tok } => self.claim(key, tok).await,
            Step::Race { key, toks } => self.race(key, &toks).await,
            Step::Renew { key, tok } => self.renew(key, tok).await,
            Step::Complete { key, tok } => self.complete(key, tok).await,
            Step::Release { key, tok } => self.release(key, tok).await,
            Step::Twice(inner) => {
                Box::pin(self.step((*inner).clone())).await;
                Box::pin(self.step(*inner)).await;
            }
            Step::Sleep { ms } => tokio::time::sleep(Duration::from_millis(ms)).await,
            Step::Prune => self.prune().await,
            Step::OnceRun { key, ok } => self.once_run(key, ok).await,
            Step::OncePrune => self.once_prune().await,
        }
    }
}

/// Operations run by every model of this kind, for the report.
pub static OPS: [std::sync::atomic::AtomicUsize; 4] =
    [const { std::sync::atomic::AtomicUsize::new(0) }; 4];

static STORES: [OnceLock<Arc<dyn DedupeStore>>; 4] = [const { OnceLock::new() }; 4];

/// Which store a test runs on.
pub trait On: 'static {
    const KIND: Kind;
}

pub struct ContractTest<K>(std::marker::PhantomData<K>);

impl<K: On> StateMachineTest for ContractTest<K> {
    type SystemUnderTest = Model;
    type Reference = Reference;

    fn init_test(_: &Steer) -> Model {
        let store = shared_store(&STORES, K::KIND);
        let source = format!("model-{}", uuid::Uuid::new_v4().simple());
        Model {
            kind: K::KIND,
            once: Once::from_arc(store.clone(), &source),
            store,
            source,
            tokens: std::array::from_fn(|_| std::array::from_fn(|_| Token::new())),
            keys: [Key::Free; KEYS],
            once_done: [false; KEYS],
            ops: 0,
        }
    }

    fn apply(mut model: Model, _: &Steer, step: Step) -> Model {
        block_on(async {
            tokio::time::timeout(Duration::from_secs(30), model.step(step.clone()))
                .await
                .unwrap_or_else(|_| panic!("{step:?}: no answer within 30 s"));
        });
        model
    }

    fn teardown(model: Model, _: Steer) {
        let i = Kind::ALL.iter().position(|k| *k == model.kind).unwrap();
        OPS[i].fetch_add(model.ops, std::sync::atomic::Ordering::Relaxed);
    }
}

macro_rules! on {
    ($marker:ident, $kind:expr, $test:ident, $file:literal) => {
        pub struct $marker;
        impl On for $marker {
            const KIND: Kind = $kind;
        }

        #[test]
        fn $test() {
            let i = Kind::ALL.iter().position(|k| *k == $kind).unwrap();
            check::<ContractTest<$marker>>(
                concat!("dedupe_store::", stringify!($test)),
                concat!("tests/proptest-regressions/", $file),
                (48, 1..40),
                &format!("dedupe store | {:?}", $kind),
                || format!("ops={}", OPS[i].load(std::sync::atomic::Ordering::Relaxed)),
            );
        }
    };
}

on!(
    OnMemory,
    Kind::Memory,
    memory,
    "model-dedupe-store-memory.txt"
);
on!(
    OnSqlite,
    Kind::Sqlite,
    sqlite,
    "model-dedupe-store-sqlite.txt"
);
on!(
    OnPostgres,
    Kind::Postgres,
    postgres,
    "model-dedupe-store-postgres.txt"
);
on!(OnRedis, Kind::Redis, redis, "model-dedupe-store-redis.txt");

/// Found by this model on PostgreSQL: claims batched into one statement were matched to
/// their answers by token alone, so two concurrent claims of one key under one token (a
/// caller retrying a claim whose answer was late) were both answered `New`. Every store
/// grants exactly one of any number of concurrent claims.
#[test]
fn one_of_concurrent_claims_under_one_token_is_granted_on_every_store() {
    block_on(async {
        for kind in Kind::ALL {
            let store = crate::common::stores::open(kind).await;
            for round in 0..10 {
                let (d, token) = (
                    Delivery::new("same-token", format!("k{round}")),
                    Token::new(),
                );
                let calls = (0..8).map(|_| store.claim(d.clone(), token, Duration::from_secs(60)));
                let answers = futures_util::future::join_all(calls).await;
                let granted = answers
                    .iter()
                    .filter(|a| matches!(a, Ok(Claim::New(_))))
                    .count();
                assert_eq!(granted, 1, "{kind:?} round {round}: {answers:?}");
            }
        }
    });
}
