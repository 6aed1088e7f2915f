//! Phase 3, request limits, before any logging, auth or plugin work: a path refused by
//! normalisation ([`super::path`]) is answered `400 invalid_path`; a request head (request line
//! and headers) over `server.max_header_bytes` is answered `431`; a declared `Content-Length`
//! over the body limit is refused with 413; any other body is wrapped so that reading past the
//! limit fails with 413 where it is read.

use axum::body::Body;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use http_body::Body as _;
use http_body_util::Limited;

use super::context::RequestContext;
use super::path::RefusedPath;
use super::{Phase, request_id};
use crate::error::GatewayError;
use crate::routes::BodyLimit;
use crate::state::AppState;

/// Phase 3: applies the limits to `request`, or answers why it is refused.
pub fn check(
    state: &AppState,
    cx: &RequestContext,
    refused_path: Option<RefusedPath>,
    request: Request,
) -> Phase<Request> {
    limit(state, cx, refused_path, request).map_err(refused)
}

fn limit(
    state: &AppState,
    cx: &RequestContext,
    refused: Option<RefusedPath>,
    request: Request,
) -> Result<Request, GatewayError> {
    if let Some(refused) = refused {
        state
            .metrics
            .paths_refused
            .with_label_values(&[cx.plane.as_str(), refused.reason()])
            .inc();
        return Err(GatewayError::bad_request(
            "invalid_path",
            format!("the request path is refused: {}", refused.0),
        ));
    }
    let max_head = state.config.server.max_header_bytes as usize;
    if head_bytes(&request) > max_head {
        return Err(GatewayError::headers_too_large(format!(
            "the request line and headers are over the {max_head} byte limit"
        )));
    }
    // Storage has its own limit: uploads stream through and may be far larger.
    let limit = match cx.group.body_limit() {
        BodyLimit::Uploads => state.config.upstreams.storage_max_body_bytes as usize,
        BodyLimit::Server => state.config.server.max_body_bytes,
    };
    let declared = request
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        return Err(GatewayError::payload_too_large(format!(
            "the request body is over the {limit} byte limit"
        )));
    }
    // A request without a body has nothing to limit.
    if request.body().is_end_stream() {
        return Ok(request);
    }
    Ok(request.map(|body| Body::new(Limited::new(body, limit))))
}

/// The size of a request's head as HTTP/1.1 writes it: the request line and every header line.
/// (The listener cuts heads over twice `server.max_header_bytes` before they get here.)
fn head_bytes(request: &Request) -> usize {
    let uri = request.uri();
    let target = uri.path_and_query().map_or(1, |p| p.as_str().len())
        + uri.authority().map_or(0, |a| a.as_str().len());
    let line = request.method().as_str().len() + target + 12;
    request.headers().iter().fold(line, |sum, (name, value)| {
        sum + name.as_str().len() + value.len() + 4
    })
}

/// The answer to a refused request: made before the request-id phase, it gets an id of its own.
fn refused(error: GatewayError) -> Response {
    let mut response = error.into_response();
    request_id::stamp_if_missing(response.headers_mut());
    response
}
