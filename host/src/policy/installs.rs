//! Changes to a project's modules, each written once as one transaction: install (in force, or
//! as a candidate tried next to the module in force), remove, promote, abort, and roll back.
//!
//! A transaction runs under the tenants' write lock, so the store write and the change on this
//! instance happen together and in the order of the requests (a refresh running meanwhile never
//! reverts them): it reads what is in force, writes the store, puts the change in force here,
//! records it in the history with the console user who made it, and announces it to the other
//! instances ([`super::registry::Announce`]), which bring their modules in line with the store at once. A module
//! is checked before any of that ([`super::tenants::TenantPolicies::prepare`]).
//!
//! The management plane's handlers ([`crate::planes::policies`]) parse a request, call one of
//! these, and answer.

use super::history::{self, Action};
use super::registry::PolicyRegistry;
use super::runtime::compile::CompileReport;
use super::stages::conformance::StageReport;
use super::tenants::{PrepareError, Role};
use crate::control::{
    HISTORY_KEPT, PolicyCandidateRecord, PolicyEventRecord, ProjectPolicyRecord, store_failed,
};
use crate::error::GatewayError;
use crate::plane::Plane;
use crate::stage::{Mode, Stage, Trial};

/// Where an installed module comes from.
#[derive(Debug)]
pub enum ModuleRef {
    /// Uploaded with the request.
    Upload(Vec<u8>),
    /// Already in the module store, by digest.
    Stored(String),
}

/// One install asked for.
#[derive(Debug)]
pub struct Install<'a> {
    pub project: &'a str,
    /// The stage's key as the route named it.
    pub stage: &'a str,
    pub module: ModuleRef,
    /// The stage configuration, JSON.
    pub config: String,
    /// `None`: put in force; otherwise tried as a candidate.
    pub trial: Option<Trial>,
    /// The console user making the change.
    pub actor: &'a str,
}

/// What an install did.
#[derive(Debug)]
pub struct Installed {
    pub digest: String,
    pub trial: Option<Trial>,
    /// The conformance vectors' run.
    pub check: StageReport,
    /// What compiling the module cost.
    pub compile: CompileReport,
}

/// The answer to a module that was not put in force, by its cause.
pub fn prepare_failed(e: PrepareError) -> GatewayError {
    match e {
        PrepareError::TooLarge { .. } => GatewayError::payload_too_large(e.to_string()),
        PrepareError::ConfigTooLarge { .. } => {
            GatewayError::too_large("config_too_large", e.to_string())
        }
        PrepareError::Refused(reason) => refused(reason),
        PrepareError::Unavailable(reason) => {
            GatewayError::unavailable("policy_check_unavailable", reason)
                .retry_after(std::time::Duration::from_secs(1))
        }
    }
}

/// A history event of a project's module, at now.
fn project_event(
    actor: &str,
    project: &str,
    stage: Stage,
    action: Action,
    before: Option<String>,
    after: Option<String>,
) -> PolicyEventRecord {
    history::event(
        actor,
        Some(project),
        Plane::Data,
        stage,
        action,
        before,
        after,
        None,
    )
}

/// The history event of a project's candidate dropped, in the candidate's mode.
fn abort_event(
    actor: &str,
    project: &str,
    stage: Stage,
    candidate: PolicyCandidateRecord,
) -> PolicyEventRecord {
    let mut event = project_event(
        actor,
        project,
        stage,
        Action::Abort,
        Some(candidate.digest),
        None,
    );
    event.mode = candidate.mode;
    event
}

fn refused(reason: impl Into<String>) -> GatewayError {
    GatewayError::bad_request("policy_refused", reason)
}

fn nothing_installed() -> GatewayError {
    GatewayError::not_found("no module installed for this stage")
}

fn no_candidate() -> GatewayError {
    GatewayError::conflict(
        "no_candidate",
        "no shadow or canary module is installed for this stage",
    )
}

impl PolicyRegistry {
    /// `404` unless `project` exists.
    pub async fn ensure_project(&self, project: &str) -> Result<(), GatewayError> {
        match self.store().project(project).await {
            Ok(Some(_)) => Ok(()),
            Ok(None) => Err(GatewayError::not_found("project not found")),
            Err(e) => Err(store_failed(&e)),
        }
    }

    /// Announces a change of `project`'s modules to the fleet.
    async fn announce(&self, project: &str) {
        if let Some(announce) = self.announcer() {
            announce.tenant_modules_changed(project).await;
        }
    }

