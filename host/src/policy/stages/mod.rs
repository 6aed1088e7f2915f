//! A policy stage as a type.
//!
//! Everything that is one stage's own lives in that stage's file: its WIT world, its input
//! record (borrowed from the request) and the owned copy a call on another thread takes, how a
//! canary picks its subject, how a decision is described for shadow comparisons, its conformance
//! vectors, how an author's test case reads, its default plugin's configuration schema and the
//! native adapter of the benchmarks. The rest of the host is written once over [`PolicyStage`]:
//! a loaded module ([`Module`]), a stage's slot, a plane's or a project's ([`super::slot::Slot`]:
//! the module in force and a candidate) and the one decision algorithm ([`super::registry::PolicyRegistry::decide`]).
//!
//! The table of stages is [`crate::stage::STAGES`]; [`for_stage`] is the one place that maps a
//! row of it to its type.
//!
//! Each stage's `bindgen!` (its module `world`) is used for its types only: the runtime finds a
//! plugin's exports itself ([`StageWorld`]), so that a plugin written against `0.1.0` (the same
//! stage records under another package version) is called through the same types. Errors a
//! guest can see are WIT results; traps stay on the host's side.

pub mod api_key;
pub mod authoring;
pub mod builtin;
pub mod conformance;
pub mod cors;
pub mod db_routing;
#[cfg(feature = "native-policies")]
pub mod native;
pub mod quota;
pub mod vectors;

use std::sync::Arc;

use tokio::time::Instant;
use wasmtime::component::Component;

use self::conformance::{ConformanceError, StageReport};
use super::runtime::decision_cache::{CacheReport, DecisionCache, KeyWriter};
use super::runtime::engine::{Owner, PolicyEngine, StageModule, StageWorld};
use super::runtime::stats::ModuleReport;
use super::{PluginError, Stage};
use crate::plane::Plane;

pub use api_key::{
    ApiKey, Credential, KeyDecision, KeyHeaders, KeyInput, KeyRequest, KeyRole, KeySource,
};
pub use cors::{Cors, CorsAllow, CorsDecision, CorsInput, CorsQuery};
pub use db_routing::{DbEngine, DbInput, DbRoute, DbRouting, ProjectDb, Topology};
pub use quota::{Quota, QuotaDecision, QuotaInput, QuotaRule};

/// Which inputs of a stage's request a module reads: bit `i` is the stage's
/// [`PolicyStage::INPUTS`]`[i]`, as the WIT `flags` of the stage orders them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Inputs(u32);

impl Inputs {
    /// Every input: what a module that declares nothing is passed.
    pub const ALL: Inputs = Inputs(u32::MAX);

    /// The inputs of a WIT `flags` value's bits.
    pub fn from_bits(bits: u32) -> Self {
        Self(bits)
    }

    /// Whether input `bit` is passed.
    pub fn has(self, bit: usize) -> bool {
        self.0 & (1 << bit) != 0
    }

    /// These inputs and `bit`.
    pub fn with(self, bit: usize) -> Self {
        Self(self.0 | (1 << bit))
    }

    /// The names of these inputs, of a stage whose inputs are `names`.
    pub fn names(self, names: &'static [&'static str]) -> Vec<&'static str> {
        (0..names.len())
            .filter(|bit| self.has(*bit))
            .map(|bit| names[bit])
            .collect()
    }
}

/// What a module's `configure` declared of its decisions: the inputs they depend on and how long
/// one holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Declaration {
    pub inputs: Inputs,
    pub max_age: std::time::Duration,
}

impl Declaration {
    /// A stage's WIT declaration: its `flags` value's bits and `max-age-ms`.
    pub fn of(bits: [u32; 1], max_age_ms: u32) -> Self {
        Self {
            inputs: Inputs::from_bits(bits[0]),
            max_age: std::time::Duration::from_millis(u64::from(max_age_ms)),
        }
    }
}

/// A stage's decision as the host hands it to the request: shared, so that a decision kept in
/// the module's cache serves every request with the same declared inputs without a copy of its
/// strings and lists (a hit costs a reference count).
pub type Decided<S> = Arc<<S as StageWorld>::Decision>;

