//! WebAssembly policy stages, in three parts:
//! - [`runtime`]: the mechanism every module runs under, whoever owns it (engine, sandbox,
//!   limits, compilation, decision caches, the tenant pool);
//! - [`stages`]: each stage as a type, with its conformance vectors, authoring tests, default
//!   plugins and native adapters;
//! - the owners' files: the per-plane set of loaded modules ([`PlanePolicies`]), a plane's slot
//!   ([`slot`]), the registry that decides ([`registry`]), projects' modules ([`tenants`],
//!   [`installs`]), trials ([`rollout`]), the history ([`history`]) and reloads ([`reload`]).
//!
//! The host owns every mechanism; a stage plugin only returns a typed decision. Modules are
//! compiled and configured when loaded, never on the request path.

pub mod history;
pub mod installs;
pub mod registry;
pub mod reload;
pub mod rollout;
pub mod runtime;
pub mod slot;
pub mod stages;
pub mod tenants;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use sha2::{Digest, Sha256};
use wasmtime::component::Component;

pub use crate::stage::Stage;
pub use runtime::engine::{Owner, PolicyEngine};
pub use slot::{AnySlot, Slot};
pub use stages::{AnyModule, Module, PolicyStage};

/// The loaded `api-key` module of the data plane.
pub type ApiKeyStage = Module<stages::ApiKey>;
/// A loaded `cors` module.
pub type CorsStage = Module<stages::Cors>;
/// A loaded `quota` module.
pub type QuotaStage = Module<stages::Quota>;
/// A loaded `db-routing` module.
pub type DbRoutingStage = Module<stages::DbRouting>;

use crate::config::{self, Config, StageConfig};
use crate::plane::Plane;
use crate::stage::STAGES;
use stages::{ModuleSource, StageFn, for_stage};

/// SHA-256 of a module, hex.
pub fn digest_of(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

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

    /// Logs the failure as an error naming plugin, stage and plane; `left_out`: the module's
    /// failures not logged since its last line (see [`runtime::plugin_log::FailureLog`]).
    pub fn log(&self, left_out: u64) {
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
                left_out,
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

/// The embedded default plugin of `stage`.
pub fn builtin_module(stage: Stage) -> &'static [u8] {
    struct Builtin;
    impl StageFn for Builtin {
        type Out = &'static [u8];
        fn call<S: PolicyStage>(self) -> &'static [u8] {
            S::BUILTIN
        }
    }
    for_stage(stage, Builtin)
}

/// Where the modules named in a configuration come from, and the components compiled so far.
struct Sources<'a> {
    runtime: &'a PolicyEngine,
    base: Option<&'a Path>,
    stored: &'a HashMap<String, Vec<u8>>,
    cache: ComponentCache,
}

