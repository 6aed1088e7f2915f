//! Slot: authentication. Establishes the [`Actor`] of the request; API keys and JWTs plug in
//! here. Until then every caller is unauthenticated (`anon` on the data plane).
//!
//! The actor is also put on the response, so that the outer access log can name it.

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;

use super::PlaneCtx;
use crate::actor::Actor;

/// The layer.
pub async fn authenticate(
    State(ctx): State<PlaneCtx>,
    mut request: Request,
    next: Next,
) -> Response {
    let actor = Actor::unauthenticated(ctx.plane);
    request.extensions_mut().insert(actor.clone());
    let mut response = next.run(request).await;
    response.extensions_mut().insert(actor);
    response
}
