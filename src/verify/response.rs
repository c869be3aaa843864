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
    #[cfg(feature = "alerts")]
    if let Some(alerts) = &config.alerts {
        alerts.rejected(config.verifier.source(), &format!("{:?}", error.kind()));
    }
    #[cfg(feature = "tracing")]
    tracing::warn!(
        target: "tower_webhook",
        source = config.verifier.source(),
        kind = ?error.kind(),
        "webhook rejected: {error}"
    );
    response::respond(error, config.rejection.as_ref()).map(ResponseBody::fixed)
}
