//! The one owner of the policy modules in force: both planes' module sets, the projects' own
//! modules, the snapshot a request pins, swap and rollback.
//!
//! Every stage decision of a request goes through here, so the choice between a project's own
//! module and the plane's is made in one place, and so is the fail-closed answer to a module
//! that fails: a swapped-in operator module failing too often is replaced by the previous set
//! (automatic rollback); a project's module never rolls back the operator's.

use std::net::IpAddr;
use std::sync::Arc;

use arc_swap::{ArcSwap, ArcSwapOption};

use super::history::Queued;
use super::rollout::{
    Candidate, Compared, OPERATOR_SCOPE, Trial, Tried, describe_cors, describe_quota, failure_kind,
    on_canary,
};
use super::stages::{CorsDecision, CorsInput, CorsQuery, QuotaDecision};
use super::tenants::{Installed, TenantCallError, TenantPolicies};
use super::{PluginError, Policies, PolicyEngine, Stage};
use crate::actor::Actor;
use crate::control::PolicyEventRecord;
use crate::error::GatewayError;
use crate::metrics::Metrics;
use crate::plane::Plane;
use crate::ratelimit::rules::RuleSource;

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
    fn canary_failed(&self, project: &str, stage: Stage, canary: &Installed, error: &PluginError) {
        if !canary.failing_too_often()
            || !self.tenants.drop_candidate(project, stage, &canary.digest)
        {
            return;
        }
        let event = self.canary_dropped(Some(project), Plane::Data, stage, &canary.digest, error);
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
    pub fn plugin_failed(&self, module: &impl Tried, error: &PluginError) -> GatewayError {
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

    /// The CORS decision for a request of `project` (when known): the project's own module on
    /// the data plane when it installed one (run on the tenant pool), the plane's otherwise.
    ///
    /// When the project tries a candidate: a canary decides instead for the clients (by
    /// address: a browser's preflight and its request are on the same side) on its share; a
    /// shadow runs after the decision, off the request's path, and is compared with it.
    pub async fn cors(
        &self,
        pinned: &Policies,
        request_id: Option<&str>,
        plane: Plane,
        project: Option<&str>,
        client: Option<IpAddr>,
        input: CorsInput<'_>,
    ) -> Result<CorsDecision, GatewayError> {
        if let (Plane::Data, Some(project)) = (plane, project)
            && let Some((candidate, gate)) = self.tenants.candidate(project, Stage::Cors)
        {
            match candidate.trial {
                Some(Trial::Canary { percent })
                    if on_canary(project, Stage::Cors, &client_subject(client), percent) =>
                {
                    let result = self
                        .tenants
                        .run_cors(candidate.clone(), &gate, request_id, plane, input)
                        .await;
                    if let Err(TenantCallError::Plugin(e)) = &result {
                        self.canary_failed(project, Stage::Cors, &candidate, e);
                    }
                    return result.map_err(|e| self.tenant_call_failed(&e));
                }
                Some(Trial::Shadow) => {
                    let decision = self
                        .enforced_cors(pinned, request_id, plane, Some(project), client, input)
                        .await;
                    if let Ok(enforced) = &decision {
                        self.tenants
                            .shadow_cors(candidate, &gate, request_id, plane, input, enforced);
                    }
                    return decision;
                }
                _ => {}
            }
        }
        self.enforced_cors(pinned, request_id, plane, project, client, input)
            .await
    }

    /// The CORS decision of the module in force for the request.
    async fn enforced_cors(
        &self,
        pinned: &Policies,
        request_id: Option<&str>,
        plane: Plane,
        project: Option<&str>,
        client: Option<IpAddr>,
        input: CorsInput<'_>,
    ) -> Result<CorsDecision, GatewayError> {
        if let (Plane::Data, Some(project)) = (plane, project)
            && let Some(result) = self
                .tenants
                .decide_cors(request_id, project, plane, input)
                .await
        {
            return result.map_err(|e| self.tenant_call_failed(&e));
        }
        let pp = pinned.plane(plane);
        // The operator's candidate, for the requests the plane's module decides.
        if let Some(c) = pp.cors_candidate.as_ref().filter(|c| !c.is_dropped()) {
            match c.trial {
                Trial::Canary { percent }
                    if on_canary(
                        OPERATOR_SCOPE,
                        Stage::Cors,
                        &client_subject(client),
                        percent,
                    ) =>
                {
                    return c.stage.decide(request_id, plane, input).map_err(|e| {
                        self.operator_canary_failed(plane, Stage::Cors, c, &e);
                        GatewayError::policy_failed(Stage::Cors.key())
                    });
                }
                Trial::Shadow => {
                    let decision = pp
                        .cors
                        .decide(request_id, plane, input)
                        .map_err(|e| self.plugin_failed(pp.cors.as_ref(), &e))?;
                    c.comparison.count_in(|| {
                        self.tenants
                            .shadow_metrics
                            .series(plane, Stage::Cors, OPERATOR_SCOPE)
                    });
                    let compared = Compared::new(request_id, input.method, input.path);
                    let enforced = describe_cors(&decision);
                    let query = CorsQuery::from(input);
                    let runner = c.clone();
                    self.tenants.spawn_shadow(&c.comparison, None, move || {
                        let shadow = runner
                            .stage
                            .decide(Some(&compared.request_id), plane, query.input())
                            .map(|d| describe_cors(&d))
                            .map_err(|e| failure_kind(&e));
                        runner.comparison.record(compared, enforced, shadow);
                    });
                    return Ok(decision);
                }
                Trial::Canary { .. } => {}
            }
        }
        pp.cors
            .decide(request_id, plane, input)
            .map_err(|e| self.plugin_failed(pp.cors.as_ref(), &e))
    }

    /// An operator's canary failed a call: when it now fails too often on its share it is no
    /// longer tried (until the next reload), recorded with the reason.
    fn operator_canary_failed<S: Tried>(
        &self,
        plane: Plane,
        stage: Stage,
        canary: &Candidate<S>,
        error: &PluginError,
    ) {
        if !canary.stage.failing_too_often() || !canary.drop_now() {
            return;
        }
        let event = self.canary_dropped(None, plane, stage, canary.stage.digest(), error);
        self.record(vec![event]);
    }

    /// Stops trying the operator's candidate for `stage` of `plane` on this instance (until the
    /// next reload), recorded as an `abort`. False when none is being tried.
    pub fn abort_operator_candidate(&self, plane: Plane, stage: Stage) -> bool {
        let pinned = self.current.load_full();
        let pp = pinned.plane(plane);
        let (digest, mode) = match stage {
            Stage::Cors => match &pp.cors_candidate {
                Some(c) if c.drop_now() => (c.stage.digest().to_owned(), c.trial.mode().as_str()),
                _ => return false,
            },
            Stage::Quota => match &pp.quota_candidate {
                Some(c) if c.drop_now() => (c.stage.digest().to_owned(), c.trial.mode().as_str()),
                _ => return false,
            },
            Stage::ApiKey | Stage::DbRouting => return false,
        };
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

    /// The quota rule of a request, and whose module answered it.
    ///
    /// When the project tries a candidate: a canary decides instead for the actors (user, else
    /// API key) on its share; a shadow runs after the decision, off the request's path, and is
    /// compared with it.
    pub async fn quota(
        &self,
        pinned: &Policies,
        request_id: Option<&str>,
        actor: &Actor,
        method: &str,
        path: &str,
        route_group: &'static str,
    ) -> Result<(QuotaDecision, RuleSource), GatewayError> {
        if let (Plane::Data, Some(project)) = (actor.plane, actor.project.as_deref())
            && let Some((candidate, gate)) = self.tenants.candidate(project, Stage::Quota)
        {
            match candidate.trial {
                Some(Trial::Canary { percent })
                    if on_canary(project, Stage::Quota, &actor_subject(actor), percent) =>
                {
                    let result = self
                        .tenants
                        .run_quota(
                            candidate.clone(),
                            &gate,
                            request_id,
                            method,
                            path,
                            route_group,
                            actor,
                        )
                        .await;
                    if let Err(TenantCallError::Plugin(e)) = &result {
                        self.canary_failed(project, Stage::Quota, &candidate, e);
                    }
                    return result
                        .map(|d| (d, RuleSource::Tenant))
                        .map_err(|e| self.tenant_call_failed(&e));
                }
                Some(Trial::Shadow) => {
                    let decision = self
                        .enforced_quota(pinned, request_id, actor, method, path, route_group)
                        .await;
                    if let Ok((enforced, _)) = &decision {
                        self.tenants.shadow_quota(
                            candidate,
                            &gate,
                            request_id,
                            method,
                            path,
                            route_group,
                            actor,
                            enforced,
                        );
                    }
                    return decision;
                }
                _ => {}
            }
        }
        self.enforced_quota(pinned, request_id, actor, method, path, route_group)
            .await
    }

    /// The quota rule of the module in force for the request.
    async fn enforced_quota(
        &self,
        pinned: &Policies,
        request_id: Option<&str>,
        actor: &Actor,
        method: &str,
        path: &str,
        route_group: &'static str,
    ) -> Result<(QuotaDecision, RuleSource), GatewayError> {
        if let (Plane::Data, Some(project)) = (actor.plane, actor.project.as_deref())
            && let Some(result) = self
                .tenants
                .decide_quota(request_id, project, method, path, route_group, actor)
                .await
        {
            return result
                .map(|d| (d, RuleSource::Tenant))
                .map_err(|e| self.tenant_call_failed(&e));
        }
        let pp = pinned.plane(actor.plane);
        // The operator's candidate, for the requests the plane's module decides.
        if let Some(c) = pp.quota_candidate.as_ref().filter(|c| !c.is_dropped()) {
            match c.trial {
                Trial::Canary { percent }
                    if on_canary(OPERATOR_SCOPE, Stage::Quota, &actor_subject(actor), percent) =>
                {
                    return c
                        .stage
                        .decide(request_id, method, path, route_group, actor)
                        .map(|d| (d, RuleSource::Operator))
                        .map_err(|e| {
                            self.operator_canary_failed(actor.plane, Stage::Quota, c, &e);
                            GatewayError::policy_failed(Stage::Quota.key())
                        });
                }
                Trial::Shadow => {
                    let decision = pp
                        .quota
                        .decide(request_id, method, path, route_group, actor)
                        .map_err(|e| self.plugin_failed(pp.quota.as_ref(), &e))?;
                    let plane = actor.plane;
                    c.comparison.count_in(|| {
                        self.tenants
                            .shadow_metrics
                            .series(plane, Stage::Quota, OPERATOR_SCOPE)
                    });
                    let compared = Compared::new(request_id, method, path);
                    let enforced = describe_quota(&decision);
                    let (method, path, who) = (method.to_owned(), path.to_owned(), actor.clone());
                    let runner = c.clone();
                    self.tenants.spawn_shadow(&c.comparison, None, move || {
                        let shadow = runner
                            .stage
                            .decide(
                                Some(&compared.request_id),
                                &method,
                                &path,
                                route_group,
                                &who,
                            )
                            .map(|d| describe_quota(&d))
                            .map_err(|e| failure_kind(&e));
                        runner.comparison.record(compared, enforced, shadow);
                    });
                    return Ok((decision, RuleSource::Operator));
                }
                Trial::Canary { .. } => {}
            }
        }
        pp.quota
            .decide(request_id, method, path, route_group, actor)
            .map(|d| (d, RuleSource::Operator))
            .map_err(|e| self.plugin_failed(pp.quota.as_ref(), &e))
    }
}

/// The canary subject of a CORS decision: the client's address (the actor is not known yet on a
/// preflight).
fn client_subject(client: Option<IpAddr>) -> String {
    client.map_or_else(|| "-".to_owned(), |ip| ip.to_string())
}

/// The canary subject of a quota decision: the user, else the API key, else the address.
fn actor_subject(actor: &Actor) -> String {
    actor
        .user_id
        .clone()
        .or_else(|| actor.key_id.clone())
        .unwrap_or_else(|| client_subject(actor.client_ip))
}
