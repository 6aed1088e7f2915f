//! Modules installed by projects (tenants) for the stages that allow it — the data plane's
//! `cors` and `quota`.
//!
//! A tenant module is untrusted code and every step around it is bounded by the host:
//! - **upload**: at most `plugins.tenant_max_concurrent_uploads` at once per instance; size
//!   checked; compiled in a separate, resource-limited process ([`super::runtime::compile`]); then
//!   exports, `configure` and the conformance vectors; stored content-addressed;
//! - **calls**: on the tenant thread pool under the project's concurrency cap
//!   ([`super::runtime::isolation`]), never on the request workers; same memory and time limits as every
//!   module;
//! - **loading follows traffic**: every `plugins.tenant_refresh_secs` (and when a change event
//!   asks) each instance lists the stored modules of every project — records only, nothing is
//!   loaded — and a project's modules are loaded on its first request on this instance (one load
//!   per project at a time; its requests wait for it). A project loaded here is kept in line by
//!   the refreshes, which load only the records that changed. A start with ten thousand stored
//!   project modules is ready once they are listed;
//! - **refusals**: a module refused when loaded is remembered (by digest, stage and
//!   configuration) and not loaded again for `plugins.tenant_refused_retry_secs` (the project
//!   then uses the plane's module for that stage); a module that cannot be loaded now (the store
//!   or the compiler unavailable) fails its project's requests closed (`503 policy_busy`);
//! - **order**: a `PUT` or `DELETE` made on this instance while a refresh or a first load runs
//!   is never reverted by it (changes are sequenced, and a refresh or a load only decides for the
//!   modules nobody changed since the listing it loads from was made).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use wasmtime::component::Component;

use super::rollout::{Compared, Comparison, ShadowMetrics, Trial, failure_kind};
use super::runtime::compile::{CompileError, CompileReport, Compiler};
use super::runtime::isolation::{Busy, Gate, TenantPool};
use super::slot::{AnySlot, Candidate, Slot, StageCall};
use super::stages::conformance::StageReport;
use super::stages::{Decided, Module, ModuleSource, PolicyStage, StageFn, for_stage};
use super::{Owner, PluginError, PolicyEngine, Stage};
use crate::config::PluginRuntimeConfig;
use crate::control::ControlStore;
use crate::metrics::Metrics;
use crate::plane::Plane;
use crate::stage::STAGES;

/// The clock of the projects' last calls: a call stamps the tick now on its project
/// ([`TenantPolicies::tick`] advances it).
pub const TICK: Duration = Duration::from_millis(100);

/// Ticks between two idle sweeps ([`Sweep::Idle`]).
pub const IDLE_SWEEP_TICKS: u64 = 10;

/// Why [`TenantPolicies::sweep`] runs, and so which projects it may unload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sweep {
    /// Every [`IDLE_SWEEP_TICKS`] ticks: projects not called for a second or more, down to the
    /// budget.
    Idle,
    /// A load took the charge over the budget: projects not called for a tick or more, down
    /// to 31/32 of the budget: the next loads do not each ask for a sweep, and a sweep unloads
    /// a few digests at a time (each unload costs CPU beside the requests).
    Pressure,
}

impl Sweep {
    /// Ticks without a call after which a project may be unloaded.
    fn idle_ticks(self) -> u64 {
        match self {
            Sweep::Idle => IDLE_SWEEP_TICKS,
            Sweep::Pressure => 1,
        }
    }

    /// The charge this sweep brings the code down to.
    fn target(self, budget: usize) -> usize {
        match self {
            Sweep::Idle => budget,
            Sweep::Pressure => budget - budget / 32,
        }
    }

    /// The `reason` label of `aura_tenant_projects_unloaded_total`.
    pub fn label(self) -> &'static str {
        match self {
            Sweep::Idle => "idle",
            Sweep::Pressure => "pressure",
        }
    }
}

/// A project whose last module call ran for this share of the call deadline or more is heavy:
/// its calls run on threads of their own, with the CPU nobody else wants
/// ([`super::runtime::isolation`]).
const HEAVY_SHARE: u32 = 4;

/// A checked module of any stage, ready to put in force: a project's slot with only a module
/// in force ([`AnySlot::tried_as`] makes it a candidate).
pub type Checked = Arc<dyn AnySlot>;

/// Which module of a project's stage: the one in force, or the candidate on trial.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    Enforced,
    Candidate,
}

/// The name of a project's module in logs and reports: this prefix and the project ref (the
/// module's owner is given at load, [`Owner::Tenant`], never read from its name).
pub const TENANT_MODULE_PREFIX: &str = "tenant:";

/// Why a module was not put in force.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PrepareError {
    /// Over `plugins.tenant_max_module_bytes`.
    #[error("the module is {size} bytes; at most {max} are accepted")]
    TooLarge { size: usize, max: usize },
    /// A configuration over `plugins.max_config_bytes`.
    #[error(
        "the stage configuration is {size} bytes as JSON; at most {max} are accepted (plugins.max_config_bytes)"
    )]
    ConfigTooLarge { size: usize, max: usize },
    /// The module's fault: invalid, too costly to compile, wrong exports, refused configuration,
    /// failed conformance vectors.
    #[error("{0}")]
    Refused(String),
    /// The gateway could not check it now (compile worker failure).
    #[error("{0}")]
    Unavailable(String),
}

impl From<CompileError> for PrepareError {
    fn from(e: CompileError) -> Self {
        if e.is_the_modules() {
            PrepareError::Refused(e.to_string())
        } else {
            PrepareError::Unavailable(e.to_string())
        }
    }
}

/// A module checked and ready to put in force, with what checking it cost.
#[derive(Debug)]
pub struct Prepared {
    /// SHA-256 of the module, hex.
    pub digest: String,
    pub installed: Checked,
    pub report: StageReport,
    pub compile: CompileReport,
}

