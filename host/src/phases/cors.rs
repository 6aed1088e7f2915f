//! Phase 1, CORS, decided by the plane's `cors` policy stage (or the project's own module).
//!
//! A preflight is answered here, before anything else runs — except the per-IP limit, whose
//! token it takes first so that a flood of preflights never reaches a module. For other requests
//! with an `Origin`, the decided headers are put on the response whatever produced it. The host
//! enforces two rules whatever the plugin answers: credentials are never allowed, and the
//! management plane never answers `*`.

use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};

use super::context::RequestContext;
use super::request_id::RequestId;
use super::{per_ip, request_id, security_headers};
use crate::error::GatewayError;
use crate::plane::Plane;
use crate::policy::slot::StageCall;
use crate::policy::stages::{self, CorsAllow, CorsDecision, CorsInput};
use crate::state::AppState;

/// Removes every CORS header a backend may have set: the gateway alone answers CORS.
pub fn strip(headers: &mut HeaderMap) {
    crate::headers::remove_prefixed(headers, "access-control-");
}

/// The values, comma-separated, as one header value. `join` sizes its string exactly, so the
/// value takes the string's buffer as it is: one allocation.
fn join(values: &[String]) -> Option<HeaderValue> {
    (!values.is_empty())
        .then(|| HeaderValue::from_maybe_shared(Bytes::from(values.join(", "))).ok())
        .flatten()
}

fn add_vary_origin(headers: &mut HeaderMap) {
    headers.append(header::VARY, HeaderValue::from_static("origin"));
}

/// The `Access-Control-Allow-Origin` value of an answer: `*` and the request's own origin (the
/// two answers the contract knows) without a copy, any other value checked and copied.
fn allow_origin_value(answered: &str, origin: &HeaderValue) -> Option<HeaderValue> {
    if answered == "*" {
        Some(HeaderValue::from_static("*"))
    } else if answered.as_bytes() == origin.as_bytes() {
        Some(origin.clone())
    } else {
        HeaderValue::from_str(answered).ok()
    }
}

