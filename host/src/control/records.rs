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
    /// `aura_control.project_auth.browser_secret_keys`: whether the project's `service_role`
    /// keys are accepted on requests a browser made, where `auth.secret_keys_from_browsers`
    /// refuses them (the default). Off unless an owner or admin turned it on.
    #[serde(default, skip_serializing_if = "is_false")]
    pub browser_secret_keys: bool,
    /// `aura_control.project_issuers`: the identity providers whose user tokens the project
    /// accepts (at most [`MAX_ISSUERS`], oldest first). Filled by each store from its own table
    /// (`[[project_issuers]]` in a control file), never written inside a project.
    #[serde(skip)]
    pub issuers: Vec<IssuerRecord>,
}

/// At most this many trusted issuers per project.
pub const MAX_ISSUERS: usize = 8;
/// At most this many accepted audiences per issuer.
pub const MAX_AUDIENCES: usize = 16;
/// Largest inline JWKS, in bytes.
pub const MAX_INLINE_KEYS_BYTES: usize = 64 * 1024;
/// Longest issuer, JWKS URL.
pub const MAX_ISSUER_URL_BYTES: usize = 2048;
/// Most keys an inline JWKS may hold in a store (`auth.issuers.max_keys` bounds it further
/// where it is used).
pub const MAX_INLINE_KEYS: usize = 256;

fn default_algorithms() -> Vec<String> {
    vec!["RS256".to_owned(), "ES256".to_owned()]
}

fn default_audience_claim() -> String {
    "aud".to_owned()
}

fn default_allowed_roles() -> Vec<String> {
    vec!["authenticated".to_owned()]
}

/// `aura_control.project_issuers`: an identity provider (Clerk, Auth0, Firebase Auth, Cognito,
/// WorkOS, any OIDC issuer) whose user tokens a project accepts, selected by the token's `iss`
/// exactly.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IssuerRecord {
    pub id: Uuid,
    pub project_ref: String,
    /// The exact `iss` of its tokens (compared byte for byte: a trailing `/` matters).
    pub issuer: String,
    /// Where its keys are. Neither this nor `keys`: OIDC discovery from `issuer` (`https`).
    #[serde(default)]
    pub jwks_url: Option<String>,
    /// Its keys inline (a JWKS, JSON text, public keys only), instead of fetching them.
    #[serde(default)]
    pub keys: Option<String>,
    /// The accepted `alg`s, a non-empty subset of `RS256`, `ES256`. Never taken from the token.
    #[serde(default = "default_algorithms")]
    pub algorithms: Vec<String>,
    /// The claim holding the audience: `aud`, `azp` (Clerk) or `client_id` (Cognito access
    /// tokens).
    #[serde(default = "default_audience_claim")]
    pub audience_claim: String,
    /// The accepted audiences (at most [`MAX_AUDIENCES`]): the claim must be one of them, or
    /// an array holding at least one. Empty: the audience is not checked — written explicitly.
    pub audiences: Vec<String>,
    /// The claim naming the platform role (`role`, `metadata.role`: at most 4 dotted
    /// segments). None: every verified user is `authenticated`.
    #[serde(default)]
    pub role_claim: Option<String>,
    /// The values of `role_claim` accepted, a non-empty subset of `authenticated`, `anon`: a
    /// project's issuer can never make `service_role` or `console`.
    #[serde(default = "default_allowed_roles")]
    pub allowed_roles: Vec<String>,
    #[serde(default)]
    pub created_at: Option<DateTime<Utc>>,
    /// The console user who added it.
    #[serde(default)]
    pub created_by: Option<String>,
}

