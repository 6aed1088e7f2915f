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

use crate::control::{PolicyEventRecord, store_failed};
use crate::error::GatewayError;
use crate::policy::history::Action;
use crate::policy::installs::{Install, Installed, ModuleRef};
use crate::policy::rollout::ShadowReport;
use crate::policy::runtime::stats::ModuleReport;
use crate::stage::{Mode, Stage, Trial};
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

/// The path parameters of the policy routes; a rejection (a segment that is not UTF-8 once
/// decoded) is the contract's JSON error.
type PolicyPath = Result<Path<(String, String)>, PathRejection>;

fn path_params(path: PolicyPath) -> Result<(String, String), GatewayError> {
    path.map(|Path(p)| p)
        .map_err(|e| GatewayError::bad_request("invalid_path", e.body_text()))
}

/// What a handler answers: its response, or the contract's JSON error.
type Answer = Result<Response, GatewayError>;

/// Runs a change of a project's modules to its end on a task of its own: a client that goes
/// away meanwhile (its request's future dropped) leaves no store written without the change
/// here, its history event or its announcement to the other instances; the upload place it
/// holds is given back when the change ends, not when the client leaves.
async fn to_the_end<T: Send + 'static>(
    change: impl Future<Output = Result<T, GatewayError>> + Send + 'static,
) -> Result<T, GatewayError> {
    tokio::spawn(change)
        .await
        .map_err(|e| GatewayError::internal(format!("a change of a project's modules: {e}")))?
}

/// What a route that changes a project's stage acts on: the project and stage of its path, and
/// the console user making the change (`-` if the token named none).
#[derive(Debug)]
pub struct StageChange {
    project: String,
    stage: String,
    user: String,
}

impl axum::extract::FromRequestParts<AppState> for StageChange {
    type Rejection = GatewayError;

    async fn from_request_parts(
        parts: &mut http::request::Parts,
        state: &AppState,
    ) -> Result<Self, GatewayError> {
        let path = Path::<(String, String)>::from_request_parts(parts, state).await;
        let (project, stage) = path_params(path)?;
        let user = super::project_route::console_user(parts);
        Ok(Self {
            project,
            stage,
            user,
        })
    }
}

/// `PUT`: installs a module for the project's stage.
pub async fn put(
    State(state): State<AppState>,
    change: StageChange,
    body: axum::body::Body,
) -> Answer {
    let StageChange {
        project,
        stage: stage_key,
        user,
    } = change;
    // Bounded before the body is read: uploads cannot pile up bodies and compilations, and
    // one organization cannot take every place (its share is
    // `plugins.tenant_max_concurrent_uploads_per_org`).
    let organization = super::project_route::organization_of(&state, &project).await?;
    let upload = state
        .policies
        .tenants
        .upload_permit(organization)
        .map_err(|busy| {
            state
                .metrics
                .tenant_uploads_busy
                .with_label_values(&[busy.label()])
                .inc();
            GatewayError::unavailable("uploads_busy", busy.to_string())
                .retry_after(std::time::Duration::from_secs(1))
        })?;
    // Read through the chain's body limit (`server.max_body_bytes`), never the framework's own
    // default: past it the answer is the gateway's JSON 413 (with the defaults a module up to
    // `plugins.tenant_max_module_bytes` fits once base64 in JSON).
    let body = crate::proxy::read_body(body).await?;
    to_the_end(async move {
        let _upload = upload;
        let install = parse_put(&project, &stage_key, &body, &user)?;
        let installed = state.policies.install(install, Action::Install).await?;
        Ok(installed_json(&project, &stage_key, &installed))
    })
    .await
}

