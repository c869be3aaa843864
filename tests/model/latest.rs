//! Model F: the ordering guard, `latest::advance`, on SQLite and PostgreSQL.
//!
//! The model is the newest time applied per (namespace, object). A case is a namespace
//! prefix of its own and a random sequence of advances of one of two objects in one of
//! two namespaces (the objects' ids shared by both namespaces), each in a transaction
//! of its own that commits or rolls back, and batches of two to four such advances run
//! at once. Times are milliseconds near one another (equal ones included, and one before
//! the epoch), so ties and millisecond precision are exercised.
//!
//! Checked, against the model: an advance answers `Newest` exactly when its time is not
//! older than every time committed before for its pair — equal times both apply, as
//! `latest` documents — else `Stale`; a rollback leaves the pair's time as it was; two
//! namespaces never share a clock. A concurrent batch is checked for some order of its
//! advances that gives every answer it gave (the row lock serialises them; which goes
//! first is not known), and the model then moves to that order's end.

use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use proptest::prelude::*;
use proptest_state_machine::{ReferenceStateMachine, StateMachineTest};
use tower_webhook::latest::{self, Order};
use tower_webhook::store::{PgStore, SqliteStore};

use crate::run::{block_on, check};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Advance {
    namespace: usize,
    object: usize,
    at_ms: i64,
    commit: bool,
}

#[derive(Clone, Debug)]
pub enum Step {
    One(Advance),
    /// Advances in transactions of their own at once (each commits).
    AtOnce(Vec<Advance>),
}

pub struct Reference;

fn advance() -> impl Strategy<Value = Advance> {
    (
        0..2usize,
        0..2usize,
        prop_oneof![8 => 0..6i64, 1 => Just(-3i64), 1 => Just(1_000i64)],
        prop::bool::weighted(0.8),
    )
        .prop_map(|(namespace, object, at_ms, commit)| Advance {
            namespace,
            object,
            at_ms,
            commit,
        })
}

impl ReferenceStateMachine for Reference {
    type State = ();
    type Transition = Step;

    fn init_state() -> BoxedStrategy<()> {
        Just(()).boxed()
    }

    fn transitions(_: &()) -> BoxedStrategy<Step> {
        prop_oneof![
            3 => advance().prop_map(Step::One),
            1 => prop::collection::vec(
                advance().prop_map(|a| Advance { commit: true, ..a }),
                2..=4
            )
            .prop_map(Step::AtOnce),
        ]
        .boxed()
    }

    fn apply(_: (), _: &Step) {}
}

/// The model's answer to `a` given the newest times committed, and the times after it.
fn model(newest: &mut HashMap<(usize, usize), i64>, a: &Advance) -> Order {
    let key = (a.namespace, a.object);
    let order = match newest.get(&key) {
        Some(t) if a.at_ms < *t => Order::Stale,
        _ => Order::Newest,
    };
    if order == Order::Newest && a.commit {
        newest.insert(key, a.at_ms);
    }
    order
}

fn time(ms: i64) -> SystemTime {
    match u64::try_from(ms) {
        Ok(ms) => UNIX_EPOCH + Duration::from_millis(ms),
        Err(_) => UNIX_EPOCH - Duration::from_millis(ms.unsigned_abs()),
    }
}

/// A database under test: one transaction per advance.
#[derive(Clone)]
pub enum Db {
    Sqlite(SqliteStore),
    Postgres(PgStore),
}

impl Db {
    async fn advance(&self, prefix: &str, a: Advance) -> Order {
        let namespace = format!("{prefix}-ns{}", a.namespace);
        let object = format!("obj_{}", a.object);
        let at = time(a.at_ms);
        macro_rules! in_tx {
            ($pool:expr) => {{
                let mut tx = $pool.begin().await.expect("a transaction");
                let order = latest::advance(&mut *tx, &namespace, &object, at)
                    .await
                    .unwrap_or_else(|e| panic!("{a:?}: the guard failed: {e}"));
                if a.commit {
                    tx.commit().await.expect("a commit");
                } else {
                    tx.rollback().await.expect("a rollback");
                }
                order
            }};
        }
        match self {
            Db::Sqlite(s) => in_tx!(s.pool()),
            Db::Postgres(s) => in_tx!(s.pool()),
        }
    }
}

pub struct Sut {
    db: Db,
    prefix: String,
    newest: HashMap<(usize, usize), i64>,
}

