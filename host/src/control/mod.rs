//! The control store: projects, organizations, memberships and API keys (CONTRACT §6), behind
//! one trait with two implementations that behave the same: a declarative file ([`file`], the
//! DB-less default) and PostgreSQL ([`postgres`]).

pub mod file;
pub mod file_history;
pub mod postgres;
pub mod records;

use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use uuid::Uuid;

pub use records::{
    ApiKeyRecord, DbEngine, IssuerRecord, KeyRole, MAX_ISSUERS, MAX_REPLICAS, MemberRecord,
    OrgRole, OrganizationRecord, PolicyCandidateRecord, PolicyEventRecord, ProjectPolicyRecord,
    ProjectRecord, ReplicaRecord, Topology,
};

use crate::config::{self, ControlConfig, StoreKind};

/// Policy events kept per project (or the operator) and stage, in both stores; older ones are
/// removed.
pub const HISTORY_KEPT: usize = 1_000;

/// The answer to a control store failure: the request fails closed (`503` while the store is
/// unreachable, with a retry hint; `500` otherwise).
pub fn store_failed(error: &StoreError) -> crate::error::GatewayError {
    use crate::error::GatewayError;
    tracing::error!(error = %error, "control store lookup failed");
    match error {
        StoreError::Unavailable(_) => GatewayError::unavailable(
            "control_store_unavailable",
            "credentials cannot be checked right now",
        )
        .retry_after(std::time::Duration::from_secs(1)),
        _ => GatewayError::internal("credentials cannot be checked"),
    }
}

/// A control store failure.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// The store cannot be reached or did not answer in time; retrying later may work.
    #[error("control store unavailable: {0}")]
    Unavailable(String),
    /// The store holds or was asked for something invalid.
    #[error("control store: {0}")]
    Invalid(String),
    /// The record to change does not exist.
    #[error("control store: {0} not found")]
    NotFound(String),
    /// The change conflicts with what the store holds (`code`: `issuer_exists`,
    /// `too_many_issuers`).
    #[error("control store: {message}")]
    Conflict { code: &'static str, message: String },
}

impl StoreError {
    /// The project already trusts this issuer.
    pub fn issuer_exists() -> Self {
        StoreError::Conflict {
            code: "issuer_exists",
            message: "the project already trusts this issuer".into(),
        }
    }

    /// The project trusts [`MAX_ISSUERS`] issuers already.
    pub fn too_many_issuers() -> Self {
        StoreError::Conflict {
            code: "too_many_issuers",
            message: format!("a project trusts at most {MAX_ISSUERS} issuers"),
        }
    }
}