/// One policy stage: its world (the runtime's view, [`StageWorld`], `aura:gateway@0.5.0` back
/// to `0.3.0`), the earlier world of the versions whose request record differs (if any), its
/// legacy world (`0.2.0` and `0.1.0`) and everything the host does with its inputs and
/// decisions.
pub trait PolicyStage: StageWorld<Decision: Clone + PartialEq> + Sized + std::fmt::Debug {
    /// The stage's world in the versions since `0.3.0` that this one does not take because its
    /// request record changed (`Self` when none did): it answers `configure` and decides in this
    /// world's types.
    type Earlier: StageWorld<Setup = <Self as StageWorld>::Setup, Decision = <Self as StageWorld>::Decision>;
    /// The stage's world in the versions before `0.3.0`, whose decisions are lifted into this
    /// one's.
    type Legacy: StageWorld;
    /// What the host keeps of a module's `configure` answer (the header names of `api-key`, …).
    type Configured: Send + Sync + 'static;
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
    type Native: self::native::NativePolicy;
    /// The names of the stage's inputs, in the order of its WIT `flags`.
    const INPUTS: &'static [&'static str];

    /// What the host keeps of a current module's `configure` answer, and its declaration;
    /// an error (an answer out of the host's bounds) refuses the module.
    fn configured(
        setup: &<Self as StageWorld>::Setup,
    ) -> Result<(Self::Configured, Option<Declaration>), String>;
    /// What the host keeps of a legacy module's `configure` answer.
    fn configured_legacy(setup: &<Self::Legacy as StageWorld>::Setup) -> Self::Configured;
    /// The owned copy of `input`.
    fn query(input: Self::Input<'_>) -> Self::Query;
    /// The borrowed view of `query`.
    fn input(query: &Self::Query) -> Self::Input<'_>;
    /// Who a canary decides for: a stable name of the caller (the same caller is always on the
    /// same side of a canary, on every instance).
    fn subject(input: &Self::Input<'_>) -> String;
    /// Starts `key` with the partition of the decision cache a request's decisions are kept in:
    /// its project, or its client's address before a project is known.
    fn partition(input: &Self::Input<'_>, key: &mut KeyWriter);
    /// Writes the inputs `inputs` of `input` into a cache key (`configured`: what the module
    /// reads, as its `configure` answered).
    fn key(
        input: &Self::Input<'_>,
        configured: &Self::Configured,
        inputs: Inputs,
        key: &mut KeyWriter,
    );
    /// The heap bytes a decision holds (its strings and lists), for the cache's bounds.
    fn decision_bytes(decision: &Self::Decision) -> usize;
    /// The request's method and path, for a shadow's sampled disagreements.
    fn request_line<'a>(input: &Self::Input<'a>) -> (&'a str, &'a str);
    /// A decision as text, to compare a shadow's with the enforced one and to show.
    fn describe(decision: &Self::Decision) -> String;
    /// Runs one call of a current `module` on `input`, lowered into the stage's WIT record with
    /// only `inputs` passed (the others empty).
    fn run(
        module: &StageModule<Self>,
        configured: &Self::Configured,
        request_id: Option<&str>,
        input: Self::Input<'_>,
        inputs: Inputs,
    ) -> Result<Self::Decision, PluginError>;
    /// Runs one call of an earlier `module` ([`Self::Earlier`]) on `input`, lowered into that
    /// world's record. A stage whose earlier world is its own runs it as its own.
    fn run_earlier(
        module: &StageModule<Self::Earlier>,
        configured: &Self::Configured,
        request_id: Option<&str>,
        input: Self::Input<'_>,
        inputs: Inputs,
    ) -> Result<Self::Decision, PluginError> {
        match (module as &dyn std::any::Any).downcast_ref::<StageModule<Self>>() {
            Some(module) => Self::run(module, configured, request_id, input, inputs),
            None => Err(PluginError::runtime(format!(
                "the {} stage has no call for its earlier world",
                Self::STAGE
            ))),
        }
    }
    /// Runs one call of a legacy `module` on `input`, its decision lifted into this world's.
    fn run_legacy(
        module: &StageModule<Self::Legacy>,
        configured: &Self::Configured,
        request_id: Option<&str>,
        input: Self::Input<'_>,
    ) -> Result<Self::Decision, PluginError>;
    /// The stage's conformance vectors, run on one module before it is trusted.
    fn conformance(module: &Module<Self>) -> Result<StageReport, ConformanceError>;
    /// Runs an author's test case (`plugin check --vectors`): the case's `input` and `expect`
    /// tables, as documented in [`self::vectors`].
    fn run_case(
        module: &Module<Self>,
        input: &toml::Table,
        expect: &toml::Table,
    ) -> Result<(), String>;
    /// The JSON Schema of the default plugin's `config`.
    fn config_schema() -> serde_json::Value {
        serde_json::to_value(schemars::schema_for!(Self::DefaultConfig)).unwrap_or_default()
    }
    /// The native policy's decision.
    #[cfg(feature = "native-policies")]
    fn native(
        native: &Self::Native,
        configured: &Self::Configured,
        input: Self::Input<'_>,
    ) -> Self::Decision;
}

/// The WIT `method` of a request method, for a stage's generated enum `$ty`.
macro_rules! wit_method {
    ($ty:ty, $method:expr) => {
        match $method {
            "GET" => <$ty>::Get,
            "HEAD" => <$ty>::Head,
            "POST" => <$ty>::Post,
            "PUT" => <$ty>::Put,
            "PATCH" => <$ty>::Patch,
            "DELETE" => <$ty>::Delete,
            "OPTIONS" => <$ty>::Options,
            _ => <$ty>::Other,
        }
    };
}
pub(crate) use wit_method;

/// The index of a request method in the WIT `method` enum (for cache keys).
pub(crate) fn method_index(method: &str) -> u8 {
    ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
        .iter()
        .position(|m| *m == method)
        .unwrap_or(7) as u8
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

/// The JSON Schema the default plugin of stage `S` exports (`config-schema`), as its crate
/// holds it.
#[cfg(test)]
pub(crate) trait ExportedSchema: PolicyStage {
    /// The plugin crate's `schema.json`.
    const EXPORTED: &'static str;
    /// Its path in the source tree.
    const FILE: &'static str;
}

/// `named-value` (a header's or claim's value by the position of its name in what `configure`
/// answered), borrowed.
#[derive(Debug, Clone, Copy, wasmtime::component::ComponentType, wasmtime::component::Lower)]
#[component(record)]
pub struct NamedRef<'a> {
    #[component(name = "name")]
    pub(crate) name: u8,
    #[component(name = "value")]
    pub(crate) value: &'a str,
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

/// Loads `source` through world `W`.
fn load_world<W: StageWorld>(
    runtime: &Arc<PolicyEngine>,
    plane: Plane,
    source: ModuleSource,
    owner: Owner,
) -> Result<StageModule<W>, PluginError> {
    StageModule::<W>::load(
        runtime.clone(),
        plane,
        source.name,
        source.digest,
        &source.component,
        source.config,
        owner,
    )
}

/// What the host reads of a loaded module's runtime side, whatever its world.
trait Loaded: Send + Sync {
    fn plane(&self) -> Plane;
    fn name(&self) -> &str;
    fn digest(&self) -> &str;
    fn config(&self) -> &str;
    fn report(&self) -> ModuleReport;
    fn wit_version(&self) -> &'static str;
    fn reset_health(&self);
    fn failing(&self) -> bool;
    fn peak_memory(&self) -> usize;
    fn schema(&self) -> Option<&str>;
}

impl<W: StageWorld> Loaded for StageModule<W> {
    fn plane(&self) -> Plane {
        StageModule::plane(self)
    }
    fn name(&self) -> &str {
        StageModule::name(self)
    }
    fn digest(&self) -> &str {
        StageModule::digest(self)
    }
    fn config(&self) -> &str {
        StageModule::config(self)
    }
    fn report(&self) -> ModuleReport {
        StageModule::report(self)
    }
    fn wit_version(&self) -> &'static str {
        StageModule::wit_version(self)
    }
    fn reset_health(&self) {
        StageModule::reset_health(self)
    }
    fn failing(&self) -> bool {
        StageModule::failing(self)
    }
    fn peak_memory(&self) -> usize {
        StageModule::peak_memory(self)
    }
    fn schema(&self) -> Option<&str> {
        StageModule::schema(self)
    }
}

/// A module's calls: through the stage's current world, its earlier one, or its legacy one.
enum Calls<S: PolicyStage> {
    Current(StageModule<S>),
    Earlier(StageModule<S::Earlier>),
    Legacy(StageModule<S::Legacy>),
}

/// A loaded module of stage `S`: compiled, exports checked, configuration accepted, its
/// declaration proven by the conformance vectors before it is put in force.
///
/// What a request reads of it comes first, in this order, from the start of a line: the cache's
/// fields, the declared inputs and the configuration the key is written from.
#[repr(C, align(64))]
pub struct Module<S: PolicyStage> {
    /// The module's decisions, when it declared its inputs and a maximum age.
    cache: Option<DecisionCache<Decided<S>>>,
    /// The inputs passed to the module: those it declared, or all of them.
    inputs: Inputs,
    /// Whether `native` decides instead of the module (read on the line of the fields above).
    #[cfg(feature = "native-policies")]
    native_decides: bool,
    configured: S::Configured,
    #[cfg(feature = "native-policies")]
    native: Option<S::Native>,
    calls: Calls<S>,
}

impl<S: PolicyStage> std::fmt::Debug for Module<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.calls {
            Calls::Current(m) => m.fmt(f),
            Calls::Earlier(m) => m.fmt(f),
            Calls::Legacy(m) => m.fmt(f),
        }
    }
}

