//! The certificate URL shape check of SNS and PayPal (`Certificates`): an arbitrary
//! string. Never a panic; an accepted URL comes back in its one canonical form — HTTPS,
//! no port, query, fragment or userinfo — which is itself accepted unchanged, so one
//! certificate is one cache entry.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tower_webhook::verify::certificate_url_shape;

fuzz_target!(|data: &[u8]| {
    let Ok(url) = std::str::from_utf8(data) else {
        return;
    };
    if let Some(canonical) = certificate_url_shape(url) {
        assert!(canonical.starts_with("https://"), "{canonical}");
        let rest = &canonical["https://".len()..];
        assert!(
            !rest.contains([':', '?', '#', '@', '%']) && !rest.contains(".."),
            "{canonical}"
        );
        assert_eq!(certificate_url_shape(&canonical).as_deref(), Some(&*canonical));
    }
});
