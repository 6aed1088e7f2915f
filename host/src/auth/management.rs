//! Management-plane authentication: a console JWT only, and the caller's organization role
//! recomputed from the control store on every request (project → organization → membership).

use http::Method;
use http::request::Parts;
use uuid::Uuid;

use super::bearer::bearer;
use super::data_plane::{malformed_authorization, strip_client_credentials};
use super::{Authenticator, store_failed};
use crate::actor::{Actor, Role};
use crate::control::OrgRole;
use crate::error::GatewayError;
use crate::plane::Plane;
use crate::routes;

/// What a management request is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// No credential needed (`/health`).
    Public,
    /// An organization route: `/v1/organizations/{org_id}/…`.
    Organization(String),
    /// A project route: `/v1/projects/{ref}/…`.
    Project(String),
    /// A service route: the project comes from `x-aura-project`.
    Service,
    /// Anything else (answered 404 by the router once the caller is known).
    Other,
}

/// The scope of a path.
pub fn scope_of(path: &str) -> Scope {
    // `/v1/policies/reload` has its own guard (the admin token).
    // `/v1/admin/*` too.
    if path == routes::HEALTH_PATH
        || path == routes::READY_PATH
        || path == "/v1/policies/reload"
        || path.starts_with("/v1/admin/")
    {
        return Scope::Public;
    }
    if let Some(rest) = path.strip_prefix("/v1/organizations/") {
        let id = rest.split('/').next().unwrap_or_default();
        return Scope::Organization(id.to_owned());
    }
    if let Some(rest) = path.strip_prefix("/v1/projects/") {
        let project = rest.split('/').next().unwrap_or_default();
        return Scope::Project(project.to_owned());
    }
    if routes::service_under(path).is_some() {
        return Scope::Service;
    }
    Scope::Other
}

/// The least role a route needs (CONTRACT §2): owner or admin to create projects and rotate
/// keys; any member elsewhere.
pub fn required_role(method: &Method, path: &str) -> OrgRole {
    let creates_project = *method == Method::POST
        && path.starts_with("/v1/organizations/")
        && path.ends_with("/projects");
    let rotates_keys = *method == Method::POST
        && path.starts_with("/v1/projects/")
        && path.ends_with("/api-keys/rotate");
    let changes_policies =
        (*method == Method::PUT || *method == Method::DELETE || *method == Method::POST)
            && path.starts_with("/v1/projects/")
            && path.contains("/policies/");
    let changes_auth_settings = *method != Method::GET
        && *method != Method::HEAD
        && project_part(path) == Some("auth-settings");
    // Who may sign a project's users in is an owner's or admin's to see and change.
    let issuers = project_part(path) == Some("issuers");
    if creates_project || rotates_keys || changes_policies || changes_auth_settings || issuers {
        OrgRole::Admin
    } else {
        OrgRole::ReadOnly
    }
}

/// The first segment after the project in `/v1/projects/{ref}/…`, matched exactly.
fn project_part(path: &str) -> Option<&str> {
    let rest = path.strip_prefix("/v1/projects/")?;
    let mut segments = rest.split('/');
    segments.next()?;
    segments.next()
}

fn not_found(what: &str) -> GatewayError {
    GatewayError::not_found(format!("{what} not found"))
}