/// The install a `PUT` body asks for.
fn parse_put<'a>(
    project: &'a str,
    stage: &'a str,
    body: &[u8],
    actor: &'a str,
) -> Result<Install<'a>, GatewayError> {
    if Stage::parse_tenant(stage).is_none() {
        return Err(GatewayError::bad_request(
            "policy_refused",
            format!(
                "projects cannot install a module for {stage:?}; stages: {}",
                Stage::tenant_keys()
            ),
        ));
    }
    let request: PutPolicy = serde_json::from_slice(body).map_err(|e| {
        GatewayError::bad_request(
            "invalid_body",
            format!("expected {{module|digest, config}}: {e}"),
        )
    })?;
    let module = match (request.module, request.digest) {
        (Some(b64), None) => ModuleRef::Upload(
            base64::engine::general_purpose::STANDARD
                .decode(b64.as_bytes())
                .map_err(|e| GatewayError::bad_request("invalid_body", format!("module: {e}")))?,
        ),
        (None, Some(digest)) => ModuleRef::Stored(digest),
        _ => {
            return Err(GatewayError::bad_request(
                "invalid_body",
                "give exactly one of module, digest",
            ));
        }
    };
    let trial = request
        .percent
        .map(|p| {
            u8::try_from(p)
                .ok()
                .filter(|p| *p <= 100)
                .ok_or_else(|| format!("percent: {p} is not from 1 to 100"))
        })
        .transpose()
        .and_then(|percent| Trial::parse(request.mode.as_deref().unwrap_or("enforce"), percent))
        .map_err(|e| GatewayError::bad_request("invalid_body", e))?;
    let config = request
        .config
        .unwrap_or_else(|| serde_json::json!({}))
        .to_string();
    Ok(Install {
        project,
        stage,
        module,
        config,
        trial,
        actor,
    })
}