/// Every order of `items` (at most 4: 24 orders).
fn orders<T: Clone>(items: &[T]) -> Vec<Vec<T>> {
    if items.len() <= 1 {
        return vec![items.to_vec()];
    }
    let mut out = Vec::new();
    for i in 0..items.len() {
        let mut rest = items.to_vec();
        let first = rest.remove(i);
        for mut tail in orders(&rest) {
            tail.insert(0, first.clone());
            out.push(tail);
        }
    }
    out
}

impl Sut {
    async fn step(&mut self, step: &Step) {
        match step {
            Step::One(a) => {
                let got = self.db.advance(&self.prefix, *a).await;
                let want = model(&mut self.newest, a);
                assert_eq!(got, want, "{a:?} (newest before: {:?})", self.newest);
            }
            Step::AtOnce(batch) => {
                let calls = batch.iter().map(|a| {
                    let (db, prefix, a) = (self.db.clone(), self.prefix.clone(), *a);
                    crate::run::spawn(async move { db.advance(&prefix, a).await })
                });
                let got: Vec<(usize, Order)> = futures_util::future::join_all(calls)
                    .await
                    .into_iter()
                    .map(|r| r.expect("no panic"))
                    .enumerate()
                    .collect();
                let serial = orders(&got).into_iter().find_map(|order| {
                    let mut newest = self.newest.clone();
                    order
                        .iter()
                        .all(|(i, answer)| model(&mut newest, &batch[*i]) == *answer)
                        .then_some(newest)
                });
                match serial {
                    Some(newest) => self.newest = newest,
                    None => panic!(
                        "{batch:?} answered {got:?}: no order of them gives these answers \
                         (newest before: {:?})",
                        self.newest
                    ),
                }
            }
        }
    }
}

static SQLITE: OnceLock<SqliteStore> = OnceLock::new();
static POSTGRES: OnceLock<PgStore> = OnceLock::new();
pub static TOTALS: [std::sync::atomic::AtomicUsize; 2] =
    [const { std::sync::atomic::AtomicUsize::new(0) }; 2];

pub trait On: 'static {
    const I: usize;
    fn db() -> Db;
}

pub struct LatestTest<K>(std::marker::PhantomData<K>);

impl<K: On> StateMachineTest for LatestTest<K> {
    type SystemUnderTest = Sut;
    type Reference = Reference;

    fn init_test(_: &()) -> Sut {
        Sut {
            db: K::db(),
            prefix: format!("latest-{}", uuid::Uuid::new_v4().simple()),
            newest: HashMap::new(),
        }
    }

    fn apply(mut sut: Sut, _: &(), step: Step) -> Sut {
        block_on(async {
            tokio::time::timeout(Duration::from_secs(30), sut.step(&step))
                .await
                .unwrap_or_else(|_| panic!("{step:?}: not within 30 s"));
        });
        let n = match &step {
            Step::One(_) => 1,
            Step::AtOnce(b) => b.len(),
        };
        TOTALS[K::I].fetch_add(n, std::sync::atomic::Ordering::Relaxed);
        sut
    }
}

pub struct OnSqlite;
impl On for OnSqlite {
    const I: usize = 0;
    fn db() -> Db {
        // The default busy timeout: concurrent advances wait for the write lock.
        Db::Sqlite(
            SQLITE
                .get_or_init(|| {
                    block_on(SqliteStore::open(crate::common::stores::temp_sqlite_path())).unwrap()
                })
                .clone(),
        )
    }
}

pub struct OnPostgres;
impl On for OnPostgres {
    const I: usize = 1;
    fn db() -> Db {
        Db::Postgres(
            POSTGRES
                .get_or_init(|| block_on(crate::common::stores::postgres()))
                .clone(),
        )
    }
}

macro_rules! on {
    ($marker:ident, $what:literal, $test:ident, $file:literal) => {
        #[test]
        fn $test() {
            check::<LatestTest<$marker>>(
                concat!("latest::", stringify!($test)),
                concat!("tests/proptest-regressions/", $file),
                (32, 1..30),
                &format!("ordering guard | {}", $what),
                || {
                    format!(
                        "advances={}",
                        TOTALS[<$marker as On>::I].load(std::sync::atomic::Ordering::Relaxed)
                    )
                },
            );
        }
    };
}

on!(OnSqlite, "SQLite", sqlite, "model-latest-sqlite.txt");
on!(
    OnPostgres,
    "PostgreSQL",
    postgres,
    "model-latest-postgres.txt"
);
