//! Slot: per-actor quota, after authentication, with the rule decided by the `quota` stage.
//! The bucket enforcement (local or Redis) plugs in here.

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;

use super::PlaneCtx;

/// The layer.
pub async fn per_actor(State(_ctx): State<PlaneCtx>, request: Request, next: Next) -> Response {
    next.run(request).await
}
