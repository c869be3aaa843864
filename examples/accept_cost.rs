//! A driver for counting what the SQL inbox's accept costs its process, in instructions
//! (`valgrind --tool=callgrind`): `N` verified 1 KiB Standard Webhooks deliveries, their
//! requests built (signed and verified) up front, then given to the inbox's `Accept`
//! service 32 at a time on a fresh SQLite file or PostgreSQL database; with `--dry` the
//! requests are built and nothing is accepted, so the difference of the two runs over
//! `N` is the accept's cost an event (the service, the writer, the driver's SQL client).
//!
//! ```text
//! cargo build --release --example accept_cost
//! valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.%p \
//!     target/release/examples/accept_cost sqlite 2000 [--keys] [--processors 3] [--dry]
//! valgrind ... accept_cost postgres://postgres@127.0.0.1:5432/postgres 2000 ...
//! ```
//!
//! PostgreSQL's URL names a server the driver creates a fresh database on (and drops
//! after). Only the driver's process is counted: the PostgreSQL server's work is not.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http_body_util::Full;
use tower::ServiceExt as _;
use tower_webhook::inbox::{Inbox, ProcessorSpec};
use tower_webhook::seal::{Key, KeyRing};
use tower_webhook::store::{PgStore, SqliteStore};
use tower_webhook::{Scheme, Verifier};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
/// Requests in flight at once, so the writer's batches hold several accepts.
const IN_FLIGHT: usize = 32;

/// A 1 KiB `invoice.paid` body for event `n`.
fn body(n: usize) -> Vec<u8> {
    let mut body = format!(
        r#"{{"id":"evt_{n}","type":"invoice.paid","data":{{"object":{{"id":"in_{n}","blob":""#
    )
    .into_bytes();
    body.resize(1024 - 4, b'a');
    body.extend_from_slice(br#""}}}"#);
    body
}

/// Delivery `n`, signed and verified: its request, the `Event` in its extensions and a
/// few headers besides the signature's, as a provider's carry.
fn request(verifier: &Verifier, n: usize) -> http::Request<Full<Bytes>> {
    let body = Bytes::from(body(n));
    let id = format!("msg_{n:08}");
    let mut headers = Scheme::standard()
        .sign([SECRET], &id, SystemTime::now(), &body)
        .expect("a valid secret");
    for (name, value) in [
        ("content-type", "application/json"),
        ("user-agent", "Svix-Webhooks/1.62.0"),
        ("accept", "*/*"),
        ("host", "receiver.example.com"),
    ] {
        headers.insert(name, value.parse().expect("a header value"));
    }
    let event = verifier.verify(&headers, body.clone()).expect("verified");
    let mut request = http::Request::post("/webhooks")
        .body(Full::new(body))
        .expect("a request");
    *request.headers_mut() = headers;
    request.extensions_mut().insert(event);
    request
}

/// `--help` and `-h` print what it does and exit 0.
#[derive(clap::Parser)]
#[command(
    name = "accept_cost",
    about = "Accepts N verified 1 KiB deliveries into a fresh SQL inbox, 32 in flight, \
        for counting the accept's instructions with valgrind --tool=callgrind."
)]
struct Args {
    /// `sqlite` (a temporary file), or a PostgreSQL server's URL (a fresh database on it).
    db: String,
    /// How many deliveries.
    n: usize,
    /// Seal with a key ring of one key.
    #[arg(long)]
    keys: bool,
    /// How many processors each event is routed to.
    #[arg(long, default_value_t = 1)]
    processors: usize,
    /// Build the requests, accept nothing (the baseline to subtract).
    #[arg(long)]
    dry: bool,
}

#[tokio::main]
async fn main() {
    let args = <Args as clap::Parser>::parse();
    let (db, n, processors) = (args.db.as_str(), args.n, args.processors);
    let verifier = Verifier::new(Scheme::standard(), [SECRET]).expect("a valid secret");
    let requests: Vec<_> = (0..n).map(|i| request(&verifier, i)).collect();

    let (inbox, cleanup) = open(db).await;
    let mut inbox = inbox;
    if processors > 1 {
        let specs = (0..processors).map(|p| ProcessorSpec::new(format!("p{p}")).expect("a name"));
        inbox = inbox.with_processors(specs).expect("processors");
    }
    if args.keys {
        let ring = KeyRing::new([Key::new("k1", [7; 32]).expect("a key")]).expect("a ring");
        inbox = inbox.with_keys(ring);
    }
    if !args.dry {
        let service = inbox.accept_service();
        let requests = Arc::new(std::sync::Mutex::new(requests));
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..IN_FLIGHT {
            let (service, requests) = (service.clone(), requests.clone());
            tasks.spawn(async move {
                loop {
                    let next = requests.lock().expect("not poisoned").pop();
                    let Some(request) = next else { break };
                    let response = service.clone().oneshot(request).await.expect("infallible");
                    assert_eq!(response.status(), 204, "every delivery is new and stored");
                }
            });
        }
        while let Some(done) = tasks.join_next().await {
            done.expect("a task ran to its end");
        }
    }
    cleanup.await;
}

/// A fresh inbox on `db` (`sqlite`: a temporary file; a PostgreSQL URL: a new database
/// on that server), and what removes it.
async fn open(
    db: &str,
) -> (
    Inbox,
    std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>,
) {
    let unique = format!(
        "accept_cost_{}_{}",
        std::process::id(),
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or(Duration::ZERO)
            .as_nanos()
    );
    if db == "sqlite" {
        let path = std::env::temp_dir().join(format!("{unique}.db"));
        let store = SqliteStore::open(&path).await.expect("a fresh SQLite file");
        let inbox = Inbox::sqlite(&store);
        let cleanup = async move {
            drop(store);
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
            }
        };
        return (inbox, Box::pin(cleanup));
    }
    let admin = sqlx::PgPool::connect(db)
        .await
        .expect("the PostgreSQL server");
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {unique}")))
        .execute(&admin)
        .await
        .expect("a fresh database");
    let (base, _) = db.rsplit_once('/').expect("a URL with a database");
    let store = PgStore::connect(&format!("{base}/{unique}"))
        .await
        .expect("the fresh database");
    let inbox = Inbox::postgres(&store);
    let cleanup = async move {
        store.pool().close().await;
        let drop_it = format!("DROP DATABASE IF EXISTS {unique} WITH (FORCE)");
        let _ = sqlx::query(sqlx::AssertSqlSafe(drop_it))
            .execute(&admin)
            .await;
    };
    (inbox, Box::pin(cleanup))
}
