//! The one owner of the policy modules in force: both planes' module sets, the projects' own
//! modules, the snapshot a request pins, swap and rollback.
//!
//! Every stage decision of a request goes through here, so the choice between a project's own
//! module and the plane's is made in one place, and so is the fail-closed answer to a module
//! that fails: a swapped-in operator module failing too often is replaced by the previous set
//! (automatic rollback); a project's module never rolls back the operator's.

use std::sync::Arc;

use arc_swap::{ArcSwap, ArcSwapOption};

use super::history::Queued;
use super::rollout::{Compared, OPERATOR_SCOPE, Trial, failure_kind, on_canary};
use super::stages::{AnyCandidate, AnyModule, PolicyStage};
use super::tenants::{AnyInstalled, TenantCallError, TenantPolicies};
use super::{PluginError, Policies, PolicyEngine, Stage};
use crate::control::PolicyEventRecord;
use crate::error::GatewayError;
use crate::metrics::Metrics;
use crate::plane::Plane;

/// The policy modules in force.
#[derive(Debug)]
pub struct PolicyRegistry {
    /// The plugin runtime.
    pub runtime: Arc<PolicyEngine>,
    current: ArcSwap<Policies>,
    previous: ArcSwapOption<Policies>,
    /// Modules installed by projects.
    pub tenants: TenantPolicies,
    metrics: Metrics,
    /// Where operator changes and dropped canaries go to be recorded ([`super::history`]).
    history: std::sync::OnceLock<tokio::sync::mpsc::UnboundedSender<Queued>>,
}

impl PolicyRegistry {
    /// A registry with `policies` in force.
    pub fn new(
        runtime: Arc<PolicyEngine>,
        policies: Policies,
        tenants: TenantPolicies,
        metrics: Metrics,
    ) -> Self {
        Self {
            runtime,
            current: ArcSwap::from_pointee(policies),
            previous: ArcSwapOption::empty(),
            tenants,
            metrics,
            history: std::sync::OnceLock::new(),
        }
    }

    /// Where operator changes are sent to be recorded from now on.
    pub fn set_history(&self, sender: tokio::sync::mpsc::UnboundedSender<Queued>) {
        let _ = self.history.set(sender);
    }

    /// Queues operator changes for the history.
    fn record(&self, events: Vec<PolicyEventRecord>) {
        if let Some(sender) = self.history.get() {
            for event in events {
                let _ = sender.send(Queued::Operator(event));
            }
        }
    }

    /// A project's canary failed a call: when it now fails too often on its share, it is taken
    /// out of force here at once and queued to be removed from the store and recorded.
    fn canary_failed(
        &self,
        project: &str,
        stage: Stage,
        canary: &dyn AnyInstalled,
        error: &PluginError,
    ) {
        if !canary.failing_too_often()
            || !self.tenants.drop_candidate(project, stage, canary.digest())
        {
            return;
        }
        let event = self.canary_dropped(Some(project), Plane::Data, stage, canary.digest(), error);
        if let Some(sender) = self.history.get() {
            let _ = sender.send(Queued::CanaryDropped(event));
        }
    }

    /// Logs and counts a canary (a project's, or the operator's: `project` none) dropped for
    /// `error`, and gives its history event.
    fn canary_dropped(
        &self,
        project: Option<&str>,
        plane: Plane,
        stage: Stage,
        digest: &str,
        error: &PluginError,
    ) -> PolicyEventRecord {
        let reason = format!("the canary fails too often on its share: {error}");
        tracing::error!(
            project = project.unwrap_or("-"),
            plane = %plane,
            stage = %stage,
            digest,
            %reason,
            "a canary module was dropped; the module in force decides for everyone"
        );
        self.metrics
            .policy_reloads
            .with_label_values(&["canary_dropped"])
            .inc();
        let mut event = super::history::event(
            super::history::OPERATOR,
            project,
            plane,
            stage.key(),
            "automatic_rollback",
            Some(digest.to_owned()),
            None,
            Some(reason),
        );
        event.mode = "canary".to_owned();
        event
    }

    /// The modules in force now: a request pins these for its whole life, so that every stage
    /// of it runs on the modules it started with.
    pub fn snapshot(&self) -> Arc<Policies> {
        self.current.load_full()
    }

    /// The modules a rollback would put back, if any.
    pub fn rollback_candidate(&self) -> Option<Arc<Policies>> {
        self.previous.load_full()
    }

    /// Puts `policies` in force atomically; the ones replaced are kept for a rollback.
    pub fn swap(&self, policies: Policies) {
        policies.reset_health();
        let new = Arc::new(policies);
        let old = self.current.swap(new.clone());
        self.record(super::history::operator_changes(
            &old,
            &new,
            "operator_reload",
            None,
        ));
        self.previous.store(Some(old));
    }

    /// Puts the previous modules back in force. False when there is nothing to roll back to.
    pub fn roll_back(&self) -> bool {
        match self.previous.swap(None) {
            Some(previous) => {
                previous.reset_health();
                self.current.store(previous);
                true
            }
            None => false,
        }
    }