/// The answer to an install (and a rollback), logged.
fn installed_json(project: &str, stage: &str, installed: &Installed) -> Response {
    let (report, compile) = (&installed.check, &installed.compile);
    let mode = Trial::mode_of(installed.trial).as_str();
    tracing::info!(
        project = %project,
        stage = %stage,
        digest = %installed.digest,
        mode,
        report = %report,
        compile_ms = compile.compile_ms,
        compile_peak_rss = compile.peak_rss_bytes,
        compile_cached = compile.cached,
        "tenant module installed"
    );
    Json(serde_json::json!({
        "project": project,
        "stage": stage,
        "digest": installed.digest,
        "mode": mode,
        "percent": installed.trial.map(Trial::percent).filter(|p| *p > 0),
        "check": report.to_string(),
        "compile": compile,
    }))
    .into_response()
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
        "cache": r.cache,
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
pub async fn get(State(state): State<AppState>, path: PolicyPath) -> Answer {
    let (project, stage_key) = path_params(path)?;
    let store = state.policies.store();
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
    let slot = stage.and_then(|stage| state.policies.tenants.slot(&project, stage));
    let health = slot
        .as_deref()
        .and_then(|s| s.module())
        .filter(|m| enforced.as_ref().is_some_and(|p| p.digest == m.digest()))
        .map(|m| health_json(&m.report()));
    let candidate = candidate.map(|c| {
        let loaded = slot
            .as_deref()
            .and_then(|s| s.candidate())
            .filter(|(m, _)| m.digest() == c.digest);
        serde_json::json!({
            "digest": c.digest,
            "config": config_json(&c.config),
            "mode": c.mode,
            "percent": Some(c.percent).filter(|p| *p > 0),
            "health": loaded.map(|(m, _)| health_json(&m.report())),
            "shadow": loaded
                .filter(|(_, trying)| trying.trial == crate::stage::Trial::Shadow)
                .map(|(_, trying)| shadow_json(&trying.comparison.report())),
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

/// `GET …/policies/{stage}/schema`: the JSON Schema of the stage's configuration — of the
/// project's module in force when it installed one, else of the data plane's module — or `null`
/// when that module exports none.
pub async fn schema(State(state): State<AppState>, path: PolicyPath) -> Answer {
    let (project, stage_key) = path_params(path)?;
    state.policies.ensure_project(&project).await?;
    let stage = Stage::parse_tenant(&stage_key)
        .ok_or_else(|| GatewayError::not_found("no such stage for a project"))?;
    let slot = state.policies.tenants.slot(&project, stage);
    let snapshot = state.policies.snapshot();
    let (source, digest, text) = match slot.as_deref().and_then(|s| s.module()) {
        Some(i) => (
            "project",
            i.digest().to_owned(),
            i.schema().map(str::to_owned),
        ),
        None => {
            let module = snapshot
                .plane(crate::plane::Plane::Data)
                .any_slot(stage)
                .and_then(|slot| slot.module())
                .ok_or_else(|| GatewayError::not_found("the data plane has no such stage"))?;
            (
                "plane",
                module.digest().to_owned(),
                module.schema().map(str::to_owned),
            )
        }
    };
    // Checked when the module was loaded: it parses.
    let schema = text.and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok());
    Ok(Json(serde_json::json!({
        "project": project,
        "stage": stage_key,
        "source": source,
        "digest": digest,
        "schema": schema,
    }))
    .into_response())
}

/// `DELETE`: the project goes back to the plane's module; a candidate goes too.
pub async fn delete(
    State(state): State<AppState>,
    c: StageChange,
) -> Result<StatusCode, GatewayError> {
    to_the_end(async move { state.policies.remove(&c.project, &c.stage, &c.user).await }).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST …/policies/{stage}/promote`: the candidate becomes the module in force, with its
/// configuration.
pub async fn promote(
    State(state): State<AppState>,
    StageChange {
        project,
        stage,
        user,
    }: StageChange,
) -> Result<Json<serde_json::Value>, GatewayError> {
    let candidate = {
        let (project, stage) = (project.clone(), stage.clone());
        to_the_end(async move { state.policies.promote(&project, &stage, &user).await }).await?
    };
    tracing::info!(project, stage, digest = %candidate.digest, from = %candidate.mode, "tenant candidate promoted");
    Ok(Json(serde_json::json!({
        "project": project,
        "stage": stage,
        "digest": candidate.digest,
        "mode": Mode::Enforce.as_str(),
    })))
}

/// `POST …/policies/{stage}/abort`: drops the candidate; the module in force stays.
pub async fn abort(
    State(state): State<AppState>,
    c: StageChange,
) -> Result<StatusCode, GatewayError> {
    to_the_end(async move { state.policies.abort(&c.project, &c.stage, &c.user).await }).await?;
    Ok(StatusCode::NO_CONTENT)
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
) -> Result<Json<serde_json::Value>, GatewayError> {
    let (project, stage_key) = path_params(path)?;
    state.policies.ensure_project(&project).await?;
    let limit = query.limit().clamp(1, 1000);
    let events = state
        .policies
        .store()
        .policy_events(Some(&project), Some(&stage_key), limit)
        .await
        .map_err(|e| store_failed(&e))?;
    Ok(Json(serde_json::json!({
        "project": project,
        "stage": stage_key,
        "events": events.iter().map(event_json).collect::<Vec<_>>(),
    })))
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
    StageChange {
        project,
        stage,
        user,
    }: StageChange,
    body: axum::body::Bytes,
) -> Answer {
    let request: RollbackPolicy = if body.is_empty() {
        RollbackPolicy::default()
    } else {
        serde_json::from_slice(&body).map_err(|e| {
            GatewayError::bad_request("invalid_body", format!("expected {{digest}}: {e}"))
        })?
    };
    to_the_end(async move {
        let installed = state
            .policies
            .roll_back_project(&project, &stage, request.digest, &user)
            .await?;
        Ok(installed_json(&project, &stage, &installed))
    })
    .await
}

/// `POST /v1/policies/reload`: reloads the plugin sections of the config file, like SIGHUP.
/// Guarded by `plugins.admin_token`; without one the route does not exist.
pub async fn reload(State(state): State<AppState>, headers: http::HeaderMap) -> Response {
    if let Err(error) =
        super::admin_token::check_token(state.config.plugins.admin_token.as_deref(), &headers)
    {
        return error.into_response();
    }
    match state.reload_policies("management API").await {
        Ok(()) => {
            // Every instance reloads its own configuration file too.
            crate::changes::publish(&state, crate::fleet::Change::OperatorReload).await;
            Json(serde_json::json!({ "status": "applied" })).into_response()
        }
        Err(error) => error.into_gateway_error().into_response(),
    }
}