impl Sources<'_> {
    /// Reads (or takes the built-in or stored bytes of) the module `stage_config` names for
    /// `stage` of `plane` (configuration key `key`), and compiles it once.
    fn source(
        &mut self,
        key: &str,
        stage: Stage,
        plane: Plane,
        stage_config: &StageConfig,
    ) -> Result<ModuleSource, PluginError> {
        let (name, bytes): (String, std::borrow::Cow<'_, [u8]>) =
            match (stage_config.module_path(), stage_config.module_digest()) {
                (None, Some(digest)) => {
                    let bytes = self.stored.get(digest).ok_or_else(|| PluginError::Io {
                        key: key.to_owned(),
                        path: stage_config.module.clone(),
                        reason: "not in the control store's module store".to_owned(),
                    })?;
                    (
                        stage_config.module.clone(),
                        std::borrow::Cow::Borrowed(bytes.as_slice()),
                    )
                }
                (None, None) => (
                    config::BUILTIN.to_owned(),
                    std::borrow::Cow::Borrowed(builtin_module(stage)),
                ),
                (Some(path), _) => {
                    let resolved = config::resolve(self.base, path);
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
        let digest = digest_of(&bytes);
        let component = match self.cache.compiled.get(&digest) {
            Some(c) => c.clone(),
            None => {
                let c = self
                    .runtime
                    .compile_module(&digest, &bytes)
                    .map_err(|reason| PluginError::Load {
                        stage,
                        plane,
                        module: name.clone(),
                        kind: FailureKind::Refused,
                        reason,
                    })?;
                self.cache.compiled.insert(digest.clone(), c.clone());
                c
            }
        };
        Ok(ModuleSource {
            name,
            digest,
            component,
            config: stage_config.config.to_string(),
        })
    }
}

/// The loaded stage modules of one plane: a slot per stage that runs on it (the module in force
/// and an operator's candidate), in [`Stage::index`] order.
#[derive(Debug, Clone)]
pub struct PlanePolicies {
    /// The plane.
    pub plane: Plane,
    slots: [Option<Arc<dyn AnySlot>>; STAGES.len()],
}

impl PlanePolicies {
    /// The plane's slot for stage `S` (`None`: the stage does not run on this plane).
    pub fn slot<S: PolicyStage>(&self) -> Option<&Slot<S>> {
        self.slots[S::STAGE.index()]
            .as_deref()?
            .as_any()
            .downcast_ref::<Slot<S>>()
    }

    /// The plane's module in force for stage `S`.
    pub fn module<S: PolicyStage>(&self) -> Option<&Arc<Module<S>>> {
        self.slot::<S>()?.module.as_ref()
    }

    /// The plane's slot for `stage`, whatever its type.
    pub fn any_slot(&self, stage: Stage) -> Option<&dyn AnySlot> {
        self.slots[stage.index()].as_deref()
    }

    /// Every slot of the plane, in stage order.
    pub fn slots(&self) -> impl Iterator<Item = &dyn AnySlot> {
        self.slots.iter().filter_map(|s| s.as_deref())
    }

    /// Each stage's module and what it did: (stage, report).
    pub fn reports(&self) -> Vec<(Stage, runtime::stats::ModuleReport)> {
        self.slots()
            .filter_map(|s| Some((s.stage(), s.module()?.report())))
            .collect()
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
        /// Loads one stage's slot.
        struct LoadSlot<'a> {
            runtime: &'a Arc<PolicyEngine>,
            plane: Plane,
            module: ModuleSource,
            candidate: Option<(ModuleSource, crate::stage::Trial)>,
        }
        impl StageFn for LoadSlot<'_> {
            type Out = Result<Arc<dyn AnySlot>, PluginError>;
            fn call<S: PolicyStage>(self) -> Self::Out {
                slot::load_slot::<S>(self.runtime, self.plane, self.module, self.candidate)
            }
        }
        let mut sources = Sources {
            runtime,
            base,
            stored,
            cache: ComponentCache::default(),
        };
        let mut load_plane = |plane: Plane| -> Result<PlanePolicies, PluginError> {
            let mut slots: [Option<Arc<dyn AnySlot>>; STAGES.len()] = Default::default();
            for info in STAGES.iter().filter(|i| i.planes.contains(&plane)) {
                let Some(sc) = config.stage(plane, info.stage) else {
                    continue;
                };
                let key = format!("{plane}_plane.plugins.{}", info.key);
                let module = sources.source(&key, info.stage, plane, sc)?;
                let candidate = match (
                    sc.candidate.as_deref(),
                    sc.candidate.as_deref().and_then(StageConfig::trial),
                ) {
                    (Some(c), Some(trial)) => {
                        Some((sources.source(&key, info.stage, plane, c)?, trial))
                    }
                    _ => None,
                };
                slots[info.stage.index()] = Some(for_stage(
                    info.stage,
                    LoadSlot {
                        runtime,
                        plane,
                        module,
                        candidate,
                    },
                )?);
            }
            Ok(PlanePolicies { plane, slots })
        };
        Ok(Self {
            data: Arc::new(load_plane(Plane::Data)?),
            management: Arc::new(load_plane(Plane::Management)?),
        })
    }

    /// Starts new failure windows for every module (when put in force).
    pub fn reset_health(&self) {
        for p in [&self.data, &self.management] {
            for slot in p.slots() {
                for module in slot
                    .module()
                    .into_iter()
                    .chain(slot.candidate().map(|c| c.0))
                {
                    module.reset_health();
                }
            }
        }
    }

    /// These policies with `plane`'s candidate for `stage` as its module in force (the
    /// candidate slot emptied); `None` when there is no candidate being tried. Put in force with
    /// [`Policies::reset_health`]: from then on the registry treats the promoted module as the
    /// module in force (rolled back when it fails too often), because that is where it sits.
    pub fn promoted(&self, plane: Plane, stage: Stage) -> Option<Policies> {
        let mut next = PlanePolicies::clone(self.plane(plane));
        let promoted = next.any_slot(stage)?.promoted()?;
        next.slots[stage.index()] = Some(promoted);
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
        Some(self.plane(plane).any_slot(stage)?.module()?.wit_version())
    }
}
