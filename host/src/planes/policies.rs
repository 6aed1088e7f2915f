//! `PUT`, `GET`, `DELETE /v1/projects/{ref}/policies/{stage}` on the management plane: an owner
//! or admin of the project's organization installs a module and configuration for a stage that
//! allows it (`cors`, `quota`). The module is checked at upload — size, compile time, exports,
//! configuration, conformance vectors — stored by digest in the control store, and put in force
//! for that project at once here and within `plugins.tenant_refresh_secs` on other instances.
//!
//! A module may also be installed as a *candidate* next to the one in force (`"mode": "shadow"`,
//! or `"mode": "canary", "percent": N`; [`crate::policy::rollout`]): `POST …/promote` makes it
//! the module in force, `POST …/abort` drops it, and `GET` shows how it compares.
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
use crate::control::{PolicyCandidateRecord, PolicyEventRecord, ProjectPolicyRecord};
use crate::error::GatewayError;
use crate::phases::context::RouteContext;
use crate::plane::Plane;
use crate::policy::history;
use crate::policy::rollout::{ShadowReport, Trial};
use crate::policy::stats::ModuleReport;
use crate::policy::tenants::{PrepareError, Slot, on_trial};
use crate::stage::Stage;
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
    /// `enforce` (the default), `shadow` or `canary`.
    #[serde(default)]
    pub mode: Option<String>,
    /// A canary's share of actors, 1–100.
    #[serde(default)]
    pub percent: Option<i64>,
}

fn refused(reason: impl Into<String>) -> GatewayError {
    GatewayError::bad_request("policy_refused", reason)
}

/// Tells the other instances that `project`'s modules changed.
async fn announce(state: &AppState, project: &str) {
    crate::changes::publish(
        state,
        crate::changes::Change::TenantModules {
            project_ref: project.to_owned(),
        },
    )
    .await;
}

/// The answer to a module that was not put in force, by its cause.
fn prepare_failed(e: PrepareError) -> GatewayError {
    match e {
        PrepareError::TooLarge { .. } => GatewayError::payload_too_large(e.to_string()),
        PrepareError::ConfigTooLarge { .. } => {
            GatewayError::too_large("config_too_large", e.to_string())
        }
        PrepareError::Refused(reason) => refused(reason),
        PrepareError::Unavailable(reason) => {
            GatewayError::unavailable("policy_check_unavailable", reason)
                .retry_after(std::time::Duration::from_secs(1))
        }
    }
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
    // Bounded before the body is read: uploads cannot pile up bodies and compilations, and
    // one organization cannot take every place (its share is
    // `plugins.tenant_max_concurrent_uploads_per_org`).
    let organization = match state.auth.cached_project(&project).await {
        Ok(Some(record)) => record.organization_id,
        Ok(None) => return GatewayError::not_found("project not found").into_response(),
        Err(e) => return e.into_response(),
    };
    let _upload = match state.policies.tenants.upload_permit(organization) {
        Ok(permit) => permit,
        Err(busy) => {
            state
                .metrics
                .tenant_uploads_busy
                .with_label_values(&[busy.label()])
                .inc();
            return GatewayError::unavailable("uploads_busy", busy.to_string())
                .retry_after(std::time::Duration::from_secs(1))
                .into_response();
        }
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
    let stage = Stage::parse_tenant(&stage_key).ok_or_else(|| {
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
    let percent = request
        .percent
        .map(|p| {
            u8::try_from(p)
                .ok()
                .filter(|p| *p <= 100)
                .ok_or_else(|| format!("percent: {p} is not from 1 to 100"))
        })
        .transpose()
        .and_then(|percent| Trial::parse(request.mode.as_deref().unwrap_or("enforce"), percent));
    let trial = percent.map_err(|e| GatewayError::bad_request("invalid_body", e))?;
    let config = request
        .config
        .unwrap_or_else(|| serde_json::json!({}))
        .to_string();
    let max_config = state.policies.tenants.max_config_bytes();
    if config.len() > max_config {
        return Err(prepare_failed(PrepareError::ConfigTooLarge {
            size: config.len(),
            max: max_config,
        }));
    }
    let prepared = state
        .policies
        .tenants
        .prepare(&project, stage, &bytes, &config)
        .await
        .map_err(prepare_failed)?;
    let digest = prepared.installed.digest().to_owned();
    let store = &state.auth.store;
    {
        // The store write and the local change together, in request order; a refresh running
        // meanwhile never reverts them. A candidate goes next to the module in force.
        let _write = state.policies.tenants.write_lock().await;
        let before = match trial {
            None => store
                .project_policy(&project, &stage_key)
                .await
                .map(|p| p.map(|p| p.digest)),
            Some(_) => store
                .policy_candidate(&project, &stage_key)
                .await
                .map(|c| c.map(|c| c.digest)),
        }
        .map_err(|e| store_failed(&e))?;
        store
            .put_module(&digest, &bytes)
            .await
            .map_err(|e| store_failed(&e))?;
        let tenants = &state.policies.tenants;
        match trial {
            None => {
                store
                    .set_project_policy(&ProjectPolicyRecord {
                        project_ref: project.clone(),
                        stage: stage_key.clone(),
                        digest: digest.clone(),
                        config: config.clone(),
                    })
                    .await
                    .map_err(|e| store_failed(&e))?;
                tenants.apply(&project, stage, Some(prepared.installed));
            }
            Some(trial) => {
                store
                    .set_policy_candidate(&PolicyCandidateRecord {
                        project_ref: project.clone(),
                        stage: stage_key.clone(),
                        digest: digest.clone(),
                        config: config.clone(),
                        mode: trial.mode().as_str().to_owned(),
                        percent: trial.percent(),
                    })
                    .await
                    .map_err(|e| store_failed(&e))?;
                let series = tenants.shadow_metrics.series(Plane::Data, stage, &project);
                let candidate = on_trial(prepared.installed, trial, Some(series));
                tenants.apply_slot(&project, stage, Slot::Candidate, Some(candidate));
            }
        }
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
        event.mode = Trial::mode_of(trial).as_str().to_owned();
        event.config = Some(config);
        history::record(store.as_ref(), &event).await;
    }
    announce(&state, &project).await;
    let (report, compile) = (prepared.report, prepared.compile);
    let mode = Trial::mode_of(trial).as_str();
    tracing::info!(
        project = %project,
        stage = %stage_key,
        %digest,
        mode,
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
        "mode": mode,
        "percent": trial.map(Trial::percent).filter(|p| *p > 0),
        "check": report.to_string(),
        "compile": compile,
    }))
    .into_response())
}

