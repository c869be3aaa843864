//! Signs and posts one test delivery, as a provider would:
//!
//! ```text
//! cargo run --example send -- [URL] [EVENT_ID | --id EVENT_ID] [--type TYPE]
//!     [--body JSON | --body-file PATH] [--scheme NAME] [--secret SECRET]
//! ```
//!
//! The scheme and secret default to `WEBHOOK_SCHEME` and `WEBHOOK_SECRETS` (the first is
//! used) as for the receiver — for a public-key scheme (`discord`, `sendgrid`, `standard`
//! with `whsk_`), the private key; the URL defaults to `http://127.0.0.1:3000/webhooks`,
//! the id to a fresh one and the type to `demo.ping`. `--help` lists every option.

mod support;

use std::time::{SystemTime, UNIX_EPOCH};

use clap::Parser;

const DEFAULT_URL: &str = "http://127.0.0.1:3000/webhooks";

/// Signs and posts one test delivery, as a provider would.
#[derive(Parser)]
#[command(
    long_about = "Signs and posts one test delivery, as a provider would. The scheme and \
        secret come from --scheme and --secret, else from WEBHOOK_SCHEME and WEBHOOK_SECRETS \
        (the first is used), as for the receiver: for a public-key scheme (discord, \
        sendgrid, standard with whsk_), the private key; without either, the scheme's \
        development secret. Prints the answer's status, the event id and the answer's body."
)]
struct Args {
    /// Where to post: an absolute http:// URL (for Twilio, Square and HubSpot, also the
    /// URL signed).
    #[arg(value_name = "URL", default_value = DEFAULT_URL, value_parser = http_url)]
    url: String,
    /// The event's id (default: a fresh evt_<nanoseconds>).
    #[arg(value_name = "EVENT_ID", conflicts_with = "id")]
    event_id: Option<String>,
    /// The event's id, as an option (instead of EVENT_ID).
    #[arg(long, value_name = "EVENT_ID")]
    id: Option<String>,
    /// The event's type, in the body the example builds.
    #[arg(long = "type", value_name = "TYPE", default_value = "demo.ping")]
    event_type: String,
    /// The body to sign and post, as it is (instead of the one built from the id and
    /// type; the id is still what the scheme's id header carries, where it has one).
    #[arg(long, value_name = "JSON", conflicts_with_all = ["body_file", "event_type"])]
    body: Option<String>,
    /// As --body, read from a file.
    #[arg(long, value_name = "PATH", conflicts_with = "event_type")]
    body_file: Option<std::path::PathBuf>,
    /// The provider's scheme (instead of WEBHOOK_SCHEME), a preset's name: standard,
    /// stripe, github, slack, …
    #[arg(long, value_name = "NAME")]
    scheme: Option<String>,
    /// The secret (or private key) to sign with (instead of WEBHOOK_SECRETS' first).
    #[arg(long, value_name = "SECRET")]
    secret: Option<String>,
}

/// `s` if it is an absolute `http://` URL with a host: what the example's client can post to.
fn http_url(s: &str) -> Result<String, String> {
    let uri: http::Uri = s
        .parse()
        .map_err(|e| format!("not a URL ({e}); expected one such as {DEFAULT_URL}"))?;
    match (uri.scheme_str(), uri.host()) {
        (Some("http"), Some(host)) if !host.is_empty() => Ok(s.to_owned()),
        (Some("https"), _) => Err(format!(
            "https is not supported: this example posts over plain HTTP (such as {DEFAULT_URL})"
        )),
        _ => Err(format!(
            "not an absolute http:// URL; expected one such as {DEFAULT_URL}"
        )),
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let args = Args::parse();
    let scheme = match args.scheme.as_deref() {
        Some(name) => support::scheme_named(name)?,
        None => support::scheme_from_env()?,
    };
    let (secrets, dev) = match args.secret {
        Some(secret) => (vec![secret], false),
        None => support::secrets_for(&scheme),
    };
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
    let url = args.url;
    let id = args.event_id.or(args.id).unwrap_or_else(|| {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        format!("evt_{}", nanos.as_nanos())
    });
    let body = match (args.body, args.body_file) {
        (Some(body), _) => body.into_bytes(),
        (None, Some(path)) => {
            std::fs::read(&path).map_err(|e| format!("--body-file {}: {e}", path.display()))?
        }
        (None, None) => support::event_body(&id, &args.event_type, "obj_1"),
    };
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
