//! The management plane: console traffic only.

use axum::Router;
use axum::routing::{get, post};

use super::chain;
use super::routes::{health, service_routes, with_budget, with_fallbacks};
use crate::plane::Plane;
use crate::proxy::forward_nats;
use crate::proxy::service::Service;
use crate::state::AppState;

/// A management route forwarded to `service` over NATS.
macro_rules! to {
    ($method:ident, $service:expr) => {
        $method(
            |axum::extract::State(state): axum::extract::State<AppState>,
             request: axum::extract::Request| async move {
                axum::response::IntoResponse::into_response(
                    forward_nats(&state, $service, request).await,
                )
            },
        )
    };
}

/// The management plane's extra routes, in the default timeout group.
fn extra_routes() -> Router<AppState> {
    Router::new()
        .merge(health())
        .route(
            "/v1/organizations/{org_id}/projects",
            to!(post, Service::Provisioner),
        )
        .route("/v1/projects/{project_ref}", to!(get, Service::Control))
        .route(
            "/v1/projects/{project_ref}/api-keys/rotate",
            to!(post, Service::Control),
        )
        .route(
            "/v1/projects/{project_ref}/logs",
            to!(get, Service::Control),
        )
}

/// Builds the management-plane router: service routes plus the management extras, under the
/// chain.
pub fn build_management_plane_router(state: AppState) -> Router {
    let timeouts = &state.config.timeouts;
    let routes =
        service_routes(timeouts).merge(with_budget(extra_routes(), timeouts.default_budget()));
    chain::apply(with_fallbacks(routes), state, Plane::Management)
}
