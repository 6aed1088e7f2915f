//! What a management route under `/v1/projects/{project_ref}/…` acts on: the project of its
//! path, its other path parameters, and the console user making the call.

use std::collections::HashMap;

use axum::extract::{FromRequestParts, Path};

use crate::error::GatewayError;
use crate::phases::context::RouteContext;
use crate::state::AppState;

/// The project, the path's other parameters and the console user (`-` if the token named
/// none). A path that cannot be read (a segment that is not UTF-8 once decoded) is the
/// contract's `400 invalid_path`.
#[derive(Debug)]
pub struct ProjectRoute {
    pub project: String,
    pub user: String,
    params: HashMap<String, String>,
}

impl ProjectRoute {
    /// Path parameter `name`.
    pub fn param(&self, name: &str) -> Option<&str> {
        self.params.get(name).map(String::as_str)
    }
}

impl FromRequestParts<AppState> for ProjectRoute {
    type Rejection = GatewayError;

    async fn from_request_parts(
        parts: &mut http::request::Parts,
        state: &AppState,
    ) -> Result<Self, GatewayError> {
        let Path(mut params) = Path::<HashMap<String, String>>::from_request_parts(parts, state)
            .await
            .map_err(|e| GatewayError::bad_request("invalid_path", e.body_text()))?;
        let project = params
            .remove("project_ref")
            .ok_or_else(|| GatewayError::internal("the route names no project"))?;
        let user = console_user(parts);
        Ok(Self {
            project,
            user,
            params,
        })
    }
}

/// The organization of `project` (from the control store's cache), for a bound shared per
/// organization; `404` for an unknown project.
pub async fn organization_of(state: &AppState, project: &str) -> Result<uuid::Uuid, GatewayError> {
    Ok(state
        .auth
        .cached_project(project)
        .await?
        .ok_or_else(|| GatewayError::not_found("project not found"))?
        .organization_id)
}

/// The console user of a management request (`-` if its token named none).
pub fn console_user(parts: &http::request::Parts) -> String {
    parts
        .extensions
        .get::<RouteContext>()
        .and_then(|route| route.actor.user_id.clone())
        .unwrap_or_else(|| "-".to_owned())
}
