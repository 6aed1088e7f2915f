//! Introspection of one instance, on the management plane only: what is in force here.
//!
//! Every route needs `Authorization: Bearer <admin.token>` (or `plugins.admin_token` when no
//! `admin.token` is set); without either configured the routes do not exist (`404`).
//!
//! - `GET /v1/admin/status`: version, git revision, build profile, uptime, config digest;
//! - `GET /v1/admin/policies`: per plane and stage the module in force (name, digest, loaded at,
//!   calls, failures, p50/p99 call time), the rollback candidate, every project's modules;
//! - `GET /v1/admin/policies/history`: the operator's module changes;
//! - `POST /v1/admin/policies/rollback`: the previous set of operator modules back in force
//!   (until the next reload), recorded;
//! - `POST /v1/admin/policies/{plane}/{stage}/promote|abort`: the operator's candidate for a
//!   stage made the module in force, or no longer tried, on this instance until the next reload;
//! - `GET /v1/admin/breakers`: every circuit breaker, its state, failures and last change;
//! - `GET /v1/admin/config`: the effective configuration, secrets redacted;
//! - `PUT /v1/admin/log-level` `{"level": "…"}`: a new tracing filter until the next restart.

use std::time::{SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use serde_json::{Value, json};

use crate::breaker::{BreakerSnapshot, BreakerState};
use crate::error::GatewayError;
use crate::policy::runtime::stats::ModuleReport;
use crate::policy::{PlanePolicies, Policies};
use crate::state::AppState;

/// The admin routes (management plane).
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/admin/status", get(status))
        .route("/v1/admin/policies", get(policies))
        .route("/v1/admin/policies/history", get(policy_history))
        .route(
            "/v1/admin/policies/rollback",
            axum::routing::post(policy_rollback),
        )
        .route(
            "/v1/admin/policies/{plane}/{stage}/{action}",
            axum::routing::post(candidate_action),
        )
        .route("/v1/admin/breakers", get(breakers))
        .route("/v1/admin/config", get(config))
        .route("/v1/admin/log-level", put(log_level))
}

/// The token that guards the admin routes, if any.
fn admin_token(state: &AppState) -> Option<&str> {
    state
        .config
        .admin
        .token
        .as_deref()
        .or(state.config.plugins.admin_token.as_deref())
}

/// `Ok` when the request carries the admin token; the error to answer otherwise.
fn guard(state: &AppState, headers: &http::HeaderMap) -> Result<(), GatewayError> {
    super::admin_token::check_token(admin_token(state), headers)
}

