//! The plugin runtime: two wasmtime engines of the same settings, components compiled once and
//! pre-instantiated, instances run under a memory cap and an epoch deadline, with the `log`
//! import and the locked-down WASI of [`super::sandbox`] and nothing else.
//!
//! The operator's modules run on an engine whose instances live in a pooling allocator sized
//! for them (their reserve); projects' modules on one that makes instances on demand, charged
//! to one memory budget for all projects ([`super::instances`]), so that no count of projects
//! with modules is fixed anywhere and a tenant never takes an operator's instance.
//!
//! Instances are either reused (`pooled`, the default: idle ones kept per module, a project's
//! within the budget) or created for every call (`fresh`). Both were measured (`cargo bench
//! --bench plugins`): a fresh pooled-allocator instance costs tens of microseconds per call
//! (instantiation plus `configure`), a reused instance a few. A kept instance is as isolated
//! as the trust boundary requires: it belongs to one module *and one configuration of one
//! plane* (each project's module its own), serves one call at a time, never sees another
//! plane's or tenant's requests, and is discarded after any failure, so a trap can never leave
//! a half-updated instance in use.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use wasmtime::component::{
    Component, ComponentExportIndex, ComponentType, Instance, InstancePre, Lift, Linker, Lower,
    TypedFunc, WasmStr,
};
use wasmtime::{
    Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, Store, StoreContextMut,
    Trap,
};

use super::epoch::{EpochTicker, IDLE_BEFORE_SLEEP, epoch_tick};
use super::limits::PluginLimiter;
use super::plugin_log::{self, CallLog, FailureLog, Level, LogRate, Source};
pub use super::sandbox::PluginState;
use crate::config::{InstanceReuse, PluginRuntimeConfig};
use crate::plane::Plane;
use crate::policy::{FailureKind, PluginError, Stage};

/// The deadline of setting up an instance of an operator's module, when longer than the call
/// deadline: a language runtime (Python, JavaScript) initialises megabytes of memory when
/// instantiated. A project's module gets [`TENANT_SETUP_FACTOR`] times the call deadline
/// instead: it may be set up again after every failed call, and each setup runs on the
/// project's share of the tenant threads.
pub const SETUP_DEADLINE_MS: u64 = 1_000;

/// A project's module is set up (instantiated and configured) within this many call
/// deadlines.
pub const TENANT_SETUP_FACTOR: u64 = 2;

/// The longest text kept of a module's refusal or of a panic's message, in bytes.
const MAX_REASON_BYTES: usize = 1024;

/// What a compiled module in use is charged beside its image (see [`compiled_weight`]): what
/// the runtime builds for it (types, function tables, its instances' memory image), measured
/// at about 210 KiB for a small Rust component (`bench/tenants`).
pub const COMPILED_OVERHEAD_BYTES: usize = 256 * 1024;

/// `text` cleaned of control characters and cut to [`MAX_REASON_BYTES`]: a module writes it.
fn bounded_reason(text: &str) -> String {
    let mut end = text.len().min(MAX_REASON_BYTES);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let cut = if end < text.len() { "…" } else { "" };
    format!("{}{cut}", plugin_log::clean(&text[..end]))
}

/// Runs `f`, turning a panic of the host inside it (a host function's bug, a runtime without a
/// context) into the call's error: the call fails closed and is counted like a trap, and no
/// panic leaves the call.
fn guarded<T>(f: impl FnOnce() -> wasmtime::Result<T>) -> wasmtime::Result<T> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(result) => result,
        Err(panic) => {
            let (message, _) = crate::telemetry::panic_text(panic.as_ref(), MAX_REASON_BYTES);
            Err(wasmtime::format_err!(
                "the host failed during the call: {message}"
            ))
        }
    }
}

fn deadline_ticks(call_deadline_ms: u64) -> u64 {
    let tick = epoch_tick(call_deadline_ms).as_millis() as u64;
    call_deadline_ms.div_ceil(tick) + 1
}

/// The versions of `aura:gateway` the host accepts, newest first.
pub const WIT_VERSIONS: [&str; 5] = ["0.5.0", "0.4.0", "0.3.0", "0.2.0", "0.1.0"];

/// The versions of `aura:gateway` whose stages declare their inputs and export their
/// configuration's schema.
pub const CURRENT_VERSIONS: &[&str] = &["0.5.0", "0.4.0", "0.3.0"];

/// The versions called through a stage's legacy types (string methods, no declaration).
pub const LEGACY_VERSIONS: &[&str] = &["0.2.0", "0.1.0"];

/// A project's compiled module in use: the modules using it and what it is charged.
#[derive(Debug)]
struct InUse {
    component: Component,
    modules: usize,
    bytes: usize,
}

/// What a compiled module in use is charged against `plugins.tenant_code_budget_bytes`: its
/// compiled image (code and data; mapped from its file, whose pages loading reads, or copied)
/// and [`COMPILED_OVERHEAD_BYTES`].
pub(crate) fn compiled_weight(component: &Component) -> usize {
    let range = component.image_range();
    let image = (range.end as usize).saturating_sub(range.start as usize);
    image.saturating_add(COMPILED_OVERHEAD_BYTES)
}