/// Applies an allow decision to response headers. Returns false (and adds nothing) when the
/// decision is not acceptable for the plane.
fn apply_allow(
    plane: Plane,
    cors: &Cors,
    allow: &CorsAllow,
    preflight: bool,
    headers: &mut HeaderMap,
) -> bool {
    if plane == Plane::Management && allow.allow_origin.trim() == "*" {
        tracing::error!(
            plane = plane.as_str(),
            "the management plane's cors stage answered \"*\"; refused, no CORS header sent"
        );
        return false;
    }
    let Some(origin) = allow_origin_value(&allow.allow_origin, &cors.origin) else {
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

/// Gives a response made here what the later phases would have added.
fn edge(mut response: Response) -> Response {
    security_headers::stamp(response.headers_mut());
    request_id::stamp_if_missing(response.headers_mut());
    response
}

/// The CORS facts of a request with an `Origin`. The header values and the URI are the
/// request's own, shared (a reference count each, no copy); each was checked to be text.
#[derive(Debug)]
pub struct Cors {
    method: Method,
    uri: Uri,
    origin: HeaderValue,
    request_method: Option<HeaderValue>,
    request_headers: Option<HeaderValue>,
    preflight: bool,
    /// The project named by `Host` (data plane, `data_plane.project_host_suffix`).
    host_project: Option<String>,
}

impl Cors {
    /// The CORS facts of `request`, `None` without an `Origin`.
    pub fn of(state: &AppState, plane: Plane, request: &Request) -> Option<Self> {
        let headers = request.headers();
        let text =
            |name: header::HeaderName| headers.get(name).filter(|v| v.to_str().is_ok()).cloned();
        let origin = text(header::ORIGIN)?;
        let request_method = text(header::ACCESS_CONTROL_REQUEST_METHOD);
        Some(Self {
            method: request.method().clone(),
            uri: request.uri().clone(),
            preflight: request.method() == Method::OPTIONS && request_method.is_some(),
            request_headers: text(header::ACCESS_CONTROL_REQUEST_HEADERS),
            request_method,
            host_project: project_from_host(state, plane, headers),
            origin,
        })
    }

    /// Whether the request is a preflight, answered by [`preflight`].
    pub fn is_preflight(&self) -> bool {
        self.preflight
    }

    fn input(&self, client: Option<std::net::IpAddr>) -> CorsInput<'_> {
        // Each value was checked to be text when the facts were taken.
        fn text(v: &HeaderValue) -> &str {
            v.to_str().unwrap_or_default()
        }
        CorsInput {
            method: self.method.as_str(),
            path: self.uri.path(),
            origin: text(&self.origin),
            request_method: self.request_method.as_ref().map(text),
            request_headers: self.request_headers.as_ref().map(text),
            client,
        }
    }
}

/// Answers a preflight, after it took its token from the per-IP limit.
pub async fn preflight(
    state: &AppState,
    cx: &mut RequestContext,
    request: Request,
    cors: &Cors,
) -> Response {
    if let Err(answer) = per_ip::check(state, cx, &request) {
        return edge(answer);
    }
    drop(request);
    // A preflight is answered here, before the request-id phase: its id is made now, so that
    // the plugin's log lines and the answer carry the same one.
    let id = cx.id.get_or_insert_with(RequestId::mint).clone();
    let project = cors.host_project.as_deref();
    let decision = decided(state, cx, cors, Some(id.as_str()), project).await;
    let response = match decision {
        Err(e) => e.into_response(),
        Ok(decision) => match &*decision {
            CorsDecision::Allow(allow) => {
                let mut response = StatusCode::NO_CONTENT.into_response();
                if apply_allow(cx.plane, cors, allow, true, response.headers_mut()) {
                    add_vary_origin(response.headers_mut());
                    response
                } else {
                    denied()
                }
            }
            CorsDecision::Deny => denied(),
        },
    };
    let mut response = edge(response);
    request_id::stamp(&id, response.headers_mut());
    response
}

/// The CORS decision for the request, asked of `project`'s module (or the plane's).
async fn decided(
    state: &AppState,
    cx: &RequestContext,
    cors: &Cors,
    request_id: Option<&str>,
    project: Option<&str>,
) -> Result<stages::Decided<stages::Cors>, GatewayError> {
    let call = StageCall {
        pinned: &cx.policies,
        request_id,
        plane: cx.plane,
        project,
        at: cx.started,
    };
    let input = cors.input(cx.client_ip);
    let (decision, _) = state.policies.decide::<stages::Cors>(&call, input).await?;
    Ok(decision)
}

/// Puts the decided CORS headers on `response` (which may be an error of any phase). A request
/// refused by the per-IP limit is decided by the plane's module, never a project's.
pub async fn respond(
    state: &AppState,
    cx: &RequestContext,
    cors: &Cors,
    response: Response,
) -> Response {
    let project = if cx.ip_limited {
        None
    } else {
        cx.project().or(cors.host_project.as_deref())
    };
    let request_id = cx.id.as_ref().map(RequestId::as_str);
    match decided(state, cx, cors, request_id, project).await {
        Err(e) => edge(e.into_response()),
        Ok(decision) => {
            let mut response = response;
            strip(response.headers_mut());
            if let CorsDecision::Allow(allow) = &*decision {
                apply_allow(cx.plane, cors, allow, false, response.headers_mut());
            }
            response
        }
    }
}

/// The project named by the `Host` header (`<ref><data_plane.project_host_suffix>`).
fn project_from_host(state: &AppState, plane: Plane, headers: &HeaderMap) -> Option<String> {
    let suffix = state.config.data_plane.project_host_suffix.as_deref()?;
    if plane != Plane::Data {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_allowed_origin_is_the_request_s_own_value_or_a_static_star() {
        let origin = HeaderValue::from_maybe_shared(Bytes::from_static(b"https://app.example"))
            .expect("an origin");
        let star = allow_origin_value("*", &origin).expect("*");
        assert_eq!(star, "*");
        let same = allow_origin_value("https://app.example", &origin).expect("the origin");
        assert_eq!(same, origin);
        assert_eq!(
            same.as_bytes().as_ptr(),
            origin.as_bytes().as_ptr(),
            "the request's own value, not a copy"
        );
        let other = allow_origin_value("https://other.example", &origin).expect("another");
        assert_eq!(other, "https://other.example");
        assert_ne!(other.as_bytes().as_ptr(), origin.as_bytes().as_ptr());
        assert_eq!(allow_origin_value("https://a\nb", &origin), None);
    }

    #[test]
    fn joined_values_are_one_checked_header_value() {
        assert_eq!(join(&[]), None);
        let one = join(&["x-request-id".to_owned()]).expect("one");
        assert_eq!(one, "x-request-id");
        let three = ["a", "b", "ratelimit-limit"].map(str::to_owned);
        assert_eq!(join(&three).expect("three"), "a, b, ratelimit-limit");
        assert_eq!(join(&["a\r\nset-cookie: x".to_owned()]), None);
    }
}
