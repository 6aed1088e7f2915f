//! Phase 8, the per-IP rate limit, before authentication, on every route of the plane (public
//! ones too): a flood is refused before any credential or plugin work. CORS preflights, answered
//! in phase 1, take their token here too.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use axum::extract::{ConnectInfo, Request};
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, HeaderName, HeaderValue};

use super::context::RequestContext;
use crate::error::GatewayError;
use crate::plane::Plane;
use crate::ratelimit::Decision;
use crate::ratelimit::client_ip::client_ip;
use crate::state::AppState;

static RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("ratelimit-limit");
static RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("ratelimit-remaining");
static RATELIMIT_RESET: HeaderName = HeaderName::from_static("ratelimit-reset");

fn secs(d: std::time::Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// Sets `RateLimit-Limit`, `RateLimit-Remaining` and `RateLimit-Reset`.
pub fn rate_limit_headers(headers: &mut HeaderMap, decision: &Decision) {
    headers.insert(RATELIMIT_LIMIT.clone(), HeaderValue::from(decision.limit));
    headers.insert(
        RATELIMIT_REMAINING.clone(),
        HeaderValue::from(decision.remaining),
    );
    headers.insert(
        RATELIMIT_RESET.clone(),
        HeaderValue::from(secs(decision.reset)),
    );
}

/// Counts a decision in `aura_ratelimit_decisions_total`.
pub fn count(state: &AppState, plane: Plane, limiter: Limiter, decision: &Decision) {
    state
        .metrics
        .ratelimit_decision(plane, limiter == Limiter::Actor, decision.allowed)
        .inc();
}

/// Which limit decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limiter {
    /// Per client IP (this phase).
    Ip,
    /// Per actor (phase 10).
    Actor,
}

/// The 429 answer of a denied decision.
pub fn too_many(decision: &Decision) -> Response {
    let mut response = GatewayError::rate_limited(decision.reset).into_response();
    rate_limit_headers(response.headers_mut(), decision);
    response
}

/// The TCP peer of a request (set by the listener).
pub fn peer(request: &Request) -> IpAddr {
    request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip())
        .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED))
}

/// Whether the TCP peer of `request` is in `rate_limit.trusted_proxies` (its forwarding and
/// trace headers are then believed).
pub fn is_trusted_peer(state: &AppState, request: &Request) -> bool {
    let trusted = &state.config.rate_limit.trusted_proxies;
    if trusted.is_empty() {
        return false;
    }
    let peer = crate::ratelimit::client_ip::canonical(peer(request));
    trusted.iter().any(|net| net.contains(&peer))
}

/// Takes one token of the per-IP limit for `request` and records the client IP in `cx`; the
/// refusal when denied (`cx.ip_limited` is then set).
pub fn check(state: &AppState, cx: &mut RequestContext, request: &Request) -> Result<(), Decision> {
    let ip = client_ip(
        peer(request),
        request.headers(),
        &state.config.rate_limit.trusted_proxies,
    );
    cx.client_ip = Some(ip);
    if let Some(decision) = state.ip_limiter(cx.plane).check(ip) {
        count(state, cx.plane, Limiter::Ip, &decision);
        if !decision.allowed {
            cx.ip_limited = true;
            return Err(decision);
        }
    }
    Ok(())
}

/// The 429 answer of the per-IP limit.
pub fn limited(decision: &Decision) -> Response {
    too_many(decision)
}
