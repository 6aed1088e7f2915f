//! `PUT`, `GET`, `DELETE /v1/projects/{ref}/policies/{stage}` on the management plane: an owner
//! or admin of the project's organization installs a module and configuration for a stage that
//! allows it (`cors`, `quota`). The module is checked at upload — size, compile time, exports,
//! configuration, conformance vectors — stored by digest in the control store, and put in force
//! for that project at once here and within `plugins.tenant_refresh_secs` on other instances.
//!
//! Every change is recorded with the console user who made it
//! (`GET …/policies/{stage}/history`), and `POST …/policies/{stage}/rollback` puts a previous
//! module back.

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use http::StatusCode;
use serde::Deserialize;

use crate::auth::store_failed;
use crate::control::{PolicyEventRecord, ProjectPolicyRecord};
use crate::error::GatewayError;
use crate::phases::context::RouteContext;
use crate::plane::Plane;
use crate::policy::history;
use crate::policy::tenants::{PrepareError, tenant_stage};
use crate::state::AppState;

/// The body of a `PUT`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PutPolicy {
    /// The component, standard base64. Either this or `digest`.
    pub module: Option<String>,
    /// A module already in the store.
    pub digest: Option<String>,
    /// The stage configuration.
    #[serde(default)]
    pub config: Option<serde_json::Value>,
}

fn refused(reason: impl Into<String>) -> GatewayError {
    GatewayError::bad_request("policy_refused", reason)
}

async fn ensure_project(state: &AppState, project: &str) -> Result<(), GatewayError> {
    match state.auth.store.project(project).await {
        Ok(Some(_)) => Ok(()),
        Ok(None) => Err(GatewayError::not_found("project not found")),
        Err(e) => Err(store_failed(&e)),
    }
}

/// The path parameters of the policy routes; a rejection (a segment that is not UTF-8 once
/// decoded) is the contract's JSON error.
type PolicyPath = Result<Path<(String, String)>, PathRejection>;

fn path_params(path: PolicyPath) -> Result<(String, String), GatewayError> {
    path.map(|Path(p)| p)
        .map_err(|e| GatewayError::bad_request("invalid_path", e.body_text()))
}

/// The console user making a change (`-` if the token named none).
fn console_user(route: &RouteContext) -> String {
    route
        .actor
        .user_id
        .clone()
        .unwrap_or_else(|| "-".to_owned())
}

