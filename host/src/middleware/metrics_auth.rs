//! `/metrics` guard, the innermost layer: a bearer token from the configuration, compared in
//! constant time. Without a configured token the endpoint does not exist (404).

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::{HeaderValue, header};

use super::PlaneCtx;
use crate::error::GatewayError;

/// The metrics path.
pub const METRICS_PATH: &str = "/metrics";

/// Compares two secrets in constant time.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The layer.
pub async fn guard(State(ctx): State<PlaneCtx>, request: Request, next: Next) -> Response {
    if request.uri().path() != METRICS_PATH {
        return next.run(request).await;
    }
    let Some(token) = ctx.state.config.metrics.token.as_deref() else {
        return GatewayError::not_found("no route for this path").into_response();
    };
    let presented = crate::auth::bearer::bearer(request.headers())
        .ok()
        .flatten()
        .unwrap_or_default();
    if !constant_time_eq(presented.as_bytes(), token.as_bytes()) {
        let mut response = GatewayError::unauthorized(
            "invalid_metrics_token",
            "a valid metrics bearer token is required",
        )
        .into_response();
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        return response;
    }
    next.run(request).await
}
