//! An event's body as the page shows it: always text (escaped where it is spliced into
//! the page), never markup. JSON is indented without being parsed into values, so its keys
//! keep their order and its numbers their digits; anything else is shown as received, and
//! base64 on request (or when it is not UTF-8).

use base64::Engine as _;

/// How the operator asked to see the body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum View {
    /// Indented when it is JSON, else as received.
    Pretty,
    /// The text exactly as received.
    Raw,
    /// Base64 of the bytes.
    Base64,
}

impl View {
    pub(super) fn of(text: Option<&str>) -> Self {
        match text {
            Some("raw") => View::Raw,
            Some("base64") => View::Base64,
            _ => View::Pretty,
        }
    }
}

/// The text shown for `body` in `view`, and what it is (`"JSON"`, `"text"`, `"base64"`).
pub(super) fn shown(body: &[u8], view: View) -> (String, &'static str) {
    let text = match (view, std::str::from_utf8(body)) {
        (View::Base64, _) | (_, Err(_)) => {
            return (
                base64::engine::general_purpose::STANDARD.encode(body),
                "base64",
            )
        }
        (_, Ok(text)) => text,
    };
    match view {
        View::Pretty => match indent_json(text) {
            Some(indented) => (indented, "JSON"),
            None => (text.to_owned(), "text"),
        },
        _ => (text.to_owned(), "text"),
    }
}

/// `text` indented by two spaces a level, when it is one JSON value.
pub(super) fn indent_json(text: &str) -> Option<String> {
    serde_json::from_str::<serde::de::IgnoredAny>(text).ok()?;
    let mut out = String::with_capacity(text.len() + text.len() / 2);
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    let mut chars = text.chars().peekable();
    let newline = |out: &mut String, depth: usize| {
        out.push('\n');
        out.extend(std::iter::repeat_n("  ", depth));
    };
    while let Some(c) = chars.next() {
        if in_string {
            out.push(c);
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => {
                in_string = true;
                out.push(c);
            }
            '{' | '[' => {
                out.push(c);
                while chars.peek().is_some_and(|c| c.is_ascii_whitespace()) {
                    chars.next();
                }
                if let Some(close @ ('}' | ']')) = chars.peek().copied() {
                    out.push(close); // `{}` and `[]` stay on one line
                    chars.next();
                } else {
                    depth += 1;
                    newline(&mut out, depth);
                }
            }
            '}' | ']' => {
                depth = depth.saturating_sub(1);
                newline(&mut out, depth);
                out.push(c);
            }
            ',' => {
                out.push(',');
                newline(&mut out, depth);
            }
            ':' => out.push_str(": "),
            c if c.is_ascii_whitespace() => {}
            c => out.push(c),
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_is_indented_keeping_its_keys_order_and_its_numbers_digits() {
        let body =
            r#"{"z":1.50,"a":[1, {"s":"a,\"b\": {c}"}],"e":{},"l":[ ],"n":12345678901234567890}"#;
        let expected = "{\n  \"z\": 1.50,\n  \"a\": [\n    1,\n    {\n      \"s\": \"a,\\\"b\\\": {c}\"\n    }\n  ],\n  \"e\": {},\n  \"l\": [],\n  \"n\": 12345678901234567890\n}";
        assert_eq!(indent_json(body).as_deref(), Some(expected));
        assert_eq!(shown(body.as_bytes(), View::Pretty).1, "JSON");
    }

    #[test]
    fn other_text_is_shown_as_received_and_other_bytes_as_base64() {
        assert_eq!(indent_json("{\"a\":"), None);
        let markup = "<script>alert(1)</script>";
        assert_eq!(
            shown(markup.as_bytes(), View::Pretty),
            (markup.into(), "text")
        );
        assert_eq!(shown(b"{\"a\":1}", View::Raw), ("{\"a\":1}".into(), "text"));
        assert_eq!(shown(b"\xff\x00", View::Pretty), ("/wA=".into(), "base64"));
        assert_eq!(shown(b"hi", View::Base64), ("aGk=".into(), "base64"));
    }
}
