//! One access log line per request (target `aura::access`): request id, plane, route group,
//! method, path, status, latency, error code, actor role and key id — never the key itself.

use std::time::Instant;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;

use super::PlaneCtx;
use super::request_id::X_REQUEST_ID;
use crate::actor::Actor;
use crate::error::ErrorCode;
use crate::route_group::RouteGroup;

/// The layer.
pub async fn log(State(ctx): State<PlaneCtx>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let response = next.run(request).await;
    let request_id = response
        .headers()
        .get(&X_REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-");
    let actor = response.extensions().get::<Actor>();
    tracing::info!(
        target: "aura::access",
        request_id,
        plane = ctx.plane.as_str(),
        group = RouteGroup::of(&path).as_str(),
        method = %method,
        path = %path,
        status = response.status().as_u16(),
        latency_us = started.elapsed().as_micros() as u64,
        error = response.extensions().get::<ErrorCode>().map(|c| c.0).unwrap_or("-"),
        role = actor.map(|a| a.role.as_str()).unwrap_or("-"),
        key_id = actor.and_then(|a| a.key_id.as_deref()).unwrap_or("-"),
        "access"
    );
    response
}
