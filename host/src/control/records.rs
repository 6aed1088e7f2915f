//! The records of the control store (CONTRACT §6).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Role of an API key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyRole {
    Anon,
    ServiceRole,
}

impl KeyRole {
    /// Contract spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            KeyRole::Anon => "anon",
            KeyRole::ServiceRole => "service_role",
        }
    }

    /// Parses the contract spelling.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "anon" => Some(KeyRole::Anon),
            "service_role" => Some(KeyRole::ServiceRole),
            _ => None,
        }
    }
}

/// Role of a member in an organization, strongest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OrgRole {
    Owner,
    Admin,
    Developer,
    ReadOnly,
}

impl OrgRole {
    /// Contract spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            OrgRole::Owner => "owner",
            OrgRole::Admin => "admin",
            OrgRole::Developer => "developer",
            OrgRole::ReadOnly => "read_only",
        }
    }

    /// Parses the contract spelling.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "owner" => Some(OrgRole::Owner),
            "admin" => Some(OrgRole::Admin),
            "developer" => Some(OrgRole::Developer),
            "read_only" => Some(OrgRole::ReadOnly),
            _ => None,
        }
    }

    /// Whether this role is at least `other` (`owner > admin > developer > read_only`).
    pub fn at_least(self, other: OrgRole) -> bool {
        self.rank() >= other.rank()
    }

    fn rank(self) -> u8 {
        match self {
            OrgRole::Owner => 3,
            OrgRole::Admin => 2,
            OrgRole::Developer => 1,
            OrgRole::ReadOnly => 0,
        }
    }
}

/// Database engine of a project.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DbEngine {
    Postgres,
    Mongodb,
}

impl DbEngine {
    /// Parses the contract spelling.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "postgres" => Some(DbEngine::Postgres),
            "mongodb" => Some(DbEngine::Mongodb),
            _ => None,
        }
    }
}

/// Database topology of a project.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Topology {
    Shared,
    Dedicated,
}

impl Topology {
    /// Parses the contract spelling.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "shared" => Some(Topology::Shared),
            "dedicated" => Some(Topology::Dedicated),
            _ => None,
        }
    }
}

/// `aura_control.organizations`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OrganizationRecord {
    pub id: Uuid,
    pub name: String,
}

fn free() -> String {
    "free".to_owned()
}

/// `aura_control.projects`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProjectRecord {
    #[serde(rename = "ref")]
    pub project_ref: String,
    pub organization_id: Uuid,
    pub db_engine: DbEngine,
    pub topology: Topology,
    #[serde(default)]
    pub postgrest_url: Option<String>,
    #[serde(default = "free")]
    pub plan: String,
    /// `aura_control.project_replicas`: the read replicas of a dedicated database (at most
    /// [`MAX_REPLICAS`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replicas: Vec<ReplicaRecord>,
}

/// At most this many read replicas of a project are passed to the db-routing stage.
pub const MAX_REPLICAS: usize = 16;

/// `aura_control.project_replicas`: a read replica (a PostgREST base URL over it) and its
/// region.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplicaRecord {
    pub url: String,
    #[serde(default)]
    pub region: Option<String>,
}

/// `aura_control.organization_members`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemberRecord {
    pub organization_id: Uuid,
    pub user_id: Uuid,
    pub role: OrgRole,
}

/// `aura_control.api_keys`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiKeyRecord {
    pub id: Uuid,
    pub project_ref: String,
    pub role: KeyRole,
    pub key_sha256: String,
    #[serde(default)]
    pub revoked_at: Option<DateTime<Utc>>,
}

impl ApiKeyRecord {
    /// Whether the key is revoked at `now`. A revocation time in the future (a rotation grace
    /// period) takes effect when it is reached.
    pub fn is_revoked(&self, now: DateTime<Utc>) -> bool {
        self.revoked_at.is_some_and(|at| at <= now)
    }
}

/// A policy module a project installed for one stage (`aura_control.project_policies`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProjectPolicyRecord {
    pub project_ref: String,
    /// The stage key (`cors`, `quota`).
    pub stage: String,
    /// SHA-256 of the module, hex; the module is in the module store.
    pub digest: String,
    /// The stage configuration, JSON text.
    pub config: String,
}

/// A module a project tries for a stage next to the one in force
/// (`aura_control.policy_candidates`): in `shadow` it runs on live requests and its decisions are
/// compared with the enforced ones; in `canary` it decides for `percent` % of actors.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyCandidateRecord {
    pub project_ref: String,
    /// The stage key (`cors`, `quota`).
    pub stage: String,
    /// SHA-256 of the module, hex; the module is in the module store.
    pub digest: String,
    /// The stage configuration, JSON text.
    pub config: String,
    /// `shadow` or `canary`.
    pub mode: String,
    /// The share of actors the canary decides for, 1–100 (0 for a shadow).
    #[serde(default)]
    pub percent: u8,
}

/// One change of a policy module in force (`aura_control.policy_events`): the audit trail and
/// the history a rollback picks from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, sqlx::FromRow)]
#[serde(deny_unknown_fields)]
pub struct PolicyEventRecord {
    pub at: DateTime<Utc>,
    /// The console user id, or `operator`.
    pub actor: String,
    /// The project, for a project's module; none for the operator's modules.
    #[serde(default)]
    pub project_ref: Option<String>,
    /// The stage key (`cors`, `quota`, …).
    pub stage: String,
    /// `data` or `management`.
    pub plane: String,
    /// `install`, `delete`, `rollback`, `automatic_rollback`, `operator_reload`, `promote`,
    /// `abort`.
    pub action: String,
    #[serde(default)]
    pub digest_before: Option<String>,
    #[serde(default)]
    pub digest_after: Option<String>,
    /// How the module is used: `enforce`, `shadow` or `canary`.
    pub mode: String,
    /// Why, for an automatic rollback.
    #[serde(default)]
    pub reason: Option<String>,
    /// The stage configuration put in force with `digest_after` (JSON text), so that a
    /// rollback restores both.
    #[serde(default)]
    pub config: Option<String>,
}
