//! Prometheus metrics of the gateway, rendered on `GET /metrics`.

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

/// Every metric the gateway exports.
#[derive(Debug, Clone)]
pub struct Metrics {
    registry: Registry,
    /// Requests by plane, route group and status.
    pub requests: IntCounterVec,
    /// Latency by plane and route group.
    pub latency: HistogramVec,
    /// Policy plugin calls by plane, stage and module digest.
    pub plugin_calls: IntCounterVec,
    /// Policy plugin failures by plane, stage, kind and module digest.
    pub plugin_failures: IntCounterVec,
    /// Policy plugin call latency by plane and stage.
    pub plugin_latency: HistogramVec,
    /// Policy reloads by result (`applied`, `refused`) and automatic rollbacks (`rolled_back`).
    pub policy_reloads: IntCounterVec,
    /// Breaker state per service and failing PostgREST target: 0 closed, 1 half-open, 2 open.
    pub breaker_state: IntGaugeVec,
    /// 1 while the NATS connection is up.
    pub nats_connected: IntGauge,
    /// Rate-limit decisions by plane, limiter (`ip`, `actor`) and decision.
    pub ratelimit_decisions: IntCounterVec,
    /// 1 while per-actor quotas are shared through Redis, 0 while local.
    pub ratelimit_shared: IntGauge,
    /// Requests shed by plane (`server.max_in_flight` reached).
    pub requests_shed: IntCounterVec,
}

impl Metrics {
    /// Creates and registers the metrics.
    pub fn new() -> Self {
        let registry = Registry::new_custom(Some("aura".into()), None).expect("valid prefix");
        let requests = IntCounterVec::new(
            Opts::new(
                "http_requests_total",
                "Requests answered, by plane, route group and status",
            ),
            &["plane", "group", "status"],
        )
        .expect("valid metric");
        let latency = HistogramVec::new(
            HistogramOpts::new(
                "http_request_duration_seconds",
                "Time to response headers, by plane and route group",
            )
            .buckets(vec![
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                10.0, 30.0, 60.0, 380.0,
            ]),
            &["plane", "group"],
        )
        .expect("valid metric");
        let plugin_calls = IntCounterVec::new(
            Opts::new(
                "plugin_calls_total",
                "Policy plugin calls by plane, stage and module digest",
            ),
            &["plane", "stage", "digest"],
        )
        .expect("valid metric");
        let plugin_failures = IntCounterVec::new(
            Opts::new(
                "plugin_failures_total",
                "Policy plugin failures by plane, stage, kind (trap, deadline, memory, refused) and module digest",
            ),
            &["plane", "stage", "kind", "digest"],
        )
        .expect("valid metric");
        let plugin_latency = HistogramVec::new(
            HistogramOpts::new("plugin_call_duration_seconds", "Policy plugin call latency")
                .buckets(vec![
                    1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 1e-3, 1e-2, 0.1,
                ]),
            &["plane", "stage"],
        )
        .expect("valid metric");
        let policy_reloads = IntCounterVec::new(
            Opts::new(
                "policy_reloads_total",
                "Policy module reloads by result: applied, refused, rolled_back",
            ),
            &["result"],
        )
        .expect("valid metric");
        let breaker_state = IntGaugeVec::new(
            Opts::new(
                "breaker_state",
                "Circuit breaker state (0 closed, 1 half-open, 2 open) per service and per failing PostgREST target",
            ),
            &["breaker"],
        )
        .expect("valid metric");
        let nats_connected = IntGauge::new("nats_connected", "1 while the NATS connection is up")
            .expect("valid metric");
        let ratelimit_decisions = IntCounterVec::new(
            Opts::new(
                "ratelimit_decisions_total",
                "Rate-limit decisions by plane, limiter and decision",
            ),
            &["plane", "limiter", "decision"],
        )
        .expect("valid metric");
        let ratelimit_shared = IntGauge::new(
            "ratelimit_shared",
            "1 while per-actor quotas are shared through Redis, 0 while local",
        )
        .expect("valid metric");
        let requests_shed = IntCounterVec::new(
            Opts::new(
                "requests_shed_total",
                "Requests answered 503 overloaded at once, by plane (server.max_in_flight)",
            ),
            &["plane"],
        )
        .expect("valid metric");
        for c in [
            Box::new(ratelimit_decisions.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(requests_shed.clone()),
            Box::new(ratelimit_shared.clone()),
            Box::new(requests.clone()),
            Box::new(latency.clone()),
            Box::new(plugin_calls.clone()),
            Box::new(plugin_failures.clone()),
            Box::new(plugin_latency.clone()),
            Box::new(breaker_state.clone()),
            Box::new(policy_reloads.clone()),
            Box::new(nats_connected.clone()),
        ] {
            registry.register(c).expect("registered once");
        }
        Self {
            registry,
            requests,
            latency,
            plugin_calls,
            plugin_failures,
            plugin_latency,
            breaker_state,
            policy_reloads,
            nats_connected,
            ratelimit_decisions,
            ratelimit_shared,
            requests_shed,
        }
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .expect("text encoding cannot fail");
        String::from_utf8(out).unwrap_or_default()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
