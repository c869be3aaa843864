//! The seed guide's whole pattern, as a small shop: verify, store in the inbox and answer
//! 204 at once; a worker re-reads the payment intent from the provider's API and decides
//! on its *current* state — fulfil the order once, or close it.
//!
//! ```text
//! cargo run --example orders
//! ```
//!
//! Everything runs here, over loopback: a mock of the provider's API
//! (`GET /payment-intents/{id}`), the shop's receiver and worker on the embedded SQLite
//! store, and a provider that sends a day's awkward deliveries — a duplicate, a late
//! event, two different events about one order, a cancellation, a test-mode event, an
//! unknown type, a forged body, an API that fails once, and two customer updates out of
//! order. At the end it prints the orders and checks every rule held.

mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::{Path, State};
use axum::routing::{get, post_service};
use axum::{Json, Router};
use bytes::Bytes;
use http::StatusCode;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::{Deserialize, Serialize};
use sqlx::SqlitePool;
use tower::ServiceBuilder;
use tower_webhook::filter::{EventFilterLayer, Livemode};
use tower_webhook::inbox::{Attempt, Inbox, Worker};
use tower_webhook::latest::{self, Order};
use tower_webhook::once::{Once, Ran};
use tower_webhook::store::SqliteStore;
use tower_webhook::{Event, Scheme, Verifier, VerifyWebhookLayer};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// A payment intent as the provider's API serves it: its current state.
#[derive(Clone, Serialize, Deserialize)]
struct PaymentIntent {
    id: String,
    status: String,
    /// The shop's order number.
    reference: i64,
    livemode: bool,
}

/// The mock provider: payment intents by id; the first read of `pi_2` fails (503).
#[derive(Clone, Default)]
struct Provider {
    intents: Arc<Mutex<HashMap<String, PaymentIntent>>>,
    flaky_once: Arc<Mutex<Option<String>>>,
}

impl Provider {
    fn set(&self, id: &str, status: &str, reference: i64) {
        let intent = PaymentIntent {
            id: id.into(),
            status: status.into(),
            reference,
            livemode: true,
        };
        self.intents.lock().unwrap().insert(id.into(), intent);
    }
}

async fn get_intent(
    State(p): State<Provider>,
    Path(id): Path<String>,
) -> Result<Json<PaymentIntent>, StatusCode> {
    if p.flaky_once.lock().unwrap().take_if(|f| *f == id).is_some() {
        return Err(StatusCode::SERVICE_UNAVAILABLE);
    }
    let intent = p.intents.lock().unwrap().get(&id).cloned();
    intent.map(Json).ok_or(StatusCode::NOT_FOUND)
}

/// The shop's side effects outside its database, counted to check "once".
#[derive(Clone, Default)]
struct Outside {
    goods_handed_over: Arc<Mutex<HashMap<i64, usize>>>,
    emails_sent: Arc<Mutex<HashMap<i64, usize>>>,
    api_reads: Arc<AtomicUsize>,
}

/// The fields of an event body the worker reads itself.
#[derive(Deserialize)]
struct Body {
    created: u64,
    data: Data,
}
#[derive(Deserialize)]
struct Data {
    object: serde_json::Value,
}

/// The worker's processor: decides on the current state, never on the event's type.
#[derive(Clone)]
struct Shop {
    db: SqlitePool,
    api: String,
    emails: Once,
    outside: Outside,
}

impl Shop {
    async fn process(&self, event: Event) -> Result<(), String> {
        let ty = event.event_type().unwrap_or_default();
        let body: Body = event.json().map_err(|e| format!("not our envelope: {e}"))?;
        if ty == "customer.updated" {
            return self.customer_updated(event.source(), &body).await;
        }
        // payment_intent.*: re-read the intent, whichever event this was.
        let id = event.object_id().ok_or("no payment intent id")?;
        let pi = self.read_intent(id).await?;
        let order: Option<(bool,)> = sqlx::query_as("SELECT livemode FROM orders WHERE id = ?1")
            .bind(pi.reference)
            .fetch_optional(&self.db)
            .await
            .map_err(|e| e.to_string())?;
        match order {
            Some((livemode,)) if livemode == pi.livemode => {}
            _ => return Ok(()), // not our order, or test ≠ live: nothing to do
        }
        match pi.status.as_str() {
            "succeeded" => self.fulfil_once(pi.reference).await,
            "canceled" | "expired" => self.close(pi.reference).await,
            _ => Ok(()), // processing, requires_action…: a later event brings news
        }
    }