/// The shared wasmtime engine and the runtime limits of every plugin call.
#[derive(Debug)]
pub struct PolicyEngine {
    /// Operators' modules: instances in the pooling allocator.
    engine: Engine,
    /// Projects' modules: instances made on demand, within `tenant_instances`.
    tenant_engine: Engine,
    tenant_instances: Arc<super::instances::TenantInstances>,
    /// Projects' compiled modules in use, by digest, with the count of loaded modules using
    /// each: a digest's code is in memory once, however many projects and configurations use
    /// it.
    compiled_in_use: Mutex<std::collections::HashMap<String, InUse>>,
    /// The bytes [`compiled_weight`] charges the digests in `compiled_in_use`.
    compiled_bytes: std::sync::atomic::AtomicUsize,
    settings: PluginRuntimeConfig,
    metrics: std::sync::OnceLock<crate::metrics::Metrics>,
    /// Advances the epoch while guest code runs.
    ticker: EpochTicker,
    /// Loaded modules per metric series (plane, stage, digest): a series is removed when the
    /// last module it counts is dropped, so replaced and removed modules leave no series behind.
    series: Mutex<std::collections::HashMap<(Plane, Stage, String), usize>>,
    /// `plugins.compile_cache_dir`, opened.
    compile_cache: Option<super::compile_cache::CompileCache>,
    /// Where projects' compiled modules are kept and mapped from: `compile_cache`, else a
    /// folder of this process's own in the system's temporary folder (made on first use).
    tenant_disk: std::sync::OnceLock<Option<super::compile_cache::CompileCache>>,
    /// The bytes every module's decision cache may keep together.
    cache_budget: Arc<super::cache_budget::CacheBudget>,
}

impl PolicyEngine {
    /// Builds the engine (pooling allocator, epoch interruption) and starts the epoch ticker.
    pub fn new(settings: &PluginRuntimeConfig) -> Result<Arc<Self>, PluginError> {
        let config = engine_config(settings, true);
        let engine = Engine::new(&config)
            .map_err(|e| PluginError::runtime(format!("cannot create the wasm engine: {e}")))?;
        let tenant_engine = Engine::new(&engine_config(settings, false)).map_err(|e| {
            PluginError::runtime(format!("cannot create the projects' wasm engine: {e}"))
        })?;
        let compile_cache = settings
            .compile_cache_dir
            .as_deref()
            .map(|dir| super::compile_cache::CompileCache::open(std::path::Path::new(dir)))
            .transpose()
            .map_err(|e| PluginError::runtime(format!("plugins.compile_cache_dir: {e}")))?;
        let tick = epoch_tick(settings.call_deadline_ms);
        let engines = vec![engine.clone(), tenant_engine.clone()];
        let ticker = EpochTicker::start(engines, tick, IDLE_BEFORE_SLEEP)
            .map_err(|e| PluginError::runtime(format!("cannot start the epoch ticker: {e}")))?;
        Ok(Arc::new(Self {
            engine,
            tenant_engine,
            tenant_instances: super::instances::TenantInstances::new(
                settings.tenant_instance_budget_bytes,
            ),
            compiled_in_use: Mutex::new(std::collections::HashMap::new()),
            compiled_bytes: std::sync::atomic::AtomicUsize::new(0),
            settings: settings.clone(),
            metrics: std::sync::OnceLock::new(),
            ticker,
            series: Mutex::new(std::collections::HashMap::new()),
            compile_cache,
            tenant_disk: std::sync::OnceLock::new(),
            cache_budget: super::cache_budget::CacheBudget::new(&settings.decision_cache),
        }))
    }

    /// Where calls, failures and latencies are counted from now on.
    pub fn set_metrics(&self, metrics: crate::metrics::Metrics) {
        self.cache_budget.count_in(&metrics);
        self.tenant_instances.count_in(&metrics);
        let _ = self.metrics.set(metrics);
    }

    /// The ceiling every module's decision cache shares (`plugins.decision_cache.total_bytes`).
    pub fn cache_budget(&self) -> &Arc<super::cache_budget::CacheBudget> {
        &self.cache_budget
    }

    fn series_acquire(&self, plane: Plane, stage: Stage, digest: &str) {
        if let Ok(mut series) = self.series.lock() {
            *series.entry((plane, stage, digest.to_owned())).or_insert(0) += 1;
        }
    }

    fn series_release(&self, plane: Plane, stage: Stage, digest: &str) {
        let Ok(mut series) = self.series.lock() else {
            return;
        };
        let key = (plane, stage, digest.to_owned());
        let Some(count) = series.get_mut(&key) else {
            return;
        };
        *count -= 1;
        if *count > 0 {
            return;
        }
        series.remove(&key);
        if let Some(m) = self.metrics.get() {
            let _ = m
                .plugin_calls
                .remove_label_values(&[plane.as_str(), stage.key(), digest]);
            for kind in [
                FailureKind::Trap,
                FailureKind::Deadline,
                FailureKind::Memory,
                FailureKind::Refused,
            ] {
                let _ = m.plugin_failures.remove_label_values(&[
                    plane.as_str(),
                    stage.key(),
                    kind.as_str(),
                    digest,
                ]);
            }
        }
    }

    /// The counters of a decision cache of `plane`'s `stage` (`owner`: whose module).
    pub(crate) fn cache_metrics(
        &self,
        plane: Plane,
        stage: Stage,
        owner: &str,
    ) -> Option<super::decision_cache::CacheMetrics> {
        let m = self.metrics.get()?;
        let series = |outcome: &str| {
            m.decision_cache
                .with_label_values(&[plane.as_str(), stage.key(), owner, outcome])
        };
        Some(super::decision_cache::CacheMetrics {
            hits: series("hit"),
            misses: series("miss"),
            evicted: series("evicted"),
            declined: series("declined"),
            publishers: m.publishers.clone(),
        })
    }

    /// Metric series of loaded modules (plane, stage, digest).
    pub fn series_count(&self) -> usize {
        self.series.lock().map(|s| s.len()).unwrap_or(0)
    }

    /// The runtime settings.
    pub fn settings(&self) -> &PluginRuntimeConfig {
        &self.settings
    }

    /// The epoch ticker: every entry into a guest holds [`EpochTicker::running`].
    pub fn ticker(&self) -> &EpochTicker {
        &self.ticker
    }

