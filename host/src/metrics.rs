//! Prometheus metrics of the gateway, rendered on `GET /metrics`.

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

/// Counts kept where they are made, without a shared counter moved on the request's path (a
/// decision cache's hits and misses, under its shards' locks), and added to their counters
/// when the metrics are rendered.
pub trait Publish: Send + Sync {
    /// Adds what was counted since the last call to the counters.
    fn publish(&self);
}

/// What [`Metrics::render`] tells to publish first: held weakly, so that a counter's source
/// goes when its owner does (a cache publishes its last counts itself when it is dropped).
#[derive(Clone, Default)]
pub struct Publishers(std::sync::Arc<std::sync::Mutex<Vec<std::sync::Weak<dyn Publish>>>>);

impl std::fmt::Debug for Publishers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.0.lock().map(|p| p.len()).unwrap_or(0);
        f.debug_tuple("Publishers").field(&n).finish()
    }
}

impl Publishers {
    /// Adds `source` (and forgets the sources that are gone).
    pub fn add(&self, source: std::sync::Weak<dyn Publish>) {
        if let Ok(mut sources) = self.0.lock() {
            sources.retain(|s| s.strong_count() > 0);
            sources.push(source);
        }
    }

    /// Tells every source that is still there to publish.
    pub fn publish(&self) {
        let live: Vec<_> = match self.0.lock() {
            Ok(mut sources) => {
                sources.retain(|s| s.strong_count() > 0);
                sources
                    .iter()
                    .filter_map(std::sync::Weak::upgrade)
                    .collect()
            }
            Err(_) => return,
        };
        // Outside the list's lock: a source takes its own locks.
        for source in live {
            source.publish();
        }
    }
}

