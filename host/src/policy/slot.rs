//! A stage's slot, whoever owns it: the module in force and a candidate tried next to it
//! ([`Slot`], erased as [`AnySlot`] where the host iterates over stages or projects). A plane
//! has one per stage (the operator's), and so has a project that installed modules of its own;
//! both are asked for a decision by the one algorithm of [`super::registry`], which differs by
//! owner only in where a call runs and what a failure does. [`StageCall`] is who asks.

use std::any::Any;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::rollout::{Comparison, ShadowSeries};
use super::runtime::engine::{Owner, PolicyEngine};
use super::stages::conformance::{ConformanceError, StageReport};
use super::stages::{AnyModule, Module, ModuleSource, PolicyStage};
use super::{PluginError, Policies, Stage};
use crate::plane::Plane;
use crate::stage::Trial;

/// How a candidate is tried, whatever its stage: the trial, a shadow's comparison with the
/// enforced decisions, and whether it was dropped (aborted, or failing too often on its share).
#[derive(Debug)]
pub struct Trying {
    pub trial: Trial,
    /// A shadow's comparison with the enforced decisions (unused by a canary).
    pub comparison: Comparison,
    dropped: AtomicBool,
}

impl Trying {
    /// Tried as `trial`, a shadow's disagreements counted in `series` (none: counted in the
    /// series the first shadow run names, [`Comparison::count_in`]).
    pub fn new(trial: Trial, series: Option<ShadowSeries>) -> Self {
        Self {
            trial,
            comparison: Comparison::new(series),
            dropped: AtomicBool::new(false),
        }
    }

    /// Whether it was aborted or dropped (it is then no longer tried).
    pub fn is_dropped(&self) -> bool {
        self.dropped.load(Ordering::Acquire)
    }

    /// Stops trying it; false when it already was.
    pub fn drop_now(&self) -> bool {
        !self.dropped.swap(true, Ordering::AcqRel)
    }
}

/// A module tried next to the one in force: the operator's (`<stage>.candidate` in the
/// configuration, tried until the next reload) or a project's (a shadow or canary it installed).
#[derive(Debug)]
pub struct Candidate<S: PolicyStage> {
    /// The candidate's module.
    pub module: Arc<Module<S>>,
    /// How it is tried.
    pub trying: Trying,
}

impl<S: PolicyStage> Candidate<S> {
    /// `module` tried as `trial`, a shadow's disagreements counted in `series`.
    pub fn new(module: Arc<Module<S>>, trial: Trial, series: Option<ShadowSeries>) -> Self {
        Self {
            module,
            trying: Trying::new(trial, series),
        }
    }
}

/// The modules of stage `S` of one owner: the one in force and a candidate, if one is tried. A
/// plane's slot always has a module in force; a project's may have a candidate alone (the
/// plane's module then decides beside it).
#[derive(Debug)]
pub struct Slot<S: PolicyStage> {
    /// The module in force.
    pub module: Option<Arc<Module<S>>>,
    /// The candidate.
    pub candidate: Option<Arc<Candidate<S>>>,
}

impl<S: PolicyStage> Clone for Slot<S> {
    fn clone(&self) -> Self {
        Self {
            module: self.module.clone(),
            candidate: self.candidate.clone(),
        }
    }
}

impl<S: PolicyStage> Slot<S> {
    /// The candidate while it is tried (not aborted or dropped).
    pub fn tried(&self) -> Option<&Arc<Candidate<S>>> {
        self.candidate.as_ref().filter(|c| !c.trying.is_dropped())
    }
}

