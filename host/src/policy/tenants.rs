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
//! - **refresh**: every `plugins.tenant_refresh_secs` each instance brings its modules in line
//!   with the control store, off the request path; a module refused there is remembered (by
//!   digest, stage and configuration) and not loaded again for
//!   `plugins.tenant_refused_retry_secs`; a `PUT` or `DELETE` made on this instance while a
//!   refresh runs is never reverted by it (changes are sequenced, and a refresh only decides for
//!   the modules nobody changed since it started).

use std::any::Any;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use wasmtime::component::Component;

use super::rollout::{Compared, Comparison, ShadowMetrics, ShadowSeries, Trial, failure_kind};
use super::runtime::compile::{CompileError, CompileReport, Compiler};
use super::runtime::isolation::{Busy, TenantPool};
use super::slot::StageCall;
use super::stages::conformance::StageReport;
use super::stages::{Decided, Module, ModuleSource, PolicyStage, StageFn, for_stage};
use super::{Owner, PluginError, PolicyEngine, Stage};
use crate::config::PluginRuntimeConfig;
use crate::control::ControlStore;
use crate::metrics::Metrics;
use crate::plane::Plane;
use crate::stage::STAGES;

/// A project's module for stage `S`, in force or on trial, with what it was loaded from.
#[derive(Debug)]
pub struct Installed<S: PolicyStage> {
    pub digest: String,
    pub config: String,
    pub module: Module<S>,
    /// `None`: the module in force; a shadow or a canary otherwise.
    pub trial: Option<Trial>,
    /// A shadow's comparison with the enforced decisions.
    pub comparison: Option<Comparison>,
}

/// What the host reads of a project's module, whatever its stage.
pub trait AnyInstalled: Send + Sync + std::fmt::Debug {
    /// The typed [`Installed`].
    fn into_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync>;
    /// The stage.
    fn stage(&self) -> Stage;
    /// SHA-256 of the module, hex.
    fn digest(&self) -> &str;
    /// Its configuration (JSON).
    fn config(&self) -> &str;
    /// `None`: the module in force; a shadow or a canary otherwise.
    fn trial(&self) -> Option<Trial>;
    /// A shadow's comparison with the enforced decisions.
    fn comparison(&self) -> Option<&Comparison>;
    /// Tries this module as a candidate (`trial`), its disagreements counted in `series`.
    fn put_on_trial(&mut self, trial: Trial, series: Option<ShadowSeries>);
    /// Calls, failures and call times since the module was loaded.
    fn report(&self) -> super::runtime::stats::ModuleReport;
    /// Whether the module fails too often in the current window.
    fn failing_too_often(&self) -> bool;
    /// The JSON Schema of the module's configuration, when it exports one.
    fn schema(&self) -> Option<&str>;
}

impl<S: PolicyStage> AnyInstalled for Installed<S> {
    fn into_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync> {
        self
    }
    fn stage(&self) -> Stage {
        S::STAGE
    }
    fn digest(&self) -> &str {
        &self.digest
    }
    fn config(&self) -> &str {
        &self.config
    }
    fn trial(&self) -> Option<Trial> {
        self.trial
    }
    fn comparison(&self) -> Option<&Comparison> {
        self.comparison.as_ref()
    }
    fn put_on_trial(&mut self, trial: Trial, series: Option<ShadowSeries>) {
        self.comparison = (trial == Trial::Shadow).then(|| Comparison::new(series));
        self.trial = Some(trial);
    }
    fn report(&self) -> super::runtime::stats::ModuleReport {
        super::AnyModule::report(&self.module)
    }
    fn failing_too_often(&self) -> bool {
        super::AnyModule::failing_too_often(&self.module)
    }
    fn schema(&self) -> Option<&str> {
        super::AnyModule::schema(&self.module)
    }
}

/// A checked module of any stage, ready to put in force.
pub type Checked = Box<dyn AnyInstalled>;

/// [`Checked`] tried as `trial`, its disagreements counted in `series`.
pub fn on_trial(mut checked: Checked, trial: Trial, series: Option<ShadowSeries>) -> Checked {
    checked.put_on_trial(trial, series);
    checked
}