    /// The wasmtime engine of `owner`'s modules: a component runs only on the engine it was
    /// compiled for.
    pub(crate) fn engine(&self, owner: Owner) -> &Engine {
        match owner {
            Owner::Operator => &self.engine,
            Owner::Tenant => &self.tenant_engine,
        }
    }

    /// The compiled module of `digest` a loaded project's module uses, if one does.
    pub(crate) fn compiled_in_use(&self, digest: &str) -> Option<Component> {
        let in_use = self.compiled_in_use.lock().ok()?;
        in_use.get(digest).map(|held| held.component.clone())
    }

    fn hold_compiled(&self, digest: &str, component: &Component) {
        if let Ok(mut in_use) = self.compiled_in_use.lock() {
            let held = in_use.entry(digest.to_owned()).or_insert_with(|| {
                let bytes = compiled_weight(component);
                self.compiled_bytes
                    .fetch_add(bytes, std::sync::atomic::Ordering::Relaxed);
                InUse {
                    component: component.clone(),
                    modules: 0,
                    bytes,
                }
            });
            held.modules += 1;
        }
    }

    fn release_compiled(&self, digest: &str) {
        if let Ok(mut in_use) = self.compiled_in_use.lock()
            && let Some(held) = in_use.get_mut(digest)
        {
            held.modules -= 1;
            if held.modules == 0 {
                self.compiled_bytes
                    .fetch_sub(held.bytes, std::sync::atomic::Ordering::Relaxed);
                in_use.remove(digest);
            }
        }
    }

    /// The bytes charged to the projects' compiled modules in use ([`compiled_weight`] of each
    /// digest once).
    pub fn compiled_bytes(&self) -> usize {
        self.compiled_bytes
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// What each digest in use is charged, by digest.
    pub(crate) fn compiled_weights(&self) -> std::collections::HashMap<String, usize> {
        self.compiled_in_use
            .lock()
            .map(|in_use| {
                in_use
                    .iter()
                    .map(|(d, held)| (d.clone(), held.bytes))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Where projects' compiled modules are kept, and run from, mapped:
    /// `plugins.compile_cache_dir`, else a folder of this process's own in the system's
    /// temporary folder, removed at exit (none when it cannot be made: they are then kept in
    /// memory only).
    pub(crate) fn tenant_disk(&self) -> Option<&super::compile_cache::CompileCache> {
        self.tenant_disk
            .get_or_init(|| {
                self.compile_cache.clone().or_else(|| {
                    let parent = std::env::temp_dir();
                    super::compile_cache::CompileCache::of_this_process(&parent)
                        .inspect_err(|e| {
                            tracing::warn!(error = %e, "no folder for projects' compiled modules: they stay in memory while loaded, and a project loaded again after it was unloaded may be compiled again");
                        })
                        .ok()
                })
            })
            .as_ref()
    }

    /// The budget of projects' module instances.
    pub fn tenant_instances(&self) -> &Arc<super::instances::TenantInstances> {
        &self.tenant_instances
    }

    /// Compiles a component for `owner`'s engine. Called when a module is loaded, never on the
    /// request path (a project's upload is compiled in a confined worker instead).
    pub fn compile(&self, owner: Owner, bytes: &[u8]) -> Result<Component, String> {
        Component::from_binary(self.engine(owner), bytes)
            .map_err(|e| format!("not a valid component: {e:#}"))
    }

    /// Compiles a module named in the configuration (`digest`: the SHA-256 of `bytes`), or
    /// loads it from `plugins.compile_cache_dir` when it was compiled before.
    pub fn compile_module(&self, digest: &str, bytes: &[u8]) -> Result<Component, String> {
        let compile = |b: &[u8]| self.compile(Owner::Operator, b);
        match &self.compile_cache {
            Some(cache) => cache.get_or_compile(&self.engine, digest, bytes, compile),
            None => compile(bytes),
        }
    }

    /// Ticks until a call's deadline: the deadline in whole ticks, plus the tick in progress
    /// when the call started (so a call is never stopped before its deadline).
    fn deadline_ticks(&self) -> u64 {
        deadline_ticks(self.settings.call_deadline_ms)
    }

    /// Ticks until the deadline of setting up an instance (instantiation and `configure`): for
    /// an operator's module, [`SETUP_DEADLINE_MS`] or the call deadline, whichever is longer; for
    /// a project's, [`TENANT_SETUP_FACTOR`] call deadlines.
    fn setup_deadline_ticks(&self, tenant: bool) -> u64 {
        let call = self.settings.call_deadline_ms;
        let tick = epoch_tick(call).as_millis() as u64;
        let deadline = if tenant {
            TENANT_SETUP_FACTOR * call
        } else {
            SETUP_DEADLINE_MS.max(call)
        };
        deadline.div_ceil(tick) + 1
    }

    fn new_store(&self, owner: Owner) -> Store<PluginState> {
        let tenant = owner == Owner::Tenant;
        let mut store = Store::new(
            self.engine(owner),
            PluginState {
                limiter: PluginLimiter::new(self.settings.memory_limit_bytes),
                log: CallLog::default(),
                sandbox: None,
            },
        );
        store.limiter(|state| &mut state.limiter);
        store.set_epoch_deadline(self.setup_deadline_ticks(tenant));
        store
    }
}

/// The engine configuration of plugin instances. `pooling` is off only in the process that
/// compiles uploaded modules: the instance allocator does not change the compiled code, so its
/// artefacts load in the pooled engine (wasmtime checks the compatibility when loading them).
pub(crate) fn engine_config(settings: &PluginRuntimeConfig, pooling: bool) -> Config {
    let mut config = Config::new();
    // Each memory slot reserves only what a plugin may use (plus a small guard), instead of
    // the default multi-GiB reservation: the pool then needs gigabytes of address space,
    // not terabytes, at the price of explicit bounds checks in plugin code.
    config
        .memory_reservation(settings.memory_limit_bytes as u64)
        .memory_guard_size(64 * 1024)
        .memory_reservation_for_growth(0)
        .wasm_component_model(true)
        .epoch_interruption(true)
        .concurrency_support(false)
        .max_wasm_stack(256 * 1024);
    if pooling {
        let mut pool = PoolingAllocationConfig::default();
        // Room for every stage of both planes with its idle instances, plus calls in flight.
        let slots = (16 * (settings.max_idle_instances + 8)) as u32;
        pool.total_component_instances(slots)
            .total_core_instances(slots * 4)
            .total_memories(slots * 2)
            .total_tables(slots * 2)
            .max_memory_size(settings.memory_limit_bytes)
            .linear_memory_keep_resident(128 * 1024)
            .table_keep_resident(16 * 1024);
        config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    }
    config
}

/// One stage as the runtime sees it: the interface a plugin exports and the types of its
/// functions. A stage has its current world (`0.5.0` to `0.3.0`, or fewer where a record
/// changed: then an earlier world of its own takes the versions before) and its legacy one, whose
/// types (the host's generated `0.2.0` ones) are checked against the plugin's own at
/// instantiation, so a `0.1.0` plugin (the same records) is called through them.
pub trait StageWorld: Send + Sync + 'static {
    /// The stage.
    const STAGE: Stage;
    /// The `aura:gateway` versions called through these types.
    const VERSIONS: &'static [&'static str];
    /// Whether the interface exports `config-schema`.
    const SCHEMA: bool;
    /// The exported interface, without package and version (`cors`).
    const INTERFACE: &'static str;
    /// The per-request function (`decide`, `extract`).
    const DECIDE: &'static str;
    /// The WIT `plane` enum of the stage's bindings.
    type Plane: ComponentType + Lower + Send + Sync + 'static;
    /// What a successful `configure` returns.
    type Setup: ComponentType + Lift + Clone + Send + Sync + 'static;
    /// The per-request input, borrowed from the request where it can be: lowering copies it
    /// into the guest, so the host need not build owned strings first.
    type Request<'a>: ComponentType + Lower + Send + Sync;
    /// The per-request decision.
    type Decision: ComponentType + Lift + Send + Sync + 'static;
    /// The WIT value of a plane.
    fn plane(plane: Plane) -> Self::Plane;
    /// Checks what `configure` returned before the host relies on it: a module's answer is
    /// bounded here, and an answer out of bounds refuses the module.
    fn check_setup(_setup: &Self::Setup) -> Result<(), String> {
        Ok(())
    }
    /// `configure` of `instance` (its export `index`), type-checked for the shape of `version`
    /// (the version the plugin was written against): a world whose `configure` answered
    /// another shape in an earlier version it accepts lifts that answer into [`Self::Setup`].
    fn configure(
        instance: &Instance,
        store: &mut Store<PluginState>,
        index: ComponentExportIndex,
        _version: &'static str,
    ) -> wasmtime::Result<Configure<Self>>
    where
        Self: Sized,
    {
        typed_configure::<Self, Self::Setup>(instance, store, index, |setup| setup)
    }
    /// Calls `decide` (type-checked once for `'static` inputs) with a borrowed input.
    fn call<'a>(
        decide: &Decide<Self>,
        store: &mut Store<PluginState>,
        request: Self::Request<'a>,
    ) -> wasmtime::Result<(Self::Decision,)>;
}

/// Where a component's stage functions are, found once at load.
#[derive(Clone)]
pub(crate) struct Exports {
    /// The `aura:gateway` version the plugin was written against.
    pub(crate) version: &'static str,
    configure: ComponentExportIndex,
    decide: ComponentExportIndex,
    schema: Option<ComponentExportIndex>,
}

/// The `aura:gateway` version of `W`'s interface that `component` exports, if any.
pub(crate) fn exported_version<W: StageWorld>(component: &Component) -> Option<&'static str> {
    WIT_VERSIONS.into_iter().find(|version| {
        let name = format!("aura:gateway/{}@{version}", W::INTERFACE);
        component.get_export_index(None, &name).is_some()
    })
}

