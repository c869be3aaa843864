use super::hosts::{
    certificate_url_shape, paypal_certificate_url, sns_certificate_url, sns_subscribe_url,
};

#[test]
fn only_the_providers_https_hosts_are_fetched_from() {
    for ok in [
        "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-abc.pem",
        "https://sns.cn-north-1.amazonaws.com.cn/SimpleNotificationService-abc.pem",
        "https://sns.eu-west-1.amazonaws.com:443/SimpleNotificationService-01.pem",
        "https://sns.us-gov-west-1.amazonaws.com/SimpleNotificationService-01.pem",
    ] {
        assert!(sns_certificate_url(ok).is_some(), "{ok}");
    }
    for bad in [
        "http://sns.us-east-1.amazonaws.com/x.pem",
        "https://sns.us-east-1.amazonaws.com.evil.com/x.pem",
        "https://evil.com/sns.us-east-1.amazonaws.com/x.pem",
        "https://sns.evil.amazonaws.com@evil.com/x.pem",
        "https://user@sns.us-east-1.amazonaws.com/x.pem",
        "https://sns.us-east-1.amazonaws.com:8443/x.pem",
        "https://s3.us-east-1.amazonaws.com/x.pem",
        "https://sns.US-EAST-1.amazonaws.com/x.pem",
        "https://sns..amazonaws.com/x.pem",
        "https://sns.us-east-1.amazonaws.com/x.crt",
        // Old-style S3 addresses of a bucket named `sns`: not SNS.
        "https://sns.s3-us-west-2.amazonaws.com/SimpleNotificationService-01.pem",
        "https://sns.s3-accelerate.amazonaws.com/SimpleNotificationService-01.pem",
        "https://sns.s3-external-1.amazonaws.com/SimpleNotificationService-01.pem",
        // Another path, or a query that would make a new cache entry per request.
        "https://sns.us-east-1.amazonaws.com/other/SimpleNotificationService-01.pem",
        "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-01.pem?1",
        // A fragment: never sent, so each one would be a new cache key.
        "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-01.pem#1",
        "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-01.pem#",
        "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-.pem",
        "https://sns.a/b.amazonaws.com/x.pem",
        "//sns.us-east-1.amazonaws.com/x.pem",
        "not a url",
    ] {
        assert!(sns_certificate_url(bad).is_none(), "{bad}");
    }
    // A SubscribeURL has a query, not a `.pem` path.
    assert!(sns_subscribe_url(
        "https://sns.us-east-1.amazonaws.com/?Action=ConfirmSubscription&Token=t"
    ));
    assert!(paypal_certificate_url(
        "https://api.paypal.com/v1/notifications/certs/CERT-360caa42-fca2a594-1d93a270"
    )
    .is_some());
    assert!(paypal_certificate_url(
        "https://api-m.sandbox.paypal.com/v1/notifications/certs/CERT-1"
    )
    .is_some());
    for bad in [
        "http://api.paypal.com/v1/notifications/certs/CERT-1",
        "https://api.paypal.com.evil.com/v1/notifications/certs/CERT-1",
        "https://evil.paypal.com/v1/notifications/certs/CERT-1",
        "https://api.paypal.com/v1/oauth2/token",
        "https://api.paypal.com/v1/notifications/certs/../../oauth2/token",
        "https://api.paypal.com/v1/notifications/certs/CERT-1/../../../v2/checkout/orders/1",
        "https://api.paypal.com/v1/notifications/certs/%2e%2e/%2e%2e/oauth2/token",
        "https://api.paypal.com/v1/notifications/certs/CERT-1?x",
        "https://api.paypal.com/v1/notifications/certs/CERT-1#x",
        "https://api.paypal.com/v1/notifications/certs/CERT-1#",
    ] {
        assert!(paypal_certificate_url(bad).is_none(), "{bad}");
    }
}

#[test]
fn one_certificate_has_one_canonical_url() {
    let url = "https://sns.eu-west-1.amazonaws.com/SimpleNotificationService-01.pem";
    let with_port = "https://sns.eu-west-1.amazonaws.com:443/SimpleNotificationService-01.pem";
    assert_eq!(sns_certificate_url(url).as_deref(), Some(url));
    assert_eq!(sns_certificate_url(with_port).as_deref(), Some(url));
    let url = "https://api.paypal.com/v1/notifications/certs/CERT-1";
    let with_port = "https://api.paypal.com:443/v1/notifications/certs/CERT-1";
    assert_eq!(paypal_certificate_url(with_port).as_deref(), Some(url));
    assert_eq!(certificate_url_shape(url).as_deref(), Some(url));
}
