//! The tracing span of a request. The request id is recorded into it by the request-id layer.

use axum::body::Body;
use http::Request;
use tower_http::classify::{ServerErrorsAsFailures, SharedClassifier};
use tower_http::trace::{MakeSpan, TraceLayer};
use tracing::Span;

use crate::plane::Plane;

/// Makes the `request` span with plane, method, path and an empty `request_id`.
#[derive(Debug, Clone, Copy)]
pub struct RequestSpan(pub Plane);

impl MakeSpan<Body> for RequestSpan {
    fn make_span(&mut self, request: &Request<Body>) -> Span {
        tracing::info_span!(
            "request",
            plane = self.0.as_str(),
            method = %request.method(),
            path = %request.uri().path(),
            request_id = tracing::field::Empty,
        )
    }
}

/// The trace layer of a plane.
pub fn layer(
    plane: Plane,
) -> TraceLayer<
    SharedClassifier<ServerErrorsAsFailures>,
    RequestSpan,
    tower_http::trace::DefaultOnRequest,
    (),
    tower_http::trace::DefaultOnBodyChunk,
    tower_http::trace::DefaultOnEos,
    (),
> {
    // The access log already reports every response; the trace layer only provides the span.
    TraceLayer::new_for_http()
        .make_span_with(RequestSpan(plane))
        .on_response(())
        .on_failure(())
}
