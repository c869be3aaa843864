//! One receiver for many tenants, each with its own Stripe signing secret, kept in SQLite.
//!
//! ```text
//! cargo run --example tenants
//! ```
//!
//! A platform gives every customer an endpoint, `/webhooks/{tenant}`, and stores each
//! customer's signing secret in its database. The layer reads the tenant from the path,
//! looks its secrets up in the `tenants` table (cached for a minute; a rotation shows
//! within it), verifies with them, and deduplicates per tenant: the same event id for two
//! tenants is two events.
//!
//! Everything runs here, over loopback: the receiver on an in-memory SQLite database, and
//! a sender that delivers each tenant's events (one twice), posts one tenant's delivery
//! to another's endpoint, names an unknown tenant, and rotates a secret. It prints what
//! each request got and what the handler ran, then checks it.

mod support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use axum::routing::post;
use axum::Router;
use sqlx::sqlite::SqlitePoolOptions;
use sqlx::SqlitePool;
use tower::ServiceBuilder;
use tower_webhook::store::MemoryStore;
use tower_webhook::verify::{TenantFrom, Tenants};
use tower_webhook::{DedupeLayer, Event, Scheme, VerifyWebhookLayer};

/// The platform's table of tenants and their current secrets.
async fn database() -> Result<SqlitePool, sqlx::Error> {
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        .connect("sqlite::memory:")
        .await?;
    sqlx::query("CREATE TABLE tenants (name TEXT PRIMARY KEY, secret TEXT NOT NULL)")
        .execute(&pool)
        .await?;
    for (name, secret) in [
        ("acme", "whsec_acme_0123456789abcdef"),
        ("globex", "whsec_globex_0123456789abcd"),
    ] {
        sqlx::query("INSERT INTO tenants (name, secret) VALUES (?, ?)")
            .bind(name)
            .bind(secret)
            .execute(&pool)
            .await?;
    }
    Ok(pool)
}

/// `Some(secrets)` for a known tenant, `None` for an unknown one; a database error
/// becomes a 503, so the provider retries.
async fn secrets_of(pool: SqlitePool, tenant: String) -> Result<Option<Vec<String>>, sqlx::Error> {
    let secret: Option<String> = sqlx::query_scalar("SELECT secret FROM tenants WHERE name = ?")
        .bind(tenant)
        .fetch_optional(&pool)
        .await?;
    Ok(secret.map(|s| vec![s]))
}

/// `--help` and `-h` say what it does and exit 0; it takes no arguments.
#[derive(clap::Parser)]
#[command(
    name = "tenants",
    about = "Runs one receiver for many tenants, each with its own Stripe secret kept in SQLite (in memory), sends each tenant's deliveries over loopback, and checks what the handler ran."
)]
struct Args {}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    <Args as clap::Parser>::parse();
    let pool = database().await?;
    let source = pool.clone();
    let tenants = Tenants::new(
        Scheme::stripe(),
        TenantFrom::path_segment(1),
        move |tenant| secrets_of(source.clone(), tenant),
    )?;
    let ran = Arc::new(Mutex::new(Vec::new()));
    let log = ran.clone();
    let dedupe = DedupeLayer::new(MemoryStore::new());
    let drain = dedupe.drain(); // the handlers still running when the server stops
    let app = Router::new().route(
        "/webhooks/{tenant}",
        post(move |event: Event| {
            log.lock()
                .unwrap()
                .push(format!("{} {}", event.source(), event.id().unwrap_or("?")));
            async { http::StatusCode::NO_CONTENT }
        })
        .layer(
            ServiceBuilder::new()
                .layer(VerifyWebhookLayer::per_tenant(tenants.clone()))
                .layer(dedupe),
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}/webhooks", listener.local_addr()?);
    let server = support::serve(listener, app);

    // Which secret signed, by name: the example prints no secret.
    let name = |secret: &str| match secret {
        "whsec_acme_0123456789abcdef" => "acme's",
        "whsec_globex_0123456789abcd" => "globex's",
        _ => "acme's rotated",
    };
    let send = |tenant: &'static str, secret: &'static str, id: &'static str| {
        let url = format!("{base}/{tenant}");
        async move {
            let body = support::event_body(id, "invoice.paid", "in_1");
            let headers = Scheme::stripe().sign([secret], id, SystemTime::now(), &body)?;
            let (status, _) = support::post(&url, headers, body).await?;
            let what = format!("{tenant} {id} (signed with {} secret)", name(secret));
            println!("{what:<48} {}", status.as_u16());
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(status.as_u16())
        }
    };
    let acme = "whsec_acme_0123456789abcdef";
    let globex = "whsec_globex_0123456789abcd";
    let mut got = vec![
        send("acme", acme, "evt_1").await?,
        send("globex", globex, "evt_1").await?,
        send("acme", acme, "evt_1").await?, // the provider's retry
        send("globex", acme, "evt_2").await?, // acme's delivery at globex's endpoint
        send("initech", acme, "evt_3").await?, // no such tenant
    ];
    // Acme rotates its secret: the platform updates the table and drops the cached copy.
    let rotated = "whsec_acme_rotated_01234567";
    sqlx::query("UPDATE tenants SET secret = ? WHERE name = 'acme'")
        .bind(rotated)
        .execute(&pool)
        .await?;
    tenants.invalidate("acme");
    got.push(send("acme", rotated, "evt_4").await?);
    got.push(send("acme", acme, "evt_5").await?); // the old secret, no longer valid
                                                  // Shut down as a deploy does: stop accepting, then let running handlers finish.
    server.shut_down().await?;
    let _ = drain.wait(Duration::from_secs(30)).await;

    let ran = ran.lock().unwrap().clone();
    println!("handler ran: {}", ran.join(", "));
    let expected_status = [204, 204, 204, 400, 400, 204, 400];
    let expected_runs = [
        "stripe/acme evt_1",
        "stripe/globex evt_1",
        "stripe/acme evt_4",
    ];
    if got == expected_status && ran == expected_runs {
        println!("ok: each tenant verified with its own secret, deduplicated apart");
        Ok(())
    } else {
        Err(format!("unexpected: statuses {got:?}, runs {ran:?}").into())
    }
}
