//! The service routes of CONTRACT §2, mounted on both planes with the same handlers.
//!
//! Each timeout group gets its budget layer before the groups are merged: a functions request
//! is never wrapped by the default budget.

use axum::Router;
use axum::middleware::from_fn_with_state;
use axum::response::IntoResponse;
use axum::routing::get;

use crate::config::TimeoutConfig;
use crate::error::GatewayError;
use crate::middleware::budget::{Budget, enforce};
use crate::proxy::service::Service;
use crate::proxy::{db_route, http_route, nats_route};
use crate::state::AppState;

/// Routes of the default timeout group (everything but functions), without their budget.
fn default_group() -> Router<AppState> {
    Router::new()
        .route("/v1/auth/{*rest}", nats_route(Service::Auth))
        .route("/v1/db/{*rest}", db_route())
        .route("/v1/storage/{*rest}", http_route(Service::Storage))
        .route("/v1/realtime/{*rest}", http_route(Service::Realtime))
        .route(
            "/v1/notifications/{*rest}",
            nats_route(Service::Notifications),
        )
        .route("/v1/ai/{*rest}", nats_route(Service::Ai))
        .route("/v1/control/{*rest}", nats_route(Service::Control))
}

/// Routes of the functions timeout group, without their budget.
fn functions_group() -> Router<AppState> {
    Router::new().route("/v1/functions/{*rest}", nats_route(Service::Functions))
}

/// Wraps a group in its budget.
pub fn with_budget(group: Router<AppState>, budget: std::time::Duration) -> Router<AppState> {
    group.layer(from_fn_with_state(Budget(budget), enforce))
}

/// Every service route, each group under its own budget.
pub fn service_routes(timeouts: &TimeoutConfig) -> Router<AppState> {
    with_budget(default_group(), timeouts.default_budget())
        .merge(with_budget(functions_group(), timeouts.functions_budget()))
}

/// `GET /health`: liveness, answered by the gateway itself.
pub fn health() -> Router<AppState> {
    Router::new().route(
        "/health",
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
