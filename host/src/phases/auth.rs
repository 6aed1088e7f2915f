//! Phase 9, authentication, after the per-IP limit: establishes the [`Actor`] of the request
//! (data plane: API key and optional user JWT; management plane: console JWT and org role) and
//! puts it in the request context, with the client IP of phase 8.

use std::sync::Arc;

use axum::extract::Request;

use axum::response::IntoResponse;

use super::Phase;
use super::context::RequestContext;
use crate::actor::Actor;
use crate::auth::{data_plane, management};
use crate::error::GatewayError;
use crate::plane::Plane;
use crate::state::AppState;

/// Authenticates `request`, which comes back with the client's credentials removed, with its
/// caller (also kept in `cx` for the phases on the way back).
pub async fn authenticate(
    state: &AppState,
    cx: &mut RequestContext,
    request: Request,
) -> Phase<(Request, Arc<Actor>)> {
    let (mut parts, body) = request.into_parts();
    let actor = caller(state, cx, &mut parts)
        .await
        .map_err(IntoResponse::into_response)?;
    cx.actor = Some(actor.clone());
    Ok((Request::from_parts(parts, body), actor))
}

async fn caller(
    state: &AppState,
    cx: &RequestContext,
    parts: &mut http::request::Parts,
) -> Result<Arc<Actor>, GatewayError> {
    if cx.plane == Plane::Data && crate::routes::is_management_route(parts.uri.path()) {
        return Err(GatewayError::not_found(
            "no such route on the data plane (it is a management-plane route)",
        ));
    }
    let mut actor: Actor = match cx.plane {
        Plane::Data => {
            data_plane::authenticate(
                &state.auth,
                &state.policies,
                &cx.policies,
                cx.client_ip,
                cx.started,
                parts,
            )
            .await?
        }
        Plane::Management => management::authenticate(&state.auth, parts).await?,
    };
    actor.client_ip = cx.client_ip;
    Ok(Arc::new(actor))
}
