//! A database URL's password kept out of the error messages printed.

/// `text` with the URL's password, as written and percent-decoded, replaced by `***`.
pub(crate) fn redact(text: &str, url: &str) -> String {
    let Some(rest) = url.split_once("://").map(|(_, rest)| rest) else {
        return text.to_owned();
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let Some((userinfo, _)) = authority.rsplit_once('@') else {
        return text.to_owned();
    };
    let Some((_, password)) = userinfo.split_once(':') else {
        return text.to_owned();
    };
    if password.is_empty() {
        return text.to_owned();
    }
    let decoded = percent_decoded(password);
    let mut text = text.replace(password, "***");
    if !decoded.is_empty() {
        text = text.replace(&decoded, "***");
    }
    text
}

fn percent_decoded(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
