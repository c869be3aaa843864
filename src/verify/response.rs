use http::Response;

use super::layer::Config;
use crate::response::{self, ResponseBody};
use crate::{metrics, VerifyError};

/// The rejection response (see [`crate::response`]); the error also goes to `tracing`
/// and is counted by its kind. Every rejection of the layer comes through here.
pub(super) fn reject<B>(config: &Config, error: VerifyError) -> Response<ResponseBody<B>> {
    let error = match config.verifier.scheme().unauthorized {
        true => error.unauthorized(),
        false => error,
    };
    metrics::rejected(config.verifier.metrics(), error.kind());
    // A 405 is a health check or a browser, not a forged or mis-signed delivery: counted,
    // but no rejection alert and no warning every few seconds.
    #[cfg(any(feature = "alerts", feature = "tracing"))]
    let probe = error.kind() == crate::VerifyErrorKind::MethodNotAllowed;
    #[cfg(feature = "alerts")]
    if let (Some(alerts), false) = (&config.alerts, probe) {
        alerts.rejected(config.verifier.source(), &format!("{:?}", error.kind()));
    }
    #[cfg(feature = "tracing")]
    if probe {
        tracing::debug!(
            target: "tower_webhook",
            source = config.verifier.source(),
            kind = ?error.kind(),
            "webhook rejected: {error}"
        );
    } else {
        tracing::warn!(
            target: "tower_webhook",
            source = config.verifier.source(),
            kind = ?error.kind(),
            "webhook rejected: {error}"
        );
    }
    response::respond(error, config.rejection.as_ref()).map(ResponseBody::fixed)
}