/// Loads a compiled component for `stage` of `project` and runs the stage's conformance
/// vectors; the module is not put in force.
pub fn prepare_compiled(
    runtime: &Arc<PolicyEngine>,
    project: &str,
    stage: Stage,
    digest: String,
    component: Component,
    config: &str,
) -> Result<(Checked, StageReport), String> {
    struct Prepare<'a> {
        runtime: &'a Arc<PolicyEngine>,
        source: ModuleSource,
    }
    impl StageFn for Prepare<'_> {
        type Out = Result<(Checked, StageReport), String>;
        fn call<S: PolicyStage>(self) -> Self::Out {
            if !S::STAGE.info().tenant {
                return Err(format!(
                    "projects cannot install a module for the {} stage",
                    S::STAGE
                ));
            }
            let module =
                Module::<S>::load(self.runtime, Plane::Data, self.source, Owner::Tenant, false)
                    .map_err(|e| e.to_string())?;
            let report = S::conformance(&module).map_err(|e| e.to_string())?;
            // The failure window starts after the checks: a canary is judged on live calls only.
            super::AnyModule::reset_health(&module);
            let installed: Checked = Arc::new(Slot::<S> {
                module: Some(Arc::new(module)),
                candidate: None,
            });
            Ok((installed, report))
        }
    }
    let source = ModuleSource {
        name: format!("{TENANT_MODULE_PREFIX}{project}"),
        digest,
        component,
        config: config.to_owned(),
    };
    for_stage(stage, Prepare { runtime, source })
}

/// A module call that did not give a decision.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The module failed; the request fails closed.
    #[error(transparent)]
    Plugin(#[from] PluginError),
    /// The project's modules are saturated; the request fails closed (`503`).
    #[error(transparent)]
    Busy(#[from] Busy),
}

/// Why an upload found no place.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum UploadsBusy {
    /// The organization has its share of uploads in progress.
    #[error("this organization already has its share of module uploads in progress; retry shortly")]
    Organization,
    /// Every place of the instance is taken.
    #[error("too many module uploads are in progress; retry shortly")]
    Instance,
}

impl UploadsBusy {
    /// Label value of `aura_tenant_uploads_busy_total`.
    pub fn label(self) -> &'static str {
        match self {
            UploadsBusy::Organization => "organization",
            UploadsBusy::Instance => "instance",
        }
    }
}

/// One upload's place, given back when dropped.
#[derive(Debug)]
pub struct UploadPermit {
    _place: OwnedSemaphorePermit,
    organization: uuid::Uuid,
    by_org: Arc<Mutex<HashMap<uuid::Uuid, usize>>>,
}

impl Drop for UploadPermit {
    fn drop(&mut self) {
        let mut by_org = self.by_org.lock().unwrap_or_else(|p| p.into_inner());
        match by_org.get_mut(&self.organization) {
            Some(n) if *n > 1 => *n -= 1,
            _ => {
                by_org.remove(&self.organization);
            }
        }
    }
}

/// A project's slot for a stage, as stored: erased, the stage's type given back by [`typed`].
type Shared = Arc<dyn AnySlot>;

/// `slot` as stage `S`'s (`None` if it is another stage's).
fn typed<S: PolicyStage>(slot: &Shared) -> Option<Arc<Slot<S>>> {
    slot.clone().into_any().downcast::<Slot<S>>().ok()
}

/// One project's modules and its concurrency gate, in [`Stage::index`] order: each stage's
/// module in force and candidate as changed and refreshed (`parts`, each a slot holding one of
/// the two), and the slot they make together, which decides.
#[derive(Debug)]
struct ProjectModules {
    parts: [[Option<Shared>; 2]; STAGES.len()],
    slots: [Option<Shared>; STAGES.len()],
    gate: Gate,
    /// The tick of the project's last call here ([`TICK`]; [`TenantPolicies::sweep`]).
    used: AtomicU64,
}

impl Role {
    fn index(self) -> usize {
        match self {
            Role::Enforced => 0,
            Role::Candidate => 1,
        }
    }
}

impl ProjectModules {
    fn get(&self, stage: Stage, role: Role) -> Option<&Shared> {
        self.parts[stage.index()][role.index()].as_ref()
    }

    fn set(&mut self, stage: Stage, role: Role, part: Option<Shared>) {
        self.parts[stage.index()][role.index()] = part;
    }

    fn is_empty(&self) -> bool {
        self.parts.iter().flatten().all(Option::is_none)
    }

    /// Makes each stage's slot of its two parts.
    fn join(&mut self) {
        for (slot, [enforced, candidate]) in self.slots.iter_mut().zip(&self.parts) {
            *slot = match (enforced, candidate) {
                (Some(e), Some(c)) => Some(e.with_candidate_of(&**c)),
                (part, None) | (None, part) => part.clone(),
            };
        }
    }

    /// Stamps the tick now as the project's last use (a load and a store of one word when the
    /// tick changed, a load otherwise).
    fn touch(&self, clock: &AtomicU64) {
        let now = clock.load(Ordering::Relaxed);
        if self.used.load(Ordering::Relaxed) != now {
            self.used.store(now, Ordering::Relaxed);
        }
    }

    /// Whether these are the modules `listed` lists, each with its configuration and trial.
    fn as_listed(&self, listed: &[Stored]) -> bool {
        let here: Vec<_> = self.all().collect();
        here.len() == listed.len()
            && here.iter().all(|(stage, role, part)| {
                let from = loaded_from(&***part);
                listed.iter().any(|s| {
                    s.stage == *stage
                        && s.role == *role
                        && from == Some((s.digest.as_str(), s.config.as_str(), s.trial))
                })
            })
    }

    /// The digests of the project's modules, in force and on trial.
    fn digests(&self) -> impl Iterator<Item = &str> {
        self.parts.iter().flatten().flatten().filter_map(|part| {
            part.module()
                .or_else(|| part.candidate().map(|(module, _)| module))
                .map(|m| m.digest())
        })
    }

    fn all(&self) -> impl Iterator<Item = (Stage, Role, &Shared)> {
        Stage::ALL.into_iter().flat_map(move |stage| {
            [Role::Enforced, Role::Candidate]
                .into_iter()
                .filter_map(move |role| Some((stage, role, self.get(stage, role)?)))
        })
    }
}

/// What a part was loaded from: digest, configuration and trial (`None`: in force).
fn loaded_from(part: &dyn AnySlot) -> Option<(&str, &str, Option<Trial>)> {
    match (part.module(), part.candidate()) {
        (Some(m), None) => Some((m.digest(), m.config(), None)),
        (None, Some((m, trying))) => Some((m.digest(), m.config(), Some(trying.trial))),
        _ => None,
    }
}