/// `PUT`: installs a module for the project's stage.
pub async fn put(
    State(state): State<AppState>,
    axum::Extension(route): axum::Extension<RouteContext>,
    path: PolicyPath,
    body: axum::body::Body,
) -> Response {
    let (project, stage_key) = match path_params(path) {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    // Bounded before the body is read: uploads cannot pile up bodies and compilations.
    let Some(_upload) = state.policies.tenants.upload_permit() else {
        return GatewayError::unavailable(
            "uploads_busy",
            "too many module uploads are in progress; retry shortly",
        )
        .retry_after(std::time::Duration::from_secs(1))
        .into_response();
    };
    // Read through the chain's body limit (`server.max_body_bytes`), never the framework's own
    // default: past it the answer is the gateway's JSON 413 (with the defaults a module up to
    // `plugins.tenant_max_module_bytes` fits once base64 in JSON).
    let body = match crate::proxy::read_body(body).await {
        Ok(body) => body,
        Err(e) => return e.into_response(),
    };
    put_inner(
        state,
        project,
        stage_key,
        body,
        &console_user(&route),
        "install",
    )
    .await
    .unwrap_or_else(IntoResponse::into_response)
}

async fn put_inner(
    state: AppState,
    project: String,
    stage_key: String,
    body: axum::body::Bytes,
    actor: &str,
    action: &str,
) -> Result<Response, GatewayError> {
    let stage = tenant_stage(&stage_key).ok_or_else(|| {
        refused(format!(
            "projects cannot install a module for {stage_key:?}; stages: cors, quota"
        ))
    })?;
    ensure_project(&state, &project).await?;
    let request: PutPolicy = serde_json::from_slice(&body).map_err(|e| {
        GatewayError::bad_request(
            "invalid_body",
            format!("expected {{module|digest, config}}: {e}"),
        )
    })?;
    drop(body);
    let bytes = match (&request.module, &request.digest) {
        (Some(b64), None) => base64::engine::general_purpose::STANDARD
            .decode(b64.as_bytes())
            .map_err(|e| GatewayError::bad_request("invalid_body", format!("module: {e}")))?,
        (None, Some(digest)) => state
            .auth
            .store
            .module(digest)
            .await
            .map_err(|e| store_failed(&e))?
            .ok_or_else(|| GatewayError::not_found("no module with this digest"))?,
        _ => {
            return Err(GatewayError::bad_request(
                "invalid_body",
                "give exactly one of module, digest",
            ));
        }
    };
    let config = request
        .config
        .unwrap_or_else(|| serde_json::json!({}))
        .to_string();
    let prepared = state
        .policies
        .tenants
        .prepare(&project, stage, &bytes, &config)
        .await
        .map_err(|e| match e {
            PrepareError::TooLarge { .. } => GatewayError::payload_too_large(e.to_string()),
            PrepareError::Refused(reason) => refused(reason),
            PrepareError::Unavailable(reason) => {
                GatewayError::unavailable("policy_check_unavailable", reason)
                    .retry_after(std::time::Duration::from_secs(1))
            }
        })?;
    let digest = prepared.installed.digest.clone();
    let store = &state.auth.store;
    {
        // The store write and the local change together, in request order; a refresh running
        // meanwhile never reverts them.
        let _write = state.policies.tenants.write_lock().await;
        let before = store
            .project_policy(&project, &stage_key)
            .await
            .map_err(|e| store_failed(&e))?
            .map(|p| p.digest);
        store
            .put_module(&digest, &bytes)
            .await
            .map_err(|e| store_failed(&e))?;
        store
            .set_project_policy(&ProjectPolicyRecord {
                project_ref: project.clone(),
                stage: stage_key.clone(),
                digest: digest.clone(),
                config: config.clone(),
            })
            .await
            .map_err(|e| store_failed(&e))?;
        state
            .policies
            .tenants
            .apply(&project, stage, Some(prepared.installed));
        let mut event = history::event(
            actor,
            Some(&project),
            Plane::Data,
            &stage_key,
            action,
            before,
            Some(digest.clone()),
            None,
        );
        event.config = Some(config);
        history::record(store.as_ref(), &event).await;
    }
    crate::changes::publish(
        &state,
        crate::changes::Change::TenantModules {
            project_ref: project.clone(),
        },
    )
    .await;
    let (report, compile) = (prepared.report, prepared.compile);
    tracing::info!(
        project = %project,
        stage = %stage_key,
        %digest,
        report = %report,
        compile_ms = compile.compile_ms,
        compile_peak_rss = compile.peak_rss_bytes,
        compile_cached = compile.cached,
        "tenant module installed"
    );
    Ok(Json(serde_json::json!({
        "project": project,
        "stage": stage_key,
        "digest": digest,
        "check": report.to_string(),
        "compile": compile,
    }))
    .into_response())
}

/// `GET`: the project's module for the stage.
pub async fn get(State(state): State<AppState>, path: PolicyPath) -> Response {
    let (project, stage_key) = match path_params(path) {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    match state.auth.store.project_policy(&project, &stage_key).await {
        Err(e) => store_failed(&e).into_response(),
        Ok(None) => GatewayError::not_found("no module installed for this stage").into_response(),
        Ok(Some(p)) => {
            // How the module did on this instance since it was loaded here.
            let health = tenant_stage(&stage_key)
                .and_then(|stage| state.policies.tenants.report(&project, stage))
                .filter(|r| r.digest == p.digest)
                .map(|r| {
                    let round = |v: Option<f64>| v.map(|v| (v * 100.0).round() / 100.0);
                    serde_json::json!({
                        "calls": r.calls,
                        "failures": {
                            "total": r.failures,
                            "trap": r.traps,
                            "deadline": r.deadlines,
                            "memory": r.memory,
                        },
                        "p50_us": round(r.p50_us),
                        "p99_us": round(r.p99_us),
                    })
                });
            Json(serde_json::json!({
                "project": p.project_ref,
                "stage": p.stage,
                "digest": p.digest,
                "config": serde_json::from_str::<serde_json::Value>(&p.config).unwrap_or_default(),
                "health": health,
            }))
            .into_response()
        }
    }
}

/// `DELETE`: the project goes back to the plane's module.
pub async fn delete(
    State(state): State<AppState>,
    axum::Extension(route): axum::Extension<RouteContext>,
    path: PolicyPath,
) -> Response {
    let (project, stage_key) = match path_params(path) {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    let _write = state.policies.tenants.write_lock().await;
    let before = match state.auth.store.project_policy(&project, &stage_key).await {
        Ok(p) => p.map(|p| p.digest),
        Err(e) => return store_failed(&e).into_response(),
    };
    match state
        .auth
        .store
        .delete_project_policy(&project, &stage_key)
        .await
    {
        Err(e) => store_failed(&e).into_response(),
        Ok(false) => GatewayError::not_found("no module installed for this stage").into_response(),
        Ok(true) => {
            if let Some(stage) = tenant_stage(&stage_key) {
                state.policies.tenants.apply(&project, stage, None);
            }
            let event = history::event(
                &console_user(&route),
                Some(&project),
                Plane::Data,
                &stage_key,
                "delete",
                before,
                None,
                None,
            );
            history::record(state.auth.store.as_ref(), &event).await;
            crate::changes::publish(
                &state,
                crate::changes::Change::TenantModules {
                    project_ref: project.clone(),
                },
            )
            .await;
            StatusCode::NO_CONTENT.into_response()
        }
    }
}

/// The JSON of a history event.
pub fn event_json(e: &PolicyEventRecord) -> serde_json::Value {
    serde_json::json!({
        "at": e.at.to_rfc3339(),
        "actor": e.actor,
        "project": e.project_ref,
        "stage": e.stage,
        "plane": e.plane,
        "action": e.action,
        "digest_before": e.digest_before,
        "digest_after": e.digest_after,
        "mode": e.mode,
        "reason": e.reason,
    })
}

/// `?limit=N` (1–1000, 100 by default).
#[derive(Debug, Deserialize)]
pub struct HistoryQuery {
    limit: Option<usize>,
}

impl HistoryQuery {
    /// The limit asked for, 100 by default.
    pub fn limit(&self) -> usize {
        self.limit.unwrap_or(100)
    }
}

/// `GET …/policies/{stage}/history`: the project's changes of that stage, newest first.
pub async fn history(
    State(state): State<AppState>,
    path: PolicyPath,
    query: axum::extract::Query<HistoryQuery>,
) -> Response {
    let (project, stage_key) = match path_params(path) {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    if let Err(e) = ensure_project(&state, &project).await {
        return e.into_response();
    }
    let limit = query.limit().clamp(1, 1000);
    match state
        .auth
        .store
        .policy_events(Some(&project), Some(&stage_key), limit)
        .await
    {
        Err(e) => store_failed(&e).into_response(),
        Ok(events) => Json(serde_json::json!({
            "project": project,
            "stage": stage_key,
            "events": events.iter().map(event_json).collect::<Vec<_>>(),
        }))
        .into_response(),
    }
}

/// The body of a rollback: a digest of the history (default: the module in force before the
/// current one).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RollbackPolicy {
    pub digest: Option<String>,
}

/// `POST …/policies/{stage}/rollback`: puts a previous module back, with the configuration it
/// had, through the same checks as an install.
pub async fn rollback(
    State(state): State<AppState>,
    axum::Extension(route): axum::Extension<RouteContext>,
    path: PolicyPath,
    body: axum::body::Bytes,
) -> Response {
    let (project, stage_key) = match path_params(path) {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    let answer = async {
        let request: RollbackPolicy = if body.is_empty() {
            RollbackPolicy::default()
        } else {
            serde_json::from_slice(&body).map_err(|e| {
                GatewayError::bad_request("invalid_body", format!("expected {{digest}}: {e}"))
            })?
        };
        ensure_project(&state, &project).await?;
        let store = &state.auth.store;
        let events = store
            .policy_events(Some(&project), Some(&stage_key), 1000)
            .await
            .map_err(|e| store_failed(&e))?;
        let current = store
            .project_policy(&project, &stage_key)
            .await
            .map_err(|e| store_failed(&e))?
            .map(|p| p.digest);
        let target = match request.digest {
            Some(digest) => digest,
            None => events
                .iter()
                .filter_map(|e| e.digest_before.clone())
                .find(|d| Some(d) != current.as_ref())
                .ok_or_else(|| {
                    GatewayError::conflict(
                        "no_previous_module",
                        "the history names no module before the one in force",
                    )
                })?,
        };
        // The configuration the module had when it was last put in force.
        let config = events
            .iter()
            .find(|e| e.digest_after.as_deref() == Some(target.as_str()))
            .ok_or_else(|| {
                GatewayError::conflict(
                    "not_in_history",
                    "this digest was never in force for this stage",
                )
            })?
            .config
            .clone()
            .unwrap_or_else(|| "{}".to_owned());
        let config: serde_json::Value = serde_json::from_str(&config).unwrap_or_default();
        let body = serde_json::to_vec(&serde_json::json!({ "digest": target, "config": config }))
            .unwrap_or_default();
        put_inner(
            state.clone(),
            project,
            stage_key,
            body.into(),
            &console_user(&route),
            "rollback",
        )
        .await
    }
    .await;
    answer.unwrap_or_else(IntoResponse::into_response)
}

/// `POST /v1/policies/reload`: reloads the plugin sections of the config file, like SIGHUP.
/// Guarded by `plugins.admin_token`; without one the route does not exist.
pub async fn reload(State(state): State<AppState>, headers: http::HeaderMap) -> Response {
    if let Err(error) =
        super::admin::check_token(state.config.plugins.admin_token.as_deref(), &headers)
    {
        return error.into_response();
    }
    match crate::reload::reload_and_log(&state, "management API").await {
        Ok(()) => {
            // Every instance reloads its own configuration file too.
            crate::changes::publish(&state, crate::changes::Change::OperatorReload).await;
            Json(serde_json::json!({ "status": "applied" })).into_response()
        }
        Err(error) => error.into_gateway_error().into_response(),
    }
}
