//! Slot: per-IP rate limit, before authentication, on every route of the plane.
//!
//! It sits before auth so that an unauthenticated flood is refused before any credential work.
//! The limiter itself (governor locally, Redis shared) plugs in here.

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;

use super::PlaneCtx;

/// The layer.
pub async fn per_ip(State(_ctx): State<PlaneCtx>, request: Request, next: Next) -> Response {
    next.run(request).await
}
