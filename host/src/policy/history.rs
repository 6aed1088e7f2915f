//! The history of the policy modules in force (the control store's `policy_events`): every
//! install, delete and rollback of a project's module with the console user who made it, and
//! every change of the operator's modules — a reload, or an automatic rollback with its reason.
//!
//! Project changes are recorded by their handler after the change is made; operator changes,
//! which happen off any request (a reload, a rollback decided on a failing call), go through the
//! registry's queue to one writer task.

use chrono::Utc;

use super::{Policies, Stage};
use crate::control::{ControlStore, PolicyEventRecord};
use crate::plane::Plane;
use crate::stage::Mode;

/// The actor of changes made by the operator (configuration file, reload, automatic rollback).
pub const OPERATOR: &str = "operator";

/// What the registry hands to its writer task, off the request path.
#[derive(Debug, Clone)]
pub enum Queued {
    /// An operator change to record.
    Operator(PolicyEventRecord),
    /// A project's canary dropped for its failures (already out of force on this instance): it
    /// is removed from the store when the store still holds it, recorded, and announced to the
    /// other instances. `digest_before` is the canary's digest.
    CanaryDropped(PolicyEventRecord),
}

/// What a history event records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// A project installed a module (in force, or as a candidate).
    Install,
    /// A project removed its module.
    Delete,
    /// A candidate became the module in force.
    Promote,
    /// A candidate was dropped by its owner.
    Abort,
    /// A previous module was put back at its owner's request.
    Rollback,
    /// The operator's configuration was reloaded.
    OperatorReload,
    /// A module that failed too often was taken out of force by the gateway.
    AutomaticRollback,
}

impl Action {
    /// The action as the store keeps it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Action::Install => "install",
            Action::Delete => "delete",
            Action::Promote => "promote",
            Action::Abort => "abort",
            Action::Rollback => "rollback",
            Action::OperatorReload => "operator_reload",
            Action::AutomaticRollback => "automatic_rollback",
        }
    }
}

/// An event at now, in `enforce` mode.
#[expect(
    clippy::too_many_arguments,
    reason = "one field each, named at the call sites"
)]
pub fn event(
    actor: &str,
    project_ref: Option<&str>,
    plane: Plane,
    stage: Stage,
    action: Action,
    digest_before: Option<String>,
    digest_after: Option<String>,
    reason: Option<String>,
) -> PolicyEventRecord {
    PolicyEventRecord {
        at: Utc::now(),
        actor: actor.to_owned(),
        project_ref: project_ref.map(str::to_owned),
        stage: stage.key().to_owned(),
        plane: plane.as_str().to_owned(),
        action: action.as_str().to_owned(),
        digest_before,
        digest_after,
        mode: Mode::Enforce.as_str().to_owned(),
        reason: reason.map(|r| bounded(r, MAX_REASON_BYTES)),
        config: None,
    }
}

/// The longest reason an event keeps, in bytes (a reason may quote a module's error).
pub const MAX_REASON_BYTES: usize = 1024;

/// `text` cut to at most `max` bytes, at a character boundary.
fn bounded(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

/// Appends `event`; a store that cannot take it is logged (the change itself stands).
pub async fn record(store: &dyn ControlStore, event: &PolicyEventRecord) {
    if let Err(e) = store.append_policy_event(event).await {
        tracing::error!(
            error = %e,
            action = %event.action,
            stage = %event.stage,
            project = event.project_ref.as_deref().unwrap_or("-"),
            "policy history not recorded"
        );
    }
}

/// The digest of each stage module of both planes and of each candidate: (plane, stage, mode,
/// digest), the mode `enforce` for the modules in force.
fn digests(p: &Policies) -> Vec<(Plane, Stage, &'static str, String)> {
    let mut out = Vec::new();
    for plane in [Plane::Data, Plane::Management] {
        let mut candidates = Vec::new();
        for slot in p.plane(plane).slots() {
            if let Some(module) = slot.module() {
                out.push((
                    plane,
                    slot.stage(),
                    Mode::Enforce.as_str(),
                    module.digest().to_owned(),
                ));
            }
            if let Some((module, trying)) = slot.candidate() {
                candidates.push((
                    plane,
                    slot.stage(),
                    trying.trial.mode().as_str(),
                    module.digest().to_owned(),
                ));
            }
        }
        out.extend(candidates);
    }
    out
}

/// One operator event per module (in force, or a candidate) that differs between `before` and
/// `after`, in the mode it has after (before, for a candidate that is gone).
pub fn operator_changes(
    before: &Policies,
    after: &Policies,
    action: Action,
    reason: Option<&str>,
) -> Vec<PolicyEventRecord> {
    let (old, new) = (digests(before), digests(after));
    // A module in force and a candidate are separate slots of a stage.
    let slot = |mode: &str| mode == "enforce";
    let find = |list: &[(Plane, Stage, &'static str, String)], plane, stage, enforce| {
        list.iter()
            .find(|(p, s, m, _)| *p == plane && *s == stage && slot(m) == enforce)
            .map(|(_, _, m, d)| (*m, d.clone()))
    };
    let mut keys: Vec<(Plane, Stage, bool)> = Vec::new();
    for (p, s, m, _) in old.iter().chain(new.iter()) {
        if !keys.contains(&(*p, *s, slot(m))) {
            keys.push((*p, *s, slot(m)));
        }
    }
    keys.into_iter()
        .filter_map(|(plane, stage, enforce)| {
            let previous = find(&old, plane, stage, enforce);
            let next = find(&new, plane, stage, enforce);
            if previous.as_ref().map(|p| &p.1) == next.as_ref().map(|n| &n.1) {
                return None;
            }
            let mode = next
                .as_ref()
                .or(previous.as_ref())
                .map_or("enforce", |m| m.0);
            let mut e = event(
                OPERATOR,
                None,
                plane,
                stage,
                action,
                previous.map(|p| p.1),
                next.map(|n| n.1),
                reason.map(str::to_owned),
            );
            e.mode = mode.to_owned();
            Some(e)
        })
        .collect()
}
