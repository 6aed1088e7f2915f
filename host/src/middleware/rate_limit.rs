//! Per-IP rate limit, before authentication, on every route of the plane (public ones too): a
//! flood is refused before any credential or plugin work.

use std::net::{IpAddr, Ipv4Addr};

use axum::extract::{ConnectInfo, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, HeaderValue};

use super::PlaneCtx;
use crate::error::GatewayError;
use crate::ratelimit::Decision;
use crate::ratelimit::client_ip::client_ip;

/// The client IP of the request (request extension), as the per-IP limit saw it.
#[derive(Debug, Clone, Copy)]
pub struct ClientIp(pub IpAddr);

fn secs(d: std::time::Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// Sets `RateLimit-Limit`, `RateLimit-Remaining` and `RateLimit-Reset`.
pub fn rate_limit_headers(headers: &mut HeaderMap, decision: &Decision) {
    headers.insert("ratelimit-limit", HeaderValue::from(decision.limit));
    headers.insert("ratelimit-remaining", HeaderValue::from(decision.remaining));
    headers.insert("ratelimit-reset", HeaderValue::from(secs(decision.reset)));
}

/// Counts a decision in `aura_ratelimit_decisions_total`.
pub fn count(ctx: &PlaneCtx, limiter: &str, decision: &Decision) {
    let verdict = if decision.allowed {
        "allowed"
    } else {
        "limited"
    };
    ctx.state
        .metrics
        .ratelimit_decisions
        .with_label_values(&[ctx.plane.as_str(), limiter, verdict])
        .inc();
}

/// The 429 answer of a denied decision.
pub fn too_many(decision: &Decision) -> Response {
    let mut response = GatewayError::rate_limited(decision.reset).into_response();
    rate_limit_headers(response.headers_mut(), decision);
    response
}

/// Marks a response refused by the per-IP limit (response extension): the CORS layer then
/// answers with the plane's module, never a project's.
#[derive(Debug, Clone, Copy)]
pub struct IpLimited;

/// The client IP of a request, as the per-IP limit computes it.
pub fn client_ip_of(ctx: &PlaneCtx, request: &Request) -> IpAddr {
    let peer = request
        .extensions()
        .get::<ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0.ip())
        .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
    client_ip(
        peer,
        request.headers(),
        &ctx.state.config.rate_limit.trusted_proxies,
    )
}

/// Takes one token of the per-IP limit for `request`: the client IP, or the refusal.
pub fn check_ip(ctx: &PlaneCtx, request: &Request) -> Result<IpAddr, Decision> {
    let ip = client_ip_of(ctx, request);
    if let Some(decision) = ctx.state.ip_limiter(ctx.plane).check(ip) {
        count(ctx, "ip", &decision);
        if !decision.allowed {
            return Err(decision);
        }
    }
    Ok(ip)
}

/// The 429 answer of the per-IP limit, marked [`IpLimited`].
pub fn ip_limited(decision: &Decision) -> Response {
    let mut response = too_many(decision);
    response.extensions_mut().insert(IpLimited);
    response
}

/// The layer.
pub async fn per_ip(State(ctx): State<PlaneCtx>, mut request: Request, next: Next) -> Response {
    match check_ip(&ctx, &request) {
        Ok(ip) => {
            request.extensions_mut().insert(ClientIp(ip));
            next.run(request).await
        }
        Err(decision) => ip_limited(&decision),
    }
}
