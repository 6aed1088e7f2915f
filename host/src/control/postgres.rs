//! PostgreSQL control store (schema `aura_control`), through sqlx. The schema is created by the
//! migrations in `host/migrations/`, applied by `aura-gateway migrate`.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use std::str::FromStr as _;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions, PgSslMode};
use uuid::Uuid;

use super::records::MAX_INLINE_KEYS;
use super::{
    ApiKeyRecord, ControlStore, DbEngine, IssuerRecord, KeyRole, MAX_ISSUERS, MAX_REPLICAS,
    OrgRole, PolicyCandidateRecord, PolicyEventRecord, ProjectPolicyRecord, ProjectRecord,
    ReplicaRecord, StoreError, Topology,
};
use crate::config::ControlConfig;

pub use super::HISTORY_KEPT;

/// The migrations shipped with the gateway.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// The Postgres-backed store.
#[derive(Debug, Clone)]
pub struct PostgresStore {
    pool: PgPool,
}

fn unavailable(e: sqlx::Error) -> StoreError {
    StoreError::Unavailable(e.to_string())
}

impl PostgresStore {
    /// Creates the pool. Connections are opened lazily, so the gateway starts while the
    /// database is down and the first queries fail fast with `Unavailable`.
    pub async fn connect(url: &str, config: &ControlConfig) -> Result<Self, StoreError> {
        let mut options = PgConnectOptions::from_str(url)
            .map_err(|e| StoreError::Invalid(format!("control.database_url: {e}")))?;
        if let Some(tls) = &config.tls {
            options = options.ssl_mode(PgSslMode::VerifyFull);
            if let Some(ca) = &tls.ca_file {
                options = options.ssl_root_cert(ca);
            }
            if let Some((cert, key)) = tls.cert_file.as_ref().zip(tls.key_file.as_ref()) {
                options = options.ssl_client_cert(cert).ssl_client_key(key);
            }
        }
        let pool = PgPoolOptions::new()
            .max_connections(config.max_connections)
            .acquire_timeout(Duration::from_millis(config.acquire_timeout_ms))
            .connect_lazy_with(options);
        Ok(Self { pool })
    }

    /// A project's trusted issuers, oldest first. A row that fails [`IssuerRecord::check`] is
    /// skipped with an error log: that issuer fails closed, the project's others keep working.
    async fn issuers(&self, project_ref: &str) -> Result<Vec<IssuerRecord>, StoreError> {
        type Row = (
            Uuid,
            String,
            Option<String>,
            Option<String>,
            Vec<String>,
            String,
            Vec<String>,
            Option<String>,
            Vec<String>,
            DateTime<Utc>,
            Option<String>,
        );
        let rows: Vec<Row> = sqlx::query_as(
            "SELECT id, issuer, jwks_url, keys, algorithms, audience_claim, audiences, \
             role_claim, allowed_roles, created_at, created_by \
             FROM aura_control.project_issuers WHERE project_ref = $1 \
             ORDER BY created_at, id LIMIT $2",
        )
        .bind(project_ref)
        .bind(MAX_ISSUERS as i64)
        .fetch_all(&self.pool)
        .await
        .map_err(unavailable)?;
        Ok(rows
            .into_iter()
            .map(|row| IssuerRecord {
                id: row.0,
                project_ref: project_ref.to_owned(),
                issuer: row.1,
                jwks_url: row.2,
                keys: row.3,
                algorithms: row.4,
                audience_claim: row.5,
                audiences: row.6,
                role_claim: row.7,
                allowed_roles: row.8,
                created_at: Some(row.9),
                created_by: row.10,
            })
            .filter(|record| match record.check(MAX_INLINE_KEYS) {
                Ok(()) => true,
                Err(e) => {
                    tracing::error!(project = %project_ref, id = %record.id, error = %e, "a project_issuers row is invalid; that issuer is not trusted");
                    false
                }
            })
            .collect())
    }

    /// Wraps an existing pool.
    pub fn from_pool(pool: PgPool) -> Self {
        Self { pool }
    }

    /// Applies the shipped migrations.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        MIGRATOR
            .run(&self.pool)
            .await
            .map_err(|e| StoreError::Unavailable(format!("migration failed: {e}")))
    }
}