/// Every metric the gateway exports.
#[derive(Debug, Clone)]
pub struct Metrics {
    registry: Registry,
    /// Counts added to their counters when rendered (see [`Publish`]).
    pub publishers: Publishers,
    /// Requests by plane, route group and status.
    pub requests: IntCounterVec,
    /// Latency by plane and route group.
    pub latency: HistogramVec,
    /// Policy plugin calls by plane, stage and module digest.
    pub plugin_calls: IntCounterVec,
    /// Policy plugin failures by plane, stage, kind and module digest.
    pub plugin_failures: IntCounterVec,
    pub decision_cache: IntCounterVec,
    /// Bytes kept by every decision cache of the instance together (set when rendered).
    pub decision_cache_bytes: IntGauge,
    /// `plugins.decision_cache.total_bytes`: the ceiling of `decision_cache_bytes`.
    pub decision_cache_ceiling_bytes: IntGauge,
    /// Instances of projects' modules alive, idle or in a call.
    pub tenant_instances: IntGauge,
    /// Bytes charged to them (linear memories, tables and each instance's state, estimated).
    pub tenant_instance_bytes: IntGauge,
    /// `plugins.tenant_instance_budget_bytes`: the ceiling of `tenant_instance_bytes`.
    pub tenant_instance_budget_bytes: IntGauge,
    /// Idle instances of projects' modules dropped, coldest first, to stay within the budget.
    pub tenant_instance_evictions: IntCounter,
    /// Bytes charged to the projects' compiled modules in use (each digest once).
    pub tenant_code_bytes: IntGauge,
    /// `plugins.tenant_code_budget_bytes`: past it the coldest projects' modules are unloaded.
    pub tenant_code_budget_bytes: IntGauge,
    /// Projects whose modules were unloaded (coldest first, to stay within the code budget;
    /// loaded again on their next request), by reason (`idle`: not called for a second, by the
    /// sweep every second; `pressure`: not called for a tick, by the sweep a load over the
    /// budget asked for).
    pub tenant_projects_unloaded: IntCounterVec,
    /// Decision cache entries given back to the instance's ceiling, by reason (`ceiling`:
    /// evicted to make room under it, from the caches furthest over their share; `idle`: a
    /// shard no request looked up for `plugins.decision_cache.idle_secs`).
    pub decision_cache_reclaimed: IntCounterVec,
    /// Plugin log lines (from `log` and captured stdout/stderr) dropped by plane, stage and
    /// reason (`per_call`: over the lines a call may keep, `rate`: over the module's rate,
    /// `bytes`: output over the capture size).
    pub plugin_log_dropped: IntCounterVec,
    /// Shadow decisions that differed from the enforced ones (a failed shadow call included).
    pub shadow_disagreements: IntCounterVec,
    /// Shadow runs: `compared`, or `skipped` (no free place: a shadow never waits).
    pub shadow_runs: IntCounterVec,
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
    /// Errors the gateway answered itself, by plane, side (`client`, `upstream`, `plugin`,
    /// `gateway`) and code.
    pub errors: IntCounterVec,
    /// User JWTs on the data plane by issuer (`platform`, `untrusted`, a trusted `iss` or
    /// `other` past the label budget) and outcome (`ok` or why it was refused).
    pub user_jwts: IntCounterVec,
    /// Fetches of a trusted issuer's keys by issuer and outcome.
    pub issuer_key_fetches: IntCounterVec,
    /// Keys in force per trusted issuer.
    pub issuer_keys: IntGaugeVec,
    /// Checks of issuers being added refused for want of a place, by scope (`organization`:
    /// its share is held; `instance`: every place is).
    pub issuer_checks_refused: IntCounterVec,
    /// Name lookups by purpose (`backend`, `issuer`, `platform`) and outcome (`ok`, `failed`,
    /// `timeout`, `refused`).
    pub dns_lookups: IntCounterVec,
    /// Request paths refused by normalisation, by plane and reason.
    pub paths_refused: IntCounterVec,
    /// Dedicated PostgREST targets refused by the allow-list, by plane.
    pub postgrest_targets_refused: IntCounterVec,
    pub db_routes_refused: IntCounterVec,
    /// Connections opened to HTTP backends, by backend (`storage`, `realtime`, `postgrest`):
    /// with keep-alive, far fewer than requests.
    pub upstream_connections_opened: IntCounterVec,
    /// Quota rule figures lowered to a ceiling, by plane, source (`operator`, `tenant`) and
    /// field (`rate`, `burst`, `cost`).
    pub quota_rules_clamped: IntCounterVec,
    /// Quota decisions refused (the request fails closed), by plane, source and reason.
    pub quota_rules_refused: IntCounterVec,
    pub quota_denials: IntCounterVec,
    /// Tenant module calls not run because the project's concurrency cap or the tenant pool was
    /// saturated, by stage.
    pub tenant_calls_shed: IntCounterVec,
    /// Projects' modules loaded (compiled or found compiled, set up, checked), by reason
    /// (`first_call`: the project's first request on this instance; `changed`: a refresh found
    /// its record changed) and result (`loaded`, `refused`, `unavailable`).
    pub tenant_module_loads: IntCounterVec,
    /// Compilations of uploaded modules by result (`ok`, `refused`, `timeout`, `memory`,
    /// `busy`, `cached`, `disk`: mapped from `plugins.compile_cache_dir`, `remembered`).
    pub tenant_compiles: IntCounterVec,
    /// Wall time of compilations of uploaded modules.
    pub tenant_compile_seconds: prometheus::Histogram,
    /// Peak resident memory of the process that compiled an uploaded module.
    pub tenant_compile_peak_bytes: prometheus::Histogram,
    /// Unused stored modules collected.
    pub modules_collected: prometheus::IntCounter,
    /// Files of the compile cache folder removed (their modules collected, or compiled for an
    /// engine this gateway no longer runs).
    pub compiled_files_collected: prometheus::IntCounter,
    /// Log lines dropped because the log writer could not keep up.
    pub log_lines_dropped: prometheus::IntCounter,
    /// Control change events acted on, by source (`nats`, `postgres`, `file`) and kind
    /// (`refused`: not an event).
    pub change_events: IntCounterVec,
    /// Listener certificate reloads by plane and result (`ok`, `refused`).
    pub tls_reloads: IntCounterVec,
    /// TLS handshakes that failed or timed out, by plane.
    pub tls_handshake_failures: IntCounterVec,
    /// Connections the listener closed before or between requests, by plane and reason
    /// (`silent`: no request started within `server.header_read_timeout_ms`; `http2_refused`:
    /// an HTTP/2 preface with `server.http2` off; `idle`: an HTTP/2 connection without a stream
    /// for `server.http2_idle_timeout_ms`; `malformed`: an HTTP/1.1 request head refused with
    /// its `400` or `431`).
    pub connections_closed: IntCounterVec,
    /// Long-lived exchanges refused because the listener's `server.max_streams` were open, by
    /// plane.
    pub streams_refused: IntCounterVec,
    /// Long-lived exchanges open now (streamed HTTP-backend bodies, WebSocket tunnels), by plane.
    pub streams_open: IntGaugeVec,
    /// HTTP/2 streams whose answer the gateway stopped sending, by plane and reason
    /// (`send_timeout`: the client made no room for the answer's next frame within
    /// `server.send_timeout_ms`; the backend exchange was dropped).
    pub http2_streams_reset: IntCounterVec,
    /// HTTP/1.1 keep-alive connections waiting for their next request with their HTTP state
    /// released (`server.idle_release_ms`), by plane.
    pub connections_parked: IntGaugeVec,
    /// Module uploads answered `503 uploads_busy`, by scope (`organization`: its share in
    /// progress; `instance`: every place taken).
    pub tenant_uploads_busy: IntCounterVec,
    /// Change events refused before acting, by source and reason (`unsigned`, `bad_signature`,
    /// `stale`, `replayed`, `invalid`, `kind`).
    pub change_events_refused: IntCounterVec,
    /// Reloads and refreshes asked for by change events, by action (`operator_reload`,
    /// `tenant_refresh`) and outcome (`run`, `coalesced`: folded into one already due).
    pub change_actions: IntCounterVec,
    /// `ratelimit_decisions` by plane, limiter and decision, looked up once.
    decisions: std::sync::Arc<[prometheus::IntCounter; 8]>,
    /// `quota_rules_clamped` by plane, source and field, looked up at first use (a series
    /// appears when it is first counted, as with the vector's own lookup).
    pub(crate) clamped: std::sync::Arc<[std::sync::OnceLock<prometheus::IntCounter>; 12]>,
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
        let decision_cache = IntCounterVec::new(
            Opts::new(
                "decision_cache_total",
                "Decision cache lookups and evictions by plane, stage, owner (operator, candidate, tenant) and outcome (hit, miss, evicted, declined: decided without a lookup while the cache thrashes)",
            ),
            &["plane", "stage", "owner", "outcome"],
        )
        .expect("valid metric");
        let decision_cache_bytes = IntGauge::new(
            "decision_cache_bytes",
            "Bytes kept by every decision cache of the instance together (keys and decisions, estimated)",
        )
        .expect("valid metric");
        let decision_cache_ceiling_bytes = IntGauge::new(
            "decision_cache_ceiling_bytes",
            "The ceiling of aura_decision_cache_bytes (plugins.decision_cache.total_bytes)",
        )
        .expect("valid metric");
        let tenant_instances = IntGauge::new(
            "tenant_instances",
            "Instances of projects' modules alive, idle or in a call",
        )
        .expect("valid metric");
        let tenant_instance_bytes = IntGauge::new(
            "tenant_instance_bytes",
            "Bytes charged to the instances of projects' modules (linear memories, tables and each instance's state, estimated)",
        )
        .expect("valid metric");
        let tenant_instance_budget_bytes = IntGauge::new(
            "tenant_instance_budget_bytes",
            "The ceiling of aura_tenant_instance_bytes (plugins.tenant_instance_budget_bytes)",
        )
        .expect("valid metric");
        let tenant_instance_evictions = IntCounter::new(
            "tenant_instance_evictions_total",
            "Idle instances of projects' modules dropped, coldest first, to stay within plugins.tenant_instance_budget_bytes",
        )
        .expect("valid metric");
        let tenant_code_bytes = IntGauge::new(
            "tenant_code_bytes",
            "Bytes charged to the projects' compiled modules in use, each digest once (image and runtime state, estimated)",
        )
        .expect("valid metric");
        let tenant_code_budget_bytes = IntGauge::new(
            "tenant_code_budget_bytes",
            "The ceiling of aura_tenant_code_bytes (plugins.tenant_code_budget_bytes)",
        )
        .expect("valid metric");
        let tenant_projects_unloaded = IntCounterVec::new(
            Opts::new(
                "tenant_projects_unloaded_total",
                "Projects whose modules were unloaded, least recently called first, to stay within plugins.tenant_code_budget_bytes (loaded again on their next request), by reason (idle: not called for a second; pressure: not called for 100 ms, after a load over the budget)",
            ),
            &["reason"],
        )
        .expect("valid metric");
        for reason in ["idle", "pressure"] {
            tenant_projects_unloaded.with_label_values(&[reason]);
        }
        let decision_cache_reclaimed = IntCounterVec::new(
            Opts::new(
                "decision_cache_reclaimed_total",
                "Decision cache entries given back to the instance's ceiling, by reason (ceiling: evicted to make room, from the caches furthest over their share; idle: a shard no request looked up for a while)",
            ),
            &["reason"],
        )
        .expect("valid metric");
        let plugin_log_dropped = IntCounterVec::new(
            Opts::new(
                "plugin_log_dropped_total",
                "Plugin log lines dropped by plane, stage and reason (per_call, rate, bytes)",
            ),
            &["plane", "stage", "reason"],
        )
        .expect("valid metric");
        let shadow_disagreements = IntCounterVec::new(
            Opts::new(
                "policy_shadow_disagreements_total",
                "Shadow module decisions that differed from the enforced ones (failed shadow calls included), by plane, stage and project (`-`: the operator's)",
            ),
            &["plane", "stage", "project"],
        )
        .expect("valid metric");
        let shadow_runs = IntCounterVec::new(
            Opts::new(
                "policy_shadow_runs_total",
                "Shadow module runs by plane, stage and outcome (compared, skipped: no free place, a shadow never waits)",
            ),
            &["plane", "stage", "outcome"],
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
        let counter = |name: &str, help: &str, labels: &[&str]| {
            IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric")
        };
        let errors = counter(
            "errors_total",
            "Errors the gateway answered itself, by plane, side (client, upstream, plugin, gateway) and code",
            &["plane", "side", "code"],
        );
        let user_jwts = counter(
            "user_jwts_total",
            "User JWTs on the data plane by issuer (platform, untrusted, a project's trusted issuer) and outcome",
            &["issuer", "outcome"],
        );
        let issuer_key_fetches = counter(
            "issuer_key_fetches_total",
            "Fetches of projects' trusted issuers' keys by issuer and outcome",
            &["issuer", "outcome"],
        );
        let issuer_checks_refused = counter(
            "issuer_checks_refused_total",
            "Checks of issuers being added refused for want of a place, by scope (organization, instance)",
            &["scope"],
        );
        let dns_lookups = counter(
            "dns_lookups_total",
            "Name lookups by purpose (backend, issuer, platform) and outcome (ok, failed, timeout, refused)",
            &["purpose", "outcome"],
        );
        let issuer_keys = IntGaugeVec::new(
            Opts::new("issuer_keys", "Keys in force per project's trusted issuer"),
            &["issuer"],
        )
        .expect("valid metric");
        let paths_refused = counter(
            "paths_refused_total",
            "Request paths refused by normalisation (400 invalid_path), by plane and reason",
            &["plane", "reason"],
        );
        let db_routes_refused = counter(
            "db_routes_refused_total",
            "db-routing decisions the host refused (503 db_route_refused), by plane and reason (write_to_replica, unknown_replica)",
            &["plane", "reason"],
        );
        let postgrest_targets_refused = counter(
            "postgrest_targets_refused_total",
            "Dedicated PostgREST targets outside upstreams.postgrest_allowed_targets, by plane",
            &["plane"],
        );
        let upstream_connections_opened = counter(
            "upstream_connections_opened_total",
            "Connections opened to HTTP backends, by backend",
            &["backend"],
        );
        let quota_rules_clamped = counter(
            "quota_rules_clamped_total",
            "Quota rule figures lowered to their ceiling, by plane, source and field",
            &["plane", "source", "field"],
        );
        let quota_rules_refused = counter(
            "quota_rules_refused_total",
            "Quota decisions refused (request failed closed), by plane, source and reason",
            &["plane", "source", "reason"],
        );
        let quota_denials = counter(
            "quota_denials_total",
            "Requests a quota module denied (403 or 429), by plane, source and code",
            &["plane", "source", "code"],
        );
        let tenant_calls_shed = counter(
            "tenant_calls_shed_total",
            "Tenant module calls refused because the project's cap or the tenant pool was full",
            &["stage"],
        );
        let tenant_module_loads = counter(
            "tenant_module_loads_total",
            "Projects' modules loaded on this instance, by reason (first_call, changed) and result (loaded, refused, unavailable)",
            &["reason", "result"],
        );
        let tenant_compiles = counter(
            "tenant_compiles_total",
            "Compilations of uploaded modules by result",
            &["result"],
        );
        let tenant_compile_seconds = prometheus::Histogram::with_opts(
            HistogramOpts::new(
                "tenant_compile_seconds",
                "Wall time of compilations of uploaded modules",
            )
            .buckets(vec![0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0]),
        )
        .expect("valid metric");
        let tenant_compile_peak_bytes = prometheus::Histogram::with_opts(
            HistogramOpts::new(
                "tenant_compile_peak_bytes",
                "Peak resident memory of the process compiling an uploaded module",
            )
            .buckets(
                prometheus::exponential_buckets(8.0 * 1024.0 * 1024.0, 2.0, 8).expect("buckets"),
            ),
        )
        .expect("valid metric");
        let modules_collected = prometheus::IntCounter::new(
            "modules_collected_total",
            "Stored policy modules removed because no project or instance used them",
        )
        .expect("valid metric");
        let compiled_files_collected = prometheus::IntCounter::new(
            "compile_cache_files_collected_total",
            "Compile cache files removed: their modules were collected, or they were compiled \
             for an engine this gateway no longer runs",
        )
        .expect("valid metric");
        let log_lines_dropped = prometheus::IntCounter::new(
            "log_lines_dropped_total",
            "Log lines dropped because the log writer could not keep up (log.buffer_lines)",
        )
        .expect("valid metric");
        let change_events = counter(
            "change_events_total",
            "Control change events acted on, by source and kind (refused: not an event)",
            &["source", "kind"],
        );
        let tls_reloads = counter(
            "tls_reloads_total",
            "Listener certificate reloads by plane and result (ok, refused)",
            &["plane", "result"],
        );
        let tls_handshake_failures = counter(
            "tls_handshake_failures_total",
            "TLS handshakes that failed or timed out, by plane",
            &["plane"],
        );
        let connections_closed = counter(
            "connections_closed_total",
            "Connections closed by the listener before or between requests, by plane and reason (silent, http2_refused, idle, malformed, send_timeout)",
            &["plane", "reason"],
        );
        let streams_refused = counter(
            "streams_refused_total",
            "Long-lived exchanges refused (503 too_many_streams) because server.max_streams were open, by plane",
            &["plane"],
        );
        let http2_streams_reset = counter(
            "http2_streams_reset_total",
            "HTTP/2 streams whose answer the gateway stopped sending, by plane and reason (send_timeout: the client made no room for it within server.send_timeout_ms; the backend exchange was dropped)",
            &["plane", "reason"],
        );
        let streams_open = IntGaugeVec::new(
            Opts::new(
                "streams_open",
                "Long-lived exchanges open (streamed HTTP-backend bodies, WebSocket tunnels), by plane",
            ),
            &["plane"],
        )
        .expect("valid metric");
        let connections_parked = IntGaugeVec::new(
            Opts::new(
                "connections_parked",
                "HTTP/1.1 keep-alive connections waiting for their next request with their HTTP state released (server.idle_release_ms), by plane",
            ),
            &["plane"],
        )
        .expect("valid metric");
        let tenant_uploads_busy = counter(
            "tenant_uploads_busy_total",
            "Module uploads answered 503 uploads_busy, by scope (organization, instance)",
            &["scope"],
        );
        let change_events_refused = counter(
            "change_events_refused_total",
            "Change events refused before acting, by source and reason",
            &["source", "reason"],
        );
        let change_actions = counter(
            "change_actions_total",
            "Reloads and refreshes asked for by change events, by action and outcome (run, coalesced)",
            &["action", "outcome"],
        );
        for c in [
            Box::new(log_lines_dropped.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(connections_closed.clone()),
            Box::new(streams_refused.clone()),
            Box::new(streams_open.clone()),
            Box::new(http2_streams_reset.clone()),
            Box::new(connections_parked.clone()),
            Box::new(tenant_uploads_busy.clone()),
            Box::new(change_events_refused.clone()),
            Box::new(change_actions.clone()),
            Box::new(tls_reloads.clone()),
            Box::new(change_events.clone()),
            Box::new(tls_handshake_failures.clone()),
            Box::new(paths_refused.clone()),
            Box::new(postgrest_targets_refused.clone()),
            Box::new(db_routes_refused.clone()),
            Box::new(upstream_connections_opened.clone()),
            Box::new(quota_rules_clamped.clone()),
            Box::new(quota_rules_refused.clone()),
            Box::new(quota_denials.clone()),
            Box::new(tenant_calls_shed.clone()),
            Box::new(tenant_module_loads.clone()),
            Box::new(tenant_compiles.clone()),
            Box::new(tenant_compile_seconds.clone()),
            Box::new(tenant_compile_peak_bytes.clone()),
            Box::new(modules_collected.clone()),
            Box::new(compiled_files_collected.clone()),
            Box::new(ratelimit_decisions.clone()),
            Box::new(requests_shed.clone()),
            Box::new(errors.clone()),
            Box::new(user_jwts.clone()),
            Box::new(issuer_key_fetches.clone()),
            Box::new(issuer_keys.clone()),
            Box::new(issuer_checks_refused.clone()),
            Box::new(dns_lookups.clone()),
            Box::new(ratelimit_shared.clone()),
            Box::new(requests.clone()),
            Box::new(latency.clone()),
            Box::new(plugin_calls.clone()),
            Box::new(plugin_failures.clone()),
            Box::new(decision_cache.clone()),
            Box::new(decision_cache_bytes.clone()),
            Box::new(decision_cache_ceiling_bytes.clone()),
            Box::new(tenant_instances.clone()),
            Box::new(tenant_instance_bytes.clone()),
            Box::new(tenant_instance_budget_bytes.clone()),
            Box::new(tenant_instance_evictions.clone()),
            Box::new(tenant_code_bytes.clone()),
            Box::new(tenant_code_budget_bytes.clone()),
            Box::new(tenant_projects_unloaded.clone()),
            Box::new(decision_cache_reclaimed.clone()),
            Box::new(plugin_log_dropped.clone()),
            Box::new(shadow_disagreements.clone()),
            Box::new(shadow_runs.clone()),
            Box::new(plugin_latency.clone()),
            Box::new(breaker_state.clone()),
            Box::new(policy_reloads.clone()),
            Box::new(nats_connected.clone()),
        ] {
            registry.register(c).expect("registered once");
        }
        let decisions = std::sync::Arc::new(std::array::from_fn(|i| {
            ratelimit_decisions.with_label_values(&[
                ["data", "management"][i >> 2],
                ["ip", "actor"][(i >> 1) & 1],
                ["allowed", "limited"][i & 1],
            ])
        }));
        let clamped = std::sync::Arc::new(std::array::from_fn(|_| std::sync::OnceLock::new()));
        Self {
            publishers: Publishers::default(),
            clamped,
            log_lines_dropped,
            connections_closed,
            streams_refused,
            streams_open,
            http2_streams_reset,
            connections_parked,
            tenant_uploads_busy,
            change_events_refused,
            change_actions,
            tls_reloads,
            tls_handshake_failures,
            change_events,
            decisions,
            registry,
            requests,
            latency,
            plugin_calls,
            plugin_failures,
            decision_cache,
            decision_cache_bytes,
            decision_cache_ceiling_bytes,
            tenant_instances,
            tenant_instance_bytes,
            tenant_instance_budget_bytes,
            tenant_instance_evictions,
            tenant_code_bytes,
            tenant_code_budget_bytes,
            tenant_projects_unloaded,
            decision_cache_reclaimed,
            plugin_log_dropped,
            shadow_disagreements,
            shadow_runs,
            plugin_latency,
            breaker_state,
            policy_reloads,
            nats_connected,
            ratelimit_decisions,
            ratelimit_shared,
            requests_shed,
            errors,
            user_jwts,
            issuer_key_fetches,
            issuer_keys,
            issuer_checks_refused,
            dns_lookups,
            paths_refused,
            postgrest_targets_refused,
            db_routes_refused,
            upstream_connections_opened,
            quota_rules_clamped,
            quota_rules_refused,
            quota_denials,
            tenant_calls_shed,
            tenant_module_loads,
            tenant_compiles,
            tenant_compile_seconds,
            tenant_compile_peak_bytes,
            modules_collected,
            compiled_files_collected,
        }
    }

    /// The counter of a rate-limit decision (`actor`: the per-actor quota, else per IP).
    pub fn ratelimit_decision(
        &self,
        plane: crate::plane::Plane,
        actor: bool,
        allowed: bool,
    ) -> &prometheus::IntCounter {
        let plane = usize::from(plane == crate::plane::Plane::Management);
        &self.decisions[plane << 2 | usize::from(actor) << 1 | usize::from(!allowed)]
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        self.publishers.publish();
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
