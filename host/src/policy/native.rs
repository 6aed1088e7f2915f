//! Benchmark-only: the default policies compiled into the host (`--features native-policies`).
//!
//! Built with the feature and started with `BENCH_AURA_NATIVE_POLICIES=1`, the gateway answers
//! every stage that runs a built-in module with the same policy code called natively instead of
//! through the sandbox, so that `bench/run` can measure the price of the sandbox on one binary.
//! The wasm modules are still compiled, checked and configured as usual (a configuration the
//! module refuses is refused the same way); only the per-request call changes. Never for
//! production: a native policy has no deadline, memory cap or fault isolation.

use std::sync::OnceLock;

use super::stages::{
    CorsAllow, CorsDecision, Credential, DbEngine, DbRoute, KeyDecision, KeyRole, KeySource,
    ProjectDb, QuotaDecision, QuotaRule, Topology,
};
use crate::actor::{Actor, Role};
use crate::config;
use crate::plane::Plane;

use aura_plugin_api_key::policy as api_key;
use aura_plugin_cors::policy as cors;
use aura_plugin_db_routing::policy as db;
use aura_plugin_quota::policy as quota;

/// Whether this process answers built-in stages natively (`BENCH_AURA_NATIVE_POLICIES=1`).
pub fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        let on = std::env::var("BENCH_AURA_NATIVE_POLICIES").is_ok_and(|v| v == "1");
        if on {
            tracing::warn!(
                "BENCH_AURA_NATIVE_POLICIES=1: built-in policy stages run natively, without \
                 the sandbox (benchmark builds only)"
            );
        }
        on
    })
}

/// A default policy compiled into the host.
pub trait NativePolicy: Sized + Send + Sync + std::fmt::Debug {
    /// The native policy standing for a module named `module` with `config` on `plane`, when
    /// this process answers built-in stages natively (and the configuration is accepted).
    fn load(module: &str, plane: Plane, config: &str) -> Option<Self>;
}

fn wanted(module: &str) -> bool {
    module == config::BUILTIN && enabled()
}

/// The native `api-key` policy.
#[derive(Debug)]
pub struct ApiKey(api_key::Policy);

impl NativePolicy for ApiKey {
    fn load(module: &str, _plane: Plane, config: &str) -> Option<Self> {
        wanted(module)
            .then(|| api_key::Policy::configure(config).ok().map(Self))
            .flatten()
    }
}

impl ApiKey {
    pub(crate) fn extract(
        &self,
        path: &str,
        query_keys: &[String],
        headers: &[(&str, &str)],
    ) -> KeyDecision {
        match self.0.extract(path, query_keys, headers) {
            api_key::Decision::Absent => KeyDecision::Absent,
            api_key::Decision::Refuse(why) => KeyDecision::Refuse(why),
            api_key::Decision::Present {
                key,
                source,
                allowed_roles,
            } => KeyDecision::Present(Credential {
                key,
                source: match source {
                    api_key::Source::Header => KeySource::Header,
                    api_key::Source::Query => KeySource::Query,
                },
                allowed_roles: allowed_roles
                    .into_iter()
                    .map(|r| match r {
                        api_key::Role::Anon => KeyRole::Anon,
                        api_key::Role::ServiceRole => KeyRole::ServiceRole,
                    })
                    .collect(),
            }),
        }
    }
}

/// The native `cors` policy.
#[derive(Debug)]
pub struct Cors(cors::Policy);

impl NativePolicy for Cors {
    fn load(module: &str, plane: Plane, config: &str) -> Option<Self> {
        let plane = match plane {
            Plane::Data => cors::Plane::Data,
            Plane::Management => cors::Plane::Management,
        };
        wanted(module)
            .then(|| cors::Policy::configure(plane, config).ok().map(Self))
            .flatten()
    }
}

impl Cors {
    pub(crate) fn decide(&self, origin: &str, preflight: bool) -> CorsDecision {
        match self.0.decide(origin, preflight) {
            None => CorsDecision::Deny,
            Some(a) => CorsDecision::Allow(CorsAllow {
                allow_origin: a.allow_origin,
                allow_methods: a.allow_methods,
                allow_headers: a.allow_headers,
                expose_headers: a.expose_headers,
                max_age: a.max_age,
            }),
        }
    }
}

/// The native `quota` policy.
#[derive(Debug)]
pub struct Quota(quota::Policy);

impl NativePolicy for Quota {
    fn load(module: &str, _plane: Plane, config: &str) -> Option<Self> {
        wanted(module)
            .then(|| quota::Policy::configure(config).ok().map(Self))
            .flatten()
    }
}

impl Quota {
    pub(crate) fn decide(&self, route_group: &str, actor: &Actor) -> QuotaDecision {
        let a = quota::Actor {
            role: match actor.role {
                Role::Anon => quota::Role::Anon,
                Role::Authenticated => quota::Role::Authenticated,
                Role::ServiceRole => quota::Role::ServiceRole,
                Role::Console => quota::Role::Console,
            },
            project: actor.project.as_deref(),
            key_id: actor.key_id.as_deref(),
            user_id: actor.user_id.as_deref(),
            plan: actor.plan.as_deref(),
        };
        match self.0.decide(route_group, a) {
            None => QuotaDecision::Exempt,
            Some(r) => QuotaDecision::Limit(QuotaRule {
                bucket: r.bucket,
                rate_per_second: r.rate_per_second,
                burst: r.burst,
                cost: r.cost,
            }),
        }
    }
}

/// The native `db-routing` policy.
#[derive(Debug)]
pub struct DbRouting(db::Policy);

impl NativePolicy for DbRouting {
    fn load(module: &str, _plane: Plane, config: &str) -> Option<Self> {
        wanted(module)
            .then(|| db::Policy::configure(config).ok().map(Self))
            .flatten()
    }
}

impl DbRouting {
    pub(crate) fn decide(&self, method: &str, path: &str, project: Option<&ProjectDb>) -> DbRoute {
        let project = project.map(|p| db::Project {
            engine: match p.engine {
                DbEngine::Postgres => db::Engine::Postgres,
                DbEngine::Mongodb => db::Engine::Mongodb,
            },
            topology: match p.topology {
                Topology::Shared => db::Topology::Shared,
                Topology::Dedicated => db::Topology::Dedicated,
            },
            postgrest_url: p.postgrest_url.as_deref(),
        });
        match self.0.decide(method, path, project) {
            db::Route::Nats => DbRoute::Nats,
            db::Route::Postgrest(url) => DbRoute::Postgrest(url),
            db::Route::Unresolved => DbRoute::Unresolved,
        }
    }
}