impl<S: PolicyStage> Module<S> {
    /// Loads `source` as `S`'s module on `plane`, owned by `owner` (`tried`: as a candidate):
    /// through the stage's world that takes the `aura:gateway` version the component exports —
    /// current, earlier or legacy.
    pub(crate) fn load(
        runtime: &Arc<PolicyEngine>,
        plane: Plane,
        source: ModuleSource,
        owner: Owner,
        tried: bool,
    ) -> Result<Self, PluginError> {
        #[cfg(feature = "native-policies")]
        let native =
            <S::Native as self::native::NativePolicy>::load(&source.name, plane, &source.config);
        let version = super::runtime::engine::exported_version::<S>(&source.component);
        let takes = |versions: &[&str]| version.is_some_and(|v| versions.contains(&v));
        let refused = |module: &str, reason: String| PluginError::Load {
            stage: S::STAGE,
            plane,
            module: module.to_owned(),
            kind: super::FailureKind::Refused,
            reason: format!("configure answered {reason}"),
        };
        let (calls, configured, declaration) = if takes(<S as StageWorld>::VERSIONS) {
            let module = load_world::<S>(runtime, plane, source, owner)?;
            let (configured, declaration) =
                S::configured(module.setup()).map_err(|r| refused(module.name(), r))?;
            (Calls::Current(module), configured, declaration)
        } else if takes(<S::Earlier as StageWorld>::VERSIONS) {
            let module = load_world::<S::Earlier>(runtime, plane, source, owner)?;
            let (configured, declaration) =
                S::configured(module.setup()).map_err(|r| refused(module.name(), r))?;
            (Calls::Earlier(module), configured, declaration)
        } else {
            let module = load_world::<S::Legacy>(runtime, plane, source, owner)?;
            let configured = S::configured_legacy(module.setup());
            (Calls::Legacy(module), configured, None)
        };
        let inputs = declaration.map_or(Inputs::ALL, |d| d.inputs);
        let cache = declaration.and_then(|d| {
            DecisionCache::new(
                &runtime.settings().decision_cache,
                runtime.cache_budget(),
                d.inputs.names(S::INPUTS),
                d.max_age,
            )
        });
        if let Some(cache) = &cache {
            // The operator's candidate counted apart from the module in force.
            let owner = match (owner, tried) {
                (Owner::Operator, true) => "candidate",
                (owner, _) => owner.as_str(),
            };
            cache.count_in(|| runtime.cache_metrics(plane, S::STAGE, owner));
        }
        Ok(Self {
            calls,
            configured,
            inputs,
            cache,
            #[cfg(feature = "native-policies")]
            native_decides: native.is_some(),
            #[cfg(feature = "native-policies")]
            native,
        })
    }