impl Exports {
    /// Finds `W`'s interface in `component`, in the versions `W` is called through.
    fn find<W: StageWorld>(component: &Component) -> Result<Self, String> {
        for &version in W::VERSIONS {
            let name = format!("aura:gateway/{}@{version}", W::INTERFACE);
            let Some(interface) = component.get_export_index(None, &name) else {
                continue;
            };
            let function = |f: &str| {
                component
                    .get_export_index(Some(&interface), f)
                    .ok_or_else(|| format!("{name} has no function `{f}`"))
            };
            return Ok(Self {
                version,
                configure: function("configure")?,
                decide: function(W::DECIDE)?,
                schema: if W::SCHEMA {
                    Some(function("config-schema")?)
                } else {
                    None
                },
            });
        }
        Err(format!(
            "no export `aura:gateway/{}` in version {}",
            W::INTERFACE,
            WIT_VERSIONS.join(" or ")
        ))
    }
}

/// A stage's `configure`, type-checked: called once per instance with the plane and the
/// configuration, its answer in the world's [`StageWorld::Setup`].
pub type Configure<W> = Box<
    dyn FnOnce(
            &mut Store<PluginState>,
            <W as StageWorld>::Plane,
            String,
        ) -> wasmtime::Result<Result<<W as StageWorld>::Setup, String>>
        + Send,
>;

/// `configure` of `instance` type-checked as answering `S`, lifted into `W`'s setup by `lift`.
pub(crate) fn typed_configure<W: StageWorld, S: ComponentType + Lift + Send + Sync + 'static>(
    instance: &Instance,
    store: &mut Store<PluginState>,
    index: ComponentExportIndex,
    lift: fn(S) -> W::Setup,
) -> wasmtime::Result<Configure<W>> {
    let function =
        instance.get_typed_func::<(W::Plane, String), (Result<S, String>,)>(&mut *store, index)?;
    Ok(Box::new(move |store, plane, config| {
        let (answer,) = function.call(store, (plane, config))?;
        Ok(answer.map(lift))
    }))
}

