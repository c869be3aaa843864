//! The operator's web page: [`ui`](super::ui), server-rendered HTML over an inbox.
//!
//! - `routes`: the pages and the forms' actions, each a few inbox calls;
//! - `pages`: the markup (maud: every value spliced in is escaped);
//! - `input`: what the forms and query strings accept;
//! - `scan`: the dead and failing listings read through a filter, a page at a time;
//! - `body`: an event's body as text (JSON pretty-printed byte for byte, else raw or
//!   base64);
//! - `guard`: the cross-site check every POST passes, and the headers every response
//!   carries (a strict `Content-Security-Policy` among them).

mod body;
mod guard;
mod input;
mod pages;
mod routes;
mod scan;

pub(super) use self::guard::same_origin;
pub(super) use self::routes::router;