/// A slot, whatever its stage: what the host iterates over (reports, history, conformance,
/// promotion, a project's modules). [`super::PlanePolicies::slot`] and
/// [`super::tenants::TenantPolicies::slot_for`] give the typed [`Slot`] back.
pub trait AnySlot: Send + Sync + std::fmt::Debug {
    /// The typed [`Slot`], borrowed.
    fn as_any(&self) -> &dyn Any;
    /// The typed [`Slot`], shared.
    fn into_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync>;
    /// The stage.
    fn stage(&self) -> Stage;
    /// The module in force.
    fn module(&self) -> Option<&dyn AnyModule>;
    /// The candidate, tried or not, and how it is tried.
    fn candidate(&self) -> Option<(&dyn AnyModule, &Trying)>;
    /// The conformance vectors on the module in force, then on the candidate.
    fn conformance(&self) -> Result<Vec<StageReport>, ConformanceError>;
    /// This slot with its candidate (still tried) as the module in force, the candidate slot
    /// emptied; `None` without one.
    fn promoted(&self) -> Option<Arc<dyn AnySlot>>;
    /// A slot whose candidate is this slot's module in force, tried as `trial` (a shadow's
    /// disagreements counted in `series`), with no module in force.
    fn tried_as(&self, trial: Trial, series: Option<ShadowSeries>) -> Arc<dyn AnySlot>;
    /// This slot's module in force with `other`'s candidate (a slot of the same stage).
    fn with_candidate_of(&self, other: &dyn AnySlot) -> Arc<dyn AnySlot>;
}

impl<S: PolicyStage> AnySlot for Slot<S> {
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn into_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync> {
        self
    }
    fn stage(&self) -> Stage {
        S::STAGE
    }
    fn module(&self) -> Option<&dyn AnyModule> {
        self.module.as_deref().map(|m| m as &dyn AnyModule)
    }
    fn candidate(&self) -> Option<(&dyn AnyModule, &Trying)> {
        self.candidate
            .as_deref()
            .map(|c| (&*c.module as &dyn AnyModule, &c.trying))
    }
    fn conformance(&self) -> Result<Vec<StageReport>, ConformanceError> {
        let mut reports = Vec::new();
        for module in self
            .module
            .iter()
            .chain(self.candidate.iter().map(|c| &c.module))
        {
            reports.push(S::conformance(module)?);
        }
        Ok(reports)
    }
    fn promoted(&self) -> Option<Arc<dyn AnySlot>> {
        let candidate = self.tried()?;
        Some(Arc::new(Slot::<S> {
            module: Some(candidate.module.clone()),
            candidate: None,
        }))
    }
    fn tried_as(&self, trial: Trial, series: Option<ShadowSeries>) -> Arc<dyn AnySlot> {
        Arc::new(Slot::<S> {
            module: None,
            candidate: self
                .module
                .clone()
                .map(|m| Arc::new(Candidate::new(m, trial, series))),
        })
    }
    fn with_candidate_of(&self, other: &dyn AnySlot) -> Arc<dyn AnySlot> {
        let candidate = other
            .as_any()
            .downcast_ref::<Slot<S>>()
            .and_then(|o| o.candidate.clone());
        Arc::new(Slot::<S> {
            module: self.module.clone(),
            candidate,
        })
    }
}

/// Loads `S`'s slot of `plane` from its module (in force) and its candidate's, if any.
pub(crate) fn load_slot<S: PolicyStage>(
    runtime: &Arc<PolicyEngine>,
    plane: Plane,
    module: ModuleSource,
    candidate: Option<(ModuleSource, Trial)>,
) -> Result<Arc<dyn AnySlot>, PluginError> {
    let module = Module::<S>::load(runtime, plane, module, Owner::Operator, false)?;
    let candidate = match candidate {
        None => None,
        Some((source, trial)) => {
            // Loaded as tried: its failures drop it alone.
            let loaded = Module::<S>::load(runtime, plane, source, Owner::Operator, true)?;
            Some(Arc::new(Candidate::new(Arc::new(loaded), trial, None)))
        }
    };
    Ok(Arc::new(Slot {
        module: Some(Arc::new(module)),
        candidate,
    }))
}

/// Who asks [`super::registry::PolicyRegistry::decide`] for a decision.
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
    /// When the request's plane received it
    /// ([`crate::phases::context::RequestContext::started`]): the decisions kept for it are
    /// judged young or old at this time, read once for all its stages.
    pub at: tokio::time::Instant,
}

impl StageCall<'_> {
    /// The project whose own modules of stage `S` may decide: a data-plane request of a known
    /// project, for a stage projects may install.
    pub(crate) fn tenant_project<S: PolicyStage>(&self) -> Option<&str> {
        if S::STAGE.info().tenant && self.plane == Plane::Data {
            self.project
        } else {
            None
        }
    }
}