/// A stage's `decide`, typed with `'static` inputs. `TypedFunc` is covariant in its
/// parameters, so the same function takes inputs that live only as long as the call.
pub type Decide<W> =
    TypedFunc<(<W as StageWorld>::Request<'static>,), (<W as StageWorld>::Decision,)>;

/// A new instance's decision function and what its `configure` returned, or the refusal
/// `configure` answered.
type Configured<W> = Result<(Decide<W>, <W as StageWorld>::Setup), String>;

/// When an instance is set up: the module's first one (its schema is asked for and the
/// configuration checked against it) or a later one.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Setup {
    First,
    Again,
}

struct Slot<W: StageWorld> {
    store: Store<PluginState>,
    decide: Decide<W>,
    /// A project's instance: its share of the tenant instance budget.
    charge: Option<super::instances::Charge>,
}

impl<W: StageWorld> Slot<W> {
    /// The bytes the instance holds now, as the budget counts them.
    fn bytes(&self) -> usize {
        let limiter = &self.store.data().limiter;
        super::instances::instance_bytes(limiter.memory, limiter.table_elements)
    }
}

/// Instantiates, type-checks the functions, checks the configuration against the module's
/// schema (on its first instance) and runs `configure`. Every step may run the module's code:
/// the caller holds [`EpochTicker::running`] throughout.
fn instantiate<W: StageWorld>(
    pre: &InstancePre<PluginState>,
    exports: &Exports,
    store: &mut Store<PluginState>,
    plane: Plane,
    config: &str,
    setup: Setup,
    schema: &mut Option<String>,
) -> Result<Configured<W>, (FailureKind, String)> {
    let failed = |store: &Store<PluginState>, what: &str, e: wasmtime::Error| {
        (classify(store, &e), format!("{what}: {e:#}"))
    };
    let instance =
        guarded(|| pre.instantiate(&mut *store)).map_err(|e| failed(store, "instantiation", e))?;
    let configure = W::configure(&instance, store, exports.configure, exports.version)
        .map_err(|e| (FailureKind::Refused, format!("configure: {e:#}")))?;
    let decide = instance
        .get_typed_func::<(W::Request<'static>,), (W::Decision,)>(&mut *store, exports.decide)
        .map_err(|e| (FailureKind::Refused, format!("{}: {e:#}", W::DECIDE)))?;
    if let (Setup::First, Some(index)) = (setup, exports.schema) {
        let function = instance
            .get_typed_func::<(), (Option<String>,)>(&mut *store, index)
            .map_err(|e| (FailureKind::Refused, format!("config-schema: {e:#}")))?;
        let (answered,) = guarded(|| function.call(&mut *store, ()))
            .map_err(|e| failed(store, "config-schema", e))?;
        if let Some(text) = answered {
            let checked = super::config_schema::check(&text, config)
                .map_err(|reason| (FailureKind::Refused, bounded_reason(&reason)))?;
            if let Err(reason) = checked {
                return Ok(Err(bounded_reason(&reason)));
            }
            *schema = Some(text);
        }
    }
    match guarded(|| configure(&mut *store, W::plane(plane), config.to_owned())) {
        Ok(Ok(setup)) => Ok(Ok((decide, setup))),
        Ok(Err(reason)) => Ok(Err(bounded_reason(&reason))),
        Err(e) => Err(failed(store, "configure", e)),
    }
}

/// The linker of a plugin: `aura:gateway/log`, the sandbox's WASI, and every other import of
/// `component` defined as a trap.
fn linker(engine: &Engine, component: &Component) -> wasmtime::Result<Linker<PluginState>> {
    let mut linker: Linker<PluginState> = Linker::new(engine);
    for version in ["0.5.0", "0.4.0", "0.3.0", "0.2.0"] {
        add_log(&mut linker, version)?;
    }
    super::sandbox::add_to_linker(&mut linker)?;
    super::sandbox::stub_the_rest(&mut linker, engine, component)?;
    Ok(linker)
}

/// The `level` of `aura:gateway/log` (the same enum in every version that has the interface).
#[derive(ComponentType, Lift, Clone, Copy, Debug)]
#[component(enum)]
#[repr(u8)]
#[allow(dead_code, reason = "made only by lifting a guest's value")]
enum LogLevel {
    #[component(name = "debug")]
    Debug,
    #[component(name = "info")]
    Info,
    #[component(name = "warn")]
    Warn,
    #[component(name = "error")]
    Error,
}

/// `aura:gateway/log` of `version` (the same function in every version that has it).
fn add_log(linker: &mut Linker<PluginState>, version: &str) -> wasmtime::Result<()> {
    linker
        .instance(&format!("aura:gateway/log@{version}"))?
        .func_wrap(
            "log",
            |mut cx: StoreContextMut<'_, PluginState>, (level, message): (LogLevel, WasmStr)| {
                if cx.data().log.is_full() {
                    cx.data_mut().log.push(Level::Info, Source::Log, "");
                    return Ok(());
                }
                let text = plugin_log::clean(&message.to_str(&cx)?);
                let level = match level {
                    LogLevel::Debug => Level::Debug,
                    LogLevel::Info => Level::Info,
                    LogLevel::Warn => Level::Warn,
                    LogLevel::Error => Level::Error,
                };
                cx.data_mut().log.push(level, Source::Log, &text);
                Ok(())
            },
        )?;
    Ok(())
}

