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

/// An event at now, in `enforce` mode.
#[expect(
    clippy::too_many_arguments,
    reason = "one field each, named at the call sites"
)]
pub fn event(
    actor: &str,
    project_ref: Option<&str>,
    plane: Plane,
    stage: &str,
    action: &str,
    digest_before: Option<String>,
    digest_after: Option<String>,
    reason: Option<String>,
) -> PolicyEventRecord {
    PolicyEventRecord {
        at: Utc::now(),
        actor: actor.to_owned(),
        project_ref: project_ref.map(str::to_owned),
        stage: stage.to_owned(),
        plane: plane.as_str().to_owned(),
        action: action.to_owned(),
        digest_before,
        digest_after,
        mode: "enforce".to_owned(),
        reason,
        config: None,
    }
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

/// The digest of each stage module of both planes.
fn digests(p: &Policies) -> Vec<(Plane, Stage, String)> {
    let mut out = Vec::new();
    for plane in [Plane::Data, Plane::Management] {
        for stage in [Stage::ApiKey, Stage::Cors, Stage::Quota, Stage::DbRouting] {
            let pp = p.plane(plane);
            let digest = match stage {
                Stage::ApiKey => pp.api_key.as_ref().map(|s| s.digest().to_owned()),
                Stage::Cors => Some(pp.cors.digest().to_owned()),
                Stage::Quota => Some(pp.quota.digest().to_owned()),
                Stage::DbRouting => Some(pp.db_routing.digest().to_owned()),
            };
            if let Some(digest) = digest {
                out.push((plane, stage, digest));
            }
        }
    }
    out
}

/// One operator event per stage whose module differs between `before` and `after`.
pub fn operator_changes(
    before: &Policies,
    after: &Policies,
    action: &str,
    reason: Option<&str>,
) -> Vec<PolicyEventRecord> {
    let old = digests(before);
    digests(after)
        .into_iter()
        .filter_map(|(plane, stage, digest)| {
            let previous = old
                .iter()
                .find(|(p, s, _)| *p == plane && *s == stage)
                .map(|(_, _, d)| d.clone());
            (previous.as_deref() != Some(digest.as_str())).then(|| {
                event(
                    OPERATOR,
                    None,
                    plane,
                    stage.key(),
                    action,
                    previous,
                    Some(digest),
                    reason.map(str::to_owned),
                )
            })
        })
        .collect()
}
