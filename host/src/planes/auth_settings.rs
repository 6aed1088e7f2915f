//! `GET`, `PUT /v1/projects/{ref}/auth-settings` on the management plane: a project's
//! credential settings. Any member of the project's organization reads them; an owner or admin
//! changes them ([`crate::auth::management::required_role`]).
//!
//! ```json
//! {"project": "alpha", "browser_secret_keys": false}
//! ```
//!
//! `browser_secret_keys`: whether the project's `service_role` keys are accepted on requests a
//! browser made, where `auth.secret_keys_from_browsers` refuses them ([`crate::auth::browser`]).
//! A change applies on this instance at once and on the others through the change events (the
//! project's cached record is dropped).

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use super::project_route::ProjectRoute;
use crate::control::{StoreError, store_failed};
use crate::error::GatewayError;
use crate::state::AppState;

/// A settings body is a few dozen bytes; anything over this is refused before it is read whole.
const MAX_BODY_BYTES: usize = 4 * 1024;

/// The body of a `PUT`: every setting, each required (a missing one is not taken as its
/// default).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Settings {
    browser_secret_keys: bool,
}

fn answer(project: &str, browser_secret_keys: bool) -> Response {
    Json(json!({ "project": project, "browser_secret_keys": browser_secret_keys })).into_response()
}

fn not_found() -> GatewayError {
    GatewayError::not_found("project not found")
}

/// `GET`: the project's settings, as the control store holds them now.
pub async fn get(
    State(state): State<AppState>,
    route: ProjectRoute,
) -> Result<Response, GatewayError> {
    let project = route.project;
    let record = state
        .auth
        .store
        .project(&project)
        .await
        .map_err(|e| store_failed(&e))?
        .ok_or_else(not_found)?;
    Ok(answer(&record.project_ref, record.browser_secret_keys))
}

/// `PUT`: replaces the project's settings.
pub async fn put(
    State(state): State<AppState>,
    ProjectRoute { project, user, .. }: ProjectRoute,
    body: axum::body::Body,
) -> Result<Response, GatewayError> {
    let body = crate::proxy::read_small_body(body, MAX_BODY_BYTES, "a settings body").await?;
    let settings: Settings = serde_json::from_slice(&body).map_err(|e| {
        GatewayError::bad_request(
            "invalid_body",
            format!("expected {{\"browser_secret_keys\": true|false}}: {e}"),
        )
    })?;
    match state
        .auth
        .store
        .set_browser_secret_keys(&project, settings.browser_secret_keys)
        .await
    {
        Ok(()) => {}
        Err(StoreError::NotFound(_)) => return Err(not_found()),
        Err(e) => return Err(store_failed(&e)),
    }
    tracing::warn!(
        project = %project,
        user = %user,
        browser_secret_keys = settings.browser_secret_keys,
        "project auth settings changed"
    );
    state.auth.forget_project(&project).await;
    crate::changes::publish(
        &state,
        crate::fleet::Change::Project {
            project_ref: project.clone(),
        },
    )
    .await;
    Ok(answer(&project, settings.browser_secret_keys))
}
