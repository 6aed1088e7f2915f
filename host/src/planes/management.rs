//! The management plane: console traffic only.

use axum::Router;
use axum::routing::{MethodFilter, get, post};

use super::chain::PlaneService;
use super::handlers::nats_route;
use super::routes::{health, with_fallbacks};
use crate::plane::Plane;
use crate::routes::Service;
use crate::state::AppState;

/// The management plane's extra routes.
fn extra_routes() -> Router<AppState> {
    Router::new()
        .merge(health())
        .route("/ready", get(ready))
        .route(
            "/v1/organizations/{org_id}/projects",
            nats_route(Service::Provisioner, Some(MethodFilter::POST)),
        )
        .route(
            "/v1/projects/{project_ref}",
            nats_route(Service::Control, Some(MethodFilter::GET)),
        )
        .route(
            "/v1/projects/{project_ref}/api-keys/rotate",
            nats_route(Service::Control, Some(MethodFilter::POST)),
        )
        .route(
            "/v1/projects/{project_ref}/logs",
            nats_route(Service::Control, Some(MethodFilter::GET)),
        )
        .route(
            "/v1/projects/{project_ref}/issuers",
            get(super::issuers::list).post(super::issuers::add),
        )
        .route(
            "/v1/projects/{project_ref}/issuers/{id}",
            get(super::issuers::get).delete(super::issuers::remove),
        )
        .route(
            "/v1/projects/{project_ref}/auth-settings",
            get(super::auth_settings::get).put(super::auth_settings::put),
        )
        .route("/v1/policies/reload", post(super::policies::reload))
        .merge(super::admin::routes())
        .route(
            "/v1/projects/{project_ref}/policies/{stage}",
            axum::routing::put(super::policies::put)
                .get(super::policies::get)
                .delete(super::policies::delete),
        )
        .route(
            "/v1/projects/{project_ref}/policies/{stage}/history",
            get(super::policies::history),
        )
        .route(
            "/v1/projects/{project_ref}/policies/{stage}/schema",
            get(super::policies::schema),
        )
        .route(
            "/v1/projects/{project_ref}/policies/{stage}/rollback",
            post(super::policies::rollback),
        )
        .route(
            "/v1/projects/{project_ref}/policies/{stage}/promote",
            post(super::policies::promote),
        )
        .route(
            "/v1/projects/{project_ref}/policies/{stage}/abort",
            post(super::policies::abort),
        )
}

/// `GET /ready`: whether this instance should get traffic ([`crate::readiness`]). `503` until
/// the control store answered once, NATS is connected and every project's modules are loaded,
/// and from SIGTERM on (the drain delay). Redis is reported but not required (quotas fall back
/// to local limits); a store outage after the first answer is reported but not required either.
async fn ready(
    axum::extract::State(state): axum::extract::State<AppState>,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    // Checked at most once a second (`crate::readiness::PROBE_TTL`), whoever asks.
    let probes = state
        .readiness
        .probes(std::time::Instant::now(), || async {
            let store_up = matches!(
                tokio::time::timeout(std::time::Duration::from_secs(1), state.auth.store.ping())
                    .await,
                Ok(Ok(()))
            );
            crate::readiness::Probes {
                store_up,
                redis_up: state.quotas.redis_up().await,
            }
        })
        .await;
    let report = state
        .readiness
        .report(probes.store_up, state.nats.is_connected());
    let redis = match probes.redis_up {
        None => "not_configured",
        Some(true) => "up",
        Some(false) => "down",
    };
    let up = |ok: bool| if ok { "up" } else { "down" };
    let checks = serde_json::json!({
        "nats": up(report.nats_up),
        "control_store": up(report.store_up),
        "redis": redis,
        "tenant_modules": if report.tenant_modules_listed { "listed" } else { "listing" },
        "draining": report.draining,
    });
    match report.reason() {
        None => {
            axum::Json(serde_json::json!({ "status": "ready", "checks": checks })).into_response()
        }
        Some(reason) => {
            let code = if report.draining {
                "draining"
            } else {
                "not_ready"
            };
            let body = serde_json::json!({
                "error": { "code": code, "message": reason },
                "status": code,
                "checks": checks,
            });
            (http::StatusCode::SERVICE_UNAVAILABLE, axum::Json(body)).into_response()
        }
    }
}

/// Builds the management plane's service: service routes plus the management extras, behind
/// the phases of [`super::chain`].
pub fn build_management_plane_router(state: AppState) -> PlaneService {
    let routes = with_fallbacks(extra_routes()).with_state(state.clone());
    PlaneService::new(state, Plane::Management, routes)
}