/// A loaded module for one stage of one plane: compiled, exports checked, configuration
/// accepted. Calls borrow an instance for their duration.
pub struct StageModule<W: StageWorld> {
    runtime: Arc<PolicyEngine>,
    plane: Plane,
    name: String,
    digest: String,
    config: String,
    pre: InstancePre<PluginState>,
    exports: Exports,
    setup: W::Setup,
    /// The configuration schema the module answered (`0.3.0` and later), checked at load.
    schema: Option<String>,
    /// Idle instances of an operator's module (a project's are kept by the tenant budget).
    idle: Mutex<Vec<Slot<W>>>,
    /// A project's module: its number in the tenant instance budget.
    kept_as: Option<u64>,
    /// The largest linear memory any instance of the module has had, in bytes.
    peak: AtomicUsize,
    log_rate: LogRate,
    /// The budget of the gateway's lines about this module's failed calls.
    failure_log: FailureLog,
    call_metrics: std::sync::OnceLock<(prometheus::IntCounter, prometheus::Histogram)>,
    health: Mutex<Health>,
    /// Whether the failure share of the current window is over the rollback threshold.
    failing: AtomicBool,
    stats: super::stats::CallStats,
    /// Whose module it is: a project's is set up within [`TENANT_SETUP_FACTOR`] call deadlines.
    owner: Owner,
}

pub use crate::stage::Owner;

/// Calls and failures of a module in the current window.
#[derive(Debug)]
struct Health {
    since: Instant,
    calls: u64,
    failures: u64,
}

impl<W: StageWorld> std::fmt::Debug for StageModule<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StageModule")
            .field("stage", &W::STAGE)
            .field("plane", &self.plane)
            .field("name", &self.name)
            .field("digest", &self.digest)
            .finish_non_exhaustive()
    }
}

impl<W: StageWorld> StageModule<W> {
    /// Loads `component` as this stage's module: checks its exports, instantiates it once and
    /// runs `configure`, which may refuse the configuration.
    pub(crate) fn load(
        runtime: Arc<PolicyEngine>,
        plane: Plane,
        name: String,
        digest: String,
        component: &Component,
        config: String,
        owner: Owner,
    ) -> Result<Self, PluginError> {
        let refuse = |kind: FailureKind, reason: String| PluginError::Load {
            stage: W::STAGE,
            plane,
            module: name.clone(),
            kind,
            reason,
        };
        let exports = Exports::find::<W>(component).map_err(|e| {
            refuse(
                FailureKind::Refused,
                format!("does not export the {} stage world: {e}", W::STAGE),
            )
        })?;
        let engine = runtime.engine(owner);
        if !Engine::same(engine, component.engine()) {
            // A host fault: the caller compiled the module for the other owner's engine.
            return Err(refuse(
                FailureKind::Refused,
                format!("compiled for another engine than the {owner:?} modules'"),
            ));
        }
        let pre = linker(engine, component)
            .and_then(|linker| linker.instantiate_pre(component))
            .map_err(|e| refuse(FailureKind::Refused, format!("imports: {e:#}")))?;
        let mut store = runtime.new_store(owner);
        let mut schema = None;
        let running = runtime.ticker.running();
        let configured = instantiate::<W>(
            &pre,
            &exports,
            &mut store,
            plane,
            &config,
            Setup::First,
            &mut schema,
        );
        drop(running);
        let log_rate = LogRate::default();
        write_log::<W>(&mut store, plane, &name, &digest, None, &log_rate, &runtime);
        let (decide, setup) = match configured {
            Ok(Ok(configured)) => configured,
            Ok(Err(reason)) => return Err(refuse(FailureKind::Refused, reason)),
            Err((kind, reason)) => return Err(refuse(kind, reason)),
        };
        W::check_setup(&setup).map_err(|reason| {
            refuse(FailureKind::Refused, format!("configure answered {reason}"))
        })?;
        runtime.series_acquire(plane, W::STAGE, &digest);
        let kept_as = (owner == Owner::Tenant).then(|| {
            runtime.hold_compiled(&digest, component);
            runtime.tenant_instances.module_id()
        });
        let module = Self {
            runtime,
            plane,
            name,
            digest,
            config,
            pre,
            exports,
            setup,
            schema,
            idle: Mutex::new(Vec::new()),
            kept_as,
            peak: AtomicUsize::new(0),
            log_rate,
            failure_log: FailureLog::default(),
            call_metrics: std::sync::OnceLock::new(),
            health: Mutex::new(Health {
                since: Instant::now(),
                calls: 0,
                failures: 0,
            }),
            failing: AtomicBool::new(false),
            stats: super::stats::CallStats::default(),
            owner,
        };
        let slot = module.slot(store, decide);
        module.note_peak(&slot);
        if module.runtime.settings.instance_reuse == InstanceReuse::Pooled {
            module.put_back(slot);
        }
        Ok(module)
    }

    /// The plane the module was loaded for.
    pub fn plane(&self) -> Plane {
        self.plane
    }

    /// The module's name: `builtin` or its file path.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// SHA-256 of the module bytes, hex.
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// The configuration it was set up with (JSON).
    pub fn config(&self) -> &str {
        &self.config
    }

    /// Calls, failures and call times since the module was loaded.
    pub fn report(&self) -> super::stats::ModuleReport {
        self.stats.report(&self.name, &self.digest)
    }

    /// The largest linear memory any instance of this module has had after a call or its
    /// setup, in bytes.
    pub fn peak_memory(&self) -> usize {
        self.peak.load(Ordering::Relaxed)
    }

    /// What `configure` returned.
    pub(crate) fn setup(&self) -> &W::Setup {
        &self.setup
    }

