//! Control changes told to the whole fleet at once.
//!
//! Every instance subscribes to `{nats.subject_prefix}.gateway.changes` and publishes there what
//! it changed itself (a tenant module installed or removed, an operator reload requested; the
//! `keys` command publishes key creations and revocations). Changes made in PostgreSQL by anyone
//! else reach every instance through `LISTEN aura_control_changes`, fed by triggers that
//! `migrate` installs; the file store tells its own instance when the file changes. An instance
//! acts on a change at once: it forgets the cached key or project, reloads the project's modules,
//! or reloads its plugin sections. Cache lifetimes and the tenant refresh stay as they were, as
//! the fallback while NATS or the listener is down: nothing is ever less fresh than without
//! events.
//!
//! Events are hints, never authority: an event only makes an instance ask the control store
//! again (or re-read its own configuration file), so a forged event can cost a lookup, never
//! grant access. Payloads over [`MAX_EVENT_BYTES`] or that do not parse are dropped and counted.

use std::time::Duration;

use futures::StreamExt as _;
use serde::{Deserialize, Serialize};

use crate::state::AppState;

/// Largest change event read, in bytes.
pub const MAX_EVENT_BYTES: usize = 4096;

/// The PostgreSQL channel the control tables' triggers notify.
pub const PG_CHANNEL: &str = "aura_control_changes";

/// One change of the control data.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Change {
    /// An API key was created, revoked or deleted (its SHA-256, hex).
    ApiKey { key_sha256: String },
    /// A project's record changed (topology, PostgREST URL, plan…).
    Project { project_ref: String },
    /// An organization membership changed (roles are read on every request; kept for
    /// completeness and for caches to come).
    Membership {
        organization_id: String,
        user_id: String,
    },
    /// A project's own policy modules changed.
    TenantModules { project_ref: String },
    /// Every cached key and project may be stale (a control file replaced).
    Everything,
    /// The operator asked for a reload of the plugin sections.
    OperatorReload,
}

/// A change as published on NATS: with the instance that made it, which does not act twice.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Published {
    origin: String,
    #[serde(flatten)]
    change: Change,
}

/// The subject of the change events under `prefix`.
pub fn subject(prefix: &str) -> String {
    format!("{prefix}.gateway.changes")
}

/// Tells the fleet about `change` (best effort: without NATS, the others see it within their
/// cache lifetimes). The caller has already applied it locally.
pub async fn publish(state: &AppState, change: Change) {
    let message = Published {
        origin: state.instance_id.clone(),
        change,
    };
    let Ok(payload) = serde_json::to_vec(&message) else {
        return;
    };
    if let Err(e) = state
        .nats
        .publish(subject(&state.config.nats.subject_prefix), payload.into())
        .await
    {
        tracing::warn!(error = %e, "change event not published; other instances catch up by polling");
    }
}

/// Acts on a change on this instance. A peer's `everything` is refused before this.
pub async fn apply(state: &AppState, change: &Change, source: &'static str) {
    state
        .metrics
        .change_events
        .with_label_values(&[source, kind(change)])
        .inc();
    tracing::debug!(?change, source, "control change");
    match change {
        Change::ApiKey { key_sha256 } => {
            state.auth.forget_key(key_sha256).await;
        }
        Change::Project { project_ref } => state.auth.forget_project(project_ref).await,
        Change::Membership { .. } => {}
        Change::TenantModules { .. } => state.request_tenant_refresh(),
        Change::Everything => {
            state.auth.forget_all();
            state.request_tenant_refresh();
        }
        Change::OperatorReload => {
            let _ = crate::reload::reload_and_log(state, "fleet change event").await;
        }
    }
}

fn kind(change: &Change) -> &'static str {
    match change {
        Change::ApiKey { .. } => "api_key",
        Change::Project { .. } => "project",
        Change::Membership { .. } => "membership",
        Change::TenantModules { .. } => "tenant_modules",
        Change::Everything => "everything",
        Change::OperatorReload => "operator_reload",
    }
}