/// What the gateway reads from (and, for key management, writes to) the control store.
#[async_trait]
pub trait ControlStore: Send + Sync + std::fmt::Debug {
    /// The key whose SHA-256 (lower-case hex) is `sha256_hex`, revoked or not.
    async fn api_key_by_hash(&self, sha256_hex: &str) -> Result<Option<ApiKeyRecord>, StoreError>;
    /// A project by reference.
    async fn project(&self, project_ref: &str) -> Result<Option<ProjectRecord>, StoreError>;
    /// Whether an organization exists.
    async fn organization_exists(&self, id: Uuid) -> Result<bool, StoreError>;
    /// The role of `user_id` in `organization_id`, if a member.
    async fn membership(
        &self,
        organization_id: Uuid,
        user_id: Uuid,
    ) -> Result<Option<OrgRole>, StoreError>;
    /// Stores a new key (only its hash) for an existing project.
    async fn create_api_key(
        &self,
        project_ref: &str,
        role: KeyRole,
        sha256_hex: &str,
    ) -> Result<ApiKeyRecord, StoreError>;
    /// Revokes a key now. Returns false when it was already revoked.
    async fn revoke_api_key(&self, id: Uuid) -> Result<bool, StoreError>;
    /// Sets whether `project_ref`'s `service_role` keys are accepted on requests a browser
    /// made ([`ProjectRecord::browser_secret_keys`]). `NotFound` when there is no such project.
    async fn set_browser_secret_keys(
        &self,
        project_ref: &str,
        allowed: bool,
    ) -> Result<(), StoreError>;
    /// Adds a trusted issuer to a project (the record passed [`IssuerRecord::check`]).
    /// `NotFound` without the project; `Conflict` `issuer_exists` (the project trusts that `iss`
    /// already) or `too_many_issuers` (it has [`MAX_ISSUERS`]).
    async fn add_issuer(&self, issuer: &IssuerRecord) -> Result<(), StoreError>;
    /// Removes a project's trusted issuer by id. Returns false when the project has no such
    /// issuer.
    async fn remove_issuer(&self, project_ref: &str, id: Uuid) -> Result<bool, StoreError>;
    /// Stores a policy module under its digest (idempotent).
    async fn put_module(&self, digest: &str, module: &[u8]) -> Result<(), StoreError>;
    /// A stored policy module.
    async fn module(&self, digest: &str) -> Result<Option<Vec<u8>>, StoreError>;
    /// Installs (or replaces) a project's module for a stage.
    async fn set_project_policy(&self, policy: &ProjectPolicyRecord) -> Result<(), StoreError>;
    /// A project's module for a stage.
    async fn project_policy(
        &self,
        project_ref: &str,
        stage: &str,
    ) -> Result<Option<ProjectPolicyRecord>, StoreError>;
    /// Removes a project's module for a stage. Returns false when there was none.
    async fn delete_project_policy(
        &self,
        project_ref: &str,
        stage: &str,
    ) -> Result<bool, StoreError>;
    /// Every project policy.
    async fn project_policies(&self) -> Result<Vec<ProjectPolicyRecord>, StoreError>;
    /// `project_ref`'s project policies, every stage (a change event named the project).
    async fn project_policies_of(
        &self,
        project_ref: &str,
    ) -> Result<Vec<ProjectPolicyRecord>, StoreError> {
        let all = self.project_policies().await?;
        Ok(all
            .into_iter()
            .filter(|p| p.project_ref == project_ref)
            .collect())
    }
    /// Sets (or replaces) a project's candidate module for a stage (shadow or canary).
    async fn set_policy_candidate(
        &self,
        candidate: &PolicyCandidateRecord,
    ) -> Result<(), StoreError>;
    /// A project's candidate module for a stage.
    async fn policy_candidate(
        &self,
        project_ref: &str,
        stage: &str,
    ) -> Result<Option<PolicyCandidateRecord>, StoreError>;
    /// Removes a project's candidate for a stage. Returns false when there was none.
    async fn delete_policy_candidate(
        &self,
        project_ref: &str,
        stage: &str,
    ) -> Result<bool, StoreError>;
    /// Every candidate module.
    async fn policy_candidates(&self) -> Result<Vec<PolicyCandidateRecord>, StoreError>;
    /// `project_ref`'s candidate modules, every stage.
    async fn policy_candidates_of(
        &self,
        project_ref: &str,
    ) -> Result<Vec<PolicyCandidateRecord>, StoreError> {
        let all = self.policy_candidates().await?;
        Ok(all
            .into_iter()
            .filter(|c| c.project_ref == project_ref)
            .collect())
    }
    /// Appends one change of a module in force to the history. The history of one project (or
    /// the operator's) and stage keeps its newest [`HISTORY_KEPT`] events; older ones are
    /// removed, never another project's or stage's.
    async fn append_policy_event(&self, event: &PolicyEventRecord) -> Result<(), StoreError>;
    /// The most recent changes (newest first, at most `limit`) of `project_ref`'s modules
    /// (none: the operator's) for `stage` (none: every stage), **without their configurations**
    /// (`config` is always `None`: a listing never reads them; see
    /// [`ControlStore::policy_event_of`]).
    async fn policy_events(
        &self,
        project_ref: Option<&str>,
        stage: Option<&str>,
        limit: usize,
    ) -> Result<Vec<PolicyEventRecord>, StoreError>;
    /// The newest `enforce` event of `project_ref`'s (none: the operator's) `stage` that put
    /// `digest` in force, **with** its configuration: what a rollback to `digest` restores.
    /// `Ok(None)` when the kept history holds no such event.
    async fn policy_event_of(
        &self,
        project_ref: Option<&str>,
        stage: &str,
        digest: &str,
    ) -> Result<Option<PolicyEventRecord>, StoreError>;
    /// Marks stored modules as in use now: they are not collected for the grace period.
    async fn touch_modules(&self, digests: &[String]) -> Result<(), StoreError> {
        let _ = digests;
        Ok(())
    }
    /// Removes the stored modules that no project policy references and that nobody stored or
    /// marked in use for `grace`; returns their digests.
    async fn collect_modules(&self, grace: std::time::Duration) -> Result<Vec<String>, StoreError> {
        let _ = grace;
        Ok(Vec::new())
    }
    /// Checks that the store answers.
    async fn ping(&self) -> Result<(), StoreError>;
    /// `file` or `postgres`.
    fn kind(&self) -> &'static str;
    /// The pool of a PostgreSQL store (its change notifications are listened to).
    fn postgres_pool(&self) -> Option<sqlx::PgPool> {
        None
    }
    /// Ticks each time the store's records were replaced wholesale (a control file reloaded).
    fn reloads(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        None
    }
}

/// Opens the store named by the configuration. `base` resolves a relative file path.
pub async fn open(
    config: &ControlConfig,
    base: Option<&Path>,
) -> Result<Arc<dyn ControlStore>, StoreError> {
    match config.store {
        StoreKind::File => {
            let store = match &config.file {
                Some(path) => file::FileStore::open(&config::resolve(base, Path::new(path)))?,
                None => file::FileStore::empty(),
            };
            let store = Arc::new(store);
            store.watch(std::time::Duration::from_millis(config.reload_interval_ms));
            Ok(store)
        }
        StoreKind::Postgres => {
            let url = config.database_url.as_deref().ok_or_else(|| {
                StoreError::Invalid(
                    "control.database_url is required for the postgres store".into(),
                )
            })?;
            Ok(Arc::new(
                postgres::PostgresStore::connect(url, config).await?,
            ))
        }
    }
}