/// The JSON of a module's health on this instance.
fn health_json(r: &ModuleReport) -> serde_json::Value {
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
}

/// The JSON of a shadow's comparison on this instance.
pub(crate) fn shadow_json(r: &ShadowReport) -> serde_json::Value {
    serde_json::json!({
        "compared": r.compared,
        "disagreements": r.disagreements,
        "failures": r.failures,
        "skipped": r.skipped,
        "sample": r.sample.iter().map(|d| serde_json::json!({
            "at": d.at.to_rfc3339(),
            "request_id": d.request_id,
            "method": d.method,
            "path": d.path,
            "enforced": d.enforced,
            "shadow": d.shadow,
        })).collect::<Vec<_>>(),
    })
}

fn config_json(config: &str) -> serde_json::Value {
    serde_json::from_str::<serde_json::Value>(config).unwrap_or_default()
}

/// `GET`: the project's module for the stage and its candidate, with how each did on the
/// answering instance since it was loaded there.
pub async fn get(State(state): State<AppState>, path: PolicyPath) -> Response {
    let (project, stage_key) = match path_params(path) {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    let answer = async {
        let store = &state.auth.store;
        let enforced = store
            .project_policy(&project, &stage_key)
            .await
            .map_err(|e| store_failed(&e))?;
        let candidate = store
            .policy_candidate(&project, &stage_key)
            .await
            .map_err(|e| store_failed(&e))?;
        if enforced.is_none() && candidate.is_none() {
            return Err(GatewayError::not_found(
                "no module installed for this stage",
            ));
        }
        let stage = Stage::parse_tenant(&stage_key);
        let health = stage
            .and_then(|stage| state.policies.tenants.installed(&project, stage))
            .filter(|i| enforced.as_ref().is_some_and(|p| p.digest == i.digest()))
            .map(|i| health_json(&i.report()));
        let candidate = candidate.map(|c| {
            let loaded = stage
                .and_then(|stage| state.policies.tenants.candidate(&project, stage))
                .filter(|i| i.digest() == c.digest);
            serde_json::json!({
                "digest": c.digest,
                "config": config_json(&c.config),
                "mode": c.mode,
                "percent": Some(c.percent).filter(|p| *p > 0),
                "health": loaded.as_ref().map(|i| health_json(&i.report())),
                "shadow": loaded
                    .as_ref()
                    .and_then(|i| i.comparison())
                    .map(|c| shadow_json(&c.report())),
            })
        });
        Ok(Json(serde_json::json!({
            "project": project,
            "stage": stage_key,
            "digest": enforced.as_ref().map(|p| p.digest.clone()),
            "config": enforced.as_ref().map(|p| config_json(&p.config)),
            "health": health,
            "candidate": candidate,
        }))
        .into_response())
    }
    .await;
    answer.unwrap_or_else(IntoResponse::into_response)
}

/// `DELETE`: the project goes back to the plane's module; a candidate goes too.
pub async fn delete(
    State(state): State<AppState>,
    axum::Extension(route): axum::Extension<RouteContext>,
    path: PolicyPath,
) -> Response {
    let (project, stage_key) = match path_params(path) {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    let answer = async {
        let store = &state.auth.store;
        let _write = state.policies.tenants.write_lock().await;
        let before = store
            .project_policy(&project, &stage_key)
            .await
            .map_err(|e| store_failed(&e))?
            .map(|p| p.digest);
        let candidate = store
            .policy_candidate(&project, &stage_key)
            .await
            .map_err(|e| store_failed(&e))?;
        let deleted = store
            .delete_project_policy(&project, &stage_key)
            .await
            .map_err(|e| store_failed(&e))?;
        let aborted = candidate.is_some()
            && store
                .delete_policy_candidate(&project, &stage_key)
                .await
                .map_err(|e| store_failed(&e))?;
        if !deleted && !aborted {
            return Err(GatewayError::not_found(
                "no module installed for this stage",
            ));
        }
        let user = console_user(&route);
        if let Some(stage) = Stage::parse_tenant(&stage_key) {
            state.policies.tenants.apply(&project, stage, None);
            state
                .policies
                .tenants
                .apply_slot(&project, stage, Slot::Candidate, None);
        }
        if let Some(c) = candidate.filter(|_| aborted) {
            let mut event = history::event(
                &user,
                Some(&project),
                Plane::Data,
                &stage_key,
                "abort",
                Some(c.digest),
                None,
                None,
            );
            event.mode = c.mode;
            history::record(store.as_ref(), &event).await;
        }
        if deleted {
            let event = history::event(
                &user,
                Some(&project),
                Plane::Data,
                &stage_key,
                "delete",
                before,
                None,
                None,
            );
            history::record(store.as_ref(), &event).await;
        }
        Ok(())
    }
    .await;
    match answer {
        Err(e) => e.into_response(),
        Ok(()) => {
            announce(&state, &project).await;
            StatusCode::NO_CONTENT.into_response()
        }
    }
}

/// `POST …/policies/{stage}/promote`: the candidate becomes the module in force, with its
/// configuration.
pub async fn promote(
    State(state): State<AppState>,
    axum::Extension(route): axum::Extension<RouteContext>,
    path: PolicyPath,
) -> Response {
    let (project, stage_key) = match path_params(path) {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    promote_inner(&state, &project, &stage_key, &console_user(&route))
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

fn no_candidate() -> GatewayError {
    GatewayError::conflict(
        "no_candidate",
        "no shadow or canary module is installed for this stage",
    )
}

async fn promote_inner(
    state: &AppState,
    project: &str,
    stage_key: &str,
    actor: &str,
) -> Result<Response, GatewayError> {
    let stage = Stage::parse_tenant(stage_key).ok_or_else(no_candidate)?;
    ensure_project(state, project).await?;
    let store = &state.auth.store;
    let candidate = store
        .policy_candidate(project, stage_key)
        .await
        .map_err(|e| store_failed(&e))?
        .ok_or_else(no_candidate)?;
    let bytes = store
        .module(&candidate.digest)
        .await
        .map_err(|e| store_failed(&e))?
        .ok_or_else(|| GatewayError::not_found("the candidate's module is no longer stored"))?;
    // Loaded again as a module in force (its compilation is cached): the candidate's own
    // instance keeps its comparison until it is dropped.
    let prepared = state
        .policies
        .tenants
        .prepare(project, stage, &bytes, &candidate.config)
        .await
        .map_err(prepare_failed)?;
    {
        let _write = state.policies.tenants.write_lock().await;
        // Another change may have come first.
        let still = store
            .policy_candidate(project, stage_key)
            .await
            .map_err(|e| store_failed(&e))?;
        if still.as_ref() != Some(&candidate) {
            return Err(GatewayError::conflict(
                "candidate_changed",
                "the candidate changed meanwhile; read it again",
            ));
        }
        let before = store
            .project_policy(project, stage_key)
            .await
            .map_err(|e| store_failed(&e))?
            .map(|p| p.digest);
        store
            .set_project_policy(&ProjectPolicyRecord {
                project_ref: project.to_owned(),
                stage: stage_key.to_owned(),
                digest: candidate.digest.clone(),
                config: candidate.config.clone(),
            })
            .await
            .map_err(|e| store_failed(&e))?;
        store
            .delete_policy_candidate(project, stage_key)
            .await
            .map_err(|e| store_failed(&e))?;
        let tenants = &state.policies.tenants;
        tenants.apply(project, stage, Some(prepared.installed));
        tenants.apply_slot(project, stage, Slot::Candidate, None);
        let mut event = history::event(
            actor,
            Some(project),
            Plane::Data,
            stage_key,
            "promote",
            before,
            Some(candidate.digest.clone()),
            None,
        );
        event.config = Some(candidate.config.clone());
        history::record(store.as_ref(), &event).await;
    }
    announce(state, project).await;
    tracing::info!(project, stage = stage_key, digest = %candidate.digest, from = %candidate.mode, "tenant candidate promoted");
    Ok(Json(serde_json::json!({
        "project": project,
        "stage": stage_key,
        "digest": candidate.digest,
        "mode": "enforce",
    }))
    .into_response())
}

/// `POST …/policies/{stage}/abort`: drops the candidate; the module in force stays.
pub async fn abort(
    State(state): State<AppState>,
    axum::Extension(route): axum::Extension<RouteContext>,
    path: PolicyPath,
) -> Response {
    let (project, stage_key) = match path_params(path) {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    let answer = async {
        ensure_project(&state, &project).await?;
        let store = &state.auth.store;
        let _write = state.policies.tenants.write_lock().await;
        let candidate = store
            .policy_candidate(&project, &stage_key)
            .await
            .map_err(|e| store_failed(&e))?
            .ok_or_else(no_candidate)?;
        store
            .delete_policy_candidate(&project, &stage_key)
            .await
            .map_err(|e| store_failed(&e))?;
        if let Some(stage) = Stage::parse_tenant(&stage_key) {
            state
                .policies
                .tenants
                .apply_slot(&project, stage, Slot::Candidate, None);
        }
        let mut event = history::event(
            &console_user(&route),
            Some(&project),
            Plane::Data,
            &stage_key,
            "abort",
            Some(candidate.digest),
            None,
            None,
        );
        event.mode = candidate.mode;
        history::record(store.as_ref(), &event).await;
        Ok::<_, GatewayError>(())
    }
    .await;
    match answer {
        Err(e) => e.into_response(),
        Ok(()) => {
            announce(&state, &project).await;
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
        // Only the modules that were in force: a shadow or canary never was. Listed without
        // their configurations; the one restored is read alone.
        let events: Vec<PolicyEventRecord> = store
            .policy_events(
                Some(&project),
                Some(&stage_key),
                crate::control::HISTORY_KEPT,
            )
            .await
            .map_err(|e| store_failed(&e))?
            .into_iter()
            .filter(|e| e.mode == "enforce")
            .collect();
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
        drop(events);
        // The configuration the module had when it was last put in force.
        let config = store
            .policy_event_of(Some(&project), &stage_key, &target)
            .await
            .map_err(|e| store_failed(&e))?
            .ok_or_else(|| {
                GatewayError::conflict(
                    "not_in_history",
                    "this digest was never in force for this stage",
                )
            })?
            .config
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