    /// Puts the previous modules back in force at the operator's request (the admin route),
    /// recorded as a `rollback`. False when there is nothing to roll back to.
    pub fn roll_back_by_operator(&self) -> bool {
        let before = self.current.load_full();
        if !self.roll_back() {
            return false;
        }
        let after = self.current.load_full();
        self.record(super::history::operator_changes(
            &before, &after, "rollback", None,
        ));
        tracing::warn!("the operator rolled the policy modules back to the previous set");
        true
    }

    /// The fail-closed answer to a failed call of `module`, the operator's module in force for
    /// its stage (the call was counted and logged by the runtime). When it now fails too often,
    /// the previous set is put back in force here, where the failure happens.
    pub fn plugin_failed(&self, module: &dyn AnyModule, error: &PluginError) -> GatewayError {
        let before = self.current.load_full();
        if module.failing_too_often() && self.roll_back() {
            self.record(super::history::operator_changes(
                &before,
                &self.current.load(),
                "automatic_rollback",
                Some(&format!("the module fails too often: {error}")),
            ));
            tracing::error!(
                error = %error,
                "a swapped-in policy module fails too often; the previous modules are back in force"
            );
            self.metrics
                .policy_reloads
                .with_label_values(&["rolled_back"])
                .inc();
        }
        GatewayError::policy_failed(error.stage().map(|s| s.key()).unwrap_or("unknown"))
    }

    /// The fail-closed answer to a project's module call that gave no decision: the module
    /// failed (`500 policy_failed`), or the project's modules are saturated (`503 policy_busy`).
    pub fn tenant_call_failed(&self, error: &TenantCallError) -> GatewayError {
        match error {
            TenantCallError::Plugin(e) => {
                GatewayError::policy_failed(e.stage().map(|s| s.key()).unwrap_or("unknown"))
            }
            TenantCallError::Busy(_) => GatewayError::policy_busy(),
        }
    }

    /// The decision of stage `S` for one request: the one algorithm every stage's decision
    /// goes through.
    ///
    /// In order: a project's candidate (data plane, a stage projects may install): a canary
    /// decides instead for the callers on its share ([`PolicyStage::subject`]), a shadow runs
    /// after the enforced decision, off the request's path, and is compared with it; then the
    /// module in force ([`Self::enforced`]). A failed call fails the request closed, and the
    /// failing module is dealt with where it sits: a candidate is dropped when it fails too
    /// often, a project's module fails that project's requests only, the operator's module in
    /// force is rolled back.
    pub async fn decide<S: PolicyStage>(
        &self,
        call: &StageCall<'_>,
        input: S::Input<'_>,
    ) -> Result<(S::Decision, Source), GatewayError> {
        if let Some(project) = call.tenant_project::<S>()
            && let Some((candidate, gate)) = self.tenants.candidate_for::<S>(project)
        {
            match candidate.trial {
                Some(Trial::Canary { percent })
                    if on_canary(project, S::STAGE, &S::subject(&input), percent) =>
                {
                    let result = self
                        .tenants
                        .run(candidate.clone(), &gate, call.request_id, input)
                        .await;
                    if let Err(TenantCallError::Plugin(e)) = &result {
                        self.canary_failed(project, S::STAGE, &*candidate, e);
                    }
                    return result
                        .map(|d| (d, Source::Tenant))
                        .map_err(|e| self.tenant_call_failed(&e));
                }
                Some(Trial::Shadow) => {
                    let decision = self.enforced::<S>(call, input).await;
                    if let Ok((enforced, _)) = &decision {
                        self.tenants
                            .shadow(candidate, &gate, call.request_id, input, enforced);
                    }
                    return decision;
                }
                _ => {}
            }
        }
        self.enforced::<S>(call, input).await
    }