type KeyRow = (Uuid, String, String, String, Option<DateTime<Utc>>);

fn key_record(
    (id, project_ref, role, key_sha256, revoked_at): KeyRow,
) -> Result<ApiKeyRecord, StoreError> {
    let role = KeyRole::parse(&role)
        .ok_or_else(|| StoreError::Invalid(format!("api_keys.{id}: unknown role {role:?}")))?;
    Ok(ApiKeyRecord {
        id,
        project_ref,
        role,
        key_sha256,
        revoked_at,
    })
}

#[async_trait]
impl ControlStore for PostgresStore {
    async fn api_key_by_hash(&self, sha256_hex: &str) -> Result<Option<ApiKeyRecord>, StoreError> {
        let row: Option<KeyRow> = sqlx::query_as(
            "SELECT id, project_ref, role, key_sha256, revoked_at \
             FROM aura_control.api_keys WHERE key_sha256 = $1",
        )
        .bind(sha256_hex)
        .fetch_optional(&self.pool)
        .await
        .map_err(unavailable)?;
        row.map(key_record).transpose()
    }

    async fn project(&self, project_ref: &str) -> Result<Option<ProjectRecord>, StoreError> {
        type Row = (String, Uuid, String, String, Option<String>, String, bool);
        let row: Option<Row> = sqlx::query_as(
            "SELECT p.ref, p.organization_id, p.db_engine, p.topology, p.postgrest_url, p.plan, \
             coalesce(a.browser_secret_keys, false) \
             FROM aura_control.projects p \
             LEFT JOIN aura_control.project_auth a ON a.project_ref = p.ref \
             WHERE p.ref = $1",
        )
        .bind(project_ref)
        .fetch_optional(&self.pool)
        .await
        .map_err(unavailable)?;
        let replicas: Vec<(String, Option<String>)> = if row.is_some() {
            sqlx::query_as(
                "SELECT url, region FROM aura_control.project_replicas \
                 WHERE project_ref = $1 ORDER BY url LIMIT $2",
            )
            .bind(project_ref)
            .bind(MAX_REPLICAS as i64)
            .fetch_all(&self.pool)
            .await
            .map_err(unavailable)?
        } else {
            Vec::new()
        };
        let replicas = replicas
            .into_iter()
            .map(|(url, region)| ReplicaRecord { url, region })
            .collect();
        let issuers = if row.is_some() {
            self.issuers(project_ref).await?
        } else {
            Vec::new()
        };
        row.map(
            |(project_ref, organization_id, engine, topology, postgrest_url, plan, browser)| {
                Ok(ProjectRecord {
                    db_engine: DbEngine::parse(&engine).ok_or_else(|| {
                        StoreError::Invalid(format!(
                            "projects.{project_ref}: unknown db_engine {engine:?}"
                        ))
                    })?,
                    topology: Topology::parse(&topology).ok_or_else(|| {
                        StoreError::Invalid(format!(
                            "projects.{project_ref}: unknown topology {topology:?}"
                        ))
                    })?,
                    project_ref,
                    organization_id,
                    postgrest_url,
                    plan,
                    replicas,
                    browser_secret_keys: browser,
                    issuers,
                })
            },
        )
        .transpose()
    }

    async fn organization_exists(&self, id: Uuid) -> Result<bool, StoreError> {
        let row: Option<(i32,)> =
            sqlx::query_as("SELECT 1 FROM aura_control.organizations WHERE id = $1")
                .bind(id)
                .fetch_optional(&self.pool)
                .await
                .map_err(unavailable)?;
        Ok(row.is_some())
    }

    async fn membership(
        &self,
        organization_id: Uuid,
        user_id: Uuid,
    ) -> Result<Option<OrgRole>, StoreError> {
        let row: Option<(String,)> = sqlx::query_as(
            "SELECT role FROM aura_control.organization_members \
             WHERE organization_id = $1 AND user_id = $2",
        )
        .bind(organization_id)
        .bind(user_id)
        .fetch_optional(&self.pool)
        .await
        .map_err(unavailable)?;
        row.map(|(role,)| {
            OrgRole::parse(&role).ok_or_else(|| {
                StoreError::Invalid(format!("organization_members: unknown role {role:?}"))
            })
        })
        .transpose()
    }

