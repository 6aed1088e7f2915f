//! Phase 8, the per-IP rate limit, before authentication, on every route of the plane (public
//! ones too): a flood is refused before any credential or plugin work. CORS preflights, answered
//! in phase 1, take their token here too.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use axum::extract::{ConnectInfo, Request};
use axum::response::{IntoResponse, Response};
use http::HeaderMap;

use super::Phase;
use super::context::RequestContext;
use crate::error::GatewayError;
use crate::plane::Plane;
use crate::ratelimit::Decision;
use crate::ratelimit::client_ip::client_ip;
use crate::state::AppState;

use super::stamps::RateLimitNumbers;

/// Sets `RateLimit-Limit`, `RateLimit-Remaining` and `RateLimit-Reset`.
pub fn rate_limit_headers(headers: &mut HeaderMap, decision: &Decision) {
    RateLimitNumbers::of(decision).write(headers);
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

/// The TCP peer of a request that reached the plane's service without its listener: the
/// address a caller put in its `ConnectInfo` extension (the tests of the chain do), else
/// unspecified. The listener hands the peer to the service directly.
pub fn peer_of(request: &Request) -> IpAddr {
    request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip())
        .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED))
}

/// Whether the TCP peer `peer` is in `rate_limit.trusted_proxies` (its forwarding and trace
/// headers are then believed).
pub fn is_trusted_peer(state: &AppState, peer: IpAddr) -> bool {
    let trusted = &state.config.rate_limit.trusted_proxies;
    if trusted.is_empty() {
        return false;
    }
    let peer = crate::ratelimit::client_ip::canonical(peer);
    trusted.iter().any(|net| net.contains(&peer))
}

/// Phase 8: takes one token of the per-IP limit for `request` and records the client IP in
/// `cx`; the `429` when denied (`cx.ip_limited` is then set).
pub fn check(state: &AppState, cx: &mut RequestContext, request: &Request) -> Phase<()> {
    let ip = client_ip(
        cx.peer,
        request.headers(),
        &state.config.rate_limit.trusted_proxies,
    );
    cx.client_ip = Some(ip);
    if let Some(decision) = state.ip_limiter(cx.plane).check(ip) {
        count(state, cx.plane, Limiter::Ip, &decision);
        if !decision.allowed {
            cx.ip_limited = true;
            return Err(too_many(&decision));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::phases::stamps::{RATELIMIT_LIMIT, RATELIMIT_REMAINING, RATELIMIT_RESET};

    #[test]
    fn the_three_headers_carry_the_decision() {
        let mut headers = HeaderMap::new();
        let decision = Decision {
            allowed: true,
            limit: 1000,
            remaining: 5_000_000,
            reset: Duration::from_millis(1_500),
        };
        rate_limit_headers(&mut headers, &decision);
        let get = |name: &http::HeaderName| headers.get(name).and_then(|v| v.to_str().ok());
        assert_eq!(get(&RATELIMIT_LIMIT), Some("1000"));
        assert_eq!(get(&RATELIMIT_REMAINING), Some("5000000"));
        assert_eq!(get(&RATELIMIT_RESET), Some("2"));
    }
}
