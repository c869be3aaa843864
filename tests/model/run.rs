//! How the models run: one Tokio runtime for the whole binary (stores and their pools
//! live on it across cases), proptest's configuration from the environment, a seed that
//! is printed and replays, and the regression files kept under `tests/proptest-regressions`.

use std::future::Future;
use std::ops::Range;
use std::sync::{Arc, LazyLock, OnceLock};

use proptest::test_runner::{Config, FileFailurePersistence, RngSeed};
use proptest_state_machine::{ReferenceStateMachine, StateMachineTest};
use tower_webhook::store::DedupeStore;

use crate::common::stores::{self, Kind};

static RUNTIME: LazyLock<tokio::runtime::Runtime> = LazyLock::new(|| {
    quiet_asked_panics();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
});

/// Runs `future` on the binary's runtime, from a test's own thread.
pub fn block_on<F: Future>(future: F) -> F::Output {
    RUNTIME.block_on(future)
}

/// Spawns `future` on the binary's runtime.
pub fn spawn<F>(future: F) -> tokio::task::JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    RUNTIME.spawn(future)
}

/// One store of each kind for a model's whole run (a database or prefix of its own,
/// opened once): each case isolates itself by a source name of its own.
pub fn shared_store(
    slot: &'static [OnceLock<Arc<dyn DedupeStore>>; 4],
    kind: Kind,
) -> Arc<dyn DedupeStore> {
    let i = Kind::ALL.iter().position(|k| *k == kind).expect("a kind");
    slot[i].get_or_init(|| block_on(stores::open(kind))).clone()
}

/// How many cases a model runs per store: `TOWER_WEBHOOK_MODEL_CASES`, else ten times
/// `ci` under `TOWER_WEBHOOK_SOAK=1`, else `ci` (the budget `.ci/run` spends).
pub fn cases(ci: u32) -> u32 {
    if let Some(n) = std::env::var("TOWER_WEBHOOK_MODEL_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
    {
        return n;
    }
    match std::env::var("TOWER_WEBHOOK_SOAK").as_deref() {
        Ok("1") => ci * 10,
        _ => ci,
    }
}

/// Runs model `T` as the test `name`: [`config`]'s cases (`ci` in CI) of `steps`
/// operations each, against its real store; then prints `MODEL | <what> | cases=… |
/// <counts()> | <time>` (RELIABILITY.md's figures) and fails with the minimal failing
/// sequence, if one was found.
pub fn check<T: StateMachineTest>(
    name: &str,
    regressions: &'static str,
    (ci, steps): (u32, Range<usize>),
    what: &str,
    counts: impl FnOnce() -> String,
) {
    let started = std::time::Instant::now();
    let config = config(name, regressions, ci);
    let mut runner = proptest::test_runner::TestRunner::new(config.clone());
    let result = runner.run(
        &T::Reference::sequential_strategy(steps),
        |(state, transitions, seen)| {
            T::test_sequential(config.clone(), state, transitions, seen);
            Ok(())
        },
    );
    eprintln!(
        "MODEL | {what} | cases={} | {} | {:.1?}",
        config.cases,
        counts(),
        started.elapsed()
    );
    if let Err(e) = result {
        panic!("{name}: {e}");
    }
}

/// The configuration of model `name` (on one store): `ci` cases (see [`cases`]), the
/// seed of `TOWER_WEBHOOK_MODEL_SEED` or a random one — printed, so a failing run
/// replays — and failures kept in `tests/proptest-regressions/<file>` (replayed first on
/// every later run, so a seed that failed once stays a regression test).
pub fn config(name: &str, regressions: &'static str, ci: u32) -> Config {
    let seed = the_seed();
    let cases = cases(ci);
    eprintln!(
        "model {name}: {cases} cases, seed {seed} (replay: TOWER_WEBHOOK_MODEL_SEED={seed} \
         cargo test --all-features --test model -- {name})"
    );
    Config {
        cases,
        rng_seed: RngSeed::Fixed(seed),
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(regressions))),
        // Each case runs against a real store, in real time: shrink within bounds.
        max_shrink_iters: 200,
        max_shrink_time: 120_000,
        ..Config::default()
    }
}

/// `TOWER_WEBHOOK_MODEL_SEED`, or a random seed.
fn the_seed() -> u64 {
    std::env::var("TOWER_WEBHOOK_MODEL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..))
}

/// The seed of round `round` of test `name`, printed so that it replays: round 0 takes
/// `TOWER_WEBHOOK_MODEL_SEED` as it is.
pub fn seed(name: &str, round: u32) -> u64 {
    let seed = the_seed().wrapping_add(u64::from(round));
    eprintln!(
        "model {name} round {round}: seed {seed} (replay: TOWER_WEBHOOK_MODEL_SEED={seed} \
         cargo test --all-features --test model -- {name})"
    );
    seed
}

/// Panics the models ask handlers and processors for are not printed (the rest are).
fn quiet_asked_panics() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let asked = info
            .payload()
            .downcast_ref::<&str>()
            .is_some_and(|m| m.contains("the model asked"));
        if !asked {
            previous(info);
        }
    }));
}
