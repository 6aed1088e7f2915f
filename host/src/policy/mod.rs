//! WebAssembly policy stages: the runtime ([`engine`]), the generated bindings (private), the
//! typed stage wrappers ([`stages`]) and the per-plane set of loaded modules ([`PlanePolicies`]).
//!
//! The host owns every mechanism; a stage plugin only returns a typed decision. Modules are
//! compiled and configured when loaded, never on the request path.

pub mod authoring;
mod bindings;
pub mod builtin;
pub mod compile;
pub mod compile_cache;
pub mod confine;
pub mod conformance;
pub mod engine;
pub mod history;
pub mod isolation;
mod limits;
#[cfg(feature = "native-policies")]
pub mod native;
pub mod plugin_log;
pub mod registry;
pub mod rollout;
pub mod sandbox;
pub mod stages;
pub mod stats;
pub mod tenants;
pub mod vectors;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use sha2::{Digest, Sha256};
use wasmtime::component::Component;

pub use crate::stage::Stage;
pub use engine::{Owner, PolicyEngine};
pub use stages::{ApiKeyStage, CorsStage, DbRoutingStage, QuotaStage};

use crate::config::{self, Config, StageConfig};
use crate::plane::Plane;

/// How a plugin failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// The guest trapped (including stack overflow and forbidden imports).
    Trap,
    /// The call overran its deadline.
    Deadline,
    /// The guest asked for more memory than its cap.
    Memory,
    /// The module or its configuration was refused.
    Refused,
}

impl FailureKind {
    /// Label value for logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            FailureKind::Trap => "trap",
            FailureKind::Deadline => "deadline",
            FailureKind::Memory => "memory",
            FailureKind::Refused => "refused",
        }
    }
}

/// A plugin failure, at load time or on a call.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PluginError {
    /// A module could not be loaded: wrong exports, refused configuration, failing instance.
    #[error("{plane}_plane.plugins.{stage}: module {module} refused ({}): {reason}", kind.as_str())]
    Load {
        stage: Stage,
        plane: Plane,
        module: String,
        kind: FailureKind,
        reason: String,
    },
    /// A call failed; the request it served fails closed.
    #[error("{plane}_plane.plugins.{stage}: module {module} failed ({}): {reason}", kind.as_str())]
    Call {
        stage: Stage,
        plane: Plane,
        module: String,
        kind: FailureKind,
        reason: String,
    },
    /// A module file could not be read.
    #[error("{key}.module: cannot read {path}: {reason}")]
    Io {
        key: String,
        path: String,
        reason: String,
    },
    /// The runtime itself could not be set up.
    #[error("plugin runtime: {0}")]
    Runtime(String),
}

impl PluginError {
    pub(crate) fn runtime(message: String) -> Self {
        PluginError::Runtime(message)
    }

    /// The stage concerned, when there is one.
    pub fn stage(&self) -> Option<Stage> {
        match self {
            PluginError::Load { stage, .. } | PluginError::Call { stage, .. } => Some(*stage),
            _ => None,
        }
    }

    /// The failure kind, when there is one.
    pub fn kind(&self) -> Option<FailureKind> {
        match self {
            PluginError::Load { kind, .. } | PluginError::Call { kind, .. } => Some(*kind),
            _ => None,
        }
    }

    /// Logs the failure as an error naming plugin, stage and plane.
    pub fn log(&self) {
        match self {
            PluginError::Call {
                stage,
                plane,
                module,
                kind,
                reason,
            }
            | PluginError::Load {
                stage,
                plane,
                module,
                kind,
                reason,
            } => tracing::error!(
                plugin = %module,
                stage = %stage,
                plane = %plane,
                kind = kind.as_str(),
                reason = %reason,
                "policy plugin failed; the request fails closed"
            ),
            other => tracing::error!(error = %other, "policy plugin error"),
        }
    }
}

/// Compiled components by digest, so that a module used by several stages or planes is
/// compiled once.
#[derive(Default)]
struct ComponentCache {
    compiled: HashMap<String, Component>,
}

