//! A plane's slot for one stage: the module in force and the operator's candidate, if one is
//! tried ([`StageSlot`], erased as [`AnySlot`] where the host iterates over stages); and who
//! asks a slot for a decision ([`StageCall`]).

use std::any::Any;
use std::sync::Arc;

use super::rollout::{Candidate, Comparison};
use super::runtime::engine::{Owner, PolicyEngine};
use super::stages::conformance::{ConformanceError, StageReport};
use super::stages::{AnyModule, Module, ModuleSource, PolicyStage};
use super::{PluginError, Policies, Stage};
use crate::plane::Plane;
use crate::stage::Trial;

/// A plane's modules for stage `S`: the one in force and the operator's candidate, if one is
/// tried.
#[derive(Debug)]
pub struct StageSlot<S: PolicyStage> {
    /// The module in force.
    pub module: Arc<Module<S>>,
    /// The operator's candidate (`<stage>.candidate` in the configuration).
    pub candidate: Option<Arc<Candidate<S>>>,
}

impl<S: PolicyStage> Clone for StageSlot<S> {
    fn clone(&self) -> Self {
        Self {
            module: self.module.clone(),
            candidate: self.candidate.clone(),
        }
    }
}

impl<S: PolicyStage> StageSlot<S> {
    /// The candidate while it is tried (not aborted or dropped).
    pub fn tried(&self) -> Option<&Arc<Candidate<S>>> {
        self.candidate.as_ref().filter(|c| !c.is_dropped())
    }
}

/// What the host reads of an operator's candidate, whatever its stage.
pub trait AnyCandidate: Send + Sync + std::fmt::Debug {
    /// The candidate's module.
    fn module(&self) -> &dyn AnyModule;
    /// How it is tried.
    fn trial(&self) -> Trial;
    /// A shadow's comparison with the enforced decisions.
    fn comparison(&self) -> &Comparison;
    /// Whether it was aborted or dropped.
    fn is_dropped(&self) -> bool;
    /// Stops trying it; false when it already was.
    fn drop_now(&self) -> bool;
}

impl<S: PolicyStage> AnyCandidate for Candidate<S> {
    fn module(&self) -> &dyn AnyModule {
        &*self.module
    }
    fn trial(&self) -> Trial {
        self.trial
    }
    fn comparison(&self) -> &Comparison {
        &self.comparison
    }
    fn is_dropped(&self) -> bool {
        Candidate::is_dropped(self)
    }
    fn drop_now(&self) -> bool {
        Candidate::drop_now(self)
    }
}

/// A plane's slot for one stage, whatever the stage: what the host iterates over (reports,
/// history, conformance, promotion). [`super::PlanePolicies::slot`] gives the typed slot back.
pub trait AnySlot: Send + Sync + std::fmt::Debug {
    /// The typed [`StageSlot`].
    fn as_any(&self) -> &dyn Any;
    /// The stage.
    fn stage(&self) -> Stage;
    /// The module in force.
    fn module(&self) -> &dyn AnyModule;
    /// The operator's candidate, tried or not.
    fn candidate(&self) -> Option<&dyn AnyCandidate>;
    /// The conformance vectors on the module in force, then on the candidate.
    fn conformance(&self) -> Result<Vec<StageReport>, ConformanceError>;
    /// This slot with its candidate (still tried) as the module in force, the candidate slot
    /// emptied; `None` without one.
    fn promoted(&self) -> Option<Arc<dyn AnySlot>>;
}

impl<S: PolicyStage> AnySlot for StageSlot<S> {
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn stage(&self) -> Stage {
        S::STAGE
    }
    fn module(&self) -> &dyn AnyModule {
        &*self.module
    }
    fn candidate(&self) -> Option<&dyn AnyCandidate> {
        self.candidate.as_deref().map(|c| c as &dyn AnyCandidate)
    }
    fn conformance(&self) -> Result<Vec<StageReport>, ConformanceError> {
        let mut reports = vec![S::conformance(&self.module)?];
        if let Some(c) = &self.candidate {
            reports.push(S::conformance(&c.module)?);
        }
        Ok(reports)
    }
    fn promoted(&self) -> Option<Arc<dyn AnySlot>> {
        let candidate = self.tried()?;
        Some(Arc::new(StageSlot::<S> {
            module: candidate.module.clone(),
            candidate: None,
        }))
    }
}

/// Loads `S`'s slot of `plane` from its module (in force) and its candidate's, if any.
pub(crate) fn load_slot<S: PolicyStage>(
    runtime: &Arc<PolicyEngine>,
    plane: Plane,
    module: ModuleSource,
    candidate: Option<(ModuleSource, Trial)>,
) -> Result<Arc<dyn AnySlot>, PluginError> {
    let module = Arc::new(Module::<S>::load(runtime, plane, module, Owner::Operator)?);
    let candidate = match candidate {
        None => None,
        Some((source, trial)) => {
            // Marked a candidate: its failures drop it alone.
            let loaded = Module::<S>::load(runtime, plane, source, Owner::Candidate)?;
            Some(Arc::new(Candidate::new(loaded, trial)))
        }
    };
    Ok(Arc::new(StageSlot { module, candidate }))
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