type Key = (String, Stage, Role);

/// One stored module of a project, as the control store lists it.
#[derive(Debug, Clone, PartialEq)]
struct Stored {
    stage: Stage,
    role: Role,
    digest: String,
    config: String,
    trial: Option<Trial>,
}

/// A project's stored modules, and whether they are loaded on this instance.
#[derive(Debug)]
struct StoredProject {
    modules: Vec<Stored>,
    /// Loaded here (on its first request, or kept by the refreshes since).
    loaded: std::sync::atomic::AtomicBool,
}

impl StoredProject {
    fn loaded(&self) -> bool {
        self.loaded.load(std::sync::atomic::Ordering::Acquire)
    }
}

/// The stored modules of every project, as the last refresh listed them.
#[derive(Debug, Default)]
struct Listing {
    /// The change sequence number when the listing was asked for: a change made here after it
    /// is newer than what it says.
    seq: u64,
    projects: HashMap<String, Arc<StoredProject>>,
}

/// Why a module was loaded, for `aura_tenant_module_loads_total`.
#[derive(Debug, Clone, Copy)]
enum LoadReason {
    FirstCall,
    Changed,
}

impl LoadReason {
    fn label(self) -> &'static str {
        match self {
            LoadReason::FirstCall => "first_call",
            LoadReason::Changed => "changed",
        }
    }
}

/// Changes made on this instance, in order.
#[derive(Debug, Default)]
struct Changes {
    seq: u64,
    /// The last change of each module, by sequence number; dropped once a refresh started after
    /// it has applied.
    touched: HashMap<Key, u64>,
    /// Projects unloaded ([`TenantPolicies::sweep`]), by sequence number; dropped like
    /// `touched`. A refresh that started before does not bring their modules back (a first
    /// load does).
    unloaded: HashMap<String, u64>,
}

impl Changes {
    /// Whether `project` was unloaded after `seq` and is not loaded again in `map`.
    fn unloaded_since(
        &self,
        project: &str,
        seq: u64,
        map: &HashMap<String, Arc<ProjectModules>>,
    ) -> bool {
        self.unloaded.get(project).is_some_and(|at| *at > seq) && !map.contains_key(project)
    }
}

/// The tenant modules in force, by project and stage.
#[derive(Debug)]
pub struct TenantPolicies {
    /// The modules loaded, by project.
    map: ArcSwap<HashMap<String, Arc<ProjectModules>>>,
    /// The modules stored, by project: what a project's first request loads.
    listing: ArcSwap<Listing>,
    /// First loads in progress, one per project.
    loading: Mutex<HashMap<String, Arc<tokio::sync::OnceCell<()>>>>,
    changes: Mutex<Changes>,
    /// Serialises the store write and the local change of a `PUT` or `DELETE`.
    writes: tokio::sync::Mutex<()>,
    /// Serialises refreshes.
    refreshing: tokio::sync::Mutex<()>,
    runtime: Arc<PolicyEngine>,
    /// Compiles uploaded modules.
    pub compiler: Compiler,
    pool: TenantPool,
    uploads: Arc<Semaphore>,
    /// Uploads in progress per organization, each at most `uploads_per_org`.
    uploads_by_org: Arc<Mutex<HashMap<uuid::Uuid, usize>>>,
    uploads_per_org: usize,
    max_module_bytes: usize,
    /// `plugins.max_config_bytes`.
    max_config_bytes: usize,
    /// Load refusals by digest, stage and configuration.
    refused: moka::sync::Cache<String, String>,
    /// The tick now ([`TICK`]), stamped on a project's modules by its calls.
    clock: AtomicU64,
    /// `plugins.tenant_code_budget_bytes`.
    code_budget: usize,
    /// Told when a load took the code over the budget ([`Sweep::Pressure`]).
    pressure: Arc<tokio::sync::Notify>,
    metrics: Metrics,
    /// The shadows' metric series.
    pub shadow_metrics: Arc<ShadowMetrics>,
}

fn refusal_key(digest: &str, stage: Stage, config: &str) -> String {
    format!("{digest}/{stage}/{}", super::digest_of(config.as_bytes()))
}

impl TenantPolicies {
    /// Tenant modules run by `runtime` with the limits of `settings`.
    pub fn new(
        runtime: Arc<PolicyEngine>,
        settings: &PluginRuntimeConfig,
        metrics: Metrics,
    ) -> Self {
        Self {
            map: ArcSwap::from_pointee(HashMap::new()),
            listing: ArcSwap::from_pointee(Listing::default()),
            loading: Mutex::new(HashMap::new()),
            changes: Mutex::new(Changes::default()),
            writes: tokio::sync::Mutex::new(()),
            refreshing: tokio::sync::Mutex::new(()),
            compiler: Compiler::new(runtime.clone(), settings, metrics.clone()),
            runtime,
            pool: TenantPool::new(
                settings.tenant_threads,
                settings.tenant_max_concurrent_calls,
                Duration::from_millis(settings.tenant_queue_timeout_ms),
            )
            .heavy_after(Duration::from_millis(settings.call_deadline_ms) / HEAVY_SHARE)
            .heavy_cpu_share(settings.tenant_heavy_cpu_share),
            uploads: Arc::new(Semaphore::new(settings.tenant_max_concurrent_uploads)),
            uploads_by_org: Arc::new(Mutex::new(HashMap::new())),
            uploads_per_org: settings.tenant_max_concurrent_uploads_per_org.max(1),
            max_module_bytes: settings.tenant_max_module_bytes,
            max_config_bytes: settings.max_config_bytes,
            refused: moka::sync::Cache::builder()
                .max_capacity(10_000)
                .time_to_live(Duration::from_secs(settings.tenant_refused_retry_secs))
                .build(),
            clock: AtomicU64::new(0),
            pressure: Arc::new(tokio::sync::Notify::new()),
            code_budget: {
                metrics
                    .tenant_code_budget_bytes
                    .set(settings.tenant_code_budget_bytes as i64);
                settings.tenant_code_budget_bytes
            },
            shadow_metrics: ShadowMetrics::new(metrics.clone()),
            metrics,
        }
    }

