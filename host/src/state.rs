//! The one state shared by both planes.

use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use crate::auth::Authenticator;
use crate::breaker::table::BreakerTable;
use crate::breaker::{BreakerSettings, CircuitBreaker};
use crate::config::{BreakerConfig, Config};
use crate::metrics::Metrics;
use crate::policy::registry::PolicyRegistry;
use crate::proxy::http::HttpTransport;
use crate::proxy::nats::NatsTransport;
use crate::ratelimit::{IpLimiter, QuotaLimiter};
use crate::routes::Service;

/// Shared state of both planes: configuration, NATS client, plugin runtime and loaded policy
/// modules, metrics. Cheap to clone.
#[derive(Debug, Clone)]
pub struct AppState(Arc<StateInner>);

/// What [`AppState`] holds.
#[derive(Debug)]
pub struct StateInner {
    /// The validated configuration.
    pub config: Config,
    /// The NATS transport.
    pub nats: NatsTransport,
    /// The policy modules in force: both planes' and the projects' own.
    pub policies: Arc<PolicyRegistry>,
    /// The config file, for reloads of the plugin sections.
    pub config_path: std::sync::OnceLock<std::path::PathBuf>,
    /// Prometheus metrics.
    pub metrics: Metrics,
    /// Credentials: the control store, key cache, JWT verifiers.
    pub auth: Authenticator,
    /// The pooled HTTP client of the HTTP backends.
    pub http: HttpTransport,
    /// Circuit breakers.
    pub breakers: Breakers,
    /// Per-IP limiters: data plane, management plane.
    pub ip_limits: [Arc<IpLimiter>; 2],
    /// Per-actor quotas.
    pub quotas: Arc<QuotaLimiter>,
    /// What `/ready` answers from.
    pub readiness: crate::readiness::Readiness,
    /// When this instance started (`/v1/admin/status`).
    pub started_at: std::time::SystemTime,
    /// This instance's id in the fleet's change events.
    pub instance_id: String,
    /// This instance's part in the fleet: signed change events, coalesced actions.
    pub fleet: Arc<crate::fleet::Fleet>,
}

/// An [`AppState`] that does not keep the state alive (for background tasks).
#[derive(Debug, Clone)]
pub struct WeakState(std::sync::Weak<StateInner>);

impl WeakState {
    /// The state, while it lives.
    pub fn upgrade(&self) -> Option<AppState> {
        self.0.upgrade().map(AppState)
    }
}

/// One breaker per service and a table of breakers per dedicated PostgREST target.
#[derive(Debug)]
pub struct Breakers {
    /// By [`Service::index`]: a request finds its service's breaker without hashing.
    services: Box<[(Service, Arc<CircuitBreaker>)]>,
    /// Per dedicated PostgREST target.
    pub postgrest: Arc<BreakerTable>,
}

impl Breakers {
    pub(crate) fn new(config: &BreakerConfig) -> Self {
        let settings = BreakerSettings::from(config);
        let services = Service::all()
            .map(|s| (s, CircuitBreaker::new(s.name(), settings)))
            .collect();
        let postgrest = BreakerTable::new(settings, config.max_targets);
        postgrest.spawn_sweeper(Duration::from_secs(config.sweep_secs));
        Self {
            services,
            postgrest,
        }
    }

    /// The breaker of `service`.
    pub fn service(&self, service: Service) -> Arc<CircuitBreaker> {
        let (of, breaker) = &self.services[service.index()];
        debug_assert_eq!(*of, service);
        breaker.clone()
    }

    /// Every service breaker.
    pub fn services(&self) -> impl Iterator<Item = (&Service, &Arc<CircuitBreaker>)> {
        self.services
            .iter()
            .map(|(service, breaker)| (service, breaker))
    }
}

impl Deref for AppState {
    type Target = StateInner;
    fn deref(&self) -> &StateInner {
        &self.0
    }
}

impl AppState {
    /// The state holding `inner` ([`crate::startup`] assembles it).
    pub(crate) fn new(inner: StateInner) -> Self {
        Self(Arc::new(inner))
    }

    /// Reads the config file again and swaps in its policy modules (SIGHUP, the reload route, a
    /// fleet event), or says why not: the modules in force keep serving.
    pub async fn reload_policies(
        &self,
        trigger: &str,
    ) -> Result<(), crate::policy::reload::ReloadError> {
        self.policies
            .reload_from_file(
                self.config_path.get().map(|p| p.as_path()),
                &self.config,
                trigger,
            )
            .await
    }

    /// A handle that does not keep the state alive.
    pub fn downgrade(&self) -> WeakState {
        WeakState(Arc::downgrade(&self.0))
    }

    /// Refreshes the projects' modules soon rather than at the end of the period (a change
    /// event): `project`'s alone when one is named, else every project's. Asks made before the
    /// refresh starts are one refresh, and refreshes asked for this way start at most once per
    /// `control.change_min_interval_ms`.
    pub fn request_tenant_refresh(&self, project: Option<&str>) {
        self.fleet.ask_tenant_refresh(project);
    }

    /// The per-IP limiter of `plane`.
    pub fn ip_limiter(&self, plane: crate::plane::Plane) -> &Arc<IpLimiter> {
        match plane {
            crate::plane::Plane::Data => &self.ip_limits[0],
            crate::plane::Plane::Management => &self.ip_limits[1],
        }
    }

    /// Brings the gauges that are read rather than counted up to date (before a scrape).
    pub fn refresh_gauges(&self) {
        let dropped = crate::telemetry::dropped_log_lines();
        let counted = self.metrics.log_lines_dropped.get();
        if dropped > counted {
            self.metrics.log_lines_dropped.inc_by(dropped - counted);
        }
        self.metrics
            .nats_connected
            .set(i64::from(self.nats.is_connected()));
        for plane in [crate::plane::Plane::Data, crate::plane::Plane::Management] {
            self.metrics
                .streams_open
                .with_label_values(&[plane.as_str()])
                .set(self.http.streams_open(plane) as i64);
        }
        // Targets that closed again disappear from the gauge: start from scratch.
        self.metrics.breaker_state.reset();
        for (target, state) in self.breakers.postgrest.not_closed() {
            self.metrics
                .breaker_state
                .with_label_values(&[&format!("postgrest:{target}")])
                .set(state.as_gauge());
        }
        for (service, breaker) in self.breakers.services() {
            self.metrics
                .breaker_state
                .with_label_values(&[service.name()])
                .set(breaker.state().as_gauge());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn each_service_finds_its_own_breaker() {
        let breakers = Breakers::new(&BreakerConfig::default());
        let mut names = Vec::new();
        for service in Service::all() {
            let breaker = breakers.service(service);
            assert_eq!(breaker.name(), service.name());
            assert!(Arc::ptr_eq(&breaker, &breakers.service(service)));
            names.push(breaker.name().to_owned());
        }
        let listed: Vec<String> = breakers
            .services()
            .map(|(s, _)| s.name().to_owned())
            .collect();
        assert_eq!(listed, names);
        let distinct: std::collections::BTreeSet<&String> = names.iter().collect();
        assert_eq!(distinct.len(), Service::all().count());
    }
}
