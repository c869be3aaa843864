use http::Response;

use super::layer::Config;
use crate::body::ResponseBody;
use crate::{metrics, VerifyError};

/// The rejection response: the user's, or a short fixed text; the error rides in the
/// extensions either way, goes to `tracing`, and is counted by its kind. Every rejection
/// of the layer comes through here.
pub(super) fn reject<B>(config: &Config, error: VerifyError) -> Response<ResponseBody<B>> {
    let error = match config.verifier.scheme().unauthorized {
        true => error.unauthorized(),
        false => error,
    };
    metrics::rejected(config.verifier.metrics(), error.kind());
    #[cfg(feature = "tracing")]
    tracing::warn!(
        target: "tower_webhook",
        source = config.verifier.source(),
        kind = ?error.kind(),
        "webhook rejected: {error}"
    );
    let mut response = match &config.rejection {
        Some(f) => f(&error).map(ResponseBody::fixed),
        None => ResponseBody::text(error.status(), error.public_message()),
    };
    response.extensions_mut().insert(error);
    response
}