    async fn read_intent(&self, id: &str) -> Result<PaymentIntent, String> {
        self.outside.api_reads.fetch_add(1, Ordering::Relaxed);
        let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
        let uri = format!("{}/payment-intents/{id}", self.api);
        let response = client
            .get(uri.parse().map_err(|_| "bad intent id")?)
            .await
            .map_err(|e| e.to_string())?;
        if !response.status().is_success() {
            return Err(format!("provider API: {}", response.status())); // retried later
        }
        let bytes = response
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?;
        serde_json::from_slice(&bytes.to_bytes()).map_err(|e| e.to_string())
    }

    /// Marks the order fulfilled on its row, and hands the goods over only if this call
    /// made the change: two different events cannot fulfil one order twice.
    async fn fulfil_once(&self, order: i64) -> Result<(), String> {
        let mut tx = self.db.begin().await.map_err(|e| e.to_string())?;
        let changed = sqlx::query(
            "UPDATE orders SET status = 'fulfilled' WHERE id = ?1 AND status = 'pending'",
        )
        .bind(order)
        .execute(&mut *tx)
        .await
        .map_err(|e| e.to_string())?
        .rows_affected();
        tx.commit().await.map_err(|e| e.to_string())?;
        if changed == 1 {
            // Marked first, then handed over (the guide's order): never twice.
            let mut goods = self.outside.goods_handed_over.lock().unwrap();
            *goods.entry(order).or_default() += 1;
        }
        // The e-mail is outside the database: `Once` keeps it to one per order, even when
        // this attempt fails after the commit above and a retry comes through here again.
        let (outside, key) = (self.outside.clone(), format!("order-{order}"));
        let email = self.emails.run(&key, move |_| async move {
            *outside
                .emails_sent
                .lock()
                .unwrap()
                .entry(order)
                .or_default() += 1;
            Ok::<_, String>(())
        });
        match email.await {
            // Another attempt is sending it: not done yet, so retry (it may still fail).
            Ok(Ran::InProgress { .. }) => Err("the e-mail is being sent elsewhere".into()),
            Ok(_) => Ok(()),
            Err(e) => Err(e.to_string()),
        }
    }

    async fn close(&self, order: i64) -> Result<(), String> {
        sqlx::query("UPDATE orders SET status = 'closed' WHERE id = ?1 AND status = 'pending'")
            .bind(order)
            .execute(&self.db)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    /// Applies the payload itself (no API to re-read): the ordering guard drops an update
    /// older than the one applied last.
    async fn customer_updated(&self, source: &str, body: &Body) -> Result<(), String> {
        let customer = body.data.object["id"].as_str().ok_or("no customer id")?;
        let email = body.data.object["email"].as_str().ok_or("no e-mail")?;
        let created = UNIX_EPOCH + Duration::from_secs(body.created);
        let mut tx = self.db.begin().await.map_err(|e| e.to_string())?;
        let object = format!("customer:{customer}");
        let order = latest::advance(&mut *tx, source, &object, created)
            .await
            .map_err(|e| e.to_string())?;
        if order == Order::Newest {
            sqlx::query("INSERT OR REPLACE INTO customers (id, email) VALUES (?1, ?2)")
                .bind(customer)
                .bind(email)
                .execute(&mut *tx)
                .await
                .map_err(|e| e.to_string())?;
        }
        tx.commit().await.map_err(|e| e.to_string())
    }
}

/// An event body as the provider sends it, created `days_ago`.
fn body(ty: &str, object: serde_json::Value, livemode: bool, days_ago: u64) -> Vec<u8> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    serde_json::json!({
        "type": ty,
        "created": now - days_ago * 86_400,
        "livemode": livemode,
        "data": { "object": object },
    })
    .to_string()
    .into_bytes()
}

