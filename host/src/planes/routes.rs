//! The service routes of CONTRACT §2, mounted on both planes with the same handlers.
//!
//! Timeout budgets are per route group and applied by the route phase of the plane's service
//! ([`super::chain`]): a functions request gets the functions budget, never the default one, and
//! there is no global timeout.

use axum::Router;
use axum::response::IntoResponse;
use axum::routing::get;

use crate::error::GatewayError;
use crate::proxy::service::Service;
use crate::proxy::{db_route, http_route, nats_route};
use crate::state::AppState;

/// Every service route.
pub fn service_routes() -> Router<AppState> {
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
        .route("/v1/functions/{*rest}", nats_route(Service::Functions))
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
