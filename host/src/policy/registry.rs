//! The one owner of the policy modules in force: both planes' module sets, the projects' own
//! modules, the snapshot a request pins, swap and rollback.
//!
//! Every stage decision of a request goes through here, so the choice between a project's own
//! module and the plane's is made in one place, and so is the fail-closed answer to a module
//! that fails: a swapped-in operator module failing too often is replaced by the previous set
//! (automatic rollback); a project's module never rolls back the operator's.

use std::sync::Arc;

use arc_swap::{ArcSwap, ArcSwapOption};

use super::history::{Action, Queued};
use super::rollout::{OPERATOR_SCOPE, Trial, on_canary};
use super::runtime::isolation::Gate;
use super::slot::{Candidate, Slot, StageCall};
use super::stages::{AnyModule, Decided, Module, PolicyStage};
use super::tenants::{CallError, TenantPolicies};
use super::{PluginError, Policies, PolicyEngine, Stage};
use crate::control::{ControlStore, PolicyEventRecord};
use crate::error::GatewayError;
use crate::metrics::Metrics;
use crate::plane::Plane;
use crate::stage::Owner;

/// Loads of its project's modules one request may wait for: its first, and three more when a
/// sweep unloaded them right after each (then it fails closed, `503 policy_busy`).
const LOADS_PER_REQUEST: usize = 4;

