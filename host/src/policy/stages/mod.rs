//! A policy stage as a type.
//!
//! Everything that is one stage's own lives in that stage's file: its WIT world, its input
//! record (borrowed from the request) and the owned copy a call on another thread takes, how a
//! canary picks its subject, how a decision is described for shadow comparisons, its conformance
//! vectors, how an author's test case reads, its default plugin's configuration schema and the
//! native adapter of the benchmarks. The rest of the host is written once over [`PolicyStage`]:
//! a loaded module ([`Module`]), a plane's slot for a stage ([`StageSlot`]: the module in force
//! and an operator's candidate), a project's module ([`super::tenants::Installed`]) and the one
//! decision algorithm ([`super::registry::PolicyRegistry::decide`]).
//!
//! The table of stages is [`crate::stage::STAGES`]; [`for_stage`] is the one place that maps a
//! row of it to its type.
//!
//! Each stage's `bindgen!` (its module `world`) is used for its types only: the runtime finds a
//! plugin's exports itself ([`StageWorld`]), so that a plugin written against `0.1.0` (the same
//! stage records under another package version) is called through the same types. Errors a
//! guest can see are WIT results; traps stay on the host's side.

pub mod api_key;
pub mod cors;
pub mod db_routing;
pub mod quota;

use std::any::Any;
use std::sync::Arc;

use wasmtime::component::Component;

use super::conformance::{ConformanceError, StageReport};
use super::engine::{Owner, PolicyEngine, StageModule, StageWorld};
use super::rollout::{Candidate, Comparison};
use super::stats::ModuleReport;
use super::{PluginError, Stage};
use crate::plane::Plane;
use crate::stage::Trial;

pub use api_key::{
    ApiKey, Credential, KeyDecision, KeyHeaders, KeyInput, KeyRequest, KeyRole, KeySource,
};
pub use cors::{Cors, CorsAllow, CorsDecision, CorsInput, CorsQuery};
pub use db_routing::{DbEngine, DbInput, DbRoute, DbRouting, ProjectDb, Topology};
pub use quota::{Quota, QuotaDecision, QuotaInput, QuotaRule};

/// One policy stage: its world (the runtime's view, [`StageWorld`]) and everything the host does
/// with its inputs and decisions.
pub trait PolicyStage: StageWorld + Sized + std::fmt::Debug {
    /// What the host knows of a request for this stage, borrowed from the request.
    type Input<'a>: Copy + Send + Sync;
    /// [`Self::Input`] with owned values, for a call run on another thread (a project's module,
    /// a shadow).
    type Query: Send + 'static;
    /// The default plugin's compiled component, embedded in the binary.
    const BUILTIN: &'static [u8];
    /// The default plugin's `config`, for its JSON Schema.
    type DefaultConfig: schemars::JsonSchema;
    /// The default policy compiled into the host (benchmark builds only).
    #[cfg(feature = "native-policies")]
    type Native: super::native::NativePolicy;

