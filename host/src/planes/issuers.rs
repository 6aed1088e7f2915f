//! `/v1/projects/{ref}/issuers` on the management plane: the identity providers whose user
//! tokens a project accepts (Clerk, Auth0, Firebase Auth, Cognito, WorkOS, any OIDC issuer).
//! Owners and admins only, reading included ([`crate::auth::management::required_role`]).
//!
//! | method, path | answer |
//! |---|---|
//! | `GET …/issuers` | `200 {"project", "issuers": […]}` |
//! | `POST …/issuers` | `201` the issuer; `400 invalid_body`, `issuer_not_allowed`, `issuer_reserved`, `issuer_unreachable`; `409 issuer_exists`, `too_many_issuers`; `413`; `429 too_many_issuer_checks` |
//! | `GET …/issuers/{id}` | `200` the issuer, `404` |
//! | `DELETE …/issuers/{id}` | `204`, `404` |
//!
//! A `POST` body:
//!
//! ```json
//! {
//!   "issuer": "https://clerk.example.com",
//!   "jwks_url": null,
//!   "keys": null,
//!   "algorithms": ["RS256"],
//!   "audience": {"claim": "aud", "accepted": ["my-api"]},
//!   "role": {"claim": "role", "allowed": ["authenticated"]},
//!   "check": true
//! }
//! ```
//!
//! `issuer` is the tokens' `iss`, exactly. Keys come from OIDC discovery of `issuer` unless
//! `jwks_url` (an `https` URL) or `keys` (a JWKS object, public keys only) is given. `audience`
//! is required: `"accepted": []` says that no audience is checked. `role` defaults to every
//! user being `authenticated`; its `allowed` values are a subset of `authenticated`, `anon`.
//! The issuer's and JWKS URL's hosts are resolved and checked against
//! `auth.issuers.denied_networks` (`issuer_not_allowed`; a name that does not resolve within
//! `dns.timeout_ms` is `issuer_unreachable`, naming it), and with `"check": true` (the default)
//! its keys are fetched once, within every bound (`issuer_unreachable` says why not). These
//! checks take a place of their own: at most `auth.issuers.max_probes_per_organization` at once
//! for one organization and `max_concurrent_probes` in all, never waited for
//! (`429 too_many_issuer_checks` with `Retry-After`).
//!
//! A change applies on this instance at once and on the others through the change events.

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};
use uuid::Uuid;

use super::project_route::ProjectRoute;
use crate::control::{IssuerRecord, StoreError, store_failed};
use crate::error::GatewayError;
use crate::state::AppState;

/// Largest body: an inline JWKS of 64 KiB as JSON, and the rest.
const MAX_BODY_BYTES: usize = 96 * 1024;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NewIssuer {
    issuer: String,
    #[serde(default)]
    jwks_url: Option<String>,
    #[serde(default)]
    keys: Option<Value>,
    #[serde(default)]
    algorithms: Option<Vec<String>>,
    audience: Audience,
    #[serde(default)]
    role: Option<RoleRule>,
    #[serde(default = "yes")]
    check: bool,
}

