//! Authentication, in its slot after the per-IP limit: establishes the [`Actor`] of the request
//! (data plane: API key and optional user JWT; management plane: console JWT and org role).
//!
//! The actor goes on the request for the layers inside and the handler, and on the response so
//! that the outer access log can name it.

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::PlaneCtx;
use crate::auth::{data_plane, management};
use crate::error::GatewayError;
use crate::plane::Plane;

/// The layer.
pub async fn authenticate(State(ctx): State<PlaneCtx>, request: Request, next: Next) -> Response {
    let (mut parts, body) = request.into_parts();
    let state = &ctx.state;
    let result = match ctx.plane {
        Plane::Data => {
            let policies = state.policies_of(&parts.extensions);
            match policies.data.api_key.as_ref() {
                Some(stage) => {
                    data_plane::authenticate(&state.auth, stage, &mut parts, |e| {
                        state.plugin_failed(e)
                    })
                    .await
                }
                None => Err(GatewayError::internal(
                    "the data plane has no api-key stage",
                )),
            }
        }
        Plane::Management => management::authenticate(&state.auth, &mut parts).await,
    };
    match result {
        Ok(mut actor) => {
            actor.client_ip = parts
                .extensions
                .get::<super::rate_limit::ClientIp>()
                .map(|c| c.0);
            parts.extensions.insert(actor.clone());
            let mut response = next.run(Request::from_parts(parts, body)).await;
            response.extensions_mut().insert(actor);
            response
        }
        Err(error) => error.into_response(),
    }
}