/// Reads (or takes the built-in or stored bytes of) a stage module, compiles it once.
#[expect(
    clippy::too_many_arguments,
    reason = "one call site, every argument distinct"
)]
fn component_for(
    runtime: &PolicyEngine,
    cache: &mut ComponentCache,
    key: &str,
    stage: Stage,
    plane: Plane,
    stage_config: &StageConfig,
    base: Option<&Path>,
    stored: &HashMap<String, Vec<u8>>,
) -> Result<(String, String, Component), PluginError> {
    let (name, bytes): (String, std::borrow::Cow<'_, [u8]>) = match stage_config.module_path() {
        None if stage_config.module_digest().is_some() => {
            let digest = stage_config.module_digest().unwrap_or_default();
            let bytes = stored.get(digest).ok_or_else(|| PluginError::Io {
                key: key.to_owned(),
                path: stage_config.module.clone(),
                reason: "not in the control store's module store".to_owned(),
            })?;
            (
                stage_config.module.clone(),
                std::borrow::Cow::Borrowed(bytes.as_slice()),
            )
        }
        None => (
            config::BUILTIN.to_owned(),
            std::borrow::Cow::Borrowed(match stage {
                Stage::ApiKey => builtin::API_KEY,
                Stage::Cors => builtin::CORS,
                Stage::Quota => builtin::QUOTA,
                Stage::DbRouting => builtin::DB_ROUTING,
            }),
        ),
        Some(path) => {
            let resolved = config::resolve(base, path);
            let bytes = std::fs::read(&resolved).map_err(|e| PluginError::Io {
                key: key.to_owned(),
                path: resolved.display().to_string(),
                reason: e.to_string(),
            })?;
            (
                resolved.display().to_string(),
                std::borrow::Cow::Owned(bytes),
            )
        }
    };
    let digest = hex::encode(Sha256::digest(&bytes));
    let component = match cache.compiled.get(&digest) {
        Some(c) => c.clone(),
        None => {
            let c =
                runtime
                    .compile_module(&digest, &bytes)
                    .map_err(|reason| PluginError::Load {
                        stage,
                        plane,
                        module: name.clone(),
                        kind: FailureKind::Refused,
                        reason,
                    })?;
            cache.compiled.insert(digest.clone(), c.clone());
            c
        }
    };
    Ok((name, digest, component))
}

/// The loaded stage modules of one plane.
#[derive(Debug)]
pub struct PlanePolicies {
    /// The plane.
    pub plane: Plane,
    /// API key extraction (data plane only).
    pub api_key: Option<Arc<ApiKeyStage>>,
    /// CORS.
    pub cors: Arc<CorsStage>,
    /// Per-actor quota rules.
    pub quota: Arc<QuotaStage>,
    /// `/v1/db/*` routing.
    pub db_routing: Arc<DbRoutingStage>,
    /// The operator's CORS module on trial (`cors.candidate`).
    pub cors_candidate: Option<Arc<rollout::Candidate<CorsStage>>>,
    /// The operator's quota module on trial (`quota.candidate`).
    pub quota_candidate: Option<Arc<rollout::Candidate<QuotaStage>>>,
}

impl PlanePolicies {
    /// Each stage's module and what it did: (stage, report).
    pub fn reports(&self) -> Vec<(Stage, stats::ModuleReport)> {
        let mut out = Vec::new();
        if let Some(api_key) = &self.api_key {
            out.push((Stage::ApiKey, api_key.report()));
        }
        out.push((Stage::Cors, self.cors.report()));
        out.push((Stage::Quota, self.quota.report()));
        out.push((Stage::DbRouting, self.db_routing.report()));
        out
    }
}

/// Why the modules a configuration names by digest could not be fetched.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoredModuleError {
    /// The configuration names a digest the store does not hold: the configuration is wrong.
    #[error("{key}.module: {digest} is not in the control store's module store")]
    Missing { key: String, digest: String },
    /// The store could not be asked: retrying later may work.
    #[error("{key}.module: {error}")]
    Store {
        key: String,
        error: crate::control::StoreError,
    },
}

/// Fetches the modules a configuration names by digest (`sha256:…`) from the control store.
pub async fn fetch_stored_modules(
    config: &Config,
    store: &dyn crate::control::ControlStore,
) -> Result<HashMap<String, Vec<u8>>, StoredModuleError> {
    let mut modules = HashMap::new();
    for (key, stage) in config.stages() {
        let Some(digest) = stage.module_digest() else {
            continue;
        };
        let bytes = store
            .module(digest)
            .await
            .map_err(|error| StoredModuleError::Store {
                key: key.to_owned(),
                error,
            })?
            .ok_or_else(|| StoredModuleError::Missing {
                key: key.to_owned(),
                digest: digest.to_owned(),
            })?;
        modules.insert(digest.to_owned(), bytes);
    }
    Ok(modules)
}

/// The loaded policies of both planes.
#[derive(Debug)]
pub struct Policies {
    pub data: Arc<PlanePolicies>,
    pub management: Arc<PlanePolicies>,
}

impl Policies {
    /// Compiles, checks and configures every stage module of both planes.
    pub fn load(
        runtime: &Arc<PolicyEngine>,
        config: &Config,
        base: Option<&Path>,
    ) -> Result<Self, PluginError> {
        Self::load_with(runtime, config, base, &HashMap::new())
    }