    fn loaded(&self) -> &dyn Loaded {
        match &self.calls {
            Calls::Current(m) => m,
            Calls::Earlier(m) => m,
            Calls::Legacy(m) => m,
        }
    }

    /// Calls the module, with `inputs` passed (a legacy module is passed everything).
    fn call(
        &self,
        request_id: Option<&str>,
        input: S::Input<'_>,
        inputs: Inputs,
    ) -> Result<S::Decision, PluginError> {
        match &self.calls {
            Calls::Current(m) => S::run(m, &self.configured, request_id, input, inputs),
            Calls::Earlier(m) => S::run_earlier(m, &self.configured, request_id, input, inputs),
            Calls::Legacy(m) => S::run_legacy(m, &self.configured, request_id, input),
        }
    }

    /// The module's decision for a request arriving now (`request_id` goes with the plugin's
    /// log lines): see [`Self::decide_at`].
    pub fn decide(
        &self,
        request_id: Option<&str>,
        input: S::Input<'_>,
    ) -> Result<Decided<S>, PluginError> {
        self.decide_at(Instant::now(), request_id, input)
    }

    /// The module's decision for one request (`request_id` goes with the plugin's log lines),
    /// which arrived at `at`: the one kept for the request's declared inputs and still young
    /// then, or the module's answer, kept. The request path passes the time its plane received
    /// the request, read once for all its stages: a hit reads no clock.
    pub fn decide_at(
        &self,
        at: Instant,
        request_id: Option<&str>,
        input: S::Input<'_>,
    ) -> Result<Decided<S>, PluginError> {
        #[cfg(feature = "native-policies")]
        if self.native_decides
            && let Some(native) = &self.native
        {
            return Ok(Arc::new(S::native(native, &self.configured, input)));
        }
        match self.cached(&input, at) {
            Ok(decision) => Ok(decision),
            Err(key) => self.decide_and_keep(key, at, request_id, input),
        }
    }

