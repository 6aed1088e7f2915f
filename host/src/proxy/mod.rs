//! The proxy handlers, written once and mounted on both planes, and their transports.

pub mod envelope;
pub mod nats;
pub mod service;

use std::error::Error as _;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, any};
use http_body_util::LengthLimitError;
use tokio::time::Instant;

use self::envelope::{EnvelopeRequest, query_without_apikey};
use self::service::Service;
use crate::actor::Actor;
use crate::error::GatewayError;
use crate::middleware::budget::Deadline;
use crate::middleware::request_id::RequestId;
use crate::policy::stages::DbRoute;
use crate::state::AppState;

/// A route handler forwarding to `service` over NATS.
pub fn nats_route(service: Service) -> MethodRouter<AppState> {
    any(
        move |State(state): State<AppState>, request: Request| async move {
            forward_nats(&state, service, request)
                .await
                .unwrap_or_else(IntoResponse::into_response)
        },
    )
}

/// The `/v1/db/*` handler: the db-routing stage decides the transport per request.
pub fn db_route() -> MethodRouter<AppState> {
    any(
        |State(state): State<AppState>, request: Request| async move {
            route_db(&state, request)
                .await
                .unwrap_or_else(IntoResponse::into_response)
        },
    )
}

/// A route handler for a service reached over HTTP (storage, realtime).
pub fn http_route(service: Service) -> MethodRouter<AppState> {
    any(move || async move {
        GatewayError::unavailable(
            "backend_not_configured",
            format!(
                "no HTTP backend is configured for the {} service",
                service.name()
            ),
        )
        .into_response()
    })
}

async fn route_db(state: &AppState, request: Request) -> Result<Response, GatewayError> {
    let actor = actor_of(&request)?;
    let policies = state.policies();
    let route = policies
        .plane(actor.plane)
        .db_routing
        .decide(
            actor.plane,
            request.method().as_str(),
            request.uri().path(),
            None,
        )
        .map_err(|e| state.plugin_failed(&e))?;
    match route {
        DbRoute::Nats => forward_nats(state, Service::Db, request).await,
        DbRoute::Unresolved => Err(GatewayError::unavailable(
            "db_target_unresolved",
            "the project's dedicated database endpoint is not resolved",
        )),
        DbRoute::Postgrest(_) => Err(GatewayError::unavailable(
            "backend_not_configured",
            "direct PostgREST routing is not available",
        )),
    }
}

fn actor_of(request: &Request) -> Result<Actor, GatewayError> {
    request
        .extensions()
        .get::<Actor>()
        .cloned()
        .ok_or_else(|| GatewayError::internal("no actor on the request (chain misconfigured)"))
}

/// Reads a request body, mapping an exceeded limit to 413.
pub async fn read_body(body: Body) -> Result<bytes::Bytes, GatewayError> {
    axum::body::to_bytes(body, usize::MAX).await.map_err(|e| {
        let mut source: Option<&(dyn std::error::Error + 'static)> = e.source();
        while let Some(err) = source {
            if err.is::<LengthLimitError>() {
                return GatewayError::payload_too_large("the request body is over the limit");
            }
            source = err.source();
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
    request: Request,
) -> Result<Response, GatewayError> {
    let actor = actor_of(&request)?;
    let (parts, body) = request.into_parts();
    let deadline = parts
        .extensions
        .get::<Deadline>()
        .map(|d| d.0)
        .unwrap_or_else(|| Instant::now() + state.config.timeouts.default_budget());
    let id = parts
        .extensions
        .get::<RequestId>()
        .map(|r| r.0.clone())
        .unwrap_or_default();
    let body = read_body(body).await?;
    let mut envelope = EnvelopeRequest {
        v: 1,
        id: &id,
        plane: actor.plane.as_str(),
        method: parts.method.as_str(),
        path: parts.uri.path(),
        query: query_without_apikey(parts.uri.query()),
        headers: EnvelopeRequest::headers_of(&parts.headers),
        body: EnvelopeRequest::encode_body(&body),
        actor: &actor,
        deadline_ms: 0,
    };
    drop(body);
    let reply = state.nats.request(service, &mut envelope, deadline).await?;
    let mut response = Response::new(Body::from(reply.body));
    *response.status_mut() = reply.status;
    *response.headers_mut() = reply.headers;
    Ok(response)
}