    /// The owned copy of `input`.
    fn query(input: Self::Input<'_>) -> Self::Query;
    /// The borrowed view of `query`.
    fn input(query: &Self::Query) -> Self::Input<'_>;
    /// Who a canary decides for: a stable name of the caller (the same caller is always on the
    /// same side of a canary, on every instance).
    fn subject(input: &Self::Input<'_>) -> String;
    /// The request's method and path, for a shadow's sampled disagreements.
    fn request_line<'a>(input: &Self::Input<'a>) -> (&'a str, &'a str);
    /// A decision as text, to compare a shadow's with the enforced one and to show.
    fn describe(decision: &Self::Decision) -> String;
    /// Runs one call of `module` on `input` (lowered into the stage's WIT record).
    fn run(
        module: &StageModule<Self>,
        request_id: Option<&str>,
        input: Self::Input<'_>,
    ) -> Result<Self::Decision, PluginError>;
    /// The stage's conformance vectors, run on one module before it is trusted.
    fn conformance(module: &Module<Self>) -> Result<StageReport, ConformanceError>;
    /// Runs an author's test case (`plugin check --vectors`): the case's `input` and `expect`
    /// tables, as documented in [`super::vectors`].
    fn run_case(
        module: &Module<Self>,
        input: &toml::Table,
        expect: &toml::Table,
    ) -> Result<(), String>;
    /// The JSON Schema of the default plugin's `config`.
    fn config_schema() -> serde_json::Value {
        serde_json::to_value(schemars::schema_for!(Self::DefaultConfig)).unwrap_or_default()
    }
    /// The native policy's decision (`module`: the sandboxed module it stands for).
    #[cfg(feature = "native-policies")]
    fn native(
        native: &Self::Native,
        module: &StageModule<Self>,
        input: Self::Input<'_>,
    ) -> Self::Decision;
}

/// Code written once for every stage, run for the stage a value names: the caller implements
/// `call` generically and [`for_stage`] picks the type.
pub(crate) trait StageFn {
    /// What the call returns.
    type Out;
    /// Runs for stage `S`.
    fn call<S: PolicyStage>(self) -> Self::Out;
}

/// Runs `f` for `stage`'s type: the one place a row of [`crate::stage::STAGES`] becomes a type.
pub(crate) fn for_stage<F: StageFn>(stage: Stage, f: F) -> F::Out {
    match stage {
        Stage::ApiKey => f.call::<ApiKey>(),
        Stage::Cors => f.call::<Cors>(),
        Stage::Quota => f.call::<Quota>(),
        Stage::DbRouting => f.call::<DbRouting>(),
    }
}

/// The JSON Schema of `stage`'s default plugin's `config`.
pub fn config_schema(stage: Stage) -> serde_json::Value {
    struct Schema;
    impl StageFn for Schema {
        type Out = serde_json::Value;
        fn call<S: PolicyStage>(self) -> serde_json::Value {
            S::config_schema()
        }
    }
    for_stage(stage, Schema)
}

/// What a module is loaded from: its name in logs and reports (`builtin`, a path, a project's
/// name), SHA-256 digest, compiled component and configuration (JSON).
#[derive(Clone)]
pub(crate) struct ModuleSource {
    pub name: String,
    pub digest: String,
    pub component: Component,
    pub config: String,
}

/// A loaded module of stage `S`: compiled, exports checked, configuration accepted.
pub struct Module<S: PolicyStage> {
    module: StageModule<S>,
    #[cfg(feature = "native-policies")]
    native: Option<S::Native>,
}

impl<S: PolicyStage> std::fmt::Debug for Module<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.module.fmt(f)
    }
}

impl<S: PolicyStage> Module<S> {
    /// Loads `source` as `S`'s module on `plane`, owned by `owner`.
    pub(crate) fn load(
        runtime: &Arc<PolicyEngine>,
        plane: Plane,
        source: ModuleSource,
        owner: Owner,
    ) -> Result<Self, PluginError> {
        #[cfg(feature = "native-policies")]
        let native =
            <S::Native as super::native::NativePolicy>::load(&source.name, plane, &source.config);
        Ok(Self {
            module: StageModule::load(
                runtime.clone(),
                plane,
                source.name,
                source.digest,
                &source.component,
                source.config,
                owner,
            )?,
            #[cfg(feature = "native-policies")]
            native,
        })
    }

    /// The module's decision for one request (`request_id` goes with the plugin's log lines).
    pub fn decide(
        &self,
        request_id: Option<&str>,
        input: S::Input<'_>,
    ) -> Result<S::Decision, PluginError> {
        #[cfg(feature = "native-policies")]
        if let Some(native) = &self.native {
            return Ok(S::native(native, &self.module, input));
        }
        S::run(&self.module, request_id, input)
    }

    /// The plane the module was loaded for.
    pub fn plane(&self) -> Plane {
        self.module.plane()
    }