/// Which module of a project's stage: the one in force, or the candidate on trial.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Slot {
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
            let (digest, config) = (self.source.digest.clone(), self.source.config.clone());
            let module = Module::<S>::load(self.runtime, Plane::Data, self.source, Owner::Tenant)
                .map_err(|e| e.to_string())?;
            let report = S::conformance(&module).map_err(|e| e.to_string())?;
            // The failure window starts after the checks: a canary is judged on live calls only.
            super::AnyModule::reset_health(&module);
            let installed: Checked = Box::new(Installed {
                digest,
                config,
                module,
                trial: None,
                comparison: None,
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

/// A tenant call that did not give a decision.
#[derive(Debug, thiserror::Error)]
pub enum TenantCallError {
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

/// A project's module as stored: erased, the stage's type given back by [`typed`].
type Shared = Arc<dyn AnyInstalled>;

/// `installed` as stage `S`'s module (`None` if it is another stage's).
fn typed<S: PolicyStage>(installed: &Shared) -> Option<Arc<Installed<S>>> {
    installed.clone().into_any().downcast::<Installed<S>>().ok()
}

/// One project's modules and its concurrency gate: a module in force and a candidate per stage,
/// in [`Stage::index`] order.
#[derive(Debug)]
struct ProjectModules {
    slots: [[Option<Shared>; 2]; STAGES.len()],
    gate: Arc<Semaphore>,
}

impl Slot {
    fn index(self) -> usize {
        match self {
            Slot::Enforced => 0,
            Slot::Candidate => 1,
        }
    }
}

impl ProjectModules {
    fn get(&self, stage: Stage, slot: Slot) -> Option<&Shared> {
        self.slots[stage.index()][slot.index()].as_ref()
    }

    fn set(&mut self, stage: Stage, slot: Slot, installed: Shared) {
        self.slots[stage.index()][slot.index()] = Some(installed);
    }

    fn all(&self) -> impl Iterator<Item = (Stage, Slot, &Shared)> {
        Stage::ALL.into_iter().flat_map(move |stage| {
            [Slot::Enforced, Slot::Candidate]
                .into_iter()
                .filter_map(move |slot| Some((stage, slot, self.get(stage, slot)?)))
        })
    }
}

type Key = (String, Stage, Slot);

/// Changes made on this instance, in order.
#[derive(Debug, Default)]
struct Changes {
    seq: u64,
    /// The last change of each module, by sequence number; dropped once a refresh started after
    /// it has applied.
    touched: HashMap<Key, u64>,
}

/// The tenant modules in force, by project and stage.
#[derive(Debug)]
pub struct TenantPolicies {
    map: ArcSwap<HashMap<String, Arc<ProjectModules>>>,
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
            changes: Mutex::new(Changes::default()),
            writes: tokio::sync::Mutex::new(()),
            refreshing: tokio::sync::Mutex::new(()),
            compiler: Compiler::new(runtime.clone(), settings, metrics.clone()),
            runtime,
            pool: TenantPool::new(
                settings.tenant_threads,
                settings.tenant_max_concurrent_calls,
                Duration::from_millis(settings.tenant_queue_timeout_ms),
            ),
            uploads: Arc::new(Semaphore::new(settings.tenant_max_concurrent_uploads)),
            uploads_by_org: Arc::new(Mutex::new(HashMap::new())),
            uploads_per_org: settings.tenant_max_concurrent_uploads_per_org.max(1),
            max_module_bytes: settings.tenant_max_module_bytes,
            max_config_bytes: settings.max_config_bytes,
            refused: moka::sync::Cache::builder()
                .max_capacity(10_000)
                .time_to_live(Duration::from_secs(settings.tenant_refused_retry_secs))
                .build(),
            shadow_metrics: ShadowMetrics::new(metrics.clone()),
            metrics,
        }
    }

    fn lookup(&self, project: &str, stage: Stage, slot: Slot) -> Option<(Shared, Arc<Semaphore>)> {
        let map = self.map.load();
        if map.is_empty() {
            return None;
        }
        let modules = map.get(project)?;
        Some((modules.get(stage, slot)?.clone(), modules.gate.clone()))
    }

    fn lookup_typed<S: PolicyStage>(
        &self,
        project: &str,
        slot: Slot,
    ) -> Option<(Arc<Installed<S>>, Arc<Semaphore>)> {
        let (installed, gate) = self.lookup(project, S::STAGE, slot)?;
        Some((typed::<S>(&installed)?, gate))
    }

    /// The project's module for `stage`, if it installed one.
    pub fn installed(&self, project: &str, stage: Stage) -> Option<Shared> {
        self.lookup(project, stage, Slot::Enforced)
            .map(|(installed, _)| installed)
    }

    /// The project's candidate for `stage` (shadow or canary).
    pub fn candidate(&self, project: &str, stage: Stage) -> Option<Shared> {
        self.lookup(project, stage, Slot::Candidate)
            .map(|(installed, _)| installed)
    }

    /// The project's module in force for stage `S`, with the project's gate.
    pub fn installed_for<S: PolicyStage>(
        &self,
        project: &str,
    ) -> Option<(Arc<Installed<S>>, Arc<Semaphore>)> {
        self.lookup_typed::<S>(project, Slot::Enforced)
    }

    /// The project's candidate for stage `S` (shadow or canary), with the project's gate.
    pub fn candidate_for<S: PolicyStage>(
        &self,
        project: &str,
    ) -> Option<(Arc<Installed<S>>, Arc<Semaphore>)> {
        self.lookup_typed::<S>(project, Slot::Candidate)
    }

    /// Digests of every module loaded, in force or on trial.
    pub fn digests(&self) -> HashSet<String> {
        self.map
            .load()
            .values()
            .flat_map(|m| {
                m.all()
                    .map(|(_, _, i)| i.digest().to_owned())
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    fn shed(&self, stage: Stage, busy: Busy) -> TenantCallError {
        self.metrics
            .tenant_calls_shed
            .with_label_values(&[stage.key()])
            .inc();
        TenantCallError::Busy(busy)
    }

    /// Runs `installed` for one request (`call`) on the tenant pool under `gate`: the input is
    /// copied (owned) for the call on another thread.
    pub async fn run<S: PolicyStage>(
        &self,
        installed: Arc<Installed<S>>,
        gate: &Arc<Semaphore>,
        call: &StageCall<'_>,
        input: S::Input<'_>,
    ) -> Result<Decided<S>, TenantCallError> {
        // A decision kept for the request's declared inputs needs no tenant thread.
        let at = call.at;
        let key = match installed.module.cached(&input, at) {
            Ok(decision) => return Ok(decision),
            Err(key) => key,
        };
        let query = S::query(input);
        let request_id = call.request_id.map(str::to_owned);
        let result = self
            .pool
            .run(gate, move || {
                installed
                    .module
                    .decide_and_keep(key, at, request_id.as_deref(), S::input(&query))
            })
            .await;
        match result {
            Ok(decision) => decision.map_err(TenantCallError::Plugin),
            Err(busy) => Err(self.shed(S::STAGE, busy)),
        }
    }

    /// Runs a project's shadow module for one request off the request's path and compares its
    /// decision with `enforced`; skipped (and counted) when no place is free at once.
    pub fn shadow<S: PolicyStage>(
        &self,
        shadow: Arc<Installed<S>>,
        gate: &Arc<Semaphore>,
        request_id: Option<&str>,
        input: S::Input<'_>,
        enforced: &S::Decision,
    ) {
        let Some(comparison) = &shadow.comparison else {
            return;
        };
        let (method, path) = S::request_line(&input);
        let compared = Compared::new(request_id, method, path);
        let enforced = S::describe(enforced);
        let query = S::query(input);
        let runner = shadow.clone();
        self.spawn_shadow(comparison, Some(gate), move || {
            let decision = runner
                .module
                .decide(Some(&compared.request_id), S::input(&query))
                .map(|d| S::describe(&d))
                .map_err(|e| failure_kind(&e));
            if let Some(comparison) = &runner.comparison {
                comparison.record(compared, enforced, decision);
            }
        });
    }

    /// Runs a shadow's `job` on the tenant pool when a place of `gate` (a project's shadow:
    /// the project's own share), a shadow place and a thread are free at once; counts a skip in
    /// `comparison` otherwise. Nothing waits for it.
    pub fn spawn_shadow(
        &self,
        comparison: &Comparison,
        gate: Option<&Arc<Semaphore>>,
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
        let runtime = self.runtime.clone();
        let (project, config) = (project.to_owned(), config.to_owned());
        let checked = tokio::task::spawn_blocking(move || {
            prepare_compiled(&runtime, &project, stage, digest, component, &config)
        })
        .await
        .map_err(|e| PrepareError::Unavailable(format!("module check: {e}")))?
        .map_err(PrepareError::Refused)?;
        Ok(Prepared {
            installed: checked.0,
            report: checked.1,
            compile,
        })
    }

    /// Holds the write lock of `PUT` and `DELETE`: the store write and the local change happen
    /// together, in the order of the requests.
    pub async fn write_lock(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.writes.lock().await
    }

    /// Puts a module in force for a project (`None` removes it), as a change of this instance.
    /// Every project's modules in force: (project, stage, report), sorted.
    /// What `project`'s module for `stage` did on this instance, if one is loaded.
    pub fn report(
        &self,
        project: &str,
        stage: Stage,
    ) -> Option<super::runtime::stats::ModuleReport> {
        Some(self.installed(project, stage)?.report())
    }

    pub fn reports(&self) -> Vec<(String, Stage, super::runtime::stats::ModuleReport)> {
        let mut out = Vec::new();
        for (project, modules) in self.map.load().iter() {
            for (stage, slot, installed) in modules.all() {
                if slot == Slot::Enforced {
                    out.push((project.clone(), stage, installed.report()));
                }
            }
        }
        out.sort_by(|a, b| (&a.0, a.1.to_string()).cmp(&(&b.0, b.1.to_string())));
        out
    }

    pub fn apply(&self, project: &str, stage: Stage, installed: Option<Checked>) {
        self.apply_slot(project, stage, Slot::Enforced, installed);
    }

    /// Puts a module in `slot` for a project (`None` empties it), as a change of this instance.
    pub fn apply_slot(&self, project: &str, stage: Stage, slot: Slot, installed: Option<Checked>) {
        self.apply_if(project, stage, slot, installed, |_| true);
    }

    /// Empties the candidate slot when it still holds `digest` (a canary dropped for its
    /// failures); false when another change came first.
    pub fn drop_candidate(&self, project: &str, stage: Stage, digest: &str) -> bool {
        self.apply_if(project, stage, Slot::Candidate, None, |current| {
            current.is_some_and(|c| c.digest() == digest)
        })
    }

    fn apply_if(
        &self,
        project: &str,
        stage: Stage,
        slot: Slot,
        installed: Option<Checked>,
        only_if: impl FnOnce(Option<&Shared>) -> bool,
    ) -> bool {
        let installed: Option<Shared> = installed.map(Shared::from);
        let mut changes = self.changes.lock().unwrap_or_else(|p| p.into_inner());
        let current = self.map.load_full();
        let mut flat = flatten(&current);
        let key = (project.to_owned(), stage, slot);
        if !only_if(flat.get(&key)) {
            return false;
        }
        changes.seq += 1;
        let seq = changes.seq;
        changes.touched.insert(key.clone(), seq);
        match installed {
            Some(i) => flat.insert(key, i),
            None => flat.remove(&key),
        };
        self.map.store(Arc::new(self.group(&current, flat)));
        true
    }

    /// Groups modules by project, keeping each project's gate.
    fn group(
        &self,
        current: &HashMap<String, Arc<ProjectModules>>,
        flat: HashMap<Key, Shared>,
    ) -> HashMap<String, Arc<ProjectModules>> {
        let mut grouped: HashMap<String, ProjectModules> = HashMap::new();
        for ((project, stage, slot), installed) in flat {
            let entry = grouped
                .entry(project.clone())
                .or_insert_with(|| ProjectModules {
                    slots: Default::default(),
                    gate: current
                        .get(&project)
                        .map(|m| m.gate.clone())
                        .unwrap_or_else(|| self.pool.project_gate()),
                });
            entry.set(stage, slot, installed);
        }
        grouped
            .into_iter()
            .map(|(project, modules)| (project, Arc::new(modules)))
            .collect()
    }

    /// Brings the modules in force in line with the store: loads new or changed ones (off the
    /// request path), drops removed ones. A module that no longer loads is dropped with an
    /// error log (the project then uses the plane's module) and remembered. Returns whether
    /// the store answered (every project's modules were then decided).
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
        let wanted = records
            .into_iter()
            .map(|p| {
                (
                    p.project_ref,
                    p.stage,
                    Slot::Enforced,
                    p.digest,
                    p.config,
                    None,
                )
            })
            .chain(candidates.into_iter().filter_map(|c| {
                // A record another version wrote with a trial this one does not know is skipped.
                let trial = Trial::parse(&c.mode, Some(c.percent).filter(|p| *p > 0))
                    .ok()
                    .flatten()?;
                Some((
                    c.project_ref,
                    c.stage,
                    Slot::Candidate,
                    c.digest,
                    c.config,
                    Some(trial),
                ))
            }));
        let current = self.map.load_full();
        let current_flat = flatten(&current);
        let mut loaded: HashMap<Key, Shared> = HashMap::new();
        for (project_ref, stage, slot, digest, config, trial) in wanted {
            let Some(stage) = Stage::parse_tenant(&stage) else {
                continue;
            };
            let key = (project_ref.clone(), stage, slot);
            if let Some(existing) = current_flat.get(&key)
                && existing.digest() == digest
                && existing.config() == config
                && existing.trial() == trial
            {
                loaded.insert(key, existing.clone());
                continue;
            }
            let refusal = refusal_key(&digest, stage, &config);
            if self.refused.contains_key(&refusal) {
                continue;
            }
            let bytes = match store.module(&digest).await {
                Ok(Some(bytes)) => bytes,
                other => {
                    tracing::error!(project = %project_ref, %digest, ?other, "tenant module missing from the store");
                    continue;
                }
            };
            match self.prepare(&project_ref, stage, &bytes, &config).await {
                Ok(prepared) => {
                    let installed = match trial {
                        None => prepared.installed,
                        Some(trial) => on_trial(
                            prepared.installed,
                            trial,
                            Some(self.shadow_metrics.series(Plane::Data, stage, &project_ref)),
                        ),
                    };
                    loaded.insert(key, Shared::from(installed));
                }
                Err(PrepareError::Unavailable(reason)) => {
                    tracing::warn!(project = %project_ref, stage = %stage, %reason, "tenant module not checked now; kept as it was");
                    if let Some(existing) = current_flat.get(&key) {
                        loaded.insert(key, existing.clone());
                    }
                }
                Err(reason) => {
                    tracing::error!(project = %project_ref, stage = %stage, %digest, %reason, "tenant module refused; remembered");
                    self.refused.insert(refusal, reason.to_string());
                }
            }
        }
        let mut changes = self.changes.lock().unwrap_or_else(|p| p.into_inner());
        let current = self.map.load_full();
        let mut next = flatten(&current);
        let keys: HashSet<Key> = next.keys().chain(loaded.keys()).cloned().collect();
        for key in keys {
            // Changed here since this refresh started: that change stands.
            if changes
                .touched
                .get(&key)
                .is_some_and(|seq| *seq > started_at)
            {
                continue;
            }
            match loaded.get(&key) {
                Some(installed) => next.insert(key, installed.clone()),
                None => next.remove(&key),
            };
        }
        self.map.store(Arc::new(self.group(&current, next)));
        changes.touched.retain(|_, seq| *seq > started_at);
        true
    }
}

fn flatten(map: &HashMap<String, Arc<ProjectModules>>) -> HashMap<Key, Shared> {
    let mut flat = HashMap::new();
    for (project, modules) in map {
        for (stage, slot, installed) in modules.all() {
            flat.insert((project.clone(), stage, slot), installed.clone());
        }
    }
    flat
}
