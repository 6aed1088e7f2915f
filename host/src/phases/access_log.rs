//! Phase 6, the access log: one line per request (target `aura::access`) with request id, plane,
//! route group, method, path, status, latency, error code and the side that failed, actor role, key id and user token issuer — never the key
//! itself. The line is built only when `aura::access` is enabled at `info`, and written through
//! the non-blocking log writer ([`crate::telemetry`]).

use axum::response::Response;
use http::Method;

use super::context::RequestContext;
use crate::error::ErrorCode;

/// Writes the line of a request.
pub fn line(cx: &RequestContext, method: &Method, path: &str, response: &Response) {
    if !tracing::enabled!(target: "aura::access", tracing::Level::INFO) {
        return;
    }
    let actor = cx.actor.as_deref();
    let error = response.extensions().get::<ErrorCode>();
    tracing::info!(
        target: "aura::access",
        request_id = cx.id.as_ref().map_or("-", |id| id.as_str()),
        plane = cx.plane.as_str(),
        group = cx.group.as_str(),
        method = %method,
        path = %path,
        status = response.status().as_u16(),
        latency_us = cx.started.elapsed().as_micros() as u64,
        error = error.map_or("-", |e| e.code),
        side = error.map_or("-", |e| e.side.as_str()),
        role = actor.map(|a| a.role.as_str()).unwrap_or("-"),
        key_id = actor.and_then(|a| a.key_id.as_deref()).unwrap_or("-"),
        // The issuer of a verified user token (`platform` or the project's trusted `iss`),
        // never the token.
        issuer = actor
            .and_then(|a| a.issuer.as_ref())
            .map_or("-", |i| i.as_str()),
        "access"
    );
}