    /// The module's decision, called whether or not one is kept (benchmarks of the call
    /// itself).
    pub fn decide_uncached(
        &self,
        request_id: Option<&str>,
        input: S::Input<'_>,
    ) -> Result<S::Decision, PluginError> {
        self.call(request_id, input, self.inputs)
    }

    /// The decision kept for `input`'s declared inputs, young at `at` (the request's arrival);
    /// else the key to keep the module's answer under (`None`: the module's decisions are not
    /// kept).
    pub fn cached(
        &self,
        input: &S::Input<'_>,
        at: Instant,
    ) -> Result<Decided<S>, Option<KeyWriter>> {
        thread_local! {
            /// The key of a lookup, written in place: a hit allocates nothing for it.
            static SCRATCH: std::cell::RefCell<KeyWriter> = std::cell::RefCell::default();
        }
        let Some(cache) = &self.cache else {
            return Err(None);
        };
        SCRATCH.with_borrow_mut(|key| {
            // The partition first: it names the shard, which says whether to look up at all.
            S::partition(input, key);
            if !cache.looks_up(key) {
                return Err(None);
            }
            S::key(input, &self.configured, self.inputs, key);
            match cache.get(key, at) {
                Some(decision) => Ok(decision),
                None => Err(Some(key.clone())),
            }
        })
    }

    /// Calls the module and keeps its decision under `key` (from [`Self::cached`]) for the
    /// request that arrived at `at`.
    pub fn decide_and_keep(
        &self,
        key: Option<KeyWriter>,
        at: Instant,
        request_id: Option<&str>,
        input: S::Input<'_>,
    ) -> Result<Decided<S>, PluginError> {
        let decision = Arc::new(self.call(request_id, input, self.inputs)?);
        if let (Some(cache), Some(key)) = (&self.cache, key) {
            // The decision's own bytes are on the heap beside its strings and lists.
            let size = S::decision_bytes(&decision) + std::mem::size_of::<S::Decision>();
            cache.put(key, decision.clone(), size, at);
        }
        Ok(decision)
    }

    /// One conformance vector or author's case: the module called (never its cache) with the
    /// inputs it declared and, when it declared some, again with every input. A decision that
    /// differs refuses the module, naming the undeclared input it depends on.
    pub(crate) fn vector(&self, input: S::Input<'_>) -> Result<S::Decision, PluginError> {
        let decision = self.call(None, input, self.inputs)?;
        if self.inputs == Inputs::ALL {
            return Ok(decision);
        }
        let full = self.call(None, input, Inputs::ALL)?;
        if decision == full {
            return Ok(decision);
        }
        let undeclared = (0..S::INPUTS.len()).filter(|bit| !self.inputs.has(*bit));
        let mut named = Vec::new();
        for bit in undeclared {
            if self.call(None, input, self.inputs.with(bit))? != decision {
                named.push(format!("`{}`", S::INPUTS[bit]));
            }
        }
        let named = if named.is_empty() {
            "inputs it did not declare (no single one alone)".to_owned()
        } else {
            named.join(", ")
        };
        Err(PluginError::Call {
            stage: S::STAGE,
            plane: self.plane(),
            module: self.loaded().name().to_owned(),
            kind: super::FailureKind::Refused,
            reason: format!(
                "the module's declared inputs are false: its decision depends on {named} \
                 ({} with the declared inputs, {} with every input)",
                S::describe(&decision),
                S::describe(&full)
            ),
        })
    }

