//! Phase 5, request metrics: every request that got past the request limits is counted by plane,
//! route group and final status, and its latency observed; an error the gateway answered itself
//! is counted by plane, side and code too. The counters are looked up once per
//! plane, group and status, not on every request.

use std::sync::OnceLock;

use axum::response::Response;
use prometheus::{Histogram, IntCounter};

use super::context::RequestContext;
use crate::error::ErrorCode;
use crate::metrics::Metrics;
use crate::plane::Plane;
use crate::routes::RouteGroup;

/// Statuses with a counter of their own per group (100–599).
const STATUSES: usize = 500;

/// The request metrics of one plane.
#[derive(Debug)]
pub struct RequestMetrics {
    metrics: Metrics,
    plane: Plane,
    counters: Box<[OnceLock<IntCounter>]>,
    /// Indexed by [`RouteGroup::index`]: the groups a path can be in are made at once (their
    /// series are exposed from the start), the others never.
    latency: Box<[OnceLock<Histogram>]>,
}

impl RequestMetrics {
    /// Handles for `plane`.
    pub fn new(metrics: &Metrics, plane: Plane) -> Self {
        let latency: Box<[OnceLock<Histogram>]> =
            (0..RouteGroup::COUNT).map(|_| OnceLock::new()).collect();
        for group in RouteGroup::all() {
            latency[group.index()].get_or_init(|| latency_of(metrics, plane, group));
        }
        Self {
            metrics: metrics.clone(),
            plane,
            counters: (0..RouteGroup::COUNT * STATUSES)
                .map(|_| OnceLock::new())
                .collect(),
            latency,
        }
    }

    /// Counts `response` and observes its latency.
    pub fn record(&self, cx: &RequestContext, response: &Response) {
        let group = cx.group.index();
        let status = response.status();
        let counter = match usize::from(status.as_u16()).checked_sub(100) {
            Some(i) if i < STATUSES => {
                self.counters[group * STATUSES + i].get_or_init(|| self.counter(cx.group, status))
            }
            _ => &self.counter(cx.group, status),
        };
        counter.inc();
        self.latency[group]
            .get_or_init(|| latency_of(&self.metrics, self.plane, cx.group))
            .observe(cx.started.elapsed().as_secs_f64());
        if let Some(error) = response.extensions().get::<ErrorCode>() {
            self.metrics
                .errors
                .with_label_values(&[self.plane.as_str(), error.side.as_str(), error.code])
                .inc();
        }
    }

    fn counter(&self, group: RouteGroup, status: http::StatusCode) -> IntCounter {
        self.metrics.requests.with_label_values(&[
            self.plane.as_str(),
            group.as_str(),
            status.as_str(),
        ])
    }
}

fn latency_of(metrics: &Metrics, plane: Plane, group: RouteGroup) -> Histogram {
    metrics
        .latency
        .with_label_values(&[plane.as_str(), group.as_str()])
}