    /// `project`'s slot for `stage` (its module in force, its candidate, or both), if it
    /// installed any.
    pub fn slot(&self, project: &str, stage: Stage) -> Option<Shared> {
        let map = self.map.load();
        if map.is_empty() {
            return None;
        }
        map.get(project)?.slots[stage.index()].clone()
    }

    /// `project`'s slot for stage `S`, with the project's gate.
    pub fn slot_for<S: PolicyStage>(&self, project: &str) -> Option<(Arc<Slot<S>>, Gate)> {
        let map = self.map.load();
        if map.is_empty() {
            return None;
        }
        let modules = map.get(project)?;
        modules.touch(&self.clock);
        Some((
            typed::<S>(modules.slots[S::STAGE.index()].as_ref()?)?,
            modules.gate.clone(),
        ))
    }

    /// Digests of every module loaded, in force or on trial.
    pub fn digests(&self) -> HashSet<String> {
        self.map
            .load()
            .values()
            .flat_map(|m| {
                m.all()
                    .filter_map(|(_, _, part)| Some(loaded_from(&**part)?.0.to_owned()))
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    fn shed(&self, stage: Stage, busy: Busy) -> CallError {
        self.metrics
            .tenant_calls_shed
            .with_label_values(&[stage.key()])
            .inc();
        CallError::Busy(busy)
    }

    /// Runs `module` for one request (`call`) on the tenant pool under `gate`: the input is
    /// copied (owned) for the call on another thread.
    pub async fn run<S: PolicyStage>(
        &self,
        module: &Arc<Module<S>>,
        gate: &Gate,
        call: &StageCall<'_>,
        input: S::Input<'_>,
    ) -> Result<Decided<S>, CallError> {
        // A decision kept for the request's declared inputs needs no tenant thread.
        let at = call.at;
        let key = match module.cached(&input, at) {
            Ok(decision) => return Ok(decision),
            Err(key) => key,
        };
        let query = S::query(input);
        let request_id = call.request_id.map(str::to_owned);
        let module = module.clone();
        let result = self
            .pool
            .run(gate, move || {
                module.decide_and_keep(key, at, request_id.as_deref(), S::input(&query))
            })
            .await;
        match result {
            Ok(decision) => decision.map_err(CallError::Plugin),
            Err(busy) => Err(self.shed(S::STAGE, busy)),
        }
    }

    /// Runs a shadow for one request off the request's path and compares its decision with
    /// `enforced`; skipped (and counted) when no place is free at once. `gate`: a project's
    /// shadow runs within the project's own share.
    pub fn shadow<S: PolicyStage>(
        &self,
        shadow: &Arc<Candidate<S>>,
        gate: Option<&Gate>,
        request_id: Option<&str>,
        input: S::Input<'_>,
        enforced: &S::Decision,
    ) {
        let (method, path) = S::request_line(&input);
        let compared = Compared::new(request_id, method, path);
        let enforced = S::describe(enforced);
        let query = S::query(input);
        let runner = shadow.clone();
        self.spawn_shadow(&shadow.trying.comparison, gate, move || {
            let decision = runner
                .module
                .decide(Some(&compared.request_id), S::input(&query))
                .map(|d| S::describe(&d))
                .map_err(|e| failure_kind(&e));
            runner
                .trying
                .comparison
                .record(compared, enforced, decision);
        });
    }

    /// Runs a shadow's `job` on the tenant pool when a place of `gate` (a project's shadow:
    /// the project's own share), a shadow place and a thread are free at once; counts a skip in
    /// `comparison` otherwise. Nothing waits for it.
    pub fn spawn_shadow(
        &self,
        comparison: &Comparison,
        gate: Option<&Gate>,
        job: impl FnOnce() + Send + 'static,
    ) {
        if self.pool.try_spawn(gate, job).is_err() {
            comparison.skipped();
        }
    }

    /// A place for one upload of `organization`, or why not: its organization already has
    /// `plugins.tenant_max_concurrent_uploads_per_org` in progress, or every one of the
    /// instance's `plugins.tenant_max_concurrent_uploads` is taken.
    pub fn upload_permit(&self, organization: uuid::Uuid) -> Result<UploadPermit, UploadsBusy> {
        let mut by_org = self
            .uploads_by_org
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let held = by_org.get(&organization).copied().unwrap_or(0);
        if held >= self.uploads_per_org {
            return Err(UploadsBusy::Organization);
        }
        let place = self
            .uploads
            .clone()
            .try_acquire_owned()
            .map_err(|_| UploadsBusy::Instance)?;
        by_org.insert(organization, held + 1);
        Ok(UploadPermit {
            _place: place,
            organization,
            by_org: self.uploads_by_org.clone(),
        })
    }

    /// `plugins.max_config_bytes`.
    pub fn max_config_bytes(&self) -> usize {
        self.max_config_bytes
    }

    /// Compiles and checks a module for `stage` of `project`; the module is not put in force.
    pub async fn prepare(
        &self,
        project: &str,
        stage: Stage,
        bytes: &[u8],
        config: &str,
    ) -> Result<Prepared, PrepareError> {
        if bytes.len() > self.max_module_bytes {
            return Err(PrepareError::TooLarge {
                size: bytes.len(),
                max: self.max_module_bytes,
            });
        }
        if config.len() > self.max_config_bytes {
            return Err(PrepareError::ConfigTooLarge {
                size: config.len(),
                max: self.max_config_bytes,
            });
        }
        let digest = super::digest_of(bytes);
        let (component, compile) = self.compiler.compile(&digest, bytes).await?;
        let (installed, report) = self
            .check(project, stage, &digest, component, config)
            .await?;
        Ok(Prepared {
            digest,
            installed,
            report,
            compile,
        })
    }

    /// Loads a compiled module for `stage` of `project` and runs its conformance vectors, off
    /// the async workers.
    async fn check(
        &self,
        project: &str,
        stage: Stage,
        digest: &str,
        component: Component,
        config: &str,
    ) -> Result<(Checked, StageReport), PrepareError> {
        let runtime = self.runtime.clone();
        let (project, config, digest) = (project.to_owned(), config.to_owned(), digest.to_owned());
        tokio::task::spawn_blocking(move || {
            prepare_compiled(&runtime, &project, stage, digest, component, &config)
        })
        .await
        .map_err(|e| PrepareError::Unavailable(format!("module check: {e}")))?
        .map_err(PrepareError::Refused)
    }

    /// Loads one stored module of `project`: compiled already when another project or an
    /// earlier load used its digest, else read from the store and compiled. `Ok(None)`: refused
    /// (remembered) or missing from the store, logged; `Err`: cannot be loaded now.
    async fn load_stored(
        &self,
        store: &Arc<dyn ControlStore>,
        project: &str,
        stored: &Stored,
        reason: LoadReason,
    ) -> Result<Option<Shared>, String> {
        let refusal = refusal_key(&stored.digest, stored.stage, &stored.config);
        if self.refused.contains_key(&refusal) {
            return Ok(None);
        }
        let count = |result: &str| {
            self.metrics
                .tenant_module_loads
                .with_label_values(&[reason.label(), result])
                .inc();
        };
        let (stage, digest, config) = (stored.stage, &stored.digest, &stored.config);
        // A digest compiled before is loaded by its name: its bytes are read from the store only
        // to compile them.
        let checked = match self.compiler.compiled(digest) {
            Some((component, _)) => self.check(project, stage, digest, component, config).await,
            None => match store.module(digest).await {
                Ok(Some(bytes)) if super::digest_of(&bytes) == *digest => {
                    let prepared = self.prepare(project, stage, &bytes, config).await;
                    prepared.map(|p| (p.installed, p.report))
                }
                Ok(Some(_)) => Err(PrepareError::Refused(
                    "the stored module's bytes do not match its digest".to_owned(),
                )),
                Ok(None) => {
                    tracing::error!(project, %digest, "tenant module missing from the store");
                    count("refused");
                    return Ok(None);
                }
                Err(e) => Err(PrepareError::Unavailable(format!("the control store: {e}"))),
            },
        };
        match checked {
            Ok((installed, _)) => {
                count("loaded");
                Ok(Some(match stored.trial {
                    None => installed,
                    Some(trial) => installed.tried_as(
                        trial,
                        Some(self.shadow_metrics.series(Plane::Data, stage, project)),
                    ),
                }))
            }
            Err(PrepareError::Unavailable(reason)) => {
                count("unavailable");
                tracing::warn!(project, %stage, %reason, "tenant module not loaded now");
                Err(reason)
            }
            Err(reason) => {
                count("refused");
                tracing::error!(project, %stage, %digest, %reason, "tenant module refused; remembered");
                self.refused.insert(refusal, reason.to_string());
                Ok(None)
            }
        }
    }

    /// Whether `project`'s stored modules are loaded here, or it stored none.
    pub fn loaded_or_unlisted(&self, project: &str) -> bool {
        self.listing
            .load()
            .projects
            .get(project)
            .is_none_or(|p| p.loaded())
    }

    /// Loads `project`'s stored modules when this is its first request on this instance; its
    /// other requests meanwhile wait for the same load. `Err`: a module cannot be loaded now
    /// (the request fails closed; the next one tries again).
    pub async fn ensure(&self, store: &Arc<dyn ControlStore>, project: &str) -> Result<(), String> {
        {
            // Every request of a project that installed a module for another stage comes here:
            // a lookup, no reference counted.
            let listing = self.listing.load();
            if listing.projects.get(project).is_none_or(|p| p.loaded()) {
                return Ok(());
            }
        }
        let listing = self.listing.load_full();
        let Some(stored) = listing.projects.get(project) else {
            return Ok(());
        };
        let cell = {
            let mut loading = self.loading.lock().unwrap_or_else(|p| p.into_inner());
            loading.entry(project.to_owned()).or_default().clone()
        };
        let loaded = cell
            .get_or_try_init(|| self.load_project(store, project, &listing, stored))
            .await
            .map(|_| ());
        let mut loading = self.loading.lock().unwrap_or_else(|p| p.into_inner());
        if loading.get(project).is_some_and(|c| Arc::ptr_eq(c, &cell)) {
            loading.remove(project);
        }
        loaded
    }

    /// Loads `stored`, `project`'s modules as `listing` lists them, and puts them in force
    /// unless changed here since the listing was made.
    async fn load_project(
        &self,
        store: &Arc<dyn ControlStore>,
        project: &str,
        listing: &Listing,
        stored: &StoredProject,
    ) -> Result<(), String> {
        if stored.loaded() {
            return Ok(());
        }
        let current = self.map.load_full();
        let mut parts = Vec::new();
        for module in &stored.modules {
            let existing = current
                .get(project)
                .and_then(|m| m.get(module.stage, module.role));
            let from = (module.digest.as_str(), module.config.as_str(), module.trial);
            if existing.is_some_and(|e| loaded_from(&**e) == Some(from)) {
                continue;
            }
            let part = self
                .load_stored(store, project, module, LoadReason::FirstCall)
                .await?;
            parts.push((module.stage, module.role, part));
        }
        let mut changes = self.changes.lock().unwrap_or_else(|p| p.into_inner());
        changes.seq += 1;
        let seq = changes.seq;
        let current = self.map.load_full();
        let next = self.put_project(&current, project, |modules| {
            for (stage, role, part) in parts {
                let key = (project.to_owned(), stage, role);
                if changes
                    .touched
                    .get(&key)
                    .is_some_and(|at| *at > listing.seq)
                {
                    continue;
                }
                changes.touched.insert(key, seq);
                modules.set(stage, role, part);
            }
        });
        self.map.store(Arc::new(next));
        stored
            .loaded
            .store(true, std::sync::atomic::Ordering::Release);
        drop(changes);
        self.loaded_one();
        Ok(())
    }

    /// `current` with `project`'s modules changed by `edit` (and regrouped into slots); a
    /// project left with no module is removed.
    fn put_project(
        &self,
        current: &HashMap<String, Arc<ProjectModules>>,
        project: &str,
        edit: impl FnOnce(&mut ProjectModules),
    ) -> HashMap<String, Arc<ProjectModules>> {
        let mut modules = match current.get(project) {
            Some(m) => ProjectModules {
                parts: m.parts.clone(),
                slots: Default::default(),
                gate: m.gate.clone(),
                used: AtomicU64::new(m.used.load(Ordering::Relaxed)),
            },
            None => ProjectModules {
                parts: Default::default(),
                slots: Default::default(),
                gate: self.pool.project_gate(),
                used: AtomicU64::new(self.clock.load(Ordering::Relaxed)),
            },
        };
        edit(&mut modules);
        modules.join();
        let mut next = current.clone();
        if modules.is_empty() {
            next.remove(project);
        } else {
            next.insert(project.to_owned(), Arc::new(modules));
        }
        next
    }

    /// Advances the clock of the projects' last calls by one [`TICK`].
    pub fn tick(&self) {
        self.clock.fetch_add(1, Ordering::Relaxed);
    }

    /// What a sweep waits for between its ticks: told when a load took the projects' compiled
    /// modules over `plugins.tenant_code_budget_bytes`.
    pub fn pressure(&self) -> Arc<tokio::sync::Notify> {
        self.pressure.clone()
    }

    /// Whether the projects' compiled modules in use are charged more than
    /// `plugins.tenant_code_budget_bytes`.
    pub fn over_budget(&self) -> bool {
        let charged = self.runtime.compiled_bytes();
        self.metrics.tenant_code_bytes.set(charged as i64);
        charged > self.code_budget
    }

    /// After a load: asks for a [`Sweep::Pressure`] when it took the code over the budget.
    fn loaded_one(&self) {
        if self.runtime.compiled_bytes() > self.code_budget {
            self.pressure.notify_one();
        }
    }

    /// While the projects' compiled modules in use are charged more than the sweep's target
    /// (`plugins.tenant_code_budget_bytes`, [`Sweep::target`]), unloads the modules of the
    /// projects called least recently here: a digest's compiled module leaves memory with the
    /// last loaded module using it, and the project's next request loads its modules again
    /// (from the compile cache, like a first request). Never unloaded: a project called within
    /// the sweep's [`Sweep::idle_ticks`] (a second for [`Sweep::Idle`], a tick for
    /// [`Sweep::Pressure`]), and one whose modules here differ from its listed ones (changed
    /// here since the listing; a reload would bring back the older ones). Returns the projects
    /// unloaded.
    pub fn sweep(&self, kind: Sweep) -> usize {
        let now = self.clock.load(Ordering::Relaxed);
        let idle = kind.idle_ticks();
        let cold = |modules: &ProjectModules| modules.used.load(Ordering::Relaxed) + idle < now;
        let target = kind.target(self.code_budget);
        let mut charged = self.runtime.compiled_bytes();
        self.metrics.tenant_code_bytes.set(charged as i64);
        if charged <= target {
            return 0;
        }
        let weights = self.runtime.compiled_weights();
        let map = self.map.load_full();
        let listing = self.listing.load_full();
        let mut users: HashMap<&str, usize> = HashMap::new();
        for modules in map.values() {
            for digest in modules.digests() {
                *users.entry(digest).or_default() += 1;
            }
        }
        let mut coldest: Vec<(u64, &String, &Arc<ProjectModules>)> = map
            .iter()
            .filter(|(project, modules)| {
                cold(modules)
                    && listing
                        .projects
                        .get(*project)
                        .is_some_and(|stored| modules.as_listed(&stored.modules))
            })
            .map(|(project, modules)| (modules.used.load(Ordering::Relaxed), project, modules))
            .collect();
        coldest.sort_unstable_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
        let mut victims = Vec::new();
        for (_, project, modules) in coldest {
            if charged <= target {
                break;
            }
            for digest in modules.digests() {
                if let Some(count) = users.get_mut(digest) {
                    *count -= 1;
                    if *count == 0 {
                        charged = charged.saturating_sub(weights.get(digest).copied().unwrap_or(0));
                    }
                }
            }
            victims.push((project.as_str(), modules));
        }
        if victims.is_empty() {
            return 0;
        }
        let unloaded = {
            let mut changes = self.changes.lock().unwrap_or_else(|p| p.into_inner());
            changes.seq += 1;
            let seq = changes.seq;
            let current = self.map.load_full();
            let mut next = (*current).clone();
            let mut unloaded = 0;
            for (project, modules) in victims {
                // Changed or called since it was chosen: it stays.
                if !current
                    .get(project)
                    .is_some_and(|now| Arc::ptr_eq(now, modules) && cold(now))
                {
                    continue;
                }
                next.remove(project);
                changes.unloaded.insert(project.to_owned(), seq);
                // Its modules were the listed ones: what marked them changed here (their load)
                // must not keep the listing's from being loaded again.
                for (stage, role, _) in modules.all() {
                    changes.touched.remove(&(project.to_owned(), stage, role));
                }
                if let Some(stored) = self.listing.load().projects.get(project) {
                    stored.loaded.store(false, Ordering::Release);
                }
                unloaded += 1;
            }
            self.map.store(Arc::new(next));
            unloaded
        };
        drop(map);
        self.metrics
            .tenant_projects_unloaded
            .with_label_values(&[kind.label()])
            .inc_by(unloaded as u64);
        self.metrics
            .tenant_code_bytes
            .set(self.runtime.compiled_bytes() as i64);
        unloaded
    }

    /// Holds the write lock of `PUT` and `DELETE`: the store write and the local change happen
    /// together, in the order of the requests.
    pub async fn write_lock(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.writes.lock().await
    }

    /// What `project`'s module in force for `stage` did on this instance, if one is loaded.
    pub fn report(
        &self,
        project: &str,
        stage: Stage,
    ) -> Option<super::runtime::stats::ModuleReport> {
        Some(self.slot(project, stage)?.module()?.report())
    }

    /// Every project's modules in force: (project, stage, report), sorted.
    pub fn reports(&self) -> Vec<(String, Stage, super::runtime::stats::ModuleReport)> {
        self.reports_page(None, usize::MAX).0
    }

    /// One page of [`Self::reports`]: the projects after `after` in the order of their refs, at
    /// most `limit` of them, and the ref to ask after for the next page (none on the last).
    #[allow(clippy::type_complexity, reason = "a page and its cursor")]
    pub fn reports_page(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> (
        Vec<(String, Stage, super::runtime::stats::ModuleReport)>,
        Option<String>,
    ) {
        let map = self.map.load();
        let mut projects: Vec<&String> = map
            .keys()
            .filter(|p| after.is_none_or(|after| p.as_str() > after))
            .collect();
        projects.sort_unstable();
        let next = (projects.len() > limit).then(|| projects[limit - 1].clone());
        let mut out = Vec::new();
        for project in projects.into_iter().take(limit) {
            for (stage, role, part) in map[project].all() {
                if let (Role::Enforced, Some(module)) = (role, part.module()) {
                    out.push((project.clone(), stage, module.report()));
                }
            }
        }
        (out, next)
    }

    /// Projects with modules loaded on this instance.
    pub fn loaded_projects(&self) -> usize {
        self.map.load().len()
    }

    /// Puts a module in force for a project (`None` removes it), as a change of this instance.
    pub fn apply(&self, project: &str, stage: Stage, installed: Option<Checked>) {
        self.apply_as(project, stage, Role::Enforced, installed);
    }

    /// Puts a module in `role` for a project (`None` empties it), as a change of this instance:
    /// a candidate is given as [`AnySlot::tried_as`] makes it.
    pub fn apply_as(&self, project: &str, stage: Stage, role: Role, part: Option<Checked>) {
        self.apply_if(project, stage, role, part, |_| true);
    }

    /// Removes the candidate when it still is `digest` (a canary dropped for its failures);
    /// false when another change came first.
    pub fn drop_candidate(&self, project: &str, stage: Stage, digest: &str) -> bool {
        self.apply_if(project, stage, Role::Candidate, None, |current| {
            current
                .and_then(|c| c.candidate())
                .is_some_and(|(module, _)| module.digest() == digest)
        })
    }

    fn apply_if(
        &self,
        project: &str,
        stage: Stage,
        role: Role,
        part: Option<Checked>,
        only_if: impl FnOnce(Option<&Shared>) -> bool,
    ) -> bool {
        let mut changes = self.changes.lock().unwrap_or_else(|p| p.into_inner());
        let current = self.map.load_full();
        if !only_if(current.get(project).and_then(|m| m.get(stage, role))) {
            return false;
        }
        changes.seq += 1;
        let seq = changes.seq;
        changes
            .touched
            .insert((project.to_owned(), stage, role), seq);
        let next = self.put_project(&current, project, |m| m.set(stage, role, part));
        self.map.store(Arc::new(next));
        drop(changes);
        self.loaded_one();
        true
    }

    /// Groups modules by project into slots, keeping each project's gate.
    fn group(
        &self,
        current: &HashMap<String, Arc<ProjectModules>>,
        flat: HashMap<Key, Shared>,
    ) -> HashMap<String, Arc<ProjectModules>> {
        let mut grouped: HashMap<String, ProjectModules> = HashMap::new();
        for ((project, stage, role), part) in flat {
            let entry = grouped.entry(project.clone()).or_insert_with(|| {
                let before = current.get(&project);
                ProjectModules {
                    parts: Default::default(),
                    slots: Default::default(),
                    gate: before
                        .map(|m| m.gate.clone())
                        .unwrap_or_else(|| self.pool.project_gate()),
                    used: AtomicU64::new(before.map_or_else(
                        || self.clock.load(Ordering::Relaxed),
                        |m| m.used.load(Ordering::Relaxed),
                    )),
                }
            });
            entry.set(stage, role, Some(part));
        }
        grouped
            .into_iter()
            .map(|(project, mut modules)| {
                modules.join();
                (project, Arc::new(modules))
            })
            .collect()
    }

    /// Lists every project's stored modules (what a project's first request loads) and brings
    /// the projects loaded here in line with the store: loads their new or changed modules (off
    /// the request path), drops removed ones. A module that no longer loads is dropped with an
    /// error log (the project then uses the plane's module) and remembered. Returns whether the
    /// store answered.
    pub async fn refresh(&self, store: &Arc<dyn ControlStore>) -> bool {
        let _one_at_a_time = self.refreshing.lock().await;
        let started_at = self.changes.lock().unwrap_or_else(|p| p.into_inner()).seq;
        let records = match store.project_policies().await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "tenant policies: store unavailable; keeping the modules in force");
                return false;
            }
        };
        let candidates = match store.policy_candidates().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "tenant policies: store unavailable; keeping the modules in force");
                return false;
            }
        };
        let projects = stored_of(records, candidates);
        let previous = self.listing.load_full();
        let current = self.map.load_full();
        // The projects loaded here are kept in line now; the others load on their first request.
        let mut loaded: HashMap<Key, Shared> = HashMap::new();
        for (project, modules) in &projects {
            let here = current.get(project);
            if here.is_none() && !previous.projects.get(project).is_some_and(|p| p.loaded()) {
                continue;
            }
            let parts = self
                .in_line(store, project, modules, here.map(|m| &**m))
                .await;
            for ((stage, role), part) in parts {
                loaded.insert((project.clone(), stage, role), part);
            }
        }
        let mut changes = self.changes.lock().unwrap_or_else(|p| p.into_inner());
        let current = self.map.load_full();
        let mut next = flatten(&current);
        let keys: HashSet<Key> = next.keys().chain(loaded.keys()).cloned().collect();
        for key in keys {
            // Changed here since this refresh started (a `PUT`, a first load): that stands; and
            // a project unloaded meanwhile stays unloaded.
            if changes
                .touched
                .get(&key)
                .is_some_and(|seq| *seq > started_at)
                || changes.unloaded_since(&key.0, started_at, &current)
            {
                continue;
            }
            match loaded.get(&key) {
                Some(installed) => next.insert(key, installed.clone()),
                None => next.remove(&key),
            };
        }
        let grouped = self.group(&current, next);
        changes.touched.retain(|_, seq| *seq > started_at);
        changes.unloaded.retain(|_, seq| *seq > started_at);
        // Loaded: what is in force now (a project unloaded or changed meanwhile is as that
        // left it, whatever this refresh found).
        let projects = projects
            .into_iter()
            .map(|(project, modules)| {
                let here = grouped.contains_key(&project);
                let loaded = std::sync::atomic::AtomicBool::new(here);
                (project, Arc::new(StoredProject { modules, loaded }))
            })
            .collect();
        self.map.store(Arc::new(grouped));
        self.listing.store(Arc::new(Listing {
            seq: started_at,
            projects,
        }));
        self.loaded_one();
        true
    }

    /// `project`'s parts as `modules` lists them: the part in force where it is the same
    /// module, configuration and trial, else a new load (a changed module); where one cannot
    /// be loaded now, what was in force stays.
    async fn in_line(
        &self,
        store: &Arc<dyn ControlStore>,
        project: &str,
        modules: &[Stored],
        here: Option<&ProjectModules>,
    ) -> HashMap<(Stage, Role), Shared> {
        let mut parts = HashMap::new();
        for module in modules {
            let key = (module.stage, module.role);
            let existing = here.and_then(|m| m.get(module.stage, module.role));
            let from = (module.digest.as_str(), module.config.as_str(), module.trial);
            if let Some(existing) = existing
                && loaded_from(&**existing) == Some(from)
            {
                parts.insert(key, existing.clone());
                continue;
            }
            match self
                .load_stored(store, project, module, LoadReason::Changed)
                .await
            {
                Ok(Some(part)) => {
                    parts.insert(key, part);
                }
                Ok(None) => {}
                Err(_) => {
                    if let Some(existing) = existing {
                        parts.insert(key, existing.clone());
                    }
                }
            }
        }
        parts
    }

    /// Lists `project`'s stored modules again (a change event named it) and, when the project
    /// is loaded here, brings it in line — nothing of any other project is read or loaded.
    /// Returns whether the store answered.
    pub async fn refresh_project(&self, store: &Arc<dyn ControlStore>, project: &str) -> bool {
        let _one_at_a_time = self.refreshing.lock().await;
        let started_at = self.changes.lock().unwrap_or_else(|p| p.into_inner()).seq;
        let unavailable = |e: crate::control::StoreError| {
            tracing::warn!(project, error = %e, "a project's modules: store unavailable; kept as they were");
            false
        };
        let records = match store.project_policies_of(project).await {
            Ok(records) => records,
            Err(e) => return unavailable(e),
        };
        let candidates = match store.policy_candidates_of(project).await {
            Ok(candidates) => candidates,
            Err(e) => return unavailable(e),
        };
        let mut listed = stored_of(records, candidates);
        let modules = listed.remove(project).unwrap_or_default();
        let listing = self.listing.load_full();
        let current = self.map.load_full();
        let here = current.get(project);
        let kept = here.is_some() || listing.projects.get(project).is_some_and(|p| p.loaded());
        let changes = if kept {
            let mut parts = self
                .in_line(store, project, &modules, here.map(|m| &**m))
                .await;
            let changes = self.changes.lock().unwrap_or_else(|p| p.into_inner());
            let current = self.map.load_full();
            if changes.unloaded_since(project, started_at, &current) {
                // Unloaded meanwhile: it stays so (its next request loads the listing's).
                return self.relist(project, modules, changes);
            }
            let next = self.put_project(&current, project, |m| {
                for stage in Stage::ALL.into_iter().filter(|s| s.info().tenant) {
                    for role in [Role::Enforced, Role::Candidate] {
                        let key = (project.to_owned(), stage, role);
                        // Changed here since this refresh started: that stands.
                        if changes.touched.get(&key).is_some_and(|at| *at > started_at) {
                            continue;
                        }
                        m.set(stage, role, parts.remove(&(stage, role)));
                    }
                }
            });
            self.map.store(Arc::new(next));
            self.loaded_one();
            changes
        } else {
            self.changes.lock().unwrap_or_else(|p| p.into_inner())
        };
        self.relist(project, modules, changes)
    }

    /// Puts `modules` in the listing as `project`'s stored modules (loaded when they are in
    /// force here now), under the change lock `changes`. Returns true.
    fn relist(
        &self,
        project: &str,
        modules: Vec<Stored>,
        changes: std::sync::MutexGuard<'_, Changes>,
    ) -> bool {
        let here = self.map.load().contains_key(project);
        let listing = self.listing.load_full();
        let mut projects = listing.projects.clone();
        if modules.is_empty() {
            projects.remove(project);
        } else {
            let loaded = std::sync::atomic::AtomicBool::new(here);
            projects.insert(
                project.to_owned(),
                Arc::new(StoredProject { modules, loaded }),
            );
        }
        self.listing.store(Arc::new(Listing {
            seq: listing.seq,
            projects,
        }));
        drop(changes);
        true
    }
}