    async fn create_api_key(
        &self,
        project_ref: &str,
        role: KeyRole,
        sha256_hex: &str,
    ) -> Result<ApiKeyRecord, StoreError> {
        if self.project(project_ref).await?.is_none() {
            return Err(StoreError::NotFound(format!("project {project_ref:?}")));
        }
        let row: KeyRow = sqlx::query_as(
            "INSERT INTO aura_control.api_keys (id, project_ref, role, key_sha256) \
             VALUES ($1, $2, $3, $4) RETURNING id, project_ref, role, key_sha256, revoked_at",
        )
        .bind(Uuid::new_v4())
        .bind(project_ref)
        .bind(role.as_str())
        .bind(sha256_hex)
        .fetch_one(&self.pool)
        .await
        .map_err(unavailable)?;
        key_record(row)
    }

    async fn revoke_api_key(&self, id: Uuid) -> Result<bool, StoreError> {
        let exists: Option<(Option<DateTime<Utc>>,)> =
            sqlx::query_as("SELECT revoked_at FROM aura_control.api_keys WHERE id = $1")
                .bind(id)
                .fetch_optional(&self.pool)
                .await
                .map_err(unavailable)?;
        if exists.is_none() {
            return Err(StoreError::NotFound(format!("api key {id}")));
        }
        let done = sqlx::query(
            "UPDATE aura_control.api_keys SET revoked_at = now() \
             WHERE id = $1 AND revoked_at IS NULL",
        )
        .bind(id)
        .execute(&self.pool)
        .await
        .map_err(unavailable)?;
        Ok(done.rows_affected() == 1)
    }

    async fn set_browser_secret_keys(
        &self,
        project_ref: &str,
        allowed: bool,
    ) -> Result<(), StoreError> {
        let done = sqlx::query(
            "INSERT INTO aura_control.project_auth (project_ref, browser_secret_keys) \
             SELECT ref, $2 FROM aura_control.projects WHERE ref = $1 \
             ON CONFLICT (project_ref) DO UPDATE \
             SET browser_secret_keys = EXCLUDED.browser_secret_keys, updated_at = now()",
        )
        .bind(project_ref)
        .bind(allowed)
        .execute(&self.pool)
        .await
        .map_err(unavailable)?;
        if done.rows_affected() == 0 {
            return Err(StoreError::NotFound(format!("project {project_ref:?}")));
        }
        Ok(())
    }

    async fn add_issuer(&self, issuer: &IssuerRecord) -> Result<(), StoreError> {
        issuer
            .check(MAX_INLINE_KEYS)
            .map_err(|e| StoreError::Invalid(format!("project_issuers: {e}")))?;
        let mut tx = self.pool.begin().await.map_err(unavailable)?;
        // Serialises the adds of one project: the count below cannot race.
        let project: Option<(String,)> =
            sqlx::query_as("SELECT ref FROM aura_control.projects WHERE ref = $1 FOR UPDATE")
                .bind(&issuer.project_ref)
                .fetch_optional(&mut *tx)
                .await
                .map_err(unavailable)?;
        if project.is_none() {
            return Err(StoreError::NotFound(format!(
                "project {:?}",
                issuer.project_ref
            )));
        }
        let (count,): (i64,) = sqlx::query_as(
            "SELECT count(*) FROM aura_control.project_issuers WHERE project_ref = $1",
        )
        .bind(&issuer.project_ref)
        .fetch_one(&mut *tx)
        .await
        .map_err(unavailable)?;
        if count >= MAX_ISSUERS as i64 {
            return Err(StoreError::too_many_issuers());
        }
        let done = sqlx::query(
            "INSERT INTO aura_control.project_issuers (id, project_ref, issuer, jwks_url, keys, \
             algorithms, audience_claim, audiences, role_claim, allowed_roles, created_at, \
             created_by) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, \
             coalesce($11, now()), $12) ON CONFLICT (project_ref, issuer) DO NOTHING",
        )
        .bind(issuer.id)
        .bind(&issuer.project_ref)
        .bind(&issuer.issuer)
        .bind(&issuer.jwks_url)
        .bind(&issuer.keys)
        .bind(&issuer.algorithms)
        .bind(&issuer.audience_claim)
        .bind(&issuer.audiences)
        .bind(&issuer.role_claim)
        .bind(&issuer.allowed_roles)
        .bind(issuer.created_at)
        .bind(&issuer.created_by)
        .execute(&mut *tx)
        .await
        .map_err(unavailable)?;
        if done.rows_affected() == 0 {
            return Err(StoreError::issuer_exists());
        }
        tx.commit().await.map_err(unavailable)
    }

