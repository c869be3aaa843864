//! Signs and posts one test delivery, as a provider would:
//!
//! ```text
//! cargo run --example send -- [URL] [EVENT_ID]
//! ```
//!
//! `WEBHOOK_SCHEME` and `WEBHOOK_SECRETS` (the first is used) as for the receiver — for a
//! public-key scheme (`discord`, `sendgrid`, `standard` with `whsk_`), the private key; the
//! URL defaults to `http://127.0.0.1:3000/webhooks` and the id to a fresh one.

mod support;

use std::time::{SystemTime, UNIX_EPOCH};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let (scheme, secrets, dev) = support::scheme_and_secrets()?;
    let signing_key = match (dev, secrets.first()) {
        (true, _) => support::dev_signing_key(&scheme).to_owned(),
        (false, Some(key)) => key.clone(),
        // SNS and PayPal sign with the provider's private key: nothing here can.
        (false, None) => {
            return Err(format!(
                "{} deliveries are signed by the provider only",
                scheme.name()
            )
            .into())
        }
    };
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .unwrap_or_else(|| "http://127.0.0.1:3000/webhooks".into());
    let id = args.next().unwrap_or_else(|| {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        format!("evt_{}", nanos.as_nanos())
    });
    let body = support::event_body(&id, "demo.ping", "obj_1");
    // For schemes that sign the URL (Twilio, Square, HubSpot), the one posted to.
    let headers = scheme.sign_request(
        [signing_key],
        &http::Method::POST,
        &url,
        &id,
        SystemTime::now(),
        &body,
    )?;
    let (status, response) = support::post(&url, headers, body).await?;
    println!("{status} {id} {}", String::from_utf8_lossy(&response));
    Ok(())
}
