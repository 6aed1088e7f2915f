//! Phase 6, the access log: one line per request (target `aura::access`) with request id, plane,
//! route group, method, path, status, latency, error code and the side that failed, actor role,
//! key id and user token issuer — never the key itself nor a token. The line is written only
//! when `aura::access` is enabled at `info`, straight into a reused buffer and handed to the log's
//! batched writer ([`crate::telemetry::info_line`]): no `fmt` layer, no allocation, no thread
//! woken per request.

use axum::response::Response;
use http::Method;

use super::context::RequestContext;
use crate::error::ErrorCode;
use crate::telemetry::line::{Key, key};

/// Whether access lines are written (the log filter in force enables `aura::access` at `info`):
/// asked of the filter when the log starts and when its level changes, not per request.
pub fn enabled() -> bool {
    crate::telemetry::access_enabled()
}

const REQUEST_ID: Key = key!("request_id");
const PLANE: Key = key!("plane");
const GROUP: Key = key!("group");
const METHOD: Key = key!("method");
const PATH: Key = key!("path");
const STATUS: Key = key!("status");
const LATENCY_US: Key = key!("latency_us");
const ERROR: Key = key!("error");
const SIDE: Key = key!("side");
const ROLE: Key = key!("role");
const KEY_ID: Key = key!("key_id");
const ISSUER: Key = key!("issuer");

/// Writes the line of a request.
pub fn line(cx: &RequestContext, method: &Method, path: &str, response: &Response) {
    let actor = cx.actor.as_deref();
    let error = response.extensions().get::<ErrorCode>();
    let latency_us = cx.started.elapsed().as_micros() as u64;
    crate::telemetry::info_line(crate::telemetry::ACCESS_TARGET, "access", |line| {
        match &cx.id {
            Some(id) => line.hex(REQUEST_ID, &id.hex()),
            None => line.name(REQUEST_ID, "-"),
        }
        .name(PLANE, cx.plane.as_str())
        .name(GROUP, cx.group.as_str())
        .bare(METHOD, method.as_str())
        .bare(PATH, path)
        .u64(STATUS, u64::from(response.status().as_u16()))
        .u64(LATENCY_US, latency_us)
        .name(ERROR, error.map_or("-", |e| e.code))
        .name(SIDE, error.map_or("-", |e| e.side.as_str()))
        .name(ROLE, actor.map_or("-", |a| a.role.as_str()))
        .str(
            KEY_ID,
            actor.and_then(|a| a.key_id.as_deref()).unwrap_or("-"),
        )
        // The issuer of a verified user token (`platform` or the project's trusted `iss`),
        // never the token.
        .str(
            ISSUER,
            actor
                .and_then(|a| a.issuer.as_ref())
                .map_or("-", |i| i.as_str()),
        );
    });
}