/// The policy modules in force.
#[derive(Debug)]
pub struct PolicyRegistry {
    /// The plugin runtime.
    pub runtime: Arc<PolicyEngine>,
    current: ArcSwap<Policies>,
    previous: ArcSwapOption<Policies>,
    /// Modules installed by projects.
    pub tenants: TenantPolicies,
    /// Where projects' modules, their history and the stored modules are kept.
    store: Arc<dyn ControlStore>,
    /// Tells the other instances that a project's modules changed.
    announcer: std::sync::OnceLock<Arc<dyn Announce>>,
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
        store: Arc<dyn ControlStore>,
        metrics: Metrics,
    ) -> Self {
        Self {
            runtime,
            current: ArcSwap::from_pointee(policies),
            previous: ArcSwapOption::empty(),
            tenants,
            store,
            announcer: std::sync::OnceLock::new(),
            metrics,
            history: std::sync::OnceLock::new(),
        }
    }

    /// Where the registry counts what it does.
    pub(crate) fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The control store the registry keeps projects' modules and the history in.
    pub fn store(&self) -> &Arc<dyn ControlStore> {
        &self.store
    }

    /// Who tells the other instances of a change, from now on.
    pub fn set_announcer(&self, announcer: Arc<dyn Announce>) {
        let _ = self.announcer.set(announcer);
    }

    /// Who tells the other instances of a change, once set.
    pub(crate) fn announcer(&self) -> Option<&Arc<dyn Announce>> {
        self.announcer.get()
    }

    /// Brings the projects' modules in line with the store; false when the store did not
    /// answer ([`TenantPolicies::refresh`]).
    pub async fn refresh_tenants(&self) -> bool {
        self.tenants.refresh(&self.store).await
    }

    /// Reads `project`'s modules again (a change event named it) and reloads what changed of
    /// them, when the project is loaded here.
    pub async fn refresh_tenant_project(&self, project: &str) -> bool {
        self.tenants.refresh_project(&self.store, project).await
    }

    /// Starts the registry's tasks: the history writer, and the stored-module collection every
    /// `gc_every` (`configured`: the digests the operator's configuration names).
    pub fn spawn_tasks(
        self: &Arc<Self>,
        configured: Vec<String>,
        gc_every: std::time::Duration,
        gc_grace: std::time::Duration,
    ) {
        self.spawn_history_writer();
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                let Some(registry) = weak.upgrade() else {
                    break;
                };
                registry.collect_modules(&configured, gc_grace).await;
                drop(registry);
                tokio::time::sleep(gc_every).await;
            }
        });
        let weak = Arc::downgrade(self);
        let pressure = self.tenants.pressure();
        tokio::spawn(async move {
            use super::tenants::{IDLE_SWEEP_TICKS, Sweep, TICK};
            let mut every = tokio::time::interval(TICK);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut ticks = 0u64;
            loop {
                let (ticked, kind) = tokio::select! {
                    _ = every.tick() => {
                        ticks += 1;
                        (true, ticks.is_multiple_of(IDLE_SWEEP_TICKS).then_some(Sweep::Idle))
                    }
                    () = pressure.notified() => (false, Some(Sweep::Pressure)),
                };
                let Some(registry) = weak.upgrade() else {
                    break;
                };
                if ticked {
                    registry.tenants.tick();
                }
                let Some(kind) = kind.filter(|_| registry.tenants.over_budget()) else {
                    continue;
                };
                // Off the request workers: it walks every loaded project.
                let _ = tokio::task::spawn_blocking(move || registry.tenants.sweep(kind)).await;
            }
        });
    }

    /// Records the operator's policy changes (reloads, automatic rollbacks) in the control
    /// store, one at a time, in order; takes a project's canary dropped for its failures out of
    /// the store (when the store still holds that canary), records it and tells the other
    /// instances.
    fn spawn_history_writer(self: &Arc<Self>) {
        let (sender, mut events) = tokio::sync::mpsc::unbounded_channel();
        let _ = self.history.set(sender);
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            while let Some(queued) = events.recv().await {
                let Some(registry) = weak.upgrade() else {
                    break;
                };
                let store = registry.store.clone();
                match queued {
                    Queued::Operator(event) => {
                        super::history::record(store.as_ref(), &event).await;
                    }
                    Queued::CanaryDropped(event) => {
                        let project = event.project_ref.clone().unwrap_or_default();
                        {
                            let _write = registry.tenants.write_lock().await;
                            match store.policy_candidate(&project, &event.stage).await {
                                Ok(Some(c)) if Some(&c.digest) == event.digest_before.as_ref() => {
                                    if let Err(e) =
                                        store.delete_policy_candidate(&project, &event.stage).await
                                    {
                                        tracing::error!(error = %e, project, "the dropped canary is still in the store");
                                    }
                                }
                                Ok(_) => {}
                                Err(e) => {
                                    tracing::error!(error = %e, project, "the dropped canary is still in the store");
                                }
                            }
                            super::history::record(store.as_ref(), &event).await;
                        }
                        if let Some(announce) = registry.announcer() {
                            announce.tenant_modules_changed(&project).await;
                        }
                    }
                }
            }
        });
    }

    /// One pass of the stored-module collection: marks the stored modules this instance uses
    /// (`configured`, the operator's configuration's, and the projects' in force) as used, then
    /// collects the stored modules that no project references and no instance used for
    /// `grace` (`plugins.module_gc_grace_secs`).
    pub async fn collect_modules(&self, configured: &[String], grace: std::time::Duration) {
        let mut in_use: Vec<String> = self.tenants.digests().into_iter().collect();
        in_use.extend(configured.iter().cloned());
        if let Err(e) = self.store.touch_modules(&in_use).await {
            tracing::warn!(error = %e, "stored modules: cannot mark the ones in use; nothing collected");
            return;
        }
        match self.store.collect_modules(grace).await {
            Ok(collected) => {
                if !collected.is_empty() {
                    self.metrics
                        .modules_collected
                        .inc_by(collected.len() as u64);
                    tracing::info!(count = collected.len(), digests = ?collected, "unused stored modules collected");
                }
                self.collect_compiled(collected, grace).await;
            }
            Err(e) => tracing::warn!(error = %e, "stored modules: collection failed"),
        }
    }

    /// Removes the compile cache folder's files of the stored modules collected, and those
    /// compiled for an engine this gateway no longer runs, unchanged for `grace`; off the
    /// request workers.
    async fn collect_compiled(&self, collected: Vec<String>, grace: std::time::Duration) {
        let Some(disk) = self.runtime.tenant_disk().cloned() else {
            return;
        };
        let engines = [
            self.runtime.engine(Owner::Tenant).clone(),
            self.runtime.engine(Owner::Operator).clone(),
        ];
        let removed =
            tokio::task::spawn_blocking(move || disk.collect(&collected, &engines, grace))
                .await
                .unwrap_or(0);
        if removed > 0 {
            self.metrics.compiled_files_collected.inc_by(removed as u64);
            tracing::info!(count = removed, "compile cache files collected");
        }
    }

    /// Queues operator changes for the history.
    fn record(&self, events: Vec<PolicyEventRecord>) {
        if let Some(sender) = self.history.get() {
            for event in events {
                let _ = sender.send(Queued::Operator(event));
            }
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
            stage,
            Action::AutomaticRollback,
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
            Action::OperatorReload,
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
            &before,
            &after,
            Action::Rollback,
            None,
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
                Action::AutomaticRollback,
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

    /// `project`'s slot for stage `S` with its gate, when it installed a module for it; its
    /// stored modules are loaded first when this is its first request on this instance. A
    /// project whose modules cannot be loaded now fails the request closed (`503 policy_busy`):
    /// the plane's module never decides in place of a project's.
    async fn tenant_slot<S: PolicyStage>(
        &self,
        project: &str,
    ) -> Result<Option<(Arc<Slot<S>>, Gate)>, GatewayError> {
        // A project unloaded between its load and the look-up after it (a sweep under pressure)
        // is loaded again: its module is never skipped for it.
        for loads in 0..=LOADS_PER_REQUEST {
            if let Some(slot) = self.tenants.slot_for::<S>(project) {
                return Ok(Some(slot));
            }
            if self.tenants.loaded_or_unlisted(project) {
                // Its load put in force what the look-up after the flag sees.
                return Ok(self.tenants.slot_for::<S>(project));
            }
            if loads == LOADS_PER_REQUEST {
                break;
            }
            if let Err(reason) = self.tenants.ensure(&self.store, project).await {
                tracing::warn!(project, stage = %S::STAGE, %reason, "a project's modules cannot be loaded now; its request fails closed");
                return Err(GatewayError::policy_busy());
            }
        }
        tracing::warn!(project, stage = %S::STAGE, "a project's modules were unloaded after each of its loads; its request fails closed");
        Err(GatewayError::policy_busy())
    }

    /// The decision of stage `S` for one request: the one algorithm every stage's decision
    /// goes through, the same for the project's slot and the plane's.
    ///
    /// The project's slot (data plane, a stage projects may install) is asked first, then the
    /// plane's. In each: a candidate tried as a canary decides instead for the callers on its
    /// share ([`PolicyStage::subject`]); a shadow is noted; then the module in force decides.
    /// A project's slot without a module in force leaves the decision to the plane's. Once
    /// decided, each noted shadow runs off the request's path and is compared with the
    /// decision.
    ///
    /// The owner tells where a call runs (a project's on the tenant pool under its gate, the
    /// operator's inline) and what a failure does ([`Self::in_force_failed`],
    /// [`Self::candidate_failed`]); every failure fails the request closed.
    pub async fn decide<S: PolicyStage>(
        &self,
        call: &StageCall<'_>,
        input: S::Input<'_>,
    ) -> Result<(Decided<S>, Owner), GatewayError> {
        let plane = call.plane;
        let tenant = match call.tenant_project::<S>() {
            Some(project) => self
                .tenant_slot::<S>(project)
                .await?
                .map(|slot| (project, slot)),
            None => None,
        };
        let operator = call.pinned.plane(plane).slot::<S>().ok_or_else(|| {
            GatewayError::internal(format!("the {plane} plane has no {} stage", S::STAGE))
        })?;
        let asked = tenant
            .as_ref()
            .map(|&(project, (ref slot, ref gate))| (&**slot, Held::Tenant { project, gate }))
            .into_iter()
            .chain([(operator, Held::Operator)]);
        let mut shadows = Vec::new();
        let mut decided = None;
        for (slot, held) in asked {
            if let Some(candidate) = slot.tried() {
                match candidate.trying.trial {
                    Trial::Canary { percent }
                        if on_canary(held.scope(), S::STAGE, &S::subject(&input), percent) =>
                    {
                        let result = self.run(held, &candidate.module, call, input).await;
                        decided = Some(
                            result
                                .map(|d| (d, held.owner()))
                                .map_err(|e| self.candidate_failed(held, plane, candidate, e)),
                        );
                        break;
                    }
                    Trial::Shadow => shadows.push((candidate, held)),
                    Trial::Canary { .. } => {}
                }
            }
            if let Some(module) = &slot.module {
                let result = self.run(held, module, call, input).await;
                decided = Some(
                    result
                        .map(|d| (d, held.owner()))
                        .map_err(|e| self.in_force_failed(held, &**module, e)),
                );
                break;
            }
        }
        let (decision, owner) = decided.unwrap_or_else(|| {
            Err(GatewayError::internal(format!(
                "the {plane} plane's {} stage has no module in force",
                S::STAGE
            )))
        })?;
        for (candidate, held) in shadows {
            let comparison = &candidate.trying.comparison;
            comparison.count_in(|| {
                self.tenants
                    .shadow_metrics
                    .series(plane, S::STAGE, held.scope())
            });
            self.tenants
                .shadow(candidate, held.gate(), call.request_id, input, &decision);
        }
        Ok((decision, owner))
    }

    /// Runs `module` of `held`'s slot for the request: inline for the operator's, on the tenant
    /// pool under the project's gate for a project's.
    async fn run<S: PolicyStage>(
        &self,
        held: Held<'_>,
        module: &Arc<Module<S>>,
        call: &StageCall<'_>,
        input: S::Input<'_>,
    ) -> Result<Decided<S>, CallError> {
        match held {
            Held::Operator => module
                .decide_at(call.at, call.request_id, input)
                .map_err(CallError::Plugin),
            Held::Tenant { gate, .. } => self.tenants.run(module, gate, call, input).await,
        }
    }

    /// The fail-closed answer to a failed call of the module in force of `held`'s slot: a
    /// project's module fails that project's request only (`500 policy_failed`, or `503
    /// policy_busy` when the project's modules are saturated); the operator's, when it now fails
    /// too often, puts the previous set back in force ([`Self::plugin_failed`]).
    fn in_force_failed(
        &self,
        held: Held<'_>,
        module: &dyn AnyModule,
        error: CallError,
    ) -> GatewayError {
        match (held, error) {
            (Held::Operator, CallError::Plugin(e)) => self.plugin_failed(module, &e),
            (_, error) => failed(&error),
        }
    }

    /// The fail-closed answer to a failed call of `held`'s candidate: when it now fails too
    /// often on its share it is no longer tried — the operator's until the next reload, a
    /// project's removed from the store — and its drop is recorded with the reason.
    fn candidate_failed<S: PolicyStage>(
        &self,
        held: Held<'_>,
        plane: Plane,
        candidate: &Candidate<S>,
        error: CallError,
    ) -> GatewayError {
        let module: &dyn AnyModule = &*candidate.module;
        if let CallError::Plugin(e) = &error
            && module.failing_too_often()
            && candidate.trying.drop_now()
        {
            match held {
                Held::Operator => {
                    let event = self.canary_dropped(None, plane, S::STAGE, module.digest(), e);
                    self.record(vec![event]);
                }
                Held::Tenant { project, .. } => {
                    if self
                        .tenants
                        .drop_candidate(project, S::STAGE, module.digest())
                    {
                        let event =
                            self.canary_dropped(Some(project), plane, S::STAGE, module.digest(), e);
                        if let Some(sender) = self.history.get() {
                            let _ = sender.send(Queued::CanaryDropped(event));
                        }
                    }
                }
            }
        }
        failed(&error)
    }
    /// Stops trying the operator's candidate for `stage` of `plane` on this instance (until the
    /// next reload), recorded as an `abort`. False when none is being tried.
    pub fn abort_operator_candidate(&self, plane: Plane, stage: Stage) -> bool {
        let pinned = self.current.load_full();
        let Some((module, trying)) = pinned
            .plane(plane)
            .any_slot(stage)
            .and_then(|slot| slot.candidate())
            .filter(|(_, trying)| trying.drop_now())
        else {
            return false;
        };
        let (digest, mode) = (module.digest().to_owned(), trying.trial.mode().as_str());
        let mut event = super::history::event(
            super::history::OPERATOR,
            None,
            plane,
            stage,
            Action::Abort,
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
        let mut events = super::history::operator_changes(&before, &next, Action::Promote, None);
        events
            .retain(|e| e.stage == stage.key() && e.plane == plane.as_str() && e.mode == "enforce");
        if events.is_empty() {
            // The candidate was the same module as the one in force.
            events.push(super::history::event(
                super::history::OPERATOR,
                None,
                plane,
                stage,
                Action::Promote,
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

/// Tells the other instances that a project's modules changed (the fleet's change events).
#[async_trait::async_trait]
pub trait Announce: Send + Sync + std::fmt::Debug {
    /// `project`'s modules changed in the store.
    async fn tenant_modules_changed(&self, project: &str);
}

/// Whose slot is asked for a decision: what tells where its calls run and what its failures do.
#[derive(Debug, Clone, Copy)]
enum Held<'a> {
    /// The plane's: calls run inline.
    Operator,
    /// `project`'s: calls run on the tenant pool under the project's `gate`.
    Tenant { project: &'a str, gate: &'a Gate },
}

impl Held<'_> {
    fn owner(self) -> Owner {
        match self {
            Held::Operator => Owner::Operator,
            Held::Tenant { .. } => Owner::Tenant,
        }
    }

    /// The scope of its canaries' shares and shadows' series: the project, or [`OPERATOR_SCOPE`].
    fn scope(&self) -> &str {
        match self {
            Held::Operator => OPERATOR_SCOPE,
            Held::Tenant { project, .. } => project,
        }
    }

    /// Where its shadows run within: the project's share of the tenant pool, or none.
    fn gate(&self) -> Option<&Gate> {
        match self {
            Held::Operator => None,
            Held::Tenant { gate, .. } => Some(gate),
        }
    }
}

/// The fail-closed answer to a call that gave no decision: the module failed (`500
/// policy_failed`), or the project's modules are saturated (`503 policy_busy`).
fn failed(error: &CallError) -> GatewayError {
    match error {
        CallError::Plugin(e) => {
            GatewayError::policy_failed(e.stage().map(|s| s.key()).unwrap_or("unknown"))
        }
        CallError::Busy(_) => GatewayError::policy_busy(),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::config::{Config, StageConfig};
    use crate::policy::stages::{Cors, CorsDecision, CorsInput};
    use crate::policy::tenants::{Role, prepare_compiled};

    const IN_FORCE: &str = "https://in-force.example";
    const CANDIDATE: &str = "https://candidate.example";
    const TENANT: &str = "https://tenant.example";
    const TENANT_CANDIDATE: &str = "https://tenant-candidate.example";

    fn allowing(origin: &str) -> serde_json::Value {
        serde_json::json!({ "allow_origins": [origin] })
    }

    /// A registry whose data plane's CORS module allows [`IN_FORCE`] only, with an operator's
    /// candidate (allowing [`CANDIDATE`] only) tried as `trial`.
    fn registry(trial: Option<(&str, Option<u8>)>) -> Arc<PolicyRegistry> {
        let mut config = Config::default();
        // Room for a shadow of each of the four decisions at once: none is skipped.
        config.plugins.tenant_threads = 8;
        config.plugins.tenant_max_concurrent_calls = 8;
        let cors = &mut config.data_plane.plugins.cors;
        cors.config = allowing(IN_FORCE);
        cors.candidate = trial.map(|(mode, percent)| {
            Box::new(StageConfig {
                config: allowing(CANDIDATE),
                mode: Some(mode.to_owned()),
                percent,
                ..StageConfig::default()
            })
        });
        let runtime = PolicyEngine::new(&config.plugins).expect("engine");
        let policies = Policies::load(&runtime, &config, None).expect("policies");
        let metrics = Metrics::new();
        let tenants = TenantPolicies::new(runtime.clone(), &config.plugins, metrics.clone());
        let store: Arc<dyn ControlStore> = Arc::new(crate::control::file::FileStore::empty());
        Arc::new(PolicyRegistry::new(
            runtime, policies, tenants, store, metrics,
        ))
    }

    /// Installs the built-in CORS module for `project`, allowing `origin`, in force or as a
    /// candidate tried as `trial`.
    fn install(registry: &PolicyRegistry, project: &str, origin: &str, trial: Option<Trial>) {
        let bytes = Cors::BUILTIN;
        let component = registry
            .runtime
            .compile(Owner::Tenant, bytes)
            .expect("compiles");
        let (checked, _) = prepare_compiled(
            &registry.runtime,
            project,
            Stage::Cors,
            crate::policy::digest_of(bytes),
            component,
            &allowing(origin).to_string(),
        )
        .expect("checked");
        match trial {
            None => registry.tenants.apply(project, Stage::Cors, Some(checked)),
            Some(trial) => registry.tenants.apply_as(
                project,
                Stage::Cors,
                Role::Candidate,
                Some(checked.tried_as(trial, None)),
            ),
        }
    }

    /// Which origins the decision for `project` allows, of the four, and whose module gave it.
    async fn allowed(
        registry: &PolicyRegistry,
        project: Option<&str>,
    ) -> (Vec<&'static str>, Owner) {
        let pinned = registry.snapshot();
        let call = StageCall {
            pinned: &pinned,
            request_id: Some("test"),
            plane: Plane::Data,
            project,
            at: tokio::time::Instant::now(),
        };
        let mut out = Vec::new();
        let mut source = None;
        for origin in [IN_FORCE, CANDIDATE, TENANT, TENANT_CANDIDATE] {
            let input = CorsInput {
                method: "GET",
                path: "/v1/db/todos",
                origin,
                request_method: None,
                request_headers: None,
                client: Some("192.0.2.7".parse().expect("address")),
            };
            let (decision, from) = registry
                .decide::<Cors>(&call, input)
                .await
                .expect("decided");
            if matches!(*decision, CorsDecision::Allow(_)) {
                out.push(origin);
            }
            assert!(source.is_none_or(|s| s == from), "one source per project");
            source = Some(from);
        }
        (out, source.expect("four decisions"))
    }

    /// Waits (on the wall clock: shadows run on the tenant threads) until `report` shows `n`
    /// comparisons, and gives the last one.
    fn compared(
        report: impl Fn() -> crate::policy::rollout::ShadowReport,
        n: u64,
    ) -> crate::policy::rollout::ShadowReport {
        for _ in 0..2_000 {
            let r = report();
            if r.compared >= n {
                return r;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        panic!("the shadow ran {} times, not {n}", report().compared);
    }

    #[tokio::test(start_paused = true)]
    async fn one_algorithm_decides_in_force_canary_shadow_and_tenant_in_order() {
        // The module in force.
        let r = registry(None);
        assert_eq!(allowed(&r, None).await, (vec![IN_FORCE], Owner::Operator));

        // The operator's canary at 100 %: it decides for everyone the plane's module would.
        let r = registry(Some(("canary", Some(100))));
        assert_eq!(allowed(&r, None).await, (vec![CANDIDATE], Owner::Operator));
        // Aborted, the module in force decides again.
        assert!(r.abort_operator_candidate(Plane::Data, Stage::Cors));
        assert_eq!(allowed(&r, None).await, (vec![IN_FORCE], Owner::Operator));

        // The operator's shadow: the module in force decides, the shadow is compared off the
        // path and disagrees on the two origins one of them allows.
        let r = registry(Some(("shadow", None)));
        assert_eq!(allowed(&r, None).await, (vec![IN_FORCE], Owner::Operator));
        let pinned = r.snapshot();
        let slot = pinned.data.slot::<Cors>().expect("cors");
        let shadow = slot.candidate.clone().expect("candidate");
        let report = compared(|| shadow.trying.comparison.report(), 4);
        assert_eq!(
            (report.compared, report.disagreements, report.skipped),
            (4, 2, 0)
        );

        // A project's own module decides for that project only, on the tenant threads, before
        // the operator's candidate.
        install(&r, "alpha", TENANT, None);
        assert_eq!(
            allowed(&r, Some("alpha")).await,
            (vec![TENANT], Owner::Tenant)
        );
        assert_eq!(
            allowed(&r, Some("beta")).await,
            (vec![IN_FORCE], Owner::Operator)
        );
        let report = compared(|| shadow.trying.comparison.report(), 8);
        assert_eq!(
            report.compared, 8,
            "the operator's shadow ran for beta only"
        );

        // The project's canary at 100 % decides before the project's module.
        install(
            &r,
            "alpha",
            TENANT_CANDIDATE,
            Some(Trial::Canary { percent: 100 }),
        );
        assert_eq!(
            allowed(&r, Some("alpha")).await,
            (vec![TENANT_CANDIDATE], Owner::Tenant)
        );

        // The project's shadow: the project's module decides, its shadow is compared.
        install(&r, "alpha", TENANT_CANDIDATE, Some(Trial::Shadow));
        assert_eq!(
            allowed(&r, Some("alpha")).await,
            (vec![TENANT], Owner::Tenant)
        );
        let slot = r.tenants.slot("alpha", Stage::Cors).expect("a slot");
        let report = compared(
            || slot.candidate().expect("a shadow").1.comparison.report(),
            4,
        );
        assert_eq!(
            (report.compared, report.disagreements, report.skipped),
            (4, 2, 0)
        );

        // The management plane never runs a project's module.
        let pinned = r.snapshot();
        let call = StageCall {
            pinned: &pinned,
            request_id: None,
            plane: Plane::Management,
            project: Some("alpha"),
            at: tokio::time::Instant::now(),
        };
        let input = CorsInput {
            method: "GET",
            path: "/v1/db/todos",
            origin: TENANT,
            request_method: None,
            request_headers: None,
            client: None,
        };
        let (decision, source) = r.decide::<Cors>(&call, input).await.expect("decided");
        assert_eq!((&*decision, source), (&CorsDecision::Deny, Owner::Operator));
    }
}