    /// Installs a module for a project's stage (`action`: an install, or a rollback's).
    pub async fn install(
        &self,
        request: Install<'_>,
        action: Action,
    ) -> Result<Installed, GatewayError> {
        let Install {
            project,
            stage: stage_key,
            module,
            config,
            trial,
            actor,
        } = request;
        let stage = Stage::parse_tenant(stage_key).ok_or_else(|| {
            refused(format!(
                "projects cannot install a module for {stage_key:?}; stages: {}",
                Stage::tenant_keys()
            ))
        })?;
        self.ensure_project(project).await?;
        let store = self.store();
        let bytes = match module {
            ModuleRef::Upload(bytes) => bytes,
            ModuleRef::Stored(digest) => store
                .module(&digest)
                .await
                .map_err(|e| store_failed(&e))?
                .ok_or_else(|| GatewayError::not_found("no module with this digest"))?,
        };
        let max_config = self.tenants.max_config_bytes();
        if config.len() > max_config {
            return Err(prepare_failed(PrepareError::ConfigTooLarge {
                size: config.len(),
                max: max_config,
            }));
        }
        let prepared = self
            .tenants
            .prepare(project, stage, &bytes, &config)
            .await
            .map_err(prepare_failed)?;
        let digest = prepared.digest.clone();
        {
            let _write = self.tenants.write_lock().await;
            let before = match trial {
                None => store
                    .project_policy(project, stage_key)
                    .await
                    .map(|p| p.map(|p| p.digest)),
                Some(_) => store
                    .policy_candidate(project, stage_key)
                    .await
                    .map(|c| c.map(|c| c.digest)),
            }
            .map_err(|e| store_failed(&e))?;
            store
                .put_module(&digest, &bytes)
                .await
                .map_err(|e| store_failed(&e))?;
            match trial {
                None => {
                    store
                        .set_project_policy(&ProjectPolicyRecord {
                            project_ref: project.to_owned(),
                            stage: stage_key.to_owned(),
                            digest: digest.clone(),
                            config: config.clone(),
                        })
                        .await
                        .map_err(|e| store_failed(&e))?;
                    self.tenants.apply(project, stage, Some(prepared.installed));
                }
                Some(trial) => {
                    store
                        .set_policy_candidate(&PolicyCandidateRecord {
                            project_ref: project.to_owned(),
                            stage: stage_key.to_owned(),
                            digest: digest.clone(),
                            config: config.clone(),
                            mode: trial.mode().as_str().to_owned(),
                            percent: trial.percent(),
                        })
                        .await
                        .map_err(|e| store_failed(&e))?;
                    let series = self
                        .tenants
                        .shadow_metrics
                        .series(Plane::Data, stage, project);
                    let candidate = prepared.installed.tried_as(trial, Some(series));
                    self.tenants
                        .apply_as(project, stage, Role::Candidate, Some(candidate));
                }
            }
            let mut event =
                project_event(actor, project, stage, action, before, Some(digest.clone()));
            event.mode = Trial::mode_of(trial).as_str().to_owned();
            event.config = Some(config);
            history::record(store.as_ref(), &event).await;
        }
        self.announce(project).await;
        Ok(Installed {
            digest,
            trial,
            check: prepared.report,
            compile: prepared.compile,
        })
    }

    /// Removes a project's module for a stage (the project goes back to the plane's module),
    /// and its candidate with it.
    pub async fn remove(
        &self,
        project: &str,
        stage_key: &str,
        actor: &str,
    ) -> Result<(), GatewayError> {
        let stage = Stage::parse_tenant(stage_key).ok_or_else(nothing_installed)?;
        let store = self.store();
        {
            let _write = self.tenants.write_lock().await;
            let before = store
                .project_policy(project, stage_key)
                .await
                .map_err(|e| store_failed(&e))?
                .map(|p| p.digest);
            let candidate = store
                .policy_candidate(project, stage_key)
                .await
                .map_err(|e| store_failed(&e))?;
            let deleted = store
                .delete_project_policy(project, stage_key)
                .await
                .map_err(|e| store_failed(&e))?;
            let aborted = candidate.is_some()
                && store
                    .delete_policy_candidate(project, stage_key)
                    .await
                    .map_err(|e| store_failed(&e))?;
            if !deleted && !aborted {
                return Err(nothing_installed());
            }
            self.tenants.apply(project, stage, None);
            self.tenants.apply_as(project, stage, Role::Candidate, None);
            if let Some(c) = candidate.filter(|_| aborted) {
                let event = abort_event(actor, project, stage, c);
                history::record(store.as_ref(), &event).await;
            }
            if deleted {
                let event = project_event(actor, project, stage, Action::Delete, before, None);
                history::record(store.as_ref(), &event).await;
            }
        }
        self.announce(project).await;
        Ok(())
    }