    /// The `aura:gateway` version the module was written against.
    pub fn wit_version(&self) -> &'static str {
        self.exports.version
    }

    /// The JSON Schema of the module's configuration, when it exports one.
    pub fn schema(&self) -> Option<&str> {
        self.schema.as_deref()
    }

    /// An instance of this module, charged to the tenant budget when it is a project's.
    fn slot(&self, store: Store<PluginState>, decide: Decide<W>) -> Slot<W> {
        let mut slot = Slot {
            store,
            decide,
            charge: None,
        };
        if self.kept_as.is_some() {
            slot.charge = Some(self.runtime.tenant_instances.charge(slot.bytes()));
        }
        slot
    }

    fn note_peak(&self, slot: &Slot<W>) {
        let peak = slot.store.data().limiter.peak_memory;
        self.peak.fetch_max(peak, Ordering::Relaxed);
    }

    /// An idle instance of this module, the warmest first.
    fn take(&self) -> Option<Slot<W>> {
        match self.kept_as {
            Some(module) => {
                let idle = self.runtime.tenant_instances.take(module)?;
                idle.downcast::<Slot<W>>().ok().map(|slot| *slot)
            }
            None => self.idle.lock().ok().and_then(|mut idle| idle.pop()),
        }
    }

    fn new_slot(&self, request_id: Option<&str>) -> Result<Slot<W>, PluginError> {
        let mut store = self.runtime.new_store(self.owner);
        let running = self.runtime.ticker.running();
        let configured = instantiate::<W>(
            &self.pre,
            &self.exports,
            &mut store,
            self.plane,
            &self.config,
            Setup::Again,
            &mut None,
        );
        drop(running);
        self.write_log(&mut store, request_id);
        match configured {
            Ok(Ok((decide, _))) => Ok(self.slot(store, decide)),
            Ok(Err(reason)) => Err(self.failure(FailureKind::Refused, reason)),
            Err((kind, reason)) => Err(self.failure(kind, reason)),
        }
    }

    fn write_log(&self, store: &mut Store<PluginState>, request_id: Option<&str>) {
        write_log::<W>(
            store,
            self.plane,
            &self.name,
            &self.digest,
            request_id,
            &self.log_rate,
            &self.runtime,
        );
    }

    /// Keeps an instance whose call succeeded for the next call: an operator's module up to
    /// `plugins.max_idle_instances` of its own; a project's in the tenant budget (the same
    /// number at most), where it may be dropped for a colder one's room.
    fn put_back(&self, mut slot: Slot<W>) {
        let most = self.runtime.settings.max_idle_instances;
        if let Some(module) = self.kept_as {
            let bytes = slot.bytes();
            if let Some(charge) = &mut slot.charge {
                charge.set(bytes);
            }
            let budget = &self.runtime.tenant_instances;
            budget.keep(module, bytes, most, Box::new(slot));
            return;
        }
        if let Ok(mut idle) = self.idle.lock()
            && idle.len() < most
        {
            idle.push(slot);
        }
    }

    /// Starts a new health window (when the module is put in force: the conformance calls made
    /// before do not count).
    pub(crate) fn reset_health(&self) {
        if let Ok(mut health) = self.health.lock() {
            *health = Health {
                since: Instant::now(),
                calls: 0,
                failures: 0,
            };
        }
        self.failing.store(false, Ordering::Release);
    }

    /// Whether the module's failure share in the current window is over
    /// `plugins.rollback_failure_ratio` (with at least `plugins.rollback_min_calls` calls).
    pub(crate) fn failing(&self) -> bool {
        self.failing.load(Ordering::Acquire)
    }

    /// Counts a call outcome. The registry reads [`Self::failing`] when a call fails and acts
    /// by where the module sits (in force, candidate, a project's).
    fn record_outcome(&self, failed: bool) {
        let settings = &self.runtime.settings;
        let Ok(mut health) = self.health.lock() else {
            return;
        };
        if health.since.elapsed() > Duration::from_secs(settings.rollback_window_secs) {
            *health = Health {
                since: Instant::now(),
                calls: 0,
                failures: 0,
            };
        }
        health.calls += 1;
        health.failures += u64::from(failed);
        let over = health.calls >= settings.rollback_min_calls
            && health.failures as f64 / health.calls as f64 > settings.rollback_failure_ratio;
        self.failing.store(over, Ordering::Release);
    }

    /// This module's call counter and latency histogram, looked up once (a labelled lookup
    /// hashes every label on each use).
    fn call_metrics(&self) -> Option<&(prometheus::IntCounter, prometheus::Histogram)> {
        if let Some(handles) = self.call_metrics.get() {
            return Some(handles);
        }
        let m = self.runtime.metrics.get()?;
        let (plane, stage) = (self.plane.as_str(), W::STAGE.key());
        Some(self.call_metrics.get_or_init(|| {
            (
                m.plugin_calls
                    .with_label_values(&[plane, stage, &self.digest]),
                m.plugin_latency.with_label_values(&[plane, stage]),
            )
        }))
    }

    fn count_failure(&self, kind: FailureKind) {
        if let Some(m) = self.runtime.metrics.get() {
            m.plugin_failures
                .with_label_values(&[
                    self.plane.as_str(),
                    W::STAGE.key(),
                    kind.as_str(),
                    &self.digest,
                ])
                .inc();
        }
    }

    /// Logs a failed call within the module's budget of failure lines; one left out is counted.
    fn log_failure(&self, error: &PluginError) {
        match self.failure_log.admit(Instant::now()) {
            Some(left_out) => error.log(left_out),
            None => {
                if let Some(m) = self.runtime.metrics.get() {
                    m.plugin_log_dropped
                        .with_label_values(&[self.plane.as_str(), W::STAGE.key(), "failures"])
                        .inc();
                }
            }
        }
    }

    fn failure(&self, kind: FailureKind, reason: String) -> PluginError {
        PluginError::Call {
            stage: W::STAGE,
            plane: self.plane,
            module: self.name.clone(),
            kind,
            reason,
        }
    }

    /// Runs one call on an instance of this module, under the memory cap and deadline, and
    /// writes what the plugin logged with `request_id`.
    ///
    /// On any failure the instance is dropped, the failure is logged with plugin and stage,
    /// and the caller gets a [`PluginError`] to answer with (fail closed).
    pub(crate) fn call(
        &self,
        request_id: Option<&str>,
        request: W::Request<'_>,
    ) -> Result<W::Decision, PluginError> {
        let pooled = self.runtime.settings.instance_reuse == InstanceReuse::Pooled;
        let reused = if pooled { self.take() } else { None };
        let mut slot = match reused {
            Some(slot) => slot,
            None => self.new_slot(request_id).inspect_err(|e| {
                self.log_failure(e);
                if let Some(kind) = e.kind() {
                    self.count_failure(kind);
                }
            })?,
        };
        slot.store.data_mut().limiter.memory_exceeded = false;
        slot.store.set_epoch_deadline(self.runtime.deadline_ticks());
        let running = self.runtime.ticker.running();
        let started = Instant::now();
        let result = guarded(|| W::call(&slot.decide, &mut slot.store, request));
        let took = started.elapsed();
        drop(running);
        self.note_peak(&slot);
        if let Some((calls, latency)) = self.call_metrics() {
            calls.inc();
            latency.observe(took.as_secs_f64());
        }
        self.stats.record(
            took,
            result.as_ref().err().map(|e| classify(&slot.store, e)),
        );
        self.record_outcome(result.is_err());
        self.write_log(&mut slot.store, request_id);
        match result {
            Ok((decision,)) => {
                if pooled {
                    self.put_back(slot);
                }
                Ok(decision)
            }
            Err(e) => {
                let kind = classify(&slot.store, &e);
                let error = self.failure(
                    kind,
                    format!("{e:#} (after {} µs)", started.elapsed().as_micros()),
                );
                self.log_failure(&error);
                self.count_failure(kind);
                Err(error)
            }
        }
    }
}

