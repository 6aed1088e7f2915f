//! Phase 11, the `/metrics` guard, next to the handler it protects: a bearer token from the
//! configuration, compared in constant time. Without a configured token the endpoint does not
//! exist (404).

use axum::extract::Request;
use axum::response::IntoResponse;
use http::{HeaderValue, header};

use super::Phase;
use crate::error::GatewayError;
use crate::routes::METRICS_PATH;
use crate::state::AppState;

/// Compares two secrets in constant time.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Phase 11: the answer to a `/metrics` request without the token; any other request goes on.
pub fn guard(state: &AppState, request: &Request) -> Phase<()> {
    if request.uri().path() != METRICS_PATH {
        return Ok(());
    }
    let Some(token) = state.config.metrics.token.as_deref() else {
        return Err(GatewayError::not_found("no route for this path").into_response());
    };
    let presented = crate::auth::bearer::bearer(request.headers())
        .ok()
        .flatten()
        .unwrap_or_default();
    if constant_time_eq(presented.as_bytes(), token.as_bytes()) {
        return Ok(());
    }
    let mut response = GatewayError::unauthorized(
        "invalid_metrics_token",
        "a valid metrics bearer token is required",
    )
    .into_response();
    response
        .headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    Err(response)
}
