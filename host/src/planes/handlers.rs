//! The proxy handlers, written once and mounted on both planes: a service route goes to its
//! backend over the transport of its row in [`crate::routes::SERVICES`] ([`crate::proxy`]), and
//! `/v1/db/*` over the one the db-routing stage decides for the request.

use axum::Extension;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodFilter, MethodRouter, any, on};

use crate::error::GatewayError;
use crate::headers::query_without_apikey;
use crate::phases::context::RouteContext;
use crate::policy::slot::StageCall;
use crate::policy::stages::db_routing;
use crate::policy::stages::{DbInput, DbRoute, DbRouting};
use crate::proxy::envelope::EnvelopeRequest;
use crate::proxy::{headers, read_body};
use crate::routes::Service;
use crate::state::AppState;

/// A route of the plane's own forwarding to `service` over NATS, for every method (`None`) or
/// for one.
pub fn nats_route(service: Service, method: Option<MethodFilter>) -> MethodRouter<AppState> {
    let handler = move |State(state): State<AppState>,
                        Extension(cx): Extension<RouteContext>,
                        request: Request| async move {
        forward_nats(&state, service, &cx, request)
            .await
            .unwrap_or_else(IntoResponse::into_response)
    };
    match method {
        None => any(handler),
        Some(method) => on(method, handler),
    }
}

/// Forwards a request of an HTTP service (storage, realtime).
pub async fn forward_http_service(
    state: &AppState,
    service: Service,
    cx: &RouteContext,
    request: Request,
) -> Result<Response, GatewayError> {
    let backend = state.http.backend(service).ok_or_else(|| {
        GatewayError::unavailable(
            "backend_not_configured",
            format!(
                "no HTTP backend is configured for the {} service",
                service.name()
            ),
        )
    })?;
    let rest = service.rest_of(request.uri().path()).unwrap_or_default();
    let uri = backend.uri(rest, request.uri().query())?;
    let breaker = state.breakers.service(service);
    let websocket = service.row().websocket == Some(request.uri().path());
    forward_http(state, &breaker, backend, uri, cx, request, websocket).await
}

async fn forward_http(
    state: &AppState,
    breaker: &std::sync::Arc<crate::breaker::CircuitBreaker>,
    backend: &crate::proxy::pool::Backend,
    uri: ::http::Uri,
    cx: &RouteContext,
    request: Request,
    websocket: bool,
) -> Result<Response, GatewayError> {
    state
        .http
        .forward(
            breaker,
            backend,
            uri,
            request,
            &cx.actor,
            cx.deadline,
            websocket,
        )
        .await
}

/// The `/v1/db/*` handler: the db-routing stage decides the transport per request.
pub async fn route_db(
    state: &AppState,
    cx: &RouteContext,
    request: Request,
) -> Result<Response, GatewayError> {
    let actor = cx.actor.clone();
    let project = match &actor.project {
        Some(project_ref) => state.auth.cached_project(project_ref).await?,
        None => None,
    };
    let project = project.map(|p| db_routing::project_db(&p));
    let client_region = state.config.upstreams.client_region(request.headers());
    let call = StageCall {
        pinned: &cx.policies,
        request_id: request
            .headers()
            .get(&crate::headers::X_REQUEST_ID)
            .and_then(|v| v.to_str().ok()),
        plane: actor.plane,
        project: actor.project.as_deref(),
        at: cx.started,
    };
    let input = DbInput {
        method: request.method().as_str(),
        path: request.uri().path(),
        project: project.as_ref(),
        client_region,
        actor: Some(&actor),
    };
    let (route, _) = state.policies.decide::<DbRouting>(&call, input).await?;
    match &*route {
        DbRoute::Nats => forward_nats(state, Service::Db, cx, request).await,
        // Fail closed: never a fallback to a shared target.
        DbRoute::Unresolved => Err(GatewayError::unavailable(
            "db_target_unresolved",
            "the project's dedicated database endpoint is not resolved",
        )),
        DbRoute::Postgrest(base) => forward_postgrest(state, cx, base, request).await,
        DbRoute::Replica(url) => {
            if let Some((reason, message)) =
                db_routing::refused_replica(url, request.method(), project.as_ref())
            {
                tracing::error!(
                    project = actor.project.as_deref().unwrap_or_default(),
                    method = %request.method(),
                    reason,
                    "db-routing answered a replica the host refuses; the request fails closed"
                );
                state
                    .metrics
                    .db_routes_refused
                    .with_label_values(&[actor.plane.as_str(), reason])
                    .inc();
                return Err(GatewayError::unavailable("db_route_refused", message));
            }
            forward_postgrest(state, cx, url, request).await
        }
    }
}

