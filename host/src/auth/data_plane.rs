//! Data-plane authentication: API key (mandatory except on public paths) and optional user JWT.

use std::net::IpAddr;

use http::request::Parts;
use http::{Uri, header};

use super::Authenticator;
use super::bearer::{Malformed, bearer};
use super::keys::{key_label, plausible_key};
use crate::actor::{Actor, Role};
use crate::control::{ApiKeyRecord, KeyRole};
use crate::error::GatewayError;
use crate::plane::Plane;
use crate::policy::Policies;
use crate::policy::registry::PolicyRegistry;
use crate::policy::slot::StageCall;
use crate::policy::stages::{
    ApiKey, KeyDecision, KeyHeaders, KeyInput, KeyRole as StageKeyRole, KeySource,
};

static APIKEY: header::HeaderName = header::HeaderName::from_static("apikey");
static X_API_KEY: header::HeaderName = header::HeaderName::from_static("x-api-key");

/// Headers and query parameters that carry credentials or impersonate the gateway: removed from
/// every request before anything is forwarded. `stage_headers` are the headers the `api-key`
/// stage asked to read: whatever it found there is a credential too.
pub fn strip_client_credentials(parts: &mut Parts, stage_headers: &[String]) {
    let headers = &mut parts.headers;
    headers.remove(&APIKEY);
    headers.remove(&X_API_KEY);
    // The default stage reads the two removed above: not looked up again.
    for name in stage_headers {
        if name != APIKEY.as_str() && name != X_API_KEY.as_str() {
            headers.remove(name.as_str());
        }
    }
    crate::headers::remove_prefixed(headers, "x-aura-");
    if let Some(query) = parts.uri.query()
        && !crate::headers::apikey_query_values(Some(query)).is_empty()
    {
        let kept = crate::headers::query_without_apikey(Some(query));
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

/// The answer to an `Authorization` header that cannot be read: refused, never forwarded.
pub fn malformed_authorization(error: Malformed) -> GatewayError {
    GatewayError::unauthorized("invalid_token", error.to_string())
}

/// `apikey` query parameters considered at most; a request with more is refused.
const MAX_QUERY_KEYS: usize = 2;

/// Refuses a request whose URL carries a `service_role` key, whatever else it carries: a key in
/// a URL leaks into logs, traces and `Referer` headers. `key` and `record` are the credential
/// already resolved; other query values are looked up (cached) too.
async fn refuse_secret_query_keys(
    auth: &Authenticator,
    uri: &Uri,
    key: &str,
    record: &ApiKeyRecord,
) -> Result<(), GatewayError> {
    let mut values = crate::headers::apikey_query_values(uri.query());
    values.sort_unstable();
    values.dedup();
    if values.len() > MAX_QUERY_KEYS {
        return Err(invalid_key("too many apikey parameters"));
    }
    for value in values {
        let value = value.trim();
        let role = if value == key {
            Some(record.role)
        } else if plausible_key(value) {
            auth.resolve_key(value).await?.map(|r| r.role)
        } else {
            None
        };
        if role == Some(KeyRole::ServiceRole) {
            return Err(invalid_key(
                "a service_role key may not be sent in the URL; use the apikey header",
            ));
        }
    }
    Ok(())
}

/// Authenticates a data-plane request from `client`, received at `at`: the `api-key` stage of
/// the request's policy snapshot (`pinned`) decides through `registry`, like every stage (a
/// failed call fails closed, and a module that fails too often is rolled back).
///
/// `Authorization` is read by the one bearer parser: malformed or duplicated, the request is
/// refused; a bearer equal to the API key is removed; any other bearer is verified as a user
/// JWT or the request is refused. No `Authorization` the gateway did not verify reaches a
/// backend (on `/metrics` the bearer is the metrics token, checked by its own guard, and the
/// gateway answers that path itself).
pub async fn authenticate(
    auth: &Authenticator,
    registry: &PolicyRegistry,
    pinned: &Policies,
    client: Option<IpAddr>,
    at: tokio::time::Instant,
    parts: &mut Parts,
) -> Result<Actor, GatewayError> {
    let stage = pinned
        .data
        .module::<ApiKey>()
        .ok_or_else(|| GatewayError::internal("the data plane has no api-key stage"))?;
    let token = bearer(&parts.headers)
        .map_err(malformed_authorization)?
        .map(str::to_owned);
    let metrics = parts.uri.path() == crate::routes::METRICS_PATH;
    let public = crate::routes::is_public(&parts.method, parts.uri.path());
    let request_id = parts
        .headers
        .get(&crate::headers::X_REQUEST_ID)
        .and_then(|v| v.to_str().ok());
    let query_keys = crate::headers::apikey_query_values(parts.uri.query());
    let call = StageCall {
        pinned,
        request_id,
        plane: Plane::Data,
        project: None,
        at,
    };
    let input = KeyInput {
        method: parts.method.as_str(),
        path: parts.uri.path(),
        query_keys: &query_keys,
        headers: KeyHeaders::Head(&parts.headers),
        client,
    };
    let (decision, _) = registry.decide::<ApiKey>(&call, input).await?;
    let mut actor = Actor::unauthenticated(Plane::Data);
    let credential = match &*decision {
        KeyDecision::Refuse(reason) => return Err(invalid_key(reason)),
        KeyDecision::Absent if public => {
            if token.is_some() && !metrics {
                // No key, so no project to check the token's `ref` against.
                return Err(GatewayError::unauthorized(
                    "invalid_token",
                    "a user token is only accepted with an API key",
                ));
            }
            strip_client_credentials(parts, stage.headers());
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
        // The clock is read only for a key with a revocation time.
        .filter(|r| r.revoked_at.is_none() || !r.is_revoked(chrono::Utc::now()));
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
    refuse_secret_query_keys(auth, &parts.uri, key, &record).await?;
    let project = auth.cached_project(&record.project_ref).await?;
    if let Some(project) = &project
        && !project.issuers.is_empty()
    {
        // Only creates what is missing: a project's issuers' keys are fetched ahead of its
        // users' first tokens.
        auth.issuers.warm(project);
    }
    if record.role == KeyRole::ServiceRole {
        // Before any user token is verified: a refused request costs no JWT check.
        let allowed = project.as_ref().is_some_and(|p| p.browser_secret_keys);
        auth.browser.check_secret_key(&parts.headers, allowed)?;
    }
    actor.role = match record.role {
        KeyRole::Anon => Role::Anon,
        KeyRole::ServiceRole => Role::ServiceRole,
    };
    actor.project = Some(record.project_ref.clone());
    actor.key_id = Some(String::from(&*record.key_id));
    actor.plan = project.as_ref().map(|p| p.plan.clone());

    match token.as_deref() {
        None => {}
        // The metrics token, checked by the `/metrics` guard.
        Some(_) if metrics => {}
        // The SDK sending the key twice: not a user token, and not forwarded as one.
        Some(token) if token == key => {
            parts.headers.remove(header::AUTHORIZATION);
        }
        Some(token) => {
            let user = auth
                .verify_user_token(token, &record.project_ref, project.as_deref())
                .await
                .map_err(|refused| {
                    tracing::debug!(
                        issuer = refused.issuer.as_str(),
                        outcome = refused.error.outcome,
                        "user token refused"
                    );
                    GatewayError::unauthorized("invalid_jwt", refused.error.message)
                })?;
            actor.role = user.role;
            actor.user_id = Some(user.subject);
            actor.claims = Some(user.claims);
            actor.issuer = Some(user.issuer);
        }
    }
    strip_client_credentials(parts, stage.headers());
    Ok(actor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_stripped_from_headers_and_query() {
        let (mut parts, ()) = http::Request::get("/v1/realtime/sse?x=1&apikey=k&y=2")
            .header("apikey", "k")
            .header("x-api-key", "k")
            .header("x-aura-role", "service_role")
            .header("x-aura-project", "other")
            .header("apikey", "k2")
            .header("x-custom-key", "k")
            .header("authorization", "Bearer t")
            .body(())
            .expect("request")
            .into_parts();
        let stage_headers = ["apikey", "x-custom-key", "x-api-key"].map(str::to_owned);
        strip_client_credentials(&mut parts, &stage_headers);
        assert_eq!(parts.uri, "/v1/realtime/sse?x=1&y=2");
        assert!(parts.headers.get("x-custom-key").is_none());
        assert!(parts.headers.get("apikey").is_none());
        assert!(parts.headers.get("x-api-key").is_none());
        assert!(parts.headers.get("x-aura-role").is_none());
        assert!(parts.headers.get("x-aura-project").is_none());
        assert!(parts.headers.get("authorization").is_some());
        assert_eq!(parts.headers.len(), 1);
    }
}