impl IssuerRecord {
    /// How its keys are found: `discovery`, `jwks_url` or `keys`.
    pub fn source_kind(&self) -> &'static str {
        match (&self.jwks_url, &self.keys) {
            (Some(_), _) => "jwks_url",
            (None, Some(_)) => "keys",
            (None, None) => "discovery",
        }
    }

    /// Checks the record against the bounds both stores keep (the file store on load, the
    /// database's constraints, the management API on add); the error names the field. An
    /// inline JWKS must hold at most `max_keys` keys.
    pub fn check(&self, max_keys: usize) -> Result<(), String> {
        let visible = |s: &str| s.bytes().all(|b| (0x21..=0x7e).contains(&b));
        if self.issuer.is_empty()
            || self.issuer.len() > MAX_ISSUER_URL_BYTES
            || !visible(&self.issuer)
        {
            return Err(format!(
                "issuer: 1 to {MAX_ISSUER_URL_BYTES} visible ASCII characters"
            ));
        }
        match (&self.jwks_url, &self.keys) {
            (Some(_), Some(_)) => return Err("jwks_url and keys: one or the other".into()),
            (Some(url), None) => check_https_url(url).map_err(|e| format!("jwks_url: {e}"))?,
            (None, Some(keys)) => {
                if keys.len() > MAX_INLINE_KEYS_BYTES {
                    return Err(format!("keys: at most {MAX_INLINE_KEYS_BYTES} bytes"));
                }
                crate::jwks::parse_set(keys.as_bytes(), max_keys)
                    .map_err(|e| format!("keys: {}", e.message))?;
            }
            (None, None) => check_https_url(&self.issuer).map_err(|e| {
                format!(
                    "issuer: {e} (its keys are found by OIDC discovery; or give jwks_url or keys)"
                )
            })?,
        }
        let mut seen = Vec::new();
        if self.algorithms.is_empty() {
            return Err("algorithms: at least one of RS256, ES256".into());
        }
        for alg in &self.algorithms {
            if !matches!(alg.as_str(), "RS256" | "ES256") || seen.contains(&alg) {
                return Err(format!(
                    "algorithms: {alg:?} (RS256 or ES256, each at most once)"
                ));
            }
            seen.push(alg);
        }
        if !matches!(self.audience_claim.as_str(), "aud" | "azp" | "client_id") {
            return Err("audience_claim: aud, azp or client_id".into());
        }
        if self.audiences.len() > MAX_AUDIENCES {
            return Err(format!("audiences: at most {MAX_AUDIENCES}"));
        }
        if self
            .audiences
            .iter()
            .any(|a| a.is_empty() || a.len() > 256 || a.chars().any(char::is_control))
        {
            return Err("audiences: each 1 to 256 characters, no control characters".into());
        }
        if let Some(claim) = &self.role_claim {
            let segments: Vec<&str> = claim.split('.').collect();
            let ok = claim.len() <= 64
                && segments.len() <= 4
                && segments.iter().all(|s| {
                    !s.is_empty()
                        && s.bytes().all(|b| {
                            b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b':'
                        })
                });
            if !ok {
                return Err(
                    "role_claim: a claim name or a dotted path of at most 4 names (64 characters)"
                        .into(),
                );
            }
        }
        if self.allowed_roles.is_empty()
            || self
                .allowed_roles
                .iter()
                .any(|r| !matches!(r.as_str(), "authenticated" | "anon"))
        {
            return Err(
                "allowed_roles: a non-empty subset of authenticated, anon (a project's issuer \
                 cannot grant service_role)"
                    .into(),
            );
        }
        if self.created_by.as_ref().is_some_and(|c| c.len() > 64) {
            return Err("created_by: at most 64 characters".into());
        }
        Ok(())
    }
}

/// An `https` URL of at most [`MAX_ISSUER_URL_BYTES`] bytes, with a host, without user
/// information or fragment.
pub fn check_https_url(url: &str) -> Result<(), String> {
    if url.len() > MAX_ISSUER_URL_BYTES {
        return Err(format!("at most {MAX_ISSUER_URL_BYTES} bytes"));
    }
    let parsed = reqwest::Url::parse(url).map_err(|_| "not a URL".to_owned())?;
    if parsed.scheme() != "https" {
        return Err("must be an https URL".into());
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err("must not carry user information".into());
    }
    if parsed.fragment().is_some() {
        return Err("must not have a fragment".into());
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err("must name a host".into());
    }
    Ok(())
}

fn is_false(value: &bool) -> bool {
    !*value
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