    /// The plane the module was loaded for.
    pub fn plane(&self) -> Plane {
        self.loaded().plane()
    }

    /// What the host kept of `configure`'s answer.
    pub(crate) fn configured(&self) -> &S::Configured {
        &self.configured
    }

    /// The inputs passed to the module (all of them when it declared none).
    pub fn inputs(&self) -> Inputs {
        self.inputs
    }

    /// The decision cache's counts, when the module's decisions are kept.
    pub fn cache_report(&self) -> Option<CacheReport> {
        self.cache.as_ref().map(DecisionCache::report)
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
    /// The configuration it was set up with (JSON).
    fn config(&self) -> &str;
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
    /// The JSON Schema of the module's configuration, when it exports one (`0.3.0` and later).
    fn schema(&self) -> Option<&str>;
    /// The inputs the module declared its decisions depend on; `None` when it declared none
    /// (it is passed every input, on every request).
    fn declared_inputs(&self) -> Option<Vec<&'static str>>;
}

impl<S: PolicyStage> AnyModule for Module<S> {
    fn stage(&self) -> Stage {
        S::STAGE
    }
    fn module_name(&self) -> &str {
        self.loaded().name()
    }
    fn digest(&self) -> &str {
        self.loaded().digest()
    }
    fn config(&self) -> &str {
        self.loaded().config()
    }
    fn report(&self) -> ModuleReport {
        let mut report = self.loaded().report();
        report.cache = self.cache_report();
        report
    }
    fn wit_version(&self) -> &'static str {
        self.loaded().wit_version()
    }
    fn reset_health(&self) {
        self.loaded().reset_health()
    }
    fn failing_too_often(&self) -> bool {
        self.loaded().failing()
    }
    fn peak_memory(&self) -> usize {
        self.loaded().peak_memory()
    }
    fn schema(&self) -> Option<&str> {
        self.loaded().schema()
    }
    fn declared_inputs(&self) -> Option<Vec<&'static str>> {
        (self.inputs != Inputs::ALL).then(|| self.inputs.names(S::INPUTS))
    }
}

/// Declares a stage's type as its [`StageWorld`]: the generated types of its bindings module
/// (`world` for the current version, `legacy` for the ones before), the request borrowed where
/// it can be. `check = f` bounds `configure`'s answer; `earlier = "0.3.0" => T, lift` names an
/// earlier version the world accepts whose `configure` answered `T`, lifted by `lift`.
macro_rules! stage_world {
    (@impl $world:ident, $module:ident, $bindings:ident, $versions:expr, $schema:expr, $stage:expr, $decide:literal, $setup:ty, $lt:lifetime, $request:ty, $decision:ty $(, check = $check:path)? $(, earlier = $earlier:literal => $old:ty, $lift:path)?) => {
        impl $crate::policy::runtime::engine::StageWorld for $world {
            const STAGE: $crate::stage::Stage = $stage;
            const INTERFACE: &'static str = $stage.info().interface;
            const VERSIONS: &'static [&'static str] = $versions;
            const SCHEMA: bool = $schema;
            const DECIDE: &'static str = $decide;
            type Plane = $crate::policy::stages::$module::$bindings::aura::gateway::types::Plane;
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
                decide: &$crate::policy::runtime::engine::Decide<Self>,
                store: &mut wasmtime::Store<$crate::policy::runtime::engine::PluginState>,
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

            $(
                fn configure(
                    instance: &wasmtime::component::Instance,
                    store: &mut wasmtime::Store<$crate::policy::runtime::engine::PluginState>,
                    index: wasmtime::component::ComponentExportIndex,
                    version: &'static str,
                ) -> wasmtime::Result<$crate::policy::runtime::engine::Configure<Self>> {
                    if version == $earlier {
                        $crate::policy::runtime::engine::typed_configure::<Self, $old>(instance, store, index, $lift)
                    } else {
                        $crate::policy::runtime::engine::typed_configure::<Self, Self::Setup>(instance, store, index, |setup| setup)
                    }
                }
            )?
        }
    };
    ($world:ident, $module:ident :: world, $($rest:tt)*) => {
        $crate::policy::stages::stage_world!(@impl $world, $module, world, $crate::policy::runtime::engine::CURRENT_VERSIONS, true, $($rest)*);
    };
    ($world:ident, $module:ident :: legacy, $($rest:tt)*) => {
        $crate::policy::stages::stage_world!(@impl $world, $module, legacy, $crate::policy::runtime::engine::LEGACY_VERSIONS, false, $($rest)*);
    };
}
pub(crate) use stage_world;