    /// Like [`Policies::load`], with the modules named by digest (`sha256:…`) already fetched
    /// from the control store.
    pub fn load_with(
        runtime: &Arc<PolicyEngine>,
        config: &Config,
        base: Option<&Path>,
        stored: &HashMap<String, Vec<u8>>,
    ) -> Result<Self, PluginError> {
        let mut cache = ComponentCache::default();
        let mut load = |plane: Plane, stage: Stage, sc: &StageConfig| {
            let key = format!("{plane}_plane.plugins.{stage}");
            let (name, digest, component) =
                component_for(runtime, &mut cache, &key, stage, plane, sc, base, stored)?;
            Ok::<_, PluginError>((name, digest, component, sc.config.to_string()))
        };
        // A candidate's module, marked so that its failures drop it alone.
        macro_rules! candidate {
            ($wrapper:ident, $plane:expr, $stage:expr, $sc:expr) => {
                match (
                    $sc.candidate.as_deref(),
                    $sc.candidate.as_deref().and_then(StageConfig::trial),
                ) {
                    (Some(c), Some(trial)) => {
                        let loaded = $wrapper::load(
                            runtime,
                            $plane,
                            load($plane, $stage, c)?,
                            Owner::Candidate,
                        )?;
                        Some(Arc::new(rollout::Candidate::new(loaded, trial)))
                    }
                    _ => None,
                }
            };
        }
        let d = &config.data_plane.plugins;
        let m = &config.management_plane.plugins;
        let dp = Plane::Data;
        let data = PlanePolicies {
            plane: dp,
            api_key: Some(Arc::new(ApiKeyStage::load(
                runtime,
                dp,
                load(dp, Stage::ApiKey, &d.api_key)?,
                Owner::Operator,
            )?)),
            cors: Arc::new(CorsStage::load(
                runtime,
                dp,
                load(dp, Stage::Cors, &d.cors)?,
                Owner::Operator,
            )?),
            quota: Arc::new(QuotaStage::load(
                runtime,
                dp,
                load(dp, Stage::Quota, &d.quota)?,
                Owner::Operator,
            )?),
            db_routing: Arc::new(DbRoutingStage::load(
                runtime,
                dp,
                load(dp, Stage::DbRouting, &d.db_routing)?,
                Owner::Operator,
            )?),
            cors_candidate: candidate!(CorsStage, dp, Stage::Cors, d.cors),
            quota_candidate: candidate!(QuotaStage, dp, Stage::Quota, d.quota),
        };
        let mp = Plane::Management;
        let management = PlanePolicies {
            plane: mp,
            api_key: None,
            cors: Arc::new(CorsStage::load(
                runtime,
                mp,
                load(mp, Stage::Cors, &m.cors)?,
                Owner::Operator,
            )?),
            quota: Arc::new(QuotaStage::load(
                runtime,
                mp,
                load(mp, Stage::Quota, &m.quota)?,
                Owner::Operator,
            )?),
            db_routing: Arc::new(DbRoutingStage::load(
                runtime,
                mp,
                load(mp, Stage::DbRouting, &m.db_routing)?,
                Owner::Operator,
            )?),
            cors_candidate: candidate!(CorsStage, mp, Stage::Cors, m.cors),
            quota_candidate: candidate!(QuotaStage, mp, Stage::Quota, m.quota),
        };
        Ok(Self {
            data: Arc::new(data),
            management: Arc::new(management),
        })
    }

    /// Starts new failure windows for every module (when put in force).
    pub fn reset_health(&self) {
        for p in [&self.data, &self.management] {
            if let Some(a) = &p.api_key {
                a.reset_health();
            }
            p.cors.reset_health();
            p.quota.reset_health();
            p.db_routing.reset_health();
            if let Some(c) = &p.cors_candidate {
                c.stage.reset_health();
            }
            if let Some(c) = &p.quota_candidate {
                c.stage.reset_health();
            }
        }
    }

    /// These policies with `plane`'s candidate for `stage` as its module in force (the
    /// candidate slot emptied); `None` when there is no candidate being tried. Put in force with
    /// [`Policies::reset_health`]: from then on the registry treats the promoted module as the
    /// module in force (rolled back when it fails too often), because that is where it sits.
    pub fn promoted(&self, plane: Plane, stage: Stage) -> Option<Policies> {
        let p = self.plane(plane);
        let mut next = PlanePolicies {
            plane,
            api_key: p.api_key.clone(),
            cors: p.cors.clone(),
            quota: p.quota.clone(),
            db_routing: p.db_routing.clone(),
            cors_candidate: p.cors_candidate.clone(),
            quota_candidate: p.quota_candidate.clone(),
        };
        match stage {
            Stage::Cors => {
                let c = next.cors_candidate.take().filter(|c| !c.is_dropped())?;
                next.cors = c.stage.clone();
            }
            Stage::Quota => {
                let c = next.quota_candidate.take().filter(|c| !c.is_dropped())?;
                next.quota = c.stage.clone();
            }
            Stage::ApiKey | Stage::DbRouting => return None,
        }
        let next = Arc::new(next);
        Some(match plane {
            Plane::Data => Policies {
                data: next,
                management: self.management.clone(),
            },
            Plane::Management => Policies {
                data: self.data.clone(),
                management: next,
            },
        })
    }

    /// The policies of `plane`.
    pub fn plane(&self, plane: Plane) -> &Arc<PlanePolicies> {
        match plane {
            Plane::Data => &self.data,
            Plane::Management => &self.management,
        }
    }
    /// The `aura:gateway` version `stage`'s module on `plane` was written against (`None`: the
    /// plane has no such stage).
    pub fn wit_version(&self, plane: Plane, stage: Stage) -> Option<&'static str> {
        let p = self.plane(plane);
        Some(match stage {
            Stage::ApiKey => p.api_key.as_ref()?.wit_version(),
            Stage::Cors => p.cors.wit_version(),
            Stage::Quota => p.quota.wit_version(),
            Stage::DbRouting => p.db_routing.wit_version(),
        })
    }
}