fn unix_secs(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

async fn status(State(state): State<AppState>, headers: http::HeaderMap) -> Response {
    if let Err(error) = guard(&state, &headers) {
        return error.into_response();
    }
    let uptime = state.started_at.elapsed().unwrap_or_default();
    Json(json!({
        "version": env!("CARGO_PKG_VERSION"),
        "git_revision": option_env!("BUILD_GIT_REVISION").unwrap_or("unknown"),
        "build_profile": if cfg!(debug_assertions) { "debug" } else { "release" },
        "started_at": unix_secs(state.started_at),
        "uptime_secs": uptime.as_secs(),
        "config_digest": state.config.digest(),
    }))
    .into_response()
}

fn module_json(m: &ModuleReport) -> Value {
    let round = |v: Option<f64>| v.map(|v| (v * 100.0).round() / 100.0);
    json!({
        "name": m.name,
        "digest": m.digest,
        "loaded_at": unix_secs(m.loaded_at),
        "calls": m.calls,
        "failures": m.failures,
        "p50_us": round(m.p50_us),
        "p99_us": round(m.p99_us),
        "cache": m.cache,
    })
}

/// The operator's candidates of both planes: module, mode, percent, whether still tried, and a
/// shadow's comparison.
fn candidates_json(policies: &Policies) -> Value {
    use crate::policy::AnyModule;
    use crate::policy::slot::Trying;
    fn one((module, trying): (&dyn AnyModule, &Trying)) -> Value {
        let mut v = module_json(&module.report());
        if let Value::Object(m) = &mut v {
            m.insert("mode".into(), json!(trying.trial.mode().as_str()));
            m.insert(
                "percent".into(),
                json!(Some(trying.trial.percent()).filter(|p| *p > 0)),
            );
            m.insert("tried".into(), json!(!trying.is_dropped()));
            if trying.trial == crate::stage::Trial::Shadow {
                m.insert(
                    "shadow".into(),
                    super::policies::shadow_json(&trying.comparison.report()),
                );
            }
        }
        v
    }
    let plane = |p: &PlanePolicies| {
        p.slots()
            .filter_map(|slot| Some((slot.stage().key().to_owned(), one(slot.candidate()?))))
            .collect::<serde_json::Map<_, _>>()
    };
    json!({ "data": plane(&policies.data), "management": plane(&policies.management) })
}

/// `POST /v1/admin/policies/{plane}/{stage}/promote|abort`.
async fn candidate_action(
    State(state): State<AppState>,
    headers: http::HeaderMap,
    path: Result<
        axum::extract::Path<(String, String, String)>,
        axum::extract::rejection::PathRejection,
    >,
) -> Response {
    if let Err(error) = guard(&state, &headers) {
        return error.into_response();
    }
    let Ok(axum::extract::Path((plane, stage, action))) = path else {
        return GatewayError::not_found("no such route").into_response();
    };
    let (Some(plane), Some(stage)) = (
        crate::plane::Plane::parse(&plane),
        crate::stage::Stage::parse(&stage).filter(|s| s.info().trials),
    ) else {
        return GatewayError::not_found("plane: data or management; stage: cors or quota")
            .into_response();
    };
    let done = match action.as_str() {
        "promote" => state.policies.promote_operator_candidate(plane, stage),
        "abort" => state.policies.abort_operator_candidate(plane, stage),
        _ => return GatewayError::not_found("actions: promote, abort").into_response(),
    };
    if done {
        Json(json!({ "plane": plane.as_str(), "stage": stage.key(), "status": action }))
            .into_response()
    } else {
        GatewayError::conflict(
            "no_candidate",
            "no candidate is being tried for this stage on this instance",
        )
        .into_response()
    }
}

fn planes_json(policies: &Policies) -> Value {
    let plane = |p: &PlanePolicies| {
        p.reports()
            .iter()
            .map(|(stage, report)| (stage.key().to_owned(), module_json(report)))
            .collect::<serde_json::Map<_, _>>()
    };
    json!({ "data": plane(&policies.data), "management": plane(&policies.management) })
}

/// `GET /v1/admin/policies/history`: the operator's module changes (reloads, automatic
/// rollbacks), newest first (`?limit=`, 100 by default).
async fn policy_history(
    State(state): State<AppState>,
    headers: http::HeaderMap,
    query: axum::extract::Query<super::policies::HistoryQuery>,
) -> Response {
    if let Err(error) = guard(&state, &headers) {
        return error.into_response();
    }
    let limit = query.limit().clamp(1, 1000);
    match state.auth.store.policy_events(None, None, limit).await {
        Err(e) => crate::auth::store_failed(&e).into_response(),
        Ok(events) => Json(json!({
            "events": events.iter().map(super::policies::event_json).collect::<Vec<_>>(),
        }))
        .into_response(),
    }
}

/// `POST /v1/admin/policies/rollback`: the operator modules in force before the last reload
/// are put back on this instance (each instance keeps its own previous set).
async fn policy_rollback(State(state): State<AppState>, headers: http::HeaderMap) -> Response {
    if let Err(error) = guard(&state, &headers) {
        return error.into_response();
    }
    if state.policies.roll_back_by_operator() {
        state
            .metrics
            .policy_reloads
            .with_label_values(&["rolled_back"])
            .inc();
        Json(json!({ "status": "rolled_back" })).into_response()
    } else {
        GatewayError::conflict(
            "no_previous_modules",
            "no previous set of modules is kept on this instance (none since the start, or \
             already rolled back)",
        )
        .into_response()
    }
}

/// `?after=<ref>&limit=N` of `GET /v1/admin/policies`: a page of the projects' modules, in
/// the order of their refs (`limit` 1–1000, 100 by default).
#[derive(Debug, serde::Deserialize)]
struct ProjectsPage {
    after: Option<String>,
    limit: Option<usize>,
}

async fn policies(
    State(state): State<AppState>,
    headers: http::HeaderMap,
    page: axum::extract::Query<ProjectsPage>,
) -> Response {
    if let Err(error) = guard(&state, &headers) {
        return error.into_response();
    }
    let limit = page.limit.unwrap_or(100).clamp(1, 1000);
    let tenants = &state.policies.tenants;
    let (reports, next) = tenants.reports_page(page.after.as_deref(), limit);
    let mut projects = serde_json::Map::new();
    for (project, stage, report) in reports {
        let entry = projects
            .entry(project)
            .or_insert_with(|| Value::Object(serde_json::Map::new()));
        if let Value::Object(stages) = entry {
            stages.insert(stage.key().to_owned(), module_json(&report));
        }
    }
    Json(json!({
        "planes": planes_json(&state.policies.snapshot()),
        "candidates": candidates_json(&state.policies.snapshot()),
        "rollback_candidate": state.policies.rollback_candidate().map(|p| planes_json(&p)),
        "projects": projects,
        "projects_loaded": tenants.loaded_projects(),
        "next_after": next,
    }))
    .into_response()
}

fn breaker_json(b: &BreakerSnapshot) -> Value {
    json!({
        "name": b.name,
        "state": match b.state {
            BreakerState::Closed => "closed",
            BreakerState::HalfOpen => "half_open",
            BreakerState::Open => "open",
        },
        "failures": b.failures,
        "last_change": b.changed_at.map(unix_secs),
    })
}

async fn breakers(State(state): State<AppState>, headers: http::HeaderMap) -> Response {
    if let Err(error) = guard(&state, &headers) {
        return error.into_response();
    }
    let mut services: Vec<BreakerSnapshot> = state
        .breakers
        .services()
        .map(|(_, b)| b.snapshot())
        .collect();
    services.sort_by(|a, b| a.name.cmp(&b.name));
    let mut targets = state.breakers.postgrest.snapshots();
    targets.sort_by(|a, b| a.name.cmp(&b.name));
    Json(json!({
        "services": services.iter().map(breaker_json).collect::<Vec<_>>(),
        "postgrest_targets": targets.iter().map(breaker_json).collect::<Vec<_>>(),
    }))
    .into_response()
}

async fn config(State(state): State<AppState>, headers: http::HeaderMap) -> Response {
    if let Err(error) = guard(&state, &headers) {
        return error.into_response();
    }
    Json(state.config.redacted()).into_response()
}

#[derive(serde::Deserialize)]
struct LogLevel {
    level: String,
}

async fn log_level(
    State(state): State<AppState>,
    headers: http::HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    if let Err(error) = guard(&state, &headers) {
        return error.into_response();
    }
    let Ok(LogLevel { level }) = serde_json::from_slice::<LogLevel>(&body) else {
        return GatewayError::bad_request(
            "invalid_body",
            "expected a JSON object {\"level\": \"<tracing filter>\"}",
        )
        .into_response();
    };
    match crate::telemetry::set_level(&level) {
        Ok(()) => {
            tracing::warn!(%level, "log level changed through the admin API (until restart)");
            Json(json!({ "level": level, "until": "restart" })).into_response()
        }
        Err(problem) => GatewayError::bad_request("invalid_log_level", problem).into_response(),
    }
}