/// Sends a `/v1/db/*` request straight to a PostgREST base URL (a dedicated one or a replica),
/// the URL checked against `upstreams.postgrest_allowed_targets` first.
async fn forward_postgrest(
    state: &AppState,
    cx: &RouteContext,
    base: &str,
    request: Request,
) -> Result<Response, GatewayError> {
    let actor = &cx.actor;

    // The URL is the stage's answer over the store's record: checked, never trusted.
    if let Err(refused) = state.http.postgrest_targets.check(base) {
        tracing::error!(
            project = actor.project.as_deref().unwrap_or_default(),
            reason = %refused,
            "dedicated PostgREST target refused (upstreams.postgrest_allowed_targets)"
        );
        state
            .metrics
            .postgrest_targets_refused
            .with_label_values(&[actor.plane.as_str()])
            .inc();
        return Err(GatewayError::unavailable(
            "db_target_not_allowed",
            "the project's dedicated database endpoint is not an allowed target",
        ));
    }
    let mut request = request;
    if actor.plane == crate::plane::Plane::Management {
        // The console JWT is an organization-wide credential: a project's own PostgREST
        // never sees it.
        request.headers_mut().remove(::http::header::AUTHORIZATION);
    }
    let rest = request
        .uri()
        .path()
        .strip_prefix("/v1/db")
        .unwrap_or_default();
    let backend = state.http.postgrest(base)?;
    let uri = backend.uri(rest, request.uri().query())?;
    let breaker = state.breakers.postgrest.get(base.trim_end_matches('/'));
    forward_http(state, &breaker, &backend, uri, cx, request, false).await
}

/// Forwards one request to `service` in an envelope and answers with its reply.
pub async fn forward_nats(
    state: &AppState,
    service: Service,
    cx: &RouteContext,
    request: Request,
) -> Result<Response, GatewayError> {
    let actor = &cx.actor;
    let deadline = cx.deadline;
    let (parts, body) = request.into_parts();
    let body = read_body(body).await?;
    let mut envelope = EnvelopeRequest {
        v: 1,
        id: cx.request_id.as_str(),
        plane: actor.plane.as_str(),
        method: parts.method.as_str(),
        path: parts.uri.path(),
        query: query_without_apikey(parts.uri.query()),
        headers: headers::EnvelopeHeaders::new(&parts.headers, actor),
        body: EnvelopeRequest::encode_body(&body),
        actor,
        deadline_ms: 0,
    };
    drop(body);
    let breaker = state.breakers.service(service);
    let probe = breaker.try_acquire_probe().map_err(|r| {
        GatewayError::unavailable(
            "circuit_open",
            format!("the {} service is failing; try again later", service.name()),
        )
        .retry_after(r.retry_after)
    })?;
    let result = state.nats.request(service, &mut envelope, deadline).await;
    match &result {
        Ok(reply) if crate::proxy::http::is_failure_status(reply.status) => probe.record_failure(),
        Ok(_) => probe.record_success(),
        Err(e) if e.counts_against_the_service() => probe.record_failure(),
        // Delivery unknown (timeout), the request's or the gateway's own fault: the probe goes
        // back unconsumed.
        Err(_) => drop(probe),
    }
    let reply = result.map_err(|e| e.into_gateway_error(service))?;
    let mut response = Response::new(Body::from(reply.body));
    *response.status_mut() = reply.status;
    *response.headers_mut() = reply.headers;
    Ok(response)
}