    /// What `configure` returned.
    pub(crate) fn setup(&self) -> &S::Setup {
        self.module.setup()
    }
}

/// What the host reads of a loaded module, whatever its stage.
pub trait AnyModule: Send + Sync + std::fmt::Debug {
    /// The stage.
    fn stage(&self) -> Stage;
    /// The module's name (`builtin`, its path, or a project's module).
    fn module_name(&self) -> &str;
    /// SHA-256 of the module, hex.
    fn digest(&self) -> &str;
    /// Calls, failures and call times since the module was loaded.
    fn report(&self) -> ModuleReport;
    /// The `aura:gateway` version the module was written against.
    fn wit_version(&self) -> &'static str;
    /// Starts a new failure window for the automatic rollback.
    fn reset_health(&self);
    /// Whether the module fails too often in the current window (the automatic rollback's
    /// thresholds, `plugins.rollback_*`).
    fn failing_too_often(&self) -> bool;
    /// The largest linear memory an instance of the module has had, in bytes.
    fn peak_memory(&self) -> usize;
}

impl<S: PolicyStage> AnyModule for Module<S> {
    fn stage(&self) -> Stage {
        S::STAGE
    }
    fn module_name(&self) -> &str {
        self.module.name()
    }
    fn digest(&self) -> &str {
        self.module.digest()
    }
    fn report(&self) -> ModuleReport {
        self.module.report()
    }
    fn wit_version(&self) -> &'static str {
        self.module.wit_version()
    }
    fn reset_health(&self) {
        self.module.reset_health()
    }
    fn failing_too_often(&self) -> bool {
        self.module.failing()
    }
    fn peak_memory(&self) -> usize {
        self.module.peak_memory()
    }
}

/// A plane's modules for stage `S`: the one in force and the operator's candidate, if one is
/// tried.
#[derive(Debug)]
pub struct StageSlot<S: PolicyStage> {
    /// The module in force.
    pub module: Arc<Module<S>>,
    /// The operator's candidate (`<stage>.candidate` in the configuration).
    pub candidate: Option<Arc<Candidate<S>>>,
}

impl<S: PolicyStage> Clone for StageSlot<S> {
    fn clone(&self) -> Self {
        Self {
            module: self.module.clone(),
            candidate: self.candidate.clone(),
        }
    }
}

impl<S: PolicyStage> StageSlot<S> {
    /// The candidate while it is tried (not aborted or dropped).
    pub fn tried(&self) -> Option<&Arc<Candidate<S>>> {
        self.candidate.as_ref().filter(|c| !c.is_dropped())
    }
}

/// What the host reads of an operator's candidate, whatever its stage.
pub trait AnyCandidate: Send + Sync + std::fmt::Debug {
    /// The candidate's module.
    fn module(&self) -> &dyn AnyModule;
    /// How it is tried.
    fn trial(&self) -> Trial;
    /// A shadow's comparison with the enforced decisions.
    fn comparison(&self) -> &Comparison;
    /// Whether it was aborted or dropped.
    fn is_dropped(&self) -> bool;
    /// Stops trying it; false when it already was.
    fn drop_now(&self) -> bool;
}

impl<S: PolicyStage> AnyCandidate for Candidate<S> {
    fn module(&self) -> &dyn AnyModule {
        &*self.module
    }
    fn trial(&self) -> Trial {
        self.trial
    }
    fn comparison(&self) -> &Comparison {
        &self.comparison
    }
    fn is_dropped(&self) -> bool {
        Candidate::is_dropped(self)
    }
    fn drop_now(&self) -> bool {
        Candidate::drop_now(self)
    }
}

