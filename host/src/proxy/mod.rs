//! The proxy handlers, written once and mounted on both planes, and their transports.

pub mod envelope;
pub mod headers;
pub mod http;
pub mod idle;
pub mod nats;
pub mod pool;
pub mod service;
pub mod targets;
pub mod tunnels;

use axum::Extension;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodFilter, MethodRouter, any, on};
use http_body_util::LengthLimitError;

use self::envelope::{EnvelopeRequest, query_without_apikey};
use self::service::Service;
use crate::error::GatewayError;
use crate::phases::context::RouteContext;
use crate::policy::registry::StageCall;
use crate::policy::stages::{DbEngine, DbInput, DbRoute, DbRouting, ProjectDb, Topology};
use crate::state::AppState;

/// An answer's body holding something until the body is done or dropped: a place in a budget,
/// the count of an open stream.
#[derive(Debug)]
pub struct Holding<G> {
    body: Body,
    _held: G,
}

impl<G> Holding<G> {
    /// `body`, holding `held`.
    pub fn new(body: Body, held: G) -> Self {
        Self { body, _held: held }
    }
}

impl<G: Send + Unpin + 'static> http_body::Body for Holding<G> {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

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
    let backend = match service {
        Service::Storage => state.http.storage.as_ref(),
        Service::Realtime => state.http.realtime.as_ref(),
        _ => None,
    }
    .ok_or_else(|| {
        GatewayError::unavailable(
            "backend_not_configured",
            format!(
                "no HTTP backend is configured for the {} service",
                service.name()
            ),
        )
    })?;
    let rest = request
        .uri()
        .path()
        .strip_prefix(service.route_prefix())
        .unwrap_or_default();
    let uri = backend.uri(rest, request.uri().query())?;
    let breaker = state.breakers.service(service);
    forward_http(state, &breaker, backend, uri, cx, request).await
}

async fn forward_http(
    state: &AppState,
    breaker: &std::sync::Arc<crate::breaker::CircuitBreaker>,
    backend: &self::pool::Backend,
    uri: ::http::Uri,
    cx: &RouteContext,
    request: Request,
) -> Result<Response, GatewayError> {
    state
        .http
        .forward(breaker, backend, uri, request, &cx.actor, cx.deadline)
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
    let project = project.map(|p| ProjectDb {
        engine: match p.db_engine {
            crate::control::DbEngine::Postgres => DbEngine::Postgres,
            crate::control::DbEngine::Mongodb => DbEngine::Mongodb,
        },
        topology: match p.topology {
            crate::control::Topology::Shared => Topology::Shared,
            crate::control::Topology::Dedicated => Topology::Dedicated,
        },
        postgrest_url: p.postgrest_url.clone(),
    });
    let call = StageCall {
        pinned: &cx.policies,
        request_id: request
            .headers()
            .get(&crate::phases::request_id::X_REQUEST_ID)
            .and_then(|v| v.to_str().ok()),
        plane: actor.plane,
        project: actor.project.as_deref(),
    };
    let input = DbInput {
        method: request.method().as_str(),
        path: request.uri().path(),
        project: project.as_ref(),
        actor: Some(&actor),
    };
    let (route, _) = state.policies.decide::<DbRouting>(&call, input).await?;
    match route {
        DbRoute::Nats => forward_nats(state, Service::Db, cx, request).await,
        // Fail closed: never a fallback to a shared target.
        DbRoute::Unresolved => Err(GatewayError::unavailable(
            "db_target_unresolved",
            "the project's dedicated database endpoint is not resolved",
        )),
        DbRoute::Postgrest(base) => {
            // The URL is the stage's answer over the store's record: checked, never trusted.
            if let Err(refused) = state.http.postgrest_targets.check(&base) {
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
            let backend = state.http.postgrest(&base)?;
            let uri = backend.uri(rest, request.uri().query())?;
            let breaker = state.breakers.postgrest.get(base.trim_end_matches('/'));
            forward_http(state, &breaker, &backend, uri, cx, request).await
        }
    }
}

/// Reads a request body, mapping an exceeded limit to 413.
/// Whether `error` (or any error under it) is the request body limit being reached.
pub(crate) fn is_body_limit(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(err) = source {
        if err.is::<LengthLimitError>() {
            return true;
        }
        source = err.source();
    }
    false
}

pub async fn read_body(body: Body) -> Result<bytes::Bytes, GatewayError> {
    axum::body::to_bytes(body, usize::MAX).await.map_err(|e| {
        if is_body_limit(&e) {
            return GatewayError::payload_too_large("the request body is over the limit");
        }
        GatewayError::bad_request(
            "invalid_body",
            format!("the request body could not be read: {e}"),
        )
    })
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
        Ok(reply) if self::http::is_failure_status(reply.status) => probe.record_failure(),
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