/// Authenticates a management-plane request.
pub async fn authenticate(auth: &Authenticator, parts: &mut Parts) -> Result<Actor, GatewayError> {
    let scope = scope_of(parts.uri.path());
    let header_project = parts
        .headers
        .get("x-aura-project")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    // One parser for both planes: a malformed or duplicated Authorization is refused.
    let token = bearer(&parts.headers)
        .map_err(malformed_authorization)?
        .map(str::to_owned);
    // API keys do not exist on this plane: ignored and removed, like any client x-aura-*.
    strip_client_credentials(parts, &[]);
    let mut actor = Actor::unauthenticated(Plane::Management);
    if scope == Scope::Public {
        return Ok(actor);
    }
    let token = token.ok_or_else(|| {
        GatewayError::unauthorized(
            "missing_token",
            "a console token is required (Authorization: Bearer)",
        )
    })?;
    let verifier = auth.console_jwt.as_ref().ok_or_else(|| {
        GatewayError::unauthorized("invalid_token", "console tokens are not configured")
    })?;
    let claims = verifier
        .verify(&token)
        .await
        .map_err(|e| GatewayError::unauthorized("invalid_token", e.message))?;
    let user = Uuid::parse_str(&claims.subject)
        .map_err(|_| GatewayError::unauthorized("invalid_token", "the sub claim must be a uuid"))?;
    actor.role = Role::Console;
    actor.user_id = Some(user.to_string());

    let (organization, project) = match scope {
        Scope::Public => unreachable!("handled above"),
        Scope::Other => return Ok(actor),
        Scope::Organization(id) => {
            let id = Uuid::parse_str(&id).map_err(|_| not_found("organization"))?;
            let exists = auth
                .store
                .organization_exists(id)
                .await
                .map_err(|e| store_failed(&e))?;
            if !exists {
                return Err(not_found("organization"));
            }
            (id, None)
        }
        Scope::Project(project_ref) => (
            organization_of(auth, &project_ref).await?,
            Some(project_ref),
        ),
        Scope::Service => {
            let project_ref = header_project.filter(|p| !p.is_empty()).ok_or_else(|| {
                GatewayError::bad_request(
                    "project_required",
                    "service routes on the management plane need the x-aura-project header",
                )
            })?;
            (
                organization_of(auth, &project_ref).await?,
                Some(project_ref),
            )
        }
    };
    // Recomputed on every request: a changed or deleted membership applies at once.
    let role = auth
        .store
        .membership(organization, user)
        .await
        .map_err(|e| store_failed(&e))?
        .ok_or_else(|| {
            GatewayError::forbidden("not_a_member", "you are not a member of this organization")
        })?;
    if role == OrgRole::ReadOnly && parts.method != Method::GET && parts.method != Method::HEAD {
        return Err(GatewayError::forbidden(
            "read_only",
            "the read_only role may only read",
        ));
    }
    if !role.at_least(required_role(&parts.method, parts.uri.path())) {
        return Err(GatewayError::forbidden(
            "insufficient_role",
            "this action needs the owner or admin role",
        ));
    }
    actor.project = project;
    actor.org_role = Some(role.as_str().to_owned());
    Ok(actor)
}

async fn organization_of(auth: &Authenticator, project_ref: &str) -> Result<Uuid, GatewayError> {
    auth.store
        .project(project_ref)
        .await
        .map_err(|e| store_failed(&e))?
        .map(|p| p.organization_id)
        .ok_or_else(|| not_found("project"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_follow_the_routes() {
        assert_eq!(scope_of("/health"), Scope::Public);
        assert_eq!(
            scope_of("/v1/projects/abc/logs"),
            Scope::Project("abc".into())
        );
        assert_eq!(scope_of("/v1/projects/abc"), Scope::Project("abc".into()));
        assert_eq!(
            scope_of("/v1/organizations/o1/projects"),
            Scope::Organization("o1".into())
        );
        assert_eq!(scope_of("/v1/db/todos"), Scope::Service);
        assert_eq!(scope_of("/nope"), Scope::Other);
    }

    #[test]
    fn owner_or_admin_where_the_contract_says_so() {
        assert_eq!(
            required_role(&Method::POST, "/v1/organizations/o/projects"),
            OrgRole::Admin
        );
        assert_eq!(
            required_role(&Method::POST, "/v1/projects/p/api-keys/rotate"),
            OrgRole::Admin
        );
        assert_eq!(
            required_role(&Method::GET, "/v1/projects/p/logs"),
            OrgRole::ReadOnly
        );
        let settings = "/v1/projects/p/auth-settings";
        assert_eq!(required_role(&Method::PUT, settings), OrgRole::Admin);
        assert_eq!(required_role(&Method::POST, settings), OrgRole::Admin);
        assert_eq!(required_role(&Method::GET, settings), OrgRole::ReadOnly);
        // Matched as the segment after the project, not anywhere in the path.
        for method in [Method::GET, Method::POST, Method::DELETE] {
            assert_eq!(
                required_role(&method, "/v1/projects/p/issuers"),
                OrgRole::Admin
            );
            assert_eq!(
                required_role(&method, "/v1/projects/p/issuers/i"),
                OrgRole::Admin
            );
        }
        let other = "/v1/projects/p/logs/auth-settings";
        assert_eq!(required_role(&Method::PUT, other), OrgRole::ReadOnly);
        assert!(OrgRole::Owner.at_least(OrgRole::Admin));
        assert!(!OrgRole::Developer.at_least(OrgRole::Admin));
    }
}
