//! Assembling the one state of both planes from the configuration, and starting the work that
//! runs beside the requests: the policy tasks (history writer, module collection) and the
//! listeners of control changes ([`crate::changes`]).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::auth::Authenticator;
use crate::config::Config;
use crate::control::{self, ControlStore};
use crate::metrics::Metrics;
use crate::policy::registry::PolicyRegistry;
use crate::policy::tenants::TenantPolicies;
use crate::policy::{Policies, PolicyEngine};
use crate::proxy::http::HttpTransport;
use crate::proxy::nats::NatsTransport;
use crate::ratelimit::{IpLimiter, QuotaLimiter};
use crate::state::{AppState, Breakers, StateInner};

impl AppState {
    /// Loads the policy modules of both planes and starts the NATS connection. `base` is the
    /// config file's folder, for relative module paths.
    pub async fn build(config: Config, base: Option<&Path>) -> anyhow::Result<Self> {
        let store = control::open(&config.control, base).await?;
        Self::build_with_store(config, base, store).await
    }

    /// Like [`AppState::build`] over a given control store.
    pub async fn build_with_store(
        config: Config,
        base: Option<&Path>,
        store: Arc<dyn ControlStore>,
    ) -> anyhow::Result<Self> {
        let metrics = Metrics::new();
        // One resolver for everything resolved while serving: never the runtime's blocking
        // threads, each lookup ended at its deadline.
        let resolver = crate::dns::Resolver::new(&config.dns, Some(&metrics))
            .map_err(|e| anyhow::anyhow!(e))?;
        let auth = Authenticator::new(&config.auth, store.clone(), &resolver, Some(&metrics))
            .map_err(|e| anyhow::anyhow!(e))?;
        let config_upstreams = config.upstreams.clone();
        let config_breaker = config.breaker.clone();
        let rl = &config.rate_limit;
        let retain = Duration::from_secs(rl.retain_interval_secs);
        let ip_limits = [
            IpLimiter::new(&rl.data_plane_per_ip, retain),
            IpLimiter::new(&rl.management_plane_per_ip, retain),
        ];
        let quotas = QuotaLimiter::new(rl, metrics.clone());
        let fleet = Arc::new(crate::fleet::Fleet::new(&config, &metrics));
        let runtime = PolicyEngine::new(&config.plugins)?;
        runtime.set_metrics(metrics.clone());
        let stored = crate::policy::fetch_stored_modules(&config, store.as_ref()).await?;
        let policies = Policies::load_with(&runtime, &config, base, &stored)?;
        crate::policy::stages::conformance::check(&policies)?;
        let nats = NatsTransport::connect(&config.nats).await?;
        let tenants = TenantPolicies::new(runtime.clone(), &config.plugins, metrics.clone());
        let http = HttpTransport::new(
            &config_upstreams,
            config.server.stream_budget(),
            &metrics,
            &resolver,
        )?;
        let state = Self::new(StateInner {
            config,
            nats,
            policies: Arc::new(PolicyRegistry::new(
                runtime,
                policies,
                tenants,
                store,
                metrics.clone(),
            )),
            config_path: std::sync::OnceLock::new(),
            metrics,
            ip_limits,
            quotas,
            http,
            breakers: Breakers::new(&config_breaker),
            auth,
            readiness: crate::readiness::Readiness::default(),
            started_at: std::time::SystemTime::now(),
            instance_id: fleet.instance_id.clone(),
            fleet,
        });
        state
            .policies
            .set_announcer(Arc::new(crate::changes::FleetAnnouncer::new(
                state.downgrade(),
            )));
        let configured: Vec<String> = state
            .config
            .stages()
            .into_iter()
            .filter_map(|(_, stage)| stage.module_digest().map(str::to_owned))
            .collect();
        state.policies.runtime.cache_budget().spawn_sweeps();
        state.policies.spawn_tasks(
            configured,
            Duration::from_secs(state.config.plugins.module_gc_interval_secs.max(1)),
            Duration::from_secs(state.config.plugins.module_gc_grace_secs),
        );
        crate::changes::spawn(&state);
        Ok(state)
    }
}
