//! Phase 4, the request's tracing span: everything that does work runs inside it. The request id
//! is recorded into it by phase 7.

use axum::extract::Request;
use tracing::Span;

use crate::plane::Plane;

/// The `request` span: plane, method, path and an empty `request_id`.
pub fn span(plane: Plane, request: &Request) -> Span {
    tracing::info_span!(
        "request",
        plane = plane.as_str(),
        method = %request.method(),
        path = %request.uri().path(),
        request_id = tracing::field::Empty,
    )
}
