//! CORS, decided by the plane's `cors` policy stage; the outermost layer.
//!
//! A preflight is answered here, before anything inside runs. For other requests with an
//! `Origin`, the decided headers are put on the response whatever produced it. The host
//! enforces two rules whatever the plugin answers: credentials are never allowed, and the
//! management plane never answers `*`.

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};

use super::PlaneCtx;
use super::{rate_limit, request_id, security_headers};
use crate::error::GatewayError;
use crate::plane::Plane;
use crate::policy::stages::{CorsAllow, CorsDecision, CorsQuery};

/// Removes every CORS header a backend may have set: the gateway alone answers CORS.
fn strip_cors(headers: &mut HeaderMap) {
    let names: Vec<HeaderName> = headers
        .keys()
        .filter(|n| n.as_str().starts_with("access-control-"))
        .cloned()
        .collect();
    for name in names {
        headers.remove(name);
    }
}

fn join(values: &[String]) -> Option<HeaderValue> {
    (!values.is_empty())
        .then(|| HeaderValue::from_str(&values.join(", ")).ok())
        .flatten()
}

fn add_vary_origin(headers: &mut HeaderMap) {
    headers.append(header::VARY, HeaderValue::from_static("origin"));
}

/// Applies an allow decision to response headers. Returns false (and adds nothing) when the
/// decision is not acceptable for the plane.
fn apply_allow(plane: Plane, allow: &CorsAllow, preflight: bool, headers: &mut HeaderMap) -> bool {
    if plane == Plane::Management && allow.allow_origin.trim() == "*" {
        tracing::error!(
            plane = plane.as_str(),
            "the management plane's cors stage answered \"*\"; refused, no CORS header sent"
        );
        return false;
    }
    let Ok(origin) = HeaderValue::from_str(&allow.allow_origin) else {
        tracing::error!(
            plane = plane.as_str(),
            "the cors stage answered an invalid origin"
        );
        return false;
    };
    headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
    if allow.allow_origin != "*" {
        add_vary_origin(headers);
    }
    if preflight {
        if let Some(v) = join(&allow.allow_methods) {
            headers.insert(header::ACCESS_CONTROL_ALLOW_METHODS, v);
        }
        if let Some(v) = join(&allow.allow_headers) {
            headers.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, v);
        }
        if let Some(age) = allow.max_age {
            headers.insert(header::ACCESS_CONTROL_MAX_AGE, HeaderValue::from(age));
        }
    } else if let Some(v) = join(&allow.expose_headers) {
        headers.insert(header::ACCESS_CONTROL_EXPOSE_HEADERS, v);
    }
    true
}

/// Gives a response made here what the inner layers would have added.
fn edge(mut response: Response) -> Response {
    security_headers::stamp(response.headers_mut());
    request_id::stamp_if_missing(response.headers_mut());
    response
}

/// Decides with the project's own module when it installed one (on the tenant pool), else the
/// plane's (inline).
async fn decide(
    ctx: &PlaneCtx,
    policies: &crate::policy::Policies,
    project: Option<&str>,
    query: &CorsQuery,
) -> Result<CorsDecision, GatewayError> {
    if let (Plane::Data, Some(project)) = (ctx.plane, project)
        && let Some(result) = ctx
            .state
            .tenants
            .decide_cors(project, ctx.plane, query.clone())
            .await
    {
        return result.map_err(|e| ctx.state.tenant_call_failed(&e));
    }
    policies
        .plane(ctx.plane)
        .cors
        .decide(ctx.plane, query.input())
        .map_err(|e| ctx.state.plugin_failed(&e))
}

/// The layer.
pub async fn cors(State(ctx): State<PlaneCtx>, mut request: Request, next: Next) -> Response {
    // The modules this request starts with; every later stage of it uses the same ones.
    let policies = ctx.state.policies();
    request
        .extensions_mut()
        .insert(crate::policy::PolicySnapshot(policies.clone()));
    let Some(origin) = request
        .headers()
        .get(header::ORIGIN)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
    else {
        let mut response = next.run(request).await;
        strip_cors(response.headers_mut());
        return response;
    };
    let query = {
        let header_str = |name: HeaderName| {
            request
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        CorsQuery {
            method: request.method().as_str().to_owned(),
            path: request.uri().path().to_owned(),
            origin,
            request_method: header_str(header::ACCESS_CONTROL_REQUEST_METHOD),
            request_headers: header_str(header::ACCESS_CONTROL_REQUEST_HEADERS),
        }
    };
    let preflight = request.method() == Method::OPTIONS && query.request_method.is_some();
    let host_project = project_from_host(&ctx, request.headers());
    if preflight {
        // A preflight is answered here, before the chain's per-IP limit: the same limit is
        // taken first, so that a flood of preflights never reaches a module.
        if let Err(decision) = rate_limit::check_ip(&ctx, &request) {
            return edge(rate_limit::ip_limited(&decision));
        }
        let response = match decide(&ctx, &policies, host_project.as_deref(), &query).await {
            Err(e) => e.into_response(),
            Ok(CorsDecision::Allow(allow)) => {
                let mut response = StatusCode::NO_CONTENT.into_response();
                if apply_allow(ctx.plane, &allow, true, response.headers_mut()) {
                    add_vary_origin(response.headers_mut());
                    response
                } else {
                    denied()
                }
            }
            Ok(CorsDecision::Deny) => denied(),
        };
        return edge(response);
    }
    let mut response = next.run(request).await;
    // Refused by the per-IP limit: a flood never reaches a project's module; the plane's
    // module answers.
    let project = if response
        .extensions()
        .get::<rate_limit::IpLimited>()
        .is_some()
    {
        None
    } else {
        // Past authentication the project is known: its own module decides.
        response
            .extensions()
            .get::<crate::actor::Actor>()
            .and_then(|a| a.project.clone())
            .or(host_project)
    };
    match decide(&ctx, &policies, project.as_deref(), &query).await {
        Err(e) => return edge(e.into_response()),
        Ok(decision) => {
            strip_cors(response.headers_mut());
            if let CorsDecision::Allow(allow) = &decision {
                apply_allow(ctx.plane, allow, false, response.headers_mut());
            }
        }
    }
    response
}

/// The project named by the `Host` header (`<ref><data_plane.project_host_suffix>`).
fn project_from_host(ctx: &PlaneCtx, headers: &HeaderMap) -> Option<String> {
    let suffix = ctx.state.config.data_plane.project_host_suffix.as_deref()?;
    if ctx.plane != Plane::Data {
        return None;
    }
    let host = headers.get(header::HOST)?.to_str().ok()?;
    let host = host.split(':').next()?;
    let project = host.strip_suffix(suffix)?;
    (!project.is_empty() && !project.contains('.')).then(|| project.to_owned())
}

fn denied() -> Response {
    GatewayError::forbidden("cors_origin_denied", "this origin is not allowed").into_response()
}
