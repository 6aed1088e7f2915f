//! The middleware chain of both planes, written once.
//!
//! In axum the LAST `.layer()` is the OUTERMOST: a request goes through the layers from the
//! bottom of [`apply`] to its top, and the response back up. The order, outermost first:
//!
//! | # | layer | why it sits there |
//! |---|---|---|
//! | 1 | CORS | a preflight is answered before any other work; CORS headers go on every response, errors included |
//! | 2 | security headers | stamped on everything produced inside, gateway errors included |
//! | 3 | request limits | refused paths (400) and oversized bodies (413) are answered before any logging, auth or plugin work |
//! | 4 | trace | the request span wraps everything that does work |
//! | 5 | metrics | counts every request that got past the limits, with its final status |
//! | 6 | access log | one line per request with its final status and latency |
//! | 7 | request id | every response from here in carries the id; backends get the same id |
//! | 8 | per-IP rate limit | floods are refused before any credential work |
//! | 9 | auth | establishes the actor |
//! | 10 | per-actor quota | needs the actor |
//! | 11 | metrics auth | guards `/metrics` only; innermost, next to the handler it protects |
//!
//! Before all of it, outside the router, the path is normalised ([`crate::middleware::path`]):
//! routing and every layer see the same path. Timeout budgets are not in the chain: each route
//! group carries its own ([`super::routes::service_routes`]).

use axum::Router;
use axum::middleware::{from_fn, from_fn_with_state};

use crate::middleware::{
    PlaneCtx, access_log, auth, body_limit, cors, metrics, metrics_auth, quota, rate_limit,
    request_id, security_headers, trace,
};
use crate::plane::Plane;
use crate::state::AppState;

/// Puts `routes` (fallbacks included) under the chain of `plane`.
pub fn apply(routes: Router<AppState>, state: AppState, plane: Plane) -> Router {
    let ctx = PlaneCtx {
        state: state.clone(),
        plane,
    };
    let chained = routes
        .layer(from_fn_with_state(ctx.clone(), metrics_auth::guard)) // 11, innermost
        .layer(from_fn_with_state(ctx.clone(), quota::per_actor)) // 10
        .layer(from_fn_with_state(ctx.clone(), auth::authenticate)) // 9
        .layer(from_fn_with_state(ctx.clone(), rate_limit::per_ip)) // 8
        .layer(from_fn(request_id::assign)) // 7
        .layer(from_fn_with_state(ctx.clone(), access_log::log)) // 6
        .layer(from_fn_with_state(ctx.clone(), metrics::record)) // 5
        .layer(trace::layer(plane)) // 4
        .layer(from_fn_with_state(ctx.clone(), body_limit::limit)) // 3
        .layer(from_fn(security_headers::apply)) // 2
        .layer(from_fn_with_state(ctx, cors::cors)) // 1, outermost
        .with_state(state);
    // Normalised before routing: the router sees the same path as every layer and handler.
    Router::new().fallback_service(tower::util::MapRequest::new(
        chained,
        crate::middleware::path::normalize_request,
    ))
}
