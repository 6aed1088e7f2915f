//! The service routes of CONTRACT §2, mounted on both planes with the same handlers: the route
//! phase of each plane's service ([`super::chain`]) sends a path under `/v1/{service}/…` to its
//! handler here, and every other path to the plane's own router (its extra routes and the
//! JSON 404/405 fallbacks).
//!
//! Timeout budgets are per route group and applied by that route phase: a functions request gets
//! the functions budget, never the default one, and there is no global timeout.

use axum::Router;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::error::GatewayError;
use crate::phases::context::RouteContext;
use crate::proxy::service::Service;
use crate::proxy::{forward_http_service, forward_nats, route_db};
use crate::state::AppState;

/// Where a service route goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServiceRoute {
    /// An envelope over NATS to the service.
    Nats(Service),
    /// `/v1/db/*`: decided per request by the `db-routing` stage.
    Db,
    /// HTTP to the service's base URL.
    Http(Service),
}

/// The service route of `path` (`/v1/{service}/{rest}`, `rest` not empty), the same on both
/// planes; `None` when `path` is not a service route.
pub fn service_route(path: &str) -> Option<ServiceRoute> {
    let (head, rest) = path.strip_prefix("/v1/")?.split_once('/')?;
    if rest.is_empty() {
        return None;
    }
    Some(match head {
        "auth" => ServiceRoute::Nats(Service::Auth),
        "db" => ServiceRoute::Db,
        "storage" => ServiceRoute::Http(Service::Storage),
        "realtime" => ServiceRoute::Http(Service::Realtime),
        "notifications" => ServiceRoute::Nats(Service::Notifications),
        "ai" => ServiceRoute::Nats(Service::Ai),
        "control" => ServiceRoute::Nats(Service::Control),
        "functions" => ServiceRoute::Nats(Service::Functions),
        _ => return None,
    })
}

impl ServiceRoute {
    /// Handles one request of this route, with what the phases handed it.
    pub async fn serve(self, state: &AppState, cx: &RouteContext, request: Request) -> Response {
        let result = match self {
            ServiceRoute::Nats(service) => forward_nats(state, service, cx, request).await,
            ServiceRoute::Db => route_db(state, cx, request).await,
            ServiceRoute::Http(service) => forward_http_service(state, service, cx, request).await,
        };
        result.unwrap_or_else(IntoResponse::into_response)
    }
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

#[cfg(test)]
mod tests {
    use super::{ServiceRoute, service_route};
    use crate::proxy::service::Service;

    #[test]
    fn service_routes_need_a_rest_after_the_prefix() {
        assert_eq!(
            service_route("/v1/storage/object/a.png"),
            Some(ServiceRoute::Http(Service::Storage))
        );
        assert_eq!(service_route("/v1/db/todos"), Some(ServiceRoute::Db));
        assert_eq!(
            service_route("/v1/functions/f"),
            Some(ServiceRoute::Nats(Service::Functions))
        );
        assert_eq!(
            service_route("/v1/auth/signup"),
            Some(ServiceRoute::Nats(Service::Auth))
        );
        for none in [
            "/v1/storage",
            "/v1/storage/",
            "/v1/projects/x",
            "/health",
            "/v1/storagex/a",
        ] {
            assert_eq!(service_route(none), None, "{none}");
        }
    }
}
