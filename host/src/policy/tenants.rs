//! Modules installed by projects (tenants) for the stages that allow it — the data plane's
//! `cors` and `quota`.
//!
//! A tenant module is untrusted code and every step around it is bounded by the host:
//! - **upload**: at most `plugins.tenant_max_concurrent_uploads` at once per instance; size
//!   checked; compiled in a separate, resource-limited process ([`super::compile`]); then
//!   exports, `configure` and the conformance vectors; stored content-addressed;
//! - **calls**: on the tenant thread pool under the project's concurrency cap
//!   ([`super::isolation`]), never on the request workers; same memory and time limits as every
//!   module;
//! - **refresh**: every `plugins.tenant_refresh_secs` each instance brings its modules in line
//!   with the control store, off the request path; a module refused there is remembered (by
//!   digest, stage and configuration) and not loaded again for
//!   `plugins.tenant_refused_retry_secs`; a `PUT` or `DELETE` made on this instance while a
//!   refresh runs is never reverted by it (changes are sequenced, and a refresh only decides for
//!   the modules nobody changed since it started).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use sha2::{Digest, Sha256};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use wasmtime::component::Component;

use super::compile::{CompileError, CompileReport, Compiler};
use super::conformance::{self, StageReport};
use super::isolation::{Busy, TenantPool};
use super::stages::{CorsDecision, CorsInput, CorsQuery, QuotaDecision};
use super::{CorsStage, PluginError, PolicyEngine, QuotaStage, Stage};
use crate::actor::Actor;
use crate::config::PluginRuntimeConfig;
use crate::control::{ControlStore, ProjectPolicyRecord};
use crate::metrics::Metrics;
use crate::plane::Plane;

/// A stage a tenant may install a module for, from its key.
pub fn tenant_stage(key: &str) -> Option<Stage> {
    match key {
        "cors" => Some(Stage::Cors),
        "quota" => Some(Stage::Quota),
        _ => None,
    }
}

/// A loaded tenant module.
#[derive(Debug)]
pub enum TenantModule {
    Cors(CorsStage),
    Quota(QuotaStage),
}

/// A tenant module in force, with what it was loaded from.
#[derive(Debug)]
pub struct Installed {
    pub digest: String,
    pub config: String,
    pub module: TenantModule,
}

/// SHA-256 of a module, hex.
pub fn digest_of(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The name of a project's module: this prefix and the project ref.
pub const TENANT_MODULE_PREFIX: &str = "tenant:";

/// Why a module was not put in force.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PrepareError {
    /// Over `plugins.tenant_max_module_bytes`.
    #[error("the module is {size} bytes; at most {max} are accepted")]
    TooLarge { size: usize, max: usize },
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
    pub installed: Installed,
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
) -> Result<(Installed, StageReport), String> {
    let loaded = (
        format!("{TENANT_MODULE_PREFIX}{project}"),
        digest.clone(),
        component,
        config.to_owned(),
    );
    let (module, report) = match stage {
        Stage::Cors => {
            let m = CorsStage::load(runtime, Plane::Data, loaded).map_err(|e| e.to_string())?;
            let r = conformance::check_cors_stage(Plane::Data, &m).map_err(|e| e.to_string())?;
            (TenantModule::Cors(m), r)
        }
        Stage::Quota => {
            let m = QuotaStage::load(runtime, Plane::Data, loaded).map_err(|e| e.to_string())?;
            let r = conformance::check_quota_stage(Plane::Data, &m).map_err(|e| e.to_string())?;
            (TenantModule::Quota(m), r)
        }
        other => {
            return Err(format!(
                "projects cannot install a module for the {other} stage"
            ));
        }
    };
    Ok((
        Installed {
            digest,
            config: config.to_owned(),
            module,
        },
        report,
    ))
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

/// One project's modules and its concurrency gate.
#[derive(Debug)]
struct ProjectModules {
    cors: Option<Arc<Installed>>,
    quota: Option<Arc<Installed>>,
    gate: Arc<Semaphore>,
}

impl ProjectModules {
    fn get(&self, stage: Stage) -> Option<&Arc<Installed>> {
        match stage {
            Stage::Cors => self.cors.as_ref(),
            Stage::Quota => self.quota.as_ref(),
            _ => None,
        }
    }
}

type Key = (String, Stage);

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
    max_module_bytes: usize,
    /// Load refusals by digest, stage and configuration.
    refused: moka::sync::Cache<String, String>,
    metrics: Metrics,
}