/// The stored modules of each project, from the store's records; a record of a stage no
/// project may install, or with a trial this version does not know (another version wrote
/// it), is skipped.
fn stored_of(
    records: Vec<crate::control::ProjectPolicyRecord>,
    candidates: Vec<crate::control::PolicyCandidateRecord>,
) -> HashMap<String, Vec<Stored>> {
    let enforced = records.into_iter().map(|p| {
        let module = (p.stage, Role::Enforced, p.digest, p.config, None);
        (p.project_ref, module)
    });
    let tried = candidates.into_iter().filter_map(|c| {
        let trial = Trial::parse(&c.mode, Some(c.percent).filter(|p| *p > 0))
            .ok()
            .flatten()?;
        let module = (c.stage, Role::Candidate, c.digest, c.config, Some(trial));
        Some((c.project_ref, module))
    });
    let mut projects: HashMap<String, Vec<Stored>> = HashMap::new();
    for (project, (stage, role, digest, config, trial)) in enforced.chain(tried) {
        let Some(stage) = Stage::parse_tenant(&stage) else {
            continue;
        };
        let stored = Stored {
            stage,
            role,
            digest,
            config,
            trial,
        };
        projects.entry(project).or_default().push(stored);
    }
    projects
}

fn flatten(map: &HashMap<String, Arc<ProjectModules>>) -> HashMap<Key, Shared> {
    let mut flat = HashMap::new();
    for (project, modules) in map {
        for (stage, role, part) in modules.all() {
            flat.insert((project.clone(), stage, role), part.clone());
        }
    }
    flat
}
