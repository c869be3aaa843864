//! The providers' schemes, as settings of the one mechanism: where each provider puts its
//! signature, timestamp, id and type, what it signs, and with which key kind.

mod by_name; // a preset by its name (`FromStr`)
mod custom; // verified by code of their own: Mailgun, SNS, PayPal, Microsoft Graph
mod header_signed; // a signature header over the body (and id, timestamp)
mod url_signed; // a signature over the public URL: Twilio, Square, HubSpot

use http::HeaderName;

use super::template::Template;

fn template(text: &str) -> Template {
    Template::parse(text).expect("preset templates are valid")
}

/// A template whose placeholders touch, as its provider signs it. Each caller says why the
/// split between the pieces is still unambiguous.
fn adjacent(text: &str) -> Template {
    Template::parse_adjacent(text).expect("preset templates are valid")
}

fn header(name: &'static str) -> HeaderName {
    HeaderName::from_static(name)
}