#[cfg(test)]
mod tests {
    use super::*;

    /// Checks (or, with `AURA_BLESS=1`, writes) the schema file of `S`'s default plugin against
    /// the one derived from its configuration type.
    fn exported_schema_is_derived<S: ExportedSchema>() {
        let derived = serde_json::to_string_pretty(&S::config_schema()).expect("json") + "\n";
        if std::env::var_os("AURA_BLESS").is_some() {
            std::fs::write(S::FILE, &derived).expect("written");
            return;
        }
        assert_eq!(
            S::EXPORTED,
            derived,
            "{} differs from the plugin's configuration type: run this test with AURA_BLESS=1",
            S::FILE
        );
    }

    #[test]
    fn what_a_lookup_reads_of_a_module_is_on_its_first_line() {
        use std::mem::{align_of, offset_of, size_of};
        assert_eq!(align_of::<Module<ApiKey>>(), 64);
        // The cache's fields and the declared inputs, then the configuration the key is written
        // from: the api-key stage's header names.
        let inputs_end = offset_of!(Module<ApiKey>, inputs) + size_of::<Inputs>();
        assert!(
            offset_of!(Module<ApiKey>, cache) == 0 && inputs_end <= 40,
            "the inputs end at {inputs_end}"
        );
        let names = offset_of!(Module<ApiKey>, configured)
            + offset_of!(api_key::KeyConfigured, names)
            + size_of::<Option<Vec<http::HeaderName>>>();
        assert!(names <= 64, "the header names end at {names}");
        let quota = offset_of!(Module<Quota>, configured);
        assert!(
            quota < 64,
            "the quota stage's configuration starts at {quota}"
        );
    }

    #[test]
    fn a_kept_decision_is_shared_by_the_requests_that_hit_it_never_copied() {
        let config = crate::config::Config::default();
        let runtime = PolicyEngine::new(&config.plugins).expect("engine");
        let policies = crate::policy::Policies::load(&runtime, &config, None).expect("policies");
        let module = policies.data.module::<ApiKey>().expect("api-key stage");
        let headers = |key: &str| vec![("apikey".to_owned(), key.to_owned())];
        let decide = |headers: &[(String, String)]| {
            module
                .decide(
                    None,
                    KeyInput {
                        method: "GET",
                        path: "/v1/storage/object/b/o",
                        query_keys: &[],
                        headers: KeyHeaders::Listed(headers),
                        client: Some("192.0.2.7".parse().expect("address")),
                    },
                )
                .expect("decided")
        };
        let (one, other) = (headers("key-one"), headers("key-two"));
        let first = decide(&one);
        assert!(matches!(&*first, KeyDecision::Present(c) if c.key == "key-one"));
        let hit = decide(&one);
        assert!(Arc::ptr_eq(&first, &hit), "the kept decision itself");
        let another = decide(&other);
        assert!(matches!(&*another, KeyDecision::Present(c) if c.key == "key-two"));
        assert!(!Arc::ptr_eq(&first, &another));
        let report = module
            .cache_report()
            .expect("the default module's decisions are kept");
        assert_eq!((report.hits, report.misses), (1, 2), "{report:?}");
    }

    #[test]
    fn the_default_plugins_export_the_schemas_of_their_configurations() {
        exported_schema_is_derived::<ApiKey>();
        exported_schema_is_derived::<Cors>();
        exported_schema_is_derived::<Quota>();
        exported_schema_is_derived::<DbRouting>();
    }
}