fn yes() -> bool {
    true
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Audience {
    #[serde(default = "aud")]
    claim: String,
    accepted: Vec<String>,
}

fn aud() -> String {
    "aud".to_owned()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RoleRule {
    #[serde(default)]
    claim: Option<String>,
    allowed: Vec<String>,
}

fn invalid(message: impl Into<String>) -> GatewayError {
    GatewayError::bad_request("invalid_body", message)
}

fn not_found() -> GatewayError {
    GatewayError::not_found("issuer not found")
}

fn store_error(e: &StoreError) -> GatewayError {
    match e {
        StoreError::NotFound(_) => GatewayError::not_found("project not found"),
        StoreError::Conflict { code, message } => GatewayError::conflict(code, message.clone()),
        StoreError::Invalid(message) => invalid(message.clone()),
        StoreError::Unavailable(_) => store_failed(e),
    }
}

/// The issuer id of the path (`404` when it is not a uuid).
fn issuer_id(route: &ProjectRoute) -> Result<Uuid, GatewayError> {
    route
        .param("id")
        .and_then(|id| Uuid::parse_str(id).ok())
        .ok_or_else(not_found)
}

/// An issuer as the API shows it, with the state of its keys on this instance. Inline keys are
/// never echoed: their ids are.
fn issuer_json(state: &AppState, record: &IssuerRecord) -> Value {
    let keys = match state.auth.issuers.status(record) {
        Some(status) => json!({
            "status": status.status,
            "count": status.count,
            "kids": status.kids,
            "age_secs": status.age_secs,
            "last_error": status.last_error,
        }),
        None => json!({ "status": "not_loaded", "count": 0, "kids": [] }),
    };
    let jwks_url = record
        .jwks_url
        .clone()
        .or_else(|| state.auth.issuers.status(record).and_then(|s| s.jwks_url));
    json!({
        "id": record.id,
        "project": record.project_ref,
        "issuer": record.issuer,
        "source": record.source_kind(),
        "jwks_url": jwks_url,
        "algorithms": record.algorithms,
        "audience": { "claim": record.audience_claim, "accepted": record.audiences },
        "role": { "claim": record.role_claim, "allowed": record.allowed_roles },
        "created_at": record.created_at,
        "created_by": record.created_by,
        "keys": keys,
    })
}

/// The project's record as the store holds it now (not the data plane's cache).
async fn project_record(
    state: &AppState,
    project: &str,
) -> Result<crate::control::ProjectRecord, GatewayError> {
    state
        .auth
        .store
        .project(project)
        .await
        .map_err(|e| store_failed(&e))?
        .ok_or_else(|| GatewayError::not_found("project not found"))
}

/// `GET …/issuers`.
pub async fn list(
    State(state): State<AppState>,
    route: ProjectRoute,
) -> Result<Response, GatewayError> {
    let record = project_record(&state, &route.project).await?;
    let issuers: Vec<Value> = record
        .issuers
        .iter()
        .map(|i| issuer_json(&state, i))
        .collect();
    Ok(Json(json!({ "project": record.project_ref, "issuers": issuers })).into_response())
}

/// `GET …/issuers/{id}`.
pub async fn get(
    State(state): State<AppState>,
    route: ProjectRoute,
) -> Result<Response, GatewayError> {
    let id = issuer_id(&route)?;
    let record = project_record(&state, &route.project).await?;
    let issuer = record
        .issuers
        .iter()
        .find(|i| i.id == id)
        .ok_or_else(not_found)?;
    Ok(Json(issuer_json(&state, issuer)).into_response())
}

/// `POST …/issuers`.
pub async fn add(
    State(state): State<AppState>,
    ProjectRoute { project, user, .. }: ProjectRoute,
    body: axum::body::Body,
) -> Result<Response, GatewayError> {
    let body = crate::proxy::read_small_body(body, MAX_BODY_BYTES, "an issuer").await?;
    let new: NewIssuer =
        serde_json::from_slice(&body).map_err(|e| invalid(format!("not an issuer: {e}")))?;
    let role = new.role.unwrap_or(RoleRule {
        claim: None,
        allowed: vec!["authenticated".to_owned()],
    });
    let record = IssuerRecord {
        id: Uuid::new_v4(),
        project_ref: project.clone(),
        issuer: new.issuer,
        jwks_url: new.jwks_url,
        keys: new.keys.map(|k| k.to_string()),
        algorithms: new
            .algorithms
            .unwrap_or_else(|| vec!["RS256".to_owned(), "ES256".to_owned()]),
        audience_claim: new.audience.claim,
        audiences: new.audience.accepted,
        role_claim: role.claim,
        allowed_roles: role.allowed,
        created_at: Some(chrono::Utc::now()),
        created_by: Some(user.clone()),
    };
    let config = &state.config.auth;
    record.check(config.issuers.max_keys).map_err(invalid)?;
    if config.user_jwt.issuer.as_deref() == Some(record.issuer.as_str()) {
        return Err(GatewayError::bad_request(
            "issuer_reserved",
            "this is the platform's own issuer (auth.user_jwt.issuer)",
        ));
    }
    if record.keys.is_none() {
        // The organization's share of the checks, taken before any name is resolved.
        let organization = super::project_route::organization_of(&state, &project).await?;
        let place = state
            .auth
            .issuers
            .admit_check(organization)
            .map_err(|busy| {
                GatewayError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "too_many_issuer_checks",
                    busy.to_string(),
                    crate::error::Side::Client,
                )
                .retry_after(std::time::Duration::from_secs(1))
            })?;
        let url = record.jwks_url.as_deref().unwrap_or(&record.issuer);
        state
            .auth
            .issuers
            .check_resolved(url, &place)
            .await
            .map_err(|e| match e.outcome {
                "not_allowed" => GatewayError::bad_request("issuer_not_allowed", e.message),
                _ => GatewayError::bad_request("issuer_unreachable", e.message),
            })?;
        if new.check {
            state
                .auth
                .issuers
                .probe(&record, &place)
                .await
                .map_err(|e| match e.outcome {
                    "not_allowed" => GatewayError::bad_request("issuer_not_allowed", e.message),
                    _ => GatewayError::bad_request(
                        "issuer_unreachable",
                        format!("its keys could not be fetched ({e})"),
                    ),
                })?;
        }
    }
    state
        .auth
        .store
        .add_issuer(&record)
        .await
        .map_err(|e| store_error(&e))?;
    tracing::warn!(project = %project, issuer = %record.issuer, id = %record.id, user = %user, "trusted issuer added");
    changed(&state, &project).await;
    // Fetched ahead of the first token.
    let _ = state.auth.issuers.source(&record);
    Ok((StatusCode::CREATED, Json(issuer_json(&state, &record))).into_response())
}

/// `DELETE …/issuers/{id}`.
pub async fn remove(
    State(state): State<AppState>,
    route: ProjectRoute,
) -> Result<Response, GatewayError> {
    let id = issuer_id(&route)?;
    let ProjectRoute { project, user, .. } = route;
    let removed = state
        .auth
        .store
        .remove_issuer(&project, id)
        .await
        .map_err(|e| store_error(&e))?;
    if !removed {
        return Err(not_found());
    }
    tracing::warn!(project = %project, id = %id, user = %user, "trusted issuer removed");
    changed(&state, &project).await;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// A project's issuers changed: forgotten here at once, and the fleet told.
async fn changed(state: &AppState, project: &str) {
    state.auth.forget_project(project).await;
    crate::changes::publish(
        state,
        crate::fleet::Change::Project {
            project_ref: project.to_owned(),
        },
    )
    .await;
}