fn refusal_key(digest: &str, stage: Stage, config: &str) -> String {
    format!("{digest}/{stage}/{}", digest_of(config.as_bytes()))
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
            max_module_bytes: settings.tenant_max_module_bytes,
            refused: moka::sync::Cache::builder()
                .max_capacity(10_000)
                .time_to_live(Duration::from_secs(settings.tenant_refused_retry_secs))
                .build(),
            metrics,
        }
    }

    fn lookup(&self, project: &str, stage: Stage) -> Option<(Arc<Installed>, Arc<Semaphore>)> {
        let map = self.map.load();
        if map.is_empty() {
            return None;
        }
        let modules = map.get(project)?;
        Some((modules.get(stage)?.clone(), modules.gate.clone()))
    }

    /// The project's module for `stage`, if it installed one.
    pub fn installed(&self, project: &str, stage: Stage) -> Option<Arc<Installed>> {
        self.lookup(project, stage).map(|(installed, _)| installed)
    }

    /// Digests of every module in force.
    pub fn digests(&self) -> HashSet<String> {
        self.map
            .load()
            .values()
            .flat_map(|m| [m.cors.as_ref(), m.quota.as_ref()])
            .flatten()
            .map(|i| i.digest.clone())
            .collect()
    }

    fn shed(&self, stage: Stage, busy: Busy) -> TenantCallError {
        self.metrics
            .tenant_calls_shed
            .with_label_values(&[stage.key()])
            .inc();
        TenantCallError::Busy(busy)
    }

    /// The project's CORS decision, when it installed a CORS module (run on the tenant pool).
    pub async fn decide_cors(
        &self,
        request_id: Option<&str>,
        project: &str,
        plane: Plane,
        input: CorsInput<'_>,
    ) -> Option<Result<CorsDecision, TenantCallError>> {
        let (installed, gate) = self.lookup(project, Stage::Cors)?;
        // Owned only for a project that has a module: the call runs on another thread.
        let query = CorsQuery::from(input);
        let request_id = request_id.map(str::to_owned);
        let result = self
            .pool
            .run(&gate, move || match &installed.module {
                TenantModule::Cors(stage) => {
                    stage.decide(request_id.as_deref(), plane, query.input())
                }
                TenantModule::Quota(_) => unreachable!("a cors slot holds a cors module"),
            })
            .await;
        Some(match result {
            Ok(decision) => decision.map_err(TenantCallError::Plugin),
            Err(busy) => Err(self.shed(Stage::Cors, busy)),
        })
    }

    /// The project's quota rule, when it installed a quota module (run on the tenant pool).
    pub async fn decide_quota(
        &self,
        request_id: Option<&str>,
        project: &str,
        method: &str,
        path: &str,
        route_group: &'static str,
        actor: &Actor,
    ) -> Option<Result<QuotaDecision, TenantCallError>> {
        let (installed, gate) = self.lookup(project, Stage::Quota)?;
        let (method, path, actor) = (method.to_owned(), path.to_owned(), actor.clone());
        let request_id = request_id.map(str::to_owned);
        let result = self
            .pool
            .run(&gate, move || match &installed.module {
                TenantModule::Quota(stage) => {
                    stage.decide(request_id.as_deref(), &method, &path, route_group, &actor)
                }
                TenantModule::Cors(_) => unreachable!("a quota slot holds a quota module"),
            })
            .await;
        Some(match result {
            Ok(decision) => decision.map_err(TenantCallError::Plugin),
            Err(busy) => Err(self.shed(Stage::Quota, busy)),
        })
    }

    /// A place for one upload, or `None` when `plugins.tenant_max_concurrent_uploads` are in
    /// progress.
    pub fn upload_permit(&self) -> Option<OwnedSemaphorePermit> {
        self.uploads.clone().try_acquire_owned().ok()
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
        let digest = digest_of(bytes);
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
    pub fn report(&self, project: &str, stage: Stage) -> Option<super::stats::ModuleReport> {
        let map = self.map.load();
        let installed = map.get(project)?.get(stage)?;
        Some(match &installed.module {
            TenantModule::Cors(m) => m.report(),
            TenantModule::Quota(m) => m.report(),
        })
    }

    pub fn reports(&self) -> Vec<(String, Stage, super::stats::ModuleReport)> {
        let mut out = Vec::new();
        for (project, modules) in self.map.load().iter() {
            for stage in [Stage::Cors, Stage::Quota] {
                if let Some(installed) = modules.get(stage) {
                    let report = match &installed.module {
                        TenantModule::Cors(m) => m.report(),
                        TenantModule::Quota(m) => m.report(),
                    };
                    out.push((project.clone(), stage, report));
                }
            }
        }
        out.sort_by(|a, b| (&a.0, a.1.to_string()).cmp(&(&b.0, b.1.to_string())));
        out
    }

    pub fn apply(&self, project: &str, stage: Stage, installed: Option<Installed>) {
        let installed = installed.map(Arc::new);
        let mut changes = self.changes.lock().unwrap_or_else(|p| p.into_inner());
        changes.seq += 1;
        let seq = changes.seq;
        changes.touched.insert((project.to_owned(), stage), seq);
        let current = self.map.load_full();
        let mut flat = flatten(&current);
        match installed {
            Some(i) => flat.insert((project.to_owned(), stage), i),
            None => flat.remove(&(project.to_owned(), stage)),
        };
        self.map.store(Arc::new(self.group(&current, flat)));
    }

    /// Groups modules by project, keeping each project's gate.
    fn group(
        &self,
        current: &HashMap<String, Arc<ProjectModules>>,
        flat: HashMap<Key, Arc<Installed>>,
    ) -> HashMap<String, Arc<ProjectModules>> {
        let mut grouped: HashMap<String, ProjectModules> = HashMap::new();
        for ((project, stage), installed) in flat {
            let entry = grouped
                .entry(project.clone())
                .or_insert_with(|| ProjectModules {
                    cors: None,
                    quota: None,
                    gate: current
                        .get(&project)
                        .map(|m| m.gate.clone())
                        .unwrap_or_else(|| self.pool.project_gate()),
                });
            match stage {
                Stage::Cors => entry.cors = Some(installed),
                Stage::Quota => entry.quota = Some(installed),
                _ => {}
            }
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
        let current = self.map.load_full();
        let current_flat = flatten(&current);
        let mut loaded: HashMap<Key, Arc<Installed>> = HashMap::new();
        for ProjectPolicyRecord {
            project_ref,
            stage,
            digest,
            config,
        } in records
        {
            let Some(stage) = tenant_stage(&stage) else {
                continue;
            };
            let key = (project_ref.clone(), stage);
            if let Some(existing) = current_flat.get(&key)
                && existing.digest == digest
                && existing.config == config
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
                    loaded.insert(key, Arc::new(prepared.installed));
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

fn flatten(map: &HashMap<String, Arc<ProjectModules>>) -> HashMap<Key, Arc<Installed>> {
    let mut flat = HashMap::new();
    for (project, modules) in map {
        for stage in [Stage::Cors, Stage::Quota] {
            if let Some(installed) = modules.get(stage) {
                flat.insert((project.clone(), stage), installed.clone());
            }
        }
    }
    flat
}
