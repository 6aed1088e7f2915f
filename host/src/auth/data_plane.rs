//! Data-plane authentication: API key (mandatory except on public paths) and optional user JWT.

use http::request::Parts;
use http::{HeaderValue, Method, Uri, header};

use super::keys::{key_label, plausible_key};
use super::{Authenticator, bearer};
use crate::actor::{Actor, Role};
use crate::control::KeyRole;
use crate::error::GatewayError;
use crate::plane::Plane;
use crate::policy::stages::{KeyDecision, KeyRole as StageKeyRole, KeySource};
use crate::policy::{ApiKeyStage, PluginError};

/// Paths that need no API key: liveness, the JWKS, sign-up, and `/metrics` (which has its own
/// guard).
pub fn is_public(method: &Method, path: &str) -> bool {
    match path {
        "/health" | "/.well-known/jwks.json" => *method == Method::GET || *method == Method::HEAD,
        "/v1/auth/signup" => *method == Method::POST,
        "/metrics" => true,
        _ => false,
    }
}

/// Headers and query parameters that carry credentials or impersonate the gateway: removed from
/// every request before anything is forwarded.
pub fn strip_client_credentials(parts: &mut Parts) {
    let names: Vec<header::HeaderName> = parts
        .headers
        .keys()
        .filter(|n| {
            let n = n.as_str();
            n == "apikey" || n == "x-api-key" || n.starts_with("x-aura-")
        })
        .cloned()
        .collect();
    for name in names {
        parts.headers.remove(name);
    }
    if let Some(query) = parts.uri.query()
        && !crate::proxy::envelope::apikey_query_values(Some(query)).is_empty()
    {
        let kept = crate::proxy::envelope::query_without_apikey(Some(query));
        let path_and_query = match kept {
            Some(q) => format!("{}?{q}", parts.uri.path()),
            None => parts.uri.path().to_owned(),
        };
        let mut uri = parts.uri.clone().into_parts();
        uri.path_and_query = path_and_query.parse().ok();
        if let Ok(new) = Uri::from_parts(uri) {
            parts.uri = new;
        }
    }
}

fn invalid_key(message: &str) -> GatewayError {
    GatewayError::unauthorized("invalid_api_key", message)
}

/// Authenticates a data-plane request. `on_plugin_error` turns a failed stage call into the
/// fail-closed answer.
pub async fn authenticate(
    auth: &Authenticator,
    stage: &ApiKeyStage,
    parts: &mut Parts,
    on_plugin_error: impl Fn(&PluginError) -> GatewayError,
) -> Result<Actor, GatewayError> {
    let public = is_public(&parts.method, parts.uri.path());
    let request = stage.request_of(parts.method.as_str(), &parts.uri, &parts.headers);
    let decision = stage.extract(&request).map_err(|e| on_plugin_error(&e))?;
    drop(request);
    let mut actor = Actor::unauthenticated(Plane::Data);
    let credential = match decision {
        KeyDecision::Refuse(reason) => return Err(invalid_key(&reason)),
        KeyDecision::Absent if public => {
            strip_client_credentials(parts);
            return Ok(actor);
        }
        KeyDecision::Absent => {
            return Err(GatewayError::unauthorized(
                "missing_api_key",
                "an API key is required (apikey header)",
            ));
        }
        KeyDecision::Present(credential) => credential,
    };
    let key = credential.key.as_str();
    if !plausible_key(key) {
        return Err(invalid_key("invalid API key"));
    }
    let record = auth
        .resolve_key(key)
        .await?
        .filter(|r| !r.is_revoked(chrono::Utc::now()));
    let Some(record) = record else {
        tracing::debug!(key = %key_label(key), "unknown or revoked API key");
        return Err(invalid_key("invalid API key"));
    };
    let role_allowed = credential.allowed_roles.iter().any(|r| {
        matches!(
            (r, record.role),
            (StageKeyRole::Anon, KeyRole::Anon) | (StageKeyRole::ServiceRole, KeyRole::ServiceRole)
        )
    });
    if !role_allowed {
        let reason = if credential.source == KeySource::Query {
            "this key may not be sent in the URL; use the apikey header"
        } else {
            "this key is not accepted here"
        };
        return Err(invalid_key(reason));
    }
    let project = auth.cached_project(&record.project_ref).await?;
    actor.role = match record.role {
        KeyRole::Anon => Role::Anon,
        KeyRole::ServiceRole => Role::ServiceRole,
    };
    actor.project = Some(record.project_ref.clone());
    actor.key_id = Some(record.id.to_string());
    actor.plan = project.map(|p| p.plan.clone());

    // Optional user JWT. A bearer equal to the API key is the SDK sending the key twice. On
    // `/metrics` the bearer is the metrics token, checked by its own guard.
    let metrics = parts.uri.path() == crate::middleware::metrics_auth::METRICS_PATH;
    if let Some(token) = bearer(parts).filter(|t| *t != key && !metrics) {
        let verifier = auth.user_jwt.as_ref().ok_or_else(|| {
            GatewayError::unauthorized("invalid_token", "user tokens are not accepted here")
        })?;
        let claims = verifier
            .verify(token)
            .await
            .map_err(|e| GatewayError::unauthorized("invalid_token", e.0))?;
        if claims.project_ref.as_deref() != Some(record.project_ref.as_str()) {
            return Err(GatewayError::unauthorized(
                "invalid_token",
                "the token was issued for another project",
            ));
        }
        actor.role = Role::Authenticated;
        actor.user_id = Some(claims.subject);
    } else if bearer(parts).is_some() && !metrics {
        // The key sent again as a bearer: not a user token, and not forwarded as one.
        parts.headers.remove(header::AUTHORIZATION);
    }
    strip_client_credentials(parts);
    Ok(actor)
}

/// `x-aura-*` headers describing the actor, for HTTP backends.
pub fn backend_headers(actor: &Actor) -> Vec<(&'static str, HeaderValue)> {
    let mut out = vec![("x-aura-role", HeaderValue::from_static(actor.role.as_str()))];
    let mut push = |name: &'static str, value: &Option<String>| {
        if let Some(v) = value.as_deref().and_then(|v| HeaderValue::from_str(v).ok()) {
            out.push((name, v));
        }
    };
    push("x-aura-project", &actor.project);
    push("x-aura-user-id", &actor.user_id);
    push("x-aura-org-role", &actor.org_role);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn public_paths_are_exactly_the_contracts() {
        assert!(is_public(&Method::GET, "/health"));
        assert!(is_public(&Method::GET, "/.well-known/jwks.json"));
        assert!(is_public(&Method::POST, "/v1/auth/signup"));
        assert!(!is_public(&Method::GET, "/v1/auth/signup"));
        assert!(!is_public(&Method::POST, "/health"));
        assert!(!is_public(&Method::GET, "/v1/auth/user"));
        assert!(is_public(&Method::GET, "/metrics"));
    }

    #[test]
    fn credentials_are_stripped_from_headers_and_query() {
        let (mut parts, ()) = http::Request::get("/v1/realtime/sse?x=1&apikey=k&y=2")
            .header("apikey", "k")
            .header("x-api-key", "k")
            .header("x-aura-role", "service_role")
            .header("authorization", "Bearer t")
            .body(())
            .expect("request")
            .into_parts();
        strip_client_credentials(&mut parts);
        assert_eq!(parts.uri, "/v1/realtime/sse?x=1&y=2");
        assert!(parts.headers.get("apikey").is_none());
        assert!(parts.headers.get("x-api-key").is_none());
        assert!(parts.headers.get("x-aura-role").is_none());
        assert!(parts.headers.get("authorization").is_some());
    }
}
