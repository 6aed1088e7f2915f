//! The data plane: public SDK traffic.

use axum::Router;
use axum::extract::State;
use axum::response::IntoResponse;
use axum::routing::get;
use http::{HeaderValue, header};

use super::chain::PlaneService;
use super::handlers::nats_route;
use super::routes::{health, with_fallbacks};
use crate::plane::Plane;
use crate::routes::{JWKS_PATH, METRICS_PATH, Service};
use crate::state::AppState;

/// The data plane's extra routes.
fn extra_routes() -> Router<AppState> {
    Router::new()
        .merge(health())
        .route(JWKS_PATH, nats_route(Service::Auth, None))
        .route(METRICS_PATH, get(metrics))
}

async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    state.refresh_gauges();
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4"),
        )],
        state.metrics.render(),
    )
}

/// Builds the data plane's service: service routes plus the data plane's extras, behind the
/// phases of [`super::chain`].
pub fn build_data_plane_router(state: AppState) -> PlaneService {
    // `POST /v1/auth/signup` is a service route (auth); it needs no key (auth::data_plane).
    let routes = with_fallbacks(extra_routes()).with_state(state.clone());
    PlaneService::new(state, Plane::Data, routes)
}
