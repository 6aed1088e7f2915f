//! Prometheus request metrics: count by plane, route group and status; latency histogram.

use std::time::Instant;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;

use super::PlaneCtx;
use crate::route_group::RouteGroup;

/// The layer.
pub async fn record(State(ctx): State<PlaneCtx>, request: Request, next: Next) -> Response {
    let group = RouteGroup::of(request.uri().path());
    let started = Instant::now();
    let response = next.run(request).await;
    let plane = ctx.plane.as_str();
    let m = &ctx.state.metrics;
    m.requests
        .with_label_values(&[plane, group.as_str(), response.status().as_str()])
        .inc();
    m.latency
        .with_label_values(&[plane, group.as_str()])
        .observe(started.elapsed().as_secs_f64());
    response
}
