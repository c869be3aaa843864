use clap::CommandFactory as _;

use crate::cli::{parse_key, Cli};
use crate::output::printable;
use crate::redact::redact;

#[test]
fn a_password_is_redacted_as_written_and_decoded() {
    let url = "postgres://operator:p%40ss-w0rd@db.internal:5432/inbox";
    assert_eq!(
        redact("failed for p%40ss-w0rd and p@ss-w0rd", url),
        "failed for *** and ***"
    );
    for url in [
        "postgres://operator@db/inbox",
        "webhooks.db",
        "postgres://:@db/x",
    ] {
        assert_eq!(redact("connection refused", url), "connection refused");
    }
}

#[test]
fn control_characters_are_shown_escaped() {
    assert_eq!(printable("a\u{1b}[31mb\u{7}", false), "a\\u{1b}[31mb\\u{7}");
    assert_eq!(printable("line\nnext\tcol", false), "line\\nnext\\tcol");
    assert_eq!(printable("line\nnext\tcol\r", true), "line\nnext\tcol\\r");
    assert_eq!(printable("naïve ✓", false), "naïve ✓");
}

#[test]
fn an_id_splits_at_the_first_slash() {
    assert_eq!(
        parse_key("stripe/evt_1/x").unwrap(),
        ("stripe".to_owned(), "evt_1/x".to_owned())
    );
    for bad in ["stripe", "/evt_1", "stripe/", ""] {
        assert!(parse_key(bad).is_err(), "{bad}");
    }
}

#[test]
fn the_command_line_is_well_formed() {
    Cli::command().debug_assert();
}