/// `--help` and `-h` say what it does and exit 0; it takes no arguments.
#[derive(clap::Parser)]
#[command(
    name = "orders",
    about = "Runs a small shop end to end over loopback: a mock provider API, the receiver and worker on a temporary SQLite file, and a day of awkward deliveries; prints the orders and checks every rule held."
)]
struct Args {}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    <Args as clap::Parser>::parse();
    let path = std::env::temp_dir().join(format!("tower-webhook-orders-{}.db", std::process::id()));
    let store = SqliteStore::open(&path).await?;
    let db = store.pool().clone();
    sqlx::query(
        "CREATE TABLE orders (id INTEGER PRIMARY KEY, status TEXT NOT NULL, livemode INTEGER NOT NULL)",
    )
    .execute(&db)
    .await?;
    sqlx::query("CREATE TABLE customers (id TEXT PRIMARY KEY, email TEXT NOT NULL)")
        .execute(&db)
        .await?;
    for order in 1..=4 {
        sqlx::query("INSERT INTO orders VALUES (?1, 'pending', 1)")
            .bind(order)
            .execute(&db)
            .await?;
    }

    // The provider's API, with the intents' current states.
    let provider = Provider::default();
    provider.set("pi_1", "succeeded", 1);
    provider.set("pi_2", "canceled", 2);
    provider.set("pi_3", "succeeded", 3);
    provider.set("pi_4", "processing", 4);
    *provider.flaky_once.lock().unwrap() = Some("pi_2".into());
    let api = serve(
        Router::new()
            .route("/payment-intents/{id}", get(get_intent))
            .with_state(provider.clone()),
    )
    .await?;

    // The shop: verify, filter, store, 204. Nothing slow runs in the request.
    let inbox = Inbox::sqlite(&store);
    let verifier = Verifier::new(Scheme::standard(), [SECRET])?;
    let (webhooks, server) = serve_webhooks(
        Router::new().route(
            "/webhooks",
            post_service(inbox.accept_service()).layer(
                ServiceBuilder::new()
                    .layer(VerifyWebhookLayer::new(verifier))
                    .layer(
                        EventFilterLayer::new()
                            .add_type("payment_intent.*")
                            .add_type("customer.updated")
                            .with_livemode(Livemode::LiveOnly),
                    ),
            ),
        ),
    )
    .await?;
    let webhooks = format!("{webhooks}/webhooks");

    let outside = Outside::default();
    let emails = Once::new(store.clone(), "order-email");
    let emails_drain = emails.drain(); // the e-mails still being sent at shutdown
    let shop = Shop {
        db: db.clone(),
        api,
        emails,
        outside: outside.clone(),
    };
    let worker = Worker::new(&inbox, move |event: Event, _: Attempt| {
        let shop = shop.clone();
        async move { shop.process(event).await }
    })
    .with_backoff(Duration::from_millis(50), Duration::from_secs(1))
    .expect("a valid worker")
    .with_poll_interval(Duration::from_millis(50))
    .expect("a valid worker")
    .spawn();

    // The provider's day; every genuine delivery is answered 204 at once.
    let pi = |id: &str| serde_json::json!({ "id": id });
    let day = [
        // (event id, type, intent, livemode, days old)
        ("evt_1", "payment_intent.succeeded", "pi_1", true, 0),
        // A duplicate.
        ("evt_1", "payment_intent.succeeded", "pi_1", true, 0),
        // Late, with an older state; then another event about the same order.
        ("evt_1_late", "payment_intent.processing", "pi_1", true, 2),
        ("evt_1_more", "payment_intent.created", "pi_1", true, 0),
        // The provider's API fails on the first read.
        ("evt_2", "payment_intent.canceled", "pi_2", true, 0),
        // Test mode: fulfils nothing.
        ("evt_3_test", "payment_intent.succeeded", "pi_3", false, 0),
        ("evt_4", "payment_intent.processing", "pi_4", true, 0),
        // An unknown type: 204, ignored.
        ("evt_unknown", "invoice.created", "in_1", true, 0),
    ];
    for (id, ty, intent, livemode, days_old) in day {
        let body = body(ty, pi(intent), livemode, days_old);
        let status = deliver(&webhooks, SECRET, id, body).await?;
        check(
            status == StatusCode::NO_CONTENT,
            &format!("{id} answered {status}"),
        )?;
    }
    let customer = |email: &str| serde_json::json!({ "id": "cus_1", "email": email });
    let update = body("customer.updated", customer("new@example.com"), true, 1);
    let status = deliver(&webhooks, SECRET, "evt_cus_new", update).await?;
    check(status == StatusCode::NO_CONTENT, "evt_cus_new answered 204")?;
    let forged = body("payment_intent.succeeded", pi("pi_3"), true, 0);
    let attacker = "whsec_Zm9yZ2VkLWJ5LWFuLWF0dGFja2VyLTAxMjM0NTY3ODk=";
    let status = deliver(&webhooks, attacker, "evt_forged", forged).await?;
    check(
        status == StatusCode::BAD_REQUEST,
        "a forged body is refused",
    )?;
    wait_for_empty_queue(&inbox).await?;

    // Later: intent 4 succeeds, and a customer update from three days ago turns up.
    provider.set("pi_4", "succeeded", 4);
    let succeeded = body(
        "payment_intent.succeeded",
        serde_json::json!({ "id": "pi_4" }),
        true,
        0,
    );
    let status = deliver(&webhooks, SECRET, "evt_4_ok", succeeded).await?;
    check(status == StatusCode::NO_CONTENT, "evt_4_ok answered 204")?;
    let update = body("customer.updated", customer("old@example.com"), true, 3);
    let status = deliver(&webhooks, SECRET, "evt_cus_old", update).await?;
    check(status == StatusCode::NO_CONTENT, "evt_cus_old answered 204")?;
    wait_for_empty_queue(&inbox).await?;
    // Shut down as a deploy does: stop accepting, let the worker and the e-mails finish.
    server.shut_down().await?;
    worker.shutdown().await;
    let _ = emails_drain.wait(Duration::from_secs(30)).await;

    let orders: Vec<(i64, String)> = sqlx::query_as("SELECT id, status FROM orders ORDER BY id")
        .fetch_all(&db)
        .await?;
    let goods = outside.goods_handed_over.lock().unwrap().clone();
    let emails = outside.emails_sent.lock().unwrap().clone();
    println!("| order | status | goods handed over | e-mails |");
    println!("|---|---|---|---|");
    for (id, status) in &orders {
        let (g, e) = (goods.get(id).unwrap_or(&0), emails.get(id).unwrap_or(&0));
        println!("| {id} | {status} | {g} | {e} |");
    }
    let (email,): (String,) = sqlx::query_as("SELECT email FROM customers WHERE id = 'cus_1'")
        .fetch_one(&db)
        .await?;
    let counts = inbox.counts().await?;
    println!("customer cus_1: {email}");
    println!(
        "inbox: {} processed, {} dead; {} reads of the provider's API",
        counts.processed,
        counts.dead,
        outside.api_reads.load(Ordering::Relaxed)
    );
    let _ = std::fs::remove_file(&path);

    let status = |id: i64| orders.iter().find(|o| o.0 == id).map(|o| o.1.as_str());
    check(status(1) == Some("fulfilled"), "order 1 fulfilled")?;
    check(
        status(2) == Some("closed"),
        "order 2 closed (after one failed read)",
    )?;
    check(
        status(3) == Some("pending"),
        "order 3: a test-mode event fulfils nothing",
    )?;
    check(
        status(4) == Some("fulfilled"),
        "order 4 fulfilled once it succeeded",
    )?;
    check(
        goods == HashMap::from([(1, 1), (4, 1)]) && emails == HashMap::from([(1, 1), (4, 1)]),
        "goods and e-mail once per fulfilled order",
    )?;
    check(
        email == "new@example.com",
        "the late customer update was dropped",
    )?;
    check(
        counts.dead == 0 && counts.processed == 8,
        "8 events processed, none dead",
    )?;
    check(
        outside.api_reads.load(Ordering::Relaxed) >= 7,
        "at least 7 reads of the API: one per payment event, and the retry after the failed \
         one (an event that finds its order's e-mail being sent by another attempt retries, \
         and reads again)",
    )?;
    println!("every rule held");
    Ok(())
}

/// Signs `body` with `secret` as the provider would and posts it; returns the status.
async fn deliver(
    url: &str,
    secret: &str,
    id: &str,
    body: Vec<u8>,
) -> Result<StatusCode, Box<dyn std::error::Error + Send + Sync>> {
    let headers = support::signed_headers(&Scheme::standard(), secret, id, &body);
    Ok(support::post(url, headers, body).await?.0)
}

fn check(ok: bool, what: &str) -> Result<(), String> {
    if ok {
        Ok(())
    } else {
        Err(format!("broken: {what}"))
    }
}

/// Serves `app` on a free loopback port; returns its base URL.
async fn serve(app: Router) -> std::io::Result<String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(url)
}

/// Serves the webhooks on a free loopback port until shut down; returns its base URL.
async fn serve_webhooks(app: Router) -> std::io::Result<(String, support::Serving)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    Ok((url, support::serve(listener, app)))
}

async fn wait_for_empty_queue(
    inbox: &Inbox,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    for _ in 0..200 {
        let c = inbox.counts().await?;
        if c.queued + c.processing == 0 {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err("the queue did not drain in 10 s".into())
}
