//! Request limits, before any logging, auth or plugin work: a path refused by normalisation
//! ([`super::path`]) is answered `400 invalid_path`; a declared `Content-Length` over the body
//! limit is refused with 413; any other body is wrapped so that reading past the limit fails
//! with 413 where it is read.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body_util::Limited;

use super::{PlaneCtx, request_id};
use crate::error::GatewayError;
use crate::route_group::RouteGroup;

/// The layer.
pub async fn limit(State(ctx): State<PlaneCtx>, request: Request, next: Next) -> Response {
    if let Some(refused) = request.extensions().get::<super::path::RefusedPath>() {
        ctx.state
            .metrics
            .paths_refused
            .with_label_values(&[ctx.plane.as_str(), refused.reason()])
            .inc();
        let mut response = GatewayError::bad_request(
            "invalid_path",
            format!("the request path is refused: {}", refused.0),
        )
        .into_response();
        request_id::stamp_if_missing(response.headers_mut());
        return response;
    }
    // Storage has its own limit: uploads stream through and may be far larger.
    let limit = match RouteGroup::of(request.uri().path()) {
        RouteGroup::Storage => ctx.state.config.upstreams.storage_max_body_bytes as usize,
        _ => ctx.state.config.server.max_body_bytes,
    };
    let declared = request
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        let mut response = GatewayError::payload_too_large(format!(
            "the request body is over the {limit} byte limit"
        ))
        .into_response();
        // Answered before the request-id layer runs: give it an id of its own.
        request_id::stamp_if_missing(response.headers_mut());
        return response;
    }
    let request = request.map(|body| Body::new(Limited::new(body, limit)));
    next.run(request).await
}