/// A plane's slot for one stage, whatever the stage: what the host iterates over (reports,
/// history, conformance, promotion). [`super::PlanePolicies::slot`] gives the typed slot back.
pub trait AnySlot: Send + Sync + std::fmt::Debug {
    /// The typed [`StageSlot`].
    fn as_any(&self) -> &dyn Any;
    /// The stage.
    fn stage(&self) -> Stage;
    /// The module in force.
    fn module(&self) -> &dyn AnyModule;
    /// The operator's candidate, tried or not.
    fn candidate(&self) -> Option<&dyn AnyCandidate>;
    /// The conformance vectors on the module in force, then on the candidate.
    fn conformance(&self) -> Result<Vec<StageReport>, ConformanceError>;
    /// This slot with its candidate (still tried) as the module in force, the candidate slot
    /// emptied; `None` without one.
    fn promoted(&self) -> Option<Arc<dyn AnySlot>>;
}

impl<S: PolicyStage> AnySlot for StageSlot<S> {
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn stage(&self) -> Stage {
        S::STAGE
    }
    fn module(&self) -> &dyn AnyModule {
        &*self.module
    }
    fn candidate(&self) -> Option<&dyn AnyCandidate> {
        self.candidate.as_deref().map(|c| c as &dyn AnyCandidate)
    }
    fn conformance(&self) -> Result<Vec<StageReport>, ConformanceError> {
        let mut reports = vec![S::conformance(&self.module)?];
        if let Some(c) = &self.candidate {
            reports.push(S::conformance(&c.module)?);
        }
        Ok(reports)
    }
    fn promoted(&self) -> Option<Arc<dyn AnySlot>> {
        let candidate = self.tried()?;
        Some(Arc::new(StageSlot::<S> {
            module: candidate.module.clone(),
            candidate: None,
        }))
    }
}

/// Loads `S`'s slot of `plane` from its module (in force) and its candidate's, if any.
pub(crate) fn load_slot<S: PolicyStage>(
    runtime: &Arc<PolicyEngine>,
    plane: Plane,
    module: ModuleSource,
    candidate: Option<(ModuleSource, Trial)>,
) -> Result<Arc<dyn AnySlot>, PluginError> {
    let module = Arc::new(Module::<S>::load(runtime, plane, module, Owner::Operator)?);
    let candidate = match candidate {
        None => None,
        Some((source, trial)) => {
            // Marked a candidate: its failures drop it alone.
            let loaded = Module::<S>::load(runtime, plane, source, Owner::Candidate)?;
            Some(Arc::new(Candidate::new(loaded, trial)))
        }
    };
    Ok(Arc::new(StageSlot { module, candidate }))
}

/// Declares a stage's type as its [`StageWorld`]: the generated types of its bindings module,
/// the request borrowed where it can be.
macro_rules! stage_world {
    ($world:ident, $module:ident, $stage:expr, $decide:literal, $setup:ty, $lt:lifetime, $request:ty, $decision:ty $(, check = $check:path)?) => {
        impl $crate::policy::engine::StageWorld for $world {
            const STAGE: $crate::stage::Stage = $stage;
            const INTERFACE: &'static str = $stage.info().interface;
            const DECIDE: &'static str = $decide;
            type Plane = $crate::policy::stages::$module::world::aura::gateway::types::Plane;
            type Setup = $setup;
            type Request<$lt> = $request;
            type Decision = $decision;

            fn plane(plane: $crate::plane::Plane) -> Self::Plane {
                match plane {
                    $crate::plane::Plane::Data => Self::Plane::Data,
                    $crate::plane::Plane::Management => Self::Plane::Management,
                }
            }

            fn call<'a>(
                decide: &$crate::policy::engine::Decide<Self>,
                store: &mut wasmtime::Store<$crate::policy::engine::PluginState>,
                request: Self::Request<'a>,
            ) -> wasmtime::Result<(Self::Decision,)> {
                // Covariance: the function checked for `'static` inputs takes `'a` ones.
                let decide: &wasmtime::component::TypedFunc<
                    (Self::Request<'a>,),
                    (Self::Decision,),
                > = decide;
                decide.call(store, (request,))
            }

            $(
                fn check_setup(setup: &Self::Setup) -> Result<(), String> {
                    $check(setup)
                }
            )?
        }
    };
}
pub(crate) use stage_world;
