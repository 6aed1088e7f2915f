//! Modules installed by projects (tenants) for the stages that allow it — the data plane's
//! `cors` and `quota`. Modules are checked when uploaded (size, compile time, exports,
//! configuration, conformance vectors), stored content-addressed in the control store, and
//! loaded off the request path; requests of that project then use them, other projects are
//! unaffected. A tenant module runs under the same memory and time limits as every module.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use sha2::{Digest, Sha256};

use super::conformance::{self, StageReport};
use super::{CorsStage, PolicyEngine, QuotaStage, Stage};
use crate::control::{ControlStore, ProjectPolicyRecord};
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

/// Limits of uploaded modules.
#[derive(Debug, Clone, Copy)]
pub struct UploadLimits {
    pub max_bytes: usize,
    pub max_compile: Duration,
}

/// SHA-256 of a module, hex.
pub fn digest_of(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Compiles and checks a module for `stage` of `project`; the module is not put in force.
/// The name of a project's module: this prefix and the project ref.
pub const TENANT_MODULE_PREFIX: &str = "tenant:";

pub fn prepare(
    runtime: &Arc<PolicyEngine>,
    project: &str,
    stage: Stage,
    bytes: &[u8],
    config: &str,
    limits: UploadLimits,
) -> Result<(Installed, StageReport), String> {
    if bytes.len() > limits.max_bytes {
        return Err(format!(
            "the module is {} bytes; at most {} are accepted",
            bytes.len(),
            limits.max_bytes
        ));
    }
    let started = Instant::now();
    let component = runtime.compile(bytes)?;
    let took = started.elapsed();
    if took > limits.max_compile {
        return Err(format!(
            "the module took {} ms to compile; at most {} ms are accepted",
            took.as_millis(),
            limits.max_compile.as_millis()
        ));
    }
    let digest = digest_of(bytes);
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

type Key = (String, Stage);

/// The tenant modules in force, by project and stage.
#[derive(Debug, Default)]
pub struct TenantPolicies {
    map: ArcSwap<HashMap<Key, Arc<Installed>>>,
}

impl TenantPolicies {
    fn get(&self, project: &str, stage: Stage) -> Option<Arc<Installed>> {
        let map = self.map.load();
        if map.is_empty() {
            return None;
        }
        map.get(&(project.to_owned(), stage)).cloned()
    }

    /// The project's CORS module, if it installed one.
    pub fn cors(&self, project: &str) -> Option<Arc<Installed>> {
        self.get(project, Stage::Cors)
    }

    /// The project's quota module, if it installed one.
    pub fn quota(&self, project: &str) -> Option<Arc<Installed>> {
        self.get(project, Stage::Quota)
    }

    /// Puts a module in force for a project.
    pub fn insert(&self, project: &str, stage: Stage, installed: Installed) {
        let installed = Arc::new(installed);
        self.map.rcu(|map| {
            let mut map = HashMap::clone(map);
            map.insert((project.to_owned(), stage), installed.clone());
            map
        });
    }

    /// Removes a project's module.
    pub fn remove(&self, project: &str, stage: Stage) {
        self.map.rcu(|map| {
            let mut map = HashMap::clone(map);
            map.remove(&(project.to_owned(), stage));
            map
        });
    }

    /// Brings the modules in force in line with the store: loads new or changed ones (off the
    /// request path), drops removed ones. A module that no longer loads is dropped with an
    /// error log (the project then uses the plane's module).
    pub async fn refresh(
        &self,
        store: &Arc<dyn ControlStore>,
        runtime: &Arc<PolicyEngine>,
        limits: UploadLimits,
    ) {
        let records = match store.project_policies().await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "tenant policies: store unavailable; keeping the modules in force");
                return;
            }
        };
        let current = self.map.load_full();
        let mut next: HashMap<Key, Arc<Installed>> = HashMap::new();
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
            if let Some(existing) = current.get(&key)
                && existing.digest == digest
                && existing.config == config
            {
                next.insert(key, existing.clone());
                continue;
            }
            let bytes = match store.module(&digest).await {
                Ok(Some(bytes)) => bytes,
                other => {
                    tracing::error!(project = %project_ref, %digest, ?other, "tenant module missing from the store");
                    continue;
                }
            };
            let runtime = runtime.clone();
            let project = project_ref.clone();
            let loaded = tokio::task::spawn_blocking(move || {
                prepare(&runtime, &project, stage, &bytes, &config, limits)
            })
            .await;
            match loaded {
                Ok(Ok((installed, _))) => {
                    next.insert(key, Arc::new(installed));
                }
                Ok(Err(reason)) => {
                    tracing::error!(project = %project_ref, stage = %stage, %reason, "tenant module refused");
                }
                Err(e) => tracing::error!(error = %e, "tenant module load task failed"),
            }
        }
        self.map.store(Arc::new(next));
    }
}