/// Writes what an instance logged (its `log` lines and captured output) since the last time.
fn write_log<W: StageWorld>(
    store: &mut Store<PluginState>,
    plane: Plane,
    module: &str,
    digest: &str,
    request_id: Option<&str>,
    rate: &LogRate,
    runtime: &PolicyEngine,
) {
    let state = store.data_mut();
    if let Some(sandbox) = &state.sandbox {
        let output = sandbox.take_output();
        state
            .log
            .push_output(Source::Stdout, &output.stdout, output.dropped);
        state.log.push_output(Source::Stderr, &output.stderr, 0);
    }
    if state.log.is_empty() {
        return;
    }
    plugin_log::write(
        &mut state.log,
        plugin_log::Writer {
            plane,
            stage: W::STAGE,
            module,
            digest,
            request_id,
        },
        rate,
        runtime.metrics.get(),
    );
}

impl<W: StageWorld> Drop for StageModule<W> {
    fn drop(&mut self) {
        if let Some(module) = self.kept_as {
            self.runtime.tenant_instances.forget(module);
            self.runtime.release_compiled(&self.digest);
        }
        self.runtime
            .series_release(self.plane, W::STAGE, &self.digest);
    }
}

/// Tells a deadline overrun and a memory excess from other traps.
fn classify(store: &Store<PluginState>, error: &wasmtime::Error) -> FailureKind {
    if store.data().limiter.memory_exceeded {
        FailureKind::Memory
    } else if matches!(error.downcast_ref::<Trap>(), Some(Trap::Interrupt)) {
        FailureKind::Deadline
    } else {
        FailureKind::Trap
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_inside_a_call_is_its_error_and_reasons_are_bounded() {
        let e = guarded::<()>(|| panic!("no reactor running\n{}", "x".repeat(5000)))
            .expect_err("failed");
        let text = e.to_string();
        assert!(
            text.starts_with("the host failed during the call: no reactor running"),
            "{text}"
        );
        assert!(text.len() < MAX_REASON_BYTES + 100, "{} bytes", text.len());
        assert!(!text.contains('\n'), "control characters cleaned: {text:?}");
        assert_eq!(guarded(|| Ok(7)).expect("ran"), 7);
        assert_eq!(
            bounded_reason("é".repeat(600).as_str()).chars().count(),
            513
        );
    }

    #[test]
    fn a_projects_module_is_set_up_within_twice_the_call_deadline() {
        let settings = PluginRuntimeConfig {
            call_deadline_ms: 20,
            ..PluginRuntimeConfig::default()
        };
        let engine = PolicyEngine::new(&settings).expect("engine");
        // Ticks of 5 ms: 40 ms for a project's module, 1 s for the operator's.
        assert_eq!(engine.setup_deadline_ticks(true), 9);
        assert_eq!(engine.setup_deadline_ticks(false), 201);
    }

    #[test]
    fn a_call_is_stopped_between_its_deadline_and_one_tick_later() {
        for deadline in 1..=10_000u64 {
            let tick = epoch_tick(deadline).as_millis() as u64;
            assert!((1..=10).contains(&tick), "tick {tick} ms for {deadline} ms");
            assert!(tick <= deadline.max(4) / 4 || tick == 1);
            // The call starts somewhere within a tick: it runs at least (ticks - 1) whole ticks
            // and at most `ticks` ticks.
            let ticks = deadline_ticks(deadline);
            let shortest = (ticks - 1) * tick;
            let longest = ticks * tick;
            assert!(
                shortest >= deadline,
                "{deadline} ms stopped after {shortest} ms"
            );
            assert!(
                longest <= deadline + 2 * tick,
                "{deadline} ms stopped as late as {longest} ms"
            );
        }
        assert_eq!(epoch_tick(20), Duration::from_millis(5));
        assert_eq!(deadline_ticks(20), 5);
    }
}