    /// The decision of the module in force for the request: the project's own (run on the
    /// tenant pool), else the plane's — or the operator's candidate, when one is tried: a canary
    /// decides instead for the callers on its share, a shadow runs after the decision and is
    /// compared with it.
    async fn enforced<S: PolicyStage>(
        &self,
        call: &StageCall<'_>,
        input: S::Input<'_>,
    ) -> Result<(S::Decision, Source), GatewayError> {
        if let Some(project) = call.tenant_project::<S>()
            && let Some((installed, gate)) = self.tenants.installed_for::<S>(project)
        {
            return self
                .tenants
                .run(installed, &gate, call.request_id, input)
                .await
                .map(|d| (d, Source::Tenant))
                .map_err(|e| self.tenant_call_failed(&e));
        }
        let plane = call.plane;
        let slot = call.pinned.plane(plane).slot::<S>().ok_or_else(|| {
            GatewayError::internal(format!("the {plane} plane has no {} stage", S::STAGE))
        })?;
        let decided = |d| (d, Source::Operator);
        if let Some(c) = slot.tried() {
            match c.trial {
                Trial::Canary { percent }
                    if on_canary(OPERATOR_SCOPE, S::STAGE, &S::subject(&input), percent) =>
                {
                    return c
                        .module
                        .decide(call.request_id, input)
                        .map(decided)
                        .map_err(|e| {
                            self.operator_canary_failed(plane, S::STAGE, &**c, &e);
                            GatewayError::policy_failed(S::STAGE.key())
                        });
                }
                Trial::Shadow => {
                    let decision = slot
                        .module
                        .decide(call.request_id, input)
                        .map_err(|e| self.plugin_failed(&*slot.module, &e))?;
                    c.comparison.count_in(|| {
                        self.tenants
                            .shadow_metrics
                            .series(plane, S::STAGE, OPERATOR_SCOPE)
                    });
                    let (method, path) = S::request_line(&input);
                    let compared = Compared::new(call.request_id, method, path);
                    let enforced = S::describe(&decision);
                    let query = S::query(input);
                    let runner = c.clone();
                    self.tenants.spawn_shadow(&c.comparison, None, move || {
                        let shadow = runner
                            .module
                            .decide(Some(&compared.request_id), S::input(&query))
                            .map(|d| S::describe(&d))
                            .map_err(|e| failure_kind(&e));
                        runner.comparison.record(compared, enforced, shadow);
                    });
                    return Ok(decided(decision));
                }
                Trial::Canary { .. } => {}
            }
        }
        slot.module
            .decide(call.request_id, input)
            .map(decided)
            .map_err(|e| self.plugin_failed(&*slot.module, &e))
    }

    /// An operator's canary failed a call: when it now fails too often on its share it is no
    /// longer tried (until the next reload), recorded with the reason.
    fn operator_canary_failed(
        &self,
        plane: Plane,
        stage: Stage,
        canary: &dyn AnyCandidate,
        error: &PluginError,
    ) {
        if !canary.module().failing_too_often() || !canary.drop_now() {
            return;
        }
        let event = self.canary_dropped(None, plane, stage, canary.module().digest(), error);
        self.record(vec![event]);
    }

    /// Stops trying the operator's candidate for `stage` of `plane` on this instance (until the
    /// next reload), recorded as an `abort`. False when none is being tried.
    pub fn abort_operator_candidate(&self, plane: Plane, stage: Stage) -> bool {
        let pinned = self.current.load_full();
        let Some(candidate) = pinned
            .plane(plane)
            .any_slot(stage)
            .and_then(|slot| slot.candidate())
            .filter(|c| c.drop_now())
        else {
            return false;
        };
        let (digest, mode) = (
            candidate.module().digest().to_owned(),
            candidate.trial().mode().as_str(),
        );
        let mut event = super::history::event(
            super::history::OPERATOR,
            None,
            plane,
            stage.key(),
            "abort",
            Some(digest),
            None,
            None,
        );
        event.mode = mode.to_owned();
        self.record(vec![event]);
        true
    }

    /// Makes the operator's candidate for `stage` of `plane` the module in force on this
    /// instance (until the next reload), recorded as a `promote`; the set it replaces is kept
    /// for a rollback. False when none is being tried.
    pub fn promote_operator_candidate(&self, plane: Plane, stage: Stage) -> bool {
        let before = self.current.load_full();
        let Some(next) = before.promoted(plane, stage) else {
            return false;
        };
        next.reset_health();
        let next = Arc::new(next);
        self.current.store(next.clone());
        self.previous.store(Some(before.clone()));
        let mut events = super::history::operator_changes(&before, &next, "promote", None);
        events
            .retain(|e| e.stage == stage.key() && e.plane == plane.as_str() && e.mode == "enforce");
        if events.is_empty() {
            // The candidate was the same module as the one in force.
            events.push(super::history::event(
                super::history::OPERATOR,
                None,
                plane,
                stage.key(),
                "promote",
                None,
                None,
                None,
            ));
        }
        self.record(events);
        tracing::warn!(plane = %plane, stage = %stage, "the operator's candidate module is now in force on this instance");
        true
    }
}

/// Whose module gave a decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The plane's (the operator's) module, or its candidate.
    Operator,
    /// The project's own module, or its candidate.
    Tenant,
}

/// Who asks [`PolicyRegistry::decide`] for a decision.
#[derive(Debug, Clone, Copy)]
pub struct StageCall<'a> {
    /// The modules the request pinned.
    pub pinned: &'a Policies,
    /// The request's id (for the plugin's log lines).
    pub request_id: Option<&'a str>,
    /// The plane of the request.
    pub plane: Plane,
    /// The request's project, when known.
    pub project: Option<&'a str>,
}

impl StageCall<'_> {
    /// The project whose own modules of stage `S` may decide: a data-plane request of a known
    /// project, for a stage projects may install.
    fn tenant_project<S: PolicyStage>(&self) -> Option<&str> {
        if S::STAGE.info().tenant && self.plane == Plane::Data {
            self.project
        } else {
            None
        }
    }
}