    /// Makes a project's candidate the module in force, with its configuration; returns the
    /// candidate as it was.
    pub async fn promote(
        &self,
        project: &str,
        stage_key: &str,
        actor: &str,
    ) -> Result<PolicyCandidateRecord, GatewayError> {
        let stage = Stage::parse_tenant(stage_key).ok_or_else(no_candidate)?;
        self.ensure_project(project).await?;
        let store = self.store();
        let candidate = store
            .policy_candidate(project, stage_key)
            .await
            .map_err(|e| store_failed(&e))?
            .ok_or_else(no_candidate)?;
        let bytes = store
            .module(&candidate.digest)
            .await
            .map_err(|e| store_failed(&e))?
            .ok_or_else(|| GatewayError::not_found("the candidate's module is no longer stored"))?;
        // Loaded again as a module in force (its compilation is cached): the candidate's own
        // instance keeps its comparison until it is dropped.
        let prepared = self
            .tenants
            .prepare(project, stage, &bytes, &candidate.config)
            .await
            .map_err(prepare_failed)?;
        {
            let _write = self.tenants.write_lock().await;
            // Another change may have come first.
            let still = store
                .policy_candidate(project, stage_key)
                .await
                .map_err(|e| store_failed(&e))?;
            if still.as_ref() != Some(&candidate) {
                return Err(GatewayError::conflict(
                    "candidate_changed",
                    "the candidate changed meanwhile; read it again",
                ));
            }
            let before = store
                .project_policy(project, stage_key)
                .await
                .map_err(|e| store_failed(&e))?
                .map(|p| p.digest);
            store
                .set_project_policy(&ProjectPolicyRecord {
                    project_ref: project.to_owned(),
                    stage: stage_key.to_owned(),
                    digest: candidate.digest.clone(),
                    config: candidate.config.clone(),
                })
                .await
                .map_err(|e| store_failed(&e))?;
            store
                .delete_policy_candidate(project, stage_key)
                .await
                .map_err(|e| store_failed(&e))?;
            self.tenants.apply(project, stage, Some(prepared.installed));
            self.tenants.apply_as(project, stage, Role::Candidate, None);
            let mut event = project_event(
                actor,
                project,
                stage,
                Action::Promote,
                before,
                Some(candidate.digest.clone()),
            );
            event.config = Some(candidate.config.clone());
            history::record(store.as_ref(), &event).await;
        }
        self.announce(project).await;
        Ok(candidate)
    }

    /// Drops a project's candidate; the module in force stays.
    pub async fn abort(
        &self,
        project: &str,
        stage_key: &str,
        actor: &str,
    ) -> Result<(), GatewayError> {
        let stage = Stage::parse_tenant(stage_key).ok_or_else(no_candidate)?;
        self.ensure_project(project).await?;
        let store = self.store();
        {
            let _write = self.tenants.write_lock().await;
            let candidate = store
                .policy_candidate(project, stage_key)
                .await
                .map_err(|e| store_failed(&e))?
                .ok_or_else(no_candidate)?;
            store
                .delete_policy_candidate(project, stage_key)
                .await
                .map_err(|e| store_failed(&e))?;
            self.tenants.apply_as(project, stage, Role::Candidate, None);
            let event = abort_event(actor, project, stage, candidate);
            history::record(store.as_ref(), &event).await;
        }
        self.announce(project).await;
        Ok(())
    }

    /// Puts a previous module of a project's stage back (`digest`, or by default the module in
    /// force before the current one), with the configuration it had, through the same checks as
    /// an install.
    pub async fn roll_back_project(
        &self,
        project: &str,
        stage_key: &str,
        digest: Option<String>,
        actor: &str,
    ) -> Result<Installed, GatewayError> {
        self.ensure_project(project).await?;
        let store = self.store();
        // Only the modules that were in force: a shadow or canary never was. Listed without
        // their configurations; the one restored is read alone.
        let events: Vec<PolicyEventRecord> = store
            .policy_events(Some(project), Some(stage_key), HISTORY_KEPT)
            .await
            .map_err(|e| store_failed(&e))?
            .into_iter()
            .filter(|e| e.mode == Mode::Enforce.as_str())
            .collect();
        let current = store
            .project_policy(project, stage_key)
            .await
            .map_err(|e| store_failed(&e))?
            .map(|p| p.digest);
        let target = match digest {
            Some(digest) => digest,
            None => events
                .iter()
                .filter_map(|e| e.digest_before.clone())
                .find(|d| Some(d) != current.as_ref())
                .ok_or_else(|| {
                    GatewayError::conflict(
                        "no_previous_module",
                        "the history names no module before the one in force",
                    )
                })?,
        };
        drop(events);
        // The configuration the module had when it was last put in force.
        let config = store
            .policy_event_of(Some(project), stage_key, &target)
            .await
            .map_err(|e| store_failed(&e))?
            .ok_or_else(|| {
                GatewayError::conflict(
                    "not_in_history",
                    "this digest was never in force for this stage",
                )
            })?
            .config
            .unwrap_or_else(|| "{}".to_owned());
        let config = match serde_json::from_str::<serde_json::Value>(&config) {
            Ok(serde_json::Value::Null) | Err(_) => "{}".to_owned(),
            Ok(config) => config.to_string(),
        };
        self.install(
            Install {
                project,
                stage: stage_key,
                module: ModuleRef::Stored(target),
                config,
                trial: None,
                actor,
            },
            Action::Rollback,
        )
        .await
    }
}