/// Parses an event payload, bounded; `None` (counted by the caller) when it is not one.
fn parse<T: serde::de::DeserializeOwned>(payload: &[u8]) -> Option<T> {
    if payload.len() > MAX_EVENT_BYTES {
        return None;
    }
    serde_json::from_slice(payload).ok()
}

/// Subscribes to the fleet's change events, and to PostgreSQL's notifications when the store
/// is PostgreSQL; both act on this instance. Runs until the state is dropped.
pub fn spawn(state: &AppState) {
    let weak = state.downgrade();
    let subject = subject(&state.config.nats.subject_prefix);
    let nats = state.nats.clone();
    tokio::spawn(async move {
        // The client resubscribes by itself after a reconnection.
        let mut subscription = loop {
            match nats.subscribe(subject.clone()).await {
                Ok(s) => break s,
                Err(e) => {
                    tracing::warn!(error = %e, "change events: cannot subscribe yet");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        };
        while let Some(message) = subscription.next().await {
            let Some(state) = weak.upgrade() else { break };
            match parse::<Published>(&message.payload) {
                Some(p) if p.origin == state.instance_id => {}
                // Emptying every cache is this instance's own decision (its store reloaded or
                // its listener reconnected), never a peer's: a flood of those would turn every
                // cached lookup into a store query.
                Some(p) if p.change != Change::Everything => apply(&state, &p.change, "nats").await,
                _ => state
                    .metrics
                    .change_events
                    .with_label_values(&["nats", "refused"])
                    .inc(),
            }
        }
    });
    if let Some(mut reloads) = state.auth.store.reloads() {
        let weak = state.downgrade();
        tokio::spawn(async move {
            while reloads.changed().await.is_ok() {
                let Some(state) = weak.upgrade() else { break };
                apply(&state, &Change::Everything, "file").await;
            }
        });
    }
    if let Some(pool) = state
        .auth
        .store
        .postgres_pool()
        .filter(|_| state.config.control.notifications)
    {
        let weak = state.downgrade();
        tokio::spawn(async move {
            loop {
                match sqlx::postgres::PgListener::connect_with(&pool).await {
                    Ok(mut listener) => {
                        if let Err(e) = listener.listen(PG_CHANNEL).await {
                            tracing::warn!(error = %e, "change events: LISTEN failed");
                        } else {
                            tracing::info!("change events: listening to PostgreSQL");
                            // A notification missed while disconnected is caught up by the
                            // caches' lifetimes; on reconnection, forget everything at once.
                            if let Some(state) = weak.upgrade() {
                                apply(&state, &Change::Everything, "postgres").await;
                            }
                            // `None` or an error: the connection was lost; reconnect.
                            while let Ok(Some(n)) = listener.try_recv().await {
                                let Some(state) = weak.upgrade() else { return };
                                match parse::<Change>(n.payload().as_bytes()) {
                                    Some(change) => apply(&state, &change, "postgres").await,
                                    None => state
                                        .metrics
                                        .change_events
                                        .with_label_values(&["postgres", "refused"])
                                        .inc(),
                                }
                            }
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "change events: cannot listen to PostgreSQL yet")
                    }
                }
                if weak.upgrade().is_none() {
                    return;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_parse_strictly_and_within_bounds() {
        let p: Published =
            parse(br#"{"origin":"a","kind":"api_key","key_sha256":"ab"}"#).expect("an event");
        assert_eq!(
            p.change,
            Change::ApiKey {
                key_sha256: "ab".into()
            }
        );
        assert!(parse::<Change>(br#"{"kind":"nonsense"}"#).is_none());
        assert!(parse::<Change>(br#"{"kind":"project"}"#).is_none());
        let big = format!(
            r#"{{"kind":"project","project_ref":"{}"}}"#,
            "x".repeat(MAX_EVENT_BYTES)
        );
        assert!(parse::<Change>(big.as_bytes()).is_none());
        assert_eq!(
            parse::<Change>(br#"{"kind":"tenant_modules","project_ref":"alpha"}"#),
            Some(Change::TenantModules {
                project_ref: "alpha".into()
            })
        );
    }
}
