//! The service routes of CONTRACT §2 ([`crate::routes`]), mounted on both planes with the same
//! handlers: the route phase of each plane's service ([`super::chain`]) sends a path under
//! `/v1/{service}/…` to [`serve`], and every other path to the plane's own router (its extra routes and the
//! JSON 404/405 fallbacks).
//!
//! Timeout budgets are per route group and applied by that route phase: a functions request gets
//! the functions budget, never the default one, and there is no global timeout.

use axum::Router;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use super::handlers::{forward_http_service, forward_nats, route_db};
use crate::error::GatewayError;
use crate::phases::context::RouteContext;
use crate::routes::{HEALTH_PATH, Service, Transport};
use crate::state::AppState;

/// Handles one request of a service route, with what the phases handed it: over the
/// service's transport ([`crate::routes::SERVICES`]).
pub async fn serve(
    service: Service,
    state: &AppState,
    cx: &RouteContext,
    request: Request,
) -> Response {
    let result = match service.row().transport {
        Transport::Nats => forward_nats(state, service, cx, request).await,
        Transport::DbRouting => route_db(state, cx, request).await,
        Transport::Http => forward_http_service(state, service, cx, request).await,
    };
    result.unwrap_or_else(IntoResponse::into_response)
}

/// `GET /health`: liveness, answered by the gateway itself.
pub fn health() -> Router<AppState> {
    Router::new().route(
        HEALTH_PATH,
        get(|| async { axum::Json(serde_json::json!({ "status": "ok" })) }),
    )
}

/// Fallbacks of both planes: unknown paths and methods get the contract's JSON errors.
pub fn with_fallbacks(router: Router<AppState>) -> Router<AppState> {
    router
        .fallback(|| async { GatewayError::not_found("no route for this path").into_response() })
        .method_not_allowed_fallback(|| async {
            GatewayError::method_not_allowed().into_response()
        })
}