    async fn remove_issuer(&self, project_ref: &str, id: Uuid) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "DELETE FROM aura_control.project_issuers WHERE project_ref = $1 AND id = $2",
        )
        .bind(project_ref)
        .bind(id)
        .execute(&self.pool)
        .await
        .map_err(unavailable)?;
        Ok(done.rows_affected() == 1)
    }

    async fn put_module(&self, digest: &str, module: &[u8]) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO aura_control.policy_modules (digest, module, size) VALUES ($1, $2, $3) \
             ON CONFLICT (digest) DO UPDATE SET last_used_at = now()",
        )
        .bind(digest)
        .bind(module)
        .bind(module.len() as i32)
        .execute(&self.pool)
        .await
        .map(|_| ())
        .map_err(unavailable)
    }

    async fn module(&self, digest: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let row: Option<(Vec<u8>,)> =
            sqlx::query_as("SELECT module FROM aura_control.policy_modules WHERE digest = $1")
                .bind(digest)
                .fetch_optional(&self.pool)
                .await
                .map_err(unavailable)?;
        Ok(row.map(|(m,)| m))
    }

    async fn set_project_policy(&self, policy: &ProjectPolicyRecord) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO aura_control.project_policies (project_ref, stage, digest, config) \
             VALUES ($1, $2, $3, $4) ON CONFLICT (project_ref, stage) \
             DO UPDATE SET digest = EXCLUDED.digest, config = EXCLUDED.config, updated_at = now()",
        )
        .bind(&policy.project_ref)
        .bind(&policy.stage)
        .bind(&policy.digest)
        .bind(&policy.config)
        .execute(&self.pool)
        .await
        .map(|_| ())
        .map_err(unavailable)
    }

    async fn project_policy(
        &self,
        project_ref: &str,
        stage: &str,
    ) -> Result<Option<ProjectPolicyRecord>, StoreError> {
        let row: Option<(String, String, String, String)> = sqlx::query_as(
            "SELECT project_ref, stage, digest, config FROM aura_control.project_policies \
             WHERE project_ref = $1 AND stage = $2",
        )
        .bind(project_ref)
        .bind(stage)
        .fetch_optional(&self.pool)
        .await
        .map_err(unavailable)?;
        Ok(
            row.map(|(project_ref, stage, digest, config)| ProjectPolicyRecord {
                project_ref,
                stage,
                digest,
                config,
            }),
        )
    }

    async fn delete_project_policy(
        &self,
        project_ref: &str,
        stage: &str,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "DELETE FROM aura_control.project_policies WHERE project_ref = $1 AND stage = $2",
        )
        .bind(project_ref)
        .bind(stage)
        .execute(&self.pool)
        .await
        .map_err(unavailable)?;
        Ok(done.rows_affected() == 1)
    }

    async fn append_policy_event(&self, e: &PolicyEventRecord) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO aura_control.policy_events \
             (at, actor, project_ref, stage, plane, action, digest_before, digest_after, mode, reason, config) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
        )
        .bind(e.at)
        .bind(&e.actor)
        .bind(&e.project_ref)
        .bind(&e.stage)
        .bind(&e.plane)
        .bind(&e.action)
        .bind(&e.digest_before)
        .bind(&e.digest_after)
        .bind(&e.mode)
        .bind(&e.reason)
        .bind(&e.config)
        .execute(&self.pool)
        .await
        .map_err(unavailable)?;
        // Bounded: an organization admin installing in a loop keeps only the newest
        // `HISTORY_KEPT` events per project and stage.
        sqlx::query(
            "DELETE FROM aura_control.policy_events \
             WHERE project_ref IS NOT DISTINCT FROM $1 AND stage = $2 AND id <= ( \
               SELECT id FROM aura_control.policy_events \
               WHERE project_ref IS NOT DISTINCT FROM $1 AND stage = $2 \
               ORDER BY id DESC OFFSET $3 LIMIT 1)",
        )
        .bind(&e.project_ref)
        .bind(&e.stage)
        .bind(HISTORY_KEPT as i64)
        .execute(&self.pool)
        .await
        .map(|_| ())
        .map_err(unavailable)
    }

    async fn policy_events(
        &self,
        project_ref: Option<&str>,
        stage: Option<&str>,
        limit: usize,
    ) -> Result<Vec<PolicyEventRecord>, StoreError> {
        // Never the configuration: a listing reads the small columns only (a configuration is
        // read by `policy_event_of`, one at a time).
        let rows: Vec<PolicyEventRecord> = sqlx::query_as(
            "SELECT at, actor, project_ref, stage, plane, action, digest_before, digest_after, mode, reason, NULL::text AS config \
             FROM aura_control.policy_events \
             WHERE project_ref IS NOT DISTINCT FROM $1 AND ($2::text IS NULL OR stage = $2) \
             ORDER BY id DESC LIMIT $3",
        )
        .bind(project_ref)
        .bind(stage)
        .bind(limit.min(HISTORY_KEPT * 16) as i64)
        .fetch_all(&self.pool)
        .await
        .map_err(unavailable)?;
        Ok(rows)
    }

    async fn policy_event_of(
        &self,
        project_ref: Option<&str>,
        stage: &str,
        digest: &str,
    ) -> Result<Option<PolicyEventRecord>, StoreError> {
        let row: Option<PolicyEventRecord> = sqlx::query_as(
            "SELECT at, actor, project_ref, stage, plane, action, digest_before, digest_after, mode, reason, config \
             FROM aura_control.policy_events \
             WHERE project_ref IS NOT DISTINCT FROM $1 AND stage = $2 AND digest_after = $3 \
             AND mode = 'enforce' ORDER BY id DESC LIMIT 1",
        )
        .bind(project_ref)
        .bind(stage)
        .bind(digest)
        .fetch_optional(&self.pool)
        .await
        .map_err(unavailable)?;
        Ok(row)
    }

    async fn project_policies(&self) -> Result<Vec<ProjectPolicyRecord>, StoreError> {
        let rows: Vec<(String, String, String, String)> = sqlx::query_as(
            "SELECT project_ref, stage, digest, config FROM aura_control.project_policies",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(unavailable)?;
        Ok(rows
            .into_iter()
            .map(|(project_ref, stage, digest, config)| ProjectPolicyRecord {
                project_ref,
                stage,
                digest,
                config,
            })
            .collect())
    }

    async fn project_policies_of(
        &self,
        project_ref: &str,
    ) -> Result<Vec<ProjectPolicyRecord>, StoreError> {
        let rows: Vec<(String, String, String, String)> = sqlx::query_as(
            "SELECT project_ref, stage, digest, config FROM aura_control.project_policies \
             WHERE project_ref = $1",
        )
        .bind(project_ref)
        .fetch_all(&self.pool)
        .await
        .map_err(unavailable)?;
        Ok(rows
            .into_iter()
            .map(|(project_ref, stage, digest, config)| ProjectPolicyRecord {
                project_ref,
                stage,
                digest,
                config,
            })
            .collect())
    }

    async fn policy_candidates_of(
        &self,
        project_ref: &str,
    ) -> Result<Vec<PolicyCandidateRecord>, StoreError> {
        let rows: Vec<CandidateRow> = sqlx::query_as(
            "SELECT project_ref, stage, digest, config, mode, percent \
             FROM aura_control.policy_candidates WHERE project_ref = $1",
        )
        .bind(project_ref)
        .fetch_all(&self.pool)
        .await
        .map_err(unavailable)?;
        Ok(rows.into_iter().map(candidate_of).collect())
    }

    async fn set_policy_candidate(
        &self,
        candidate: &PolicyCandidateRecord,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO aura_control.policy_candidates \
             (project_ref, stage, digest, config, mode, percent) VALUES ($1, $2, $3, $4, $5, $6) \
             ON CONFLICT (project_ref, stage) DO UPDATE SET digest = EXCLUDED.digest, \
             config = EXCLUDED.config, mode = EXCLUDED.mode, percent = EXCLUDED.percent, \
             updated_at = now()",
        )
        .bind(&candidate.project_ref)
        .bind(&candidate.stage)
        .bind(&candidate.digest)
        .bind(&candidate.config)
        .bind(&candidate.mode)
        .bind(i16::from(candidate.percent))
        .execute(&self.pool)
        .await
        .map(|_| ())
        .map_err(unavailable)
    }

    async fn policy_candidate(
        &self,
        project_ref: &str,
        stage: &str,
    ) -> Result<Option<PolicyCandidateRecord>, StoreError> {
        let row: Option<CandidateRow> = sqlx::query_as(
            "SELECT project_ref, stage, digest, config, mode, percent \
             FROM aura_control.policy_candidates WHERE project_ref = $1 AND stage = $2",
        )
        .bind(project_ref)
        .bind(stage)
        .fetch_optional(&self.pool)
        .await
        .map_err(unavailable)?;
        Ok(row.map(candidate_of))
    }

    async fn delete_policy_candidate(
        &self,
        project_ref: &str,
        stage: &str,
    ) -> Result<bool, StoreError> {
        sqlx::query(
            "DELETE FROM aura_control.policy_candidates WHERE project_ref = $1 AND stage = $2",
        )
        .bind(project_ref)
        .bind(stage)
        .execute(&self.pool)
        .await
        .map(|r| r.rows_affected() > 0)
        .map_err(unavailable)
    }

    async fn policy_candidates(&self) -> Result<Vec<PolicyCandidateRecord>, StoreError> {
        let rows: Vec<CandidateRow> = sqlx::query_as(
            "SELECT project_ref, stage, digest, config, mode, percent \
             FROM aura_control.policy_candidates",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(unavailable)?;
        Ok(rows.into_iter().map(candidate_of).collect())
    }

    async fn touch_modules(&self, digests: &[String]) -> Result<(), StoreError> {
        if digests.is_empty() {
            return Ok(());
        }
        sqlx::query(
            "UPDATE aura_control.policy_modules SET last_used_at = now() WHERE digest = ANY($1)",
        )
        .bind(digests)
        .execute(&self.pool)
        .await
        .map(|_| ())
        .map_err(unavailable)
    }

    async fn collect_modules(&self, grace: std::time::Duration) -> Result<Vec<String>, StoreError> {
        let rows: Vec<(String,)> = sqlx::query_as(
            "DELETE FROM aura_control.policy_modules m \
             WHERE m.last_used_at < now() - make_interval(secs => $1) \
             AND NOT EXISTS (SELECT 1 FROM aura_control.project_policies p WHERE p.digest = m.digest) \
             AND NOT EXISTS (SELECT 1 FROM aura_control.policy_candidates c WHERE c.digest = m.digest) \
             RETURNING m.digest",
        )
        .bind(grace.as_secs_f64())
        .fetch_all(&self.pool)
        .await
        .map_err(unavailable)?;
        Ok(rows.into_iter().map(|(d,)| d).collect())
    }

    async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1")
            .execute(&self.pool)
            .await
            .map(|_| ())
            .map_err(unavailable)
    }

    fn kind(&self) -> &'static str {
        "postgres"
    }

    fn postgres_pool(&self) -> Option<sqlx::PgPool> {
        Some(self.pool.clone())
    }
}

type CandidateRow = (String, String, String, String, String, i16);

fn candidate_of(
    (project_ref, stage, digest, config, mode, percent): CandidateRow,
) -> PolicyCandidateRecord {
    PolicyCandidateRecord {
        project_ref,
        stage,
        digest,
        config,
        mode,
        percent: u8::try_from(percent.clamp(0, 100)).unwrap_or(0),
    }
}
