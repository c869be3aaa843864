//! Which certificate and subscription URLs are on the provider's own HTTPS hosts, and
//! the one canonical form of each.

use http::Uri;

/// An HTTPS URL on a host that passes `host`, without userinfo, another port or a
/// fragment (which the server never sees, so each would be a new cache entry for one
/// certificate).
fn https_host(url: &str, host: impl Fn(&str) -> bool) -> Option<Uri> {
    if url.contains('#') {
        return None;
    }
    let uri: Uri = url.parse().ok()?;
    let authority = uri.authority()?;
    let plain = authority.as_str() == authority.host()
        || authority.as_str() == format!("{}:443", authority.host());
    (uri.scheme_str() == Some("https") && plain && host(authority.host())).then_some(uri)
}

/// `https://host/path`: the one form of a certificate URL, its cache key and what is
/// fetched (the query and fragment were refused, `:443` is dropped).
fn canonical(uri: &Uri) -> Option<String> {
    Some(format!("https://{}{}", uri.host()?, uri.path()))
}

/// An AWS region's name: `us-east-1`, `us-gov-west-1`, `cn-north-1` — letters in groups
/// and a number, never `s3-…` (`sns.s3-….amazonaws.com` is an S3 bucket named `sns`).
fn aws_region(region: &str) -> bool {
    let mut parts = region.split('-');
    let first = parts.next().unwrap_or("");
    let mut rest: Vec<&str> = parts.collect();
    let Some(number) = rest.pop() else {
        return false;
    };
    first.len() == 2
        && first.bytes().all(|b| b.is_ascii_lowercase())
        && !rest.is_empty()
        && rest
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_lowercase()))
        && !number.is_empty()
        && number.len() <= 2
        && number.bytes().all(|b| b.is_ascii_digit())
}

/// `sns.<region>.amazonaws.com[.cn]`.
fn sns_host(host: &str) -> bool {
    let rest = host
        .strip_suffix(".amazonaws.com")
        .or_else(|| host.strip_suffix(".amazonaws.com.cn"));
    rest.and_then(|r| r.strip_prefix("sns."))
        .is_some_and(aws_region)
}

/// `https://sns.<region>.amazonaws.com[.cn]/SimpleNotificationService-<hex>.pem`, no
/// query or fragment (AWS names certificates by 32 hex digits; up to 64 are taken), in
/// its canonical form.
pub(crate) fn sns_certificate_url(url: &str) -> Option<String> {
    let uri = https_host(url, sns_host)?;
    let name = uri
        .path()
        .strip_prefix("/SimpleNotificationService-")
        .and_then(|p| p.strip_suffix(".pem"))?;
    let named = !name.is_empty() && name.len() <= 64 && name.bytes().all(|b| b.is_ascii_hexdigit());
    (uri.query().is_none() && named)
        .then(|| canonical(&uri))
        .flatten()
}

/// An SNS `SubscribeURL`: `https://sns.<region>.amazonaws.com[.cn]/…` (with its query).
pub(super) fn sns_subscribe_url(url: &str) -> bool {
    https_host(url, sns_host).is_some()
}

/// `https://api[-m][.sandbox].paypal.com/v1/notifications/certs/CERT-…`, no query or
/// fragment and nothing but letters, digits and `-` in the name (no `..` to climb out of
/// it; PayPal's are `CERT-<hex>-<hex>-<hex>`; up to 128 characters are taken), in its
/// canonical form.
pub(crate) fn paypal_certificate_url(url: &str) -> Option<String> {
    const HOSTS: [&str; 4] = [
        "api.paypal.com",
        "api-m.paypal.com",
        "api.sandbox.paypal.com",
        "api-m.sandbox.paypal.com",
    ];
    let uri = https_host(url, |h| HOSTS.contains(&h))?;
    let name = uri.path().strip_prefix("/v1/notifications/certs/CERT-")?;
    let named = !name.is_empty()
        && name.len() <= 128
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
    (uri.query().is_none() && named)
        .then(|| canonical(&uri))
        .flatten()
}

/// Whether `url` is a certificate URL of SNS's or PayPal's shape; its canonical form if
/// so (for the fuzz targets: never panics, and the form is itself accepted unchanged).
#[doc(hidden)]
pub fn certificate_url_shape(url: &str) -> Option<String> {
    sns_certificate_url(url).or_else(|| paypal_certificate_url(url))
}
