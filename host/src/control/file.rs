//! DB-less control store: a declarative TOML file holding the same records as the Postgres
//! tables, reloaded when it changes.
//!
//! ```toml
//! [[organizations]]
//! id = "6f1c…"
//! name = "Demo"
//!
//! [[projects]]
//! ref = "demo"
//! organization_id = "6f1c…"
//! db_engine = "postgres"      # or "mongodb"
//! topology = "shared"         # or "dedicated"
//! # postgrest_url = "http://…"
//! # plan = "free"
//! # replicas = [{ url = "http://…", region = "eu-west" }]   # read replicas, at most 16
//! # browser_secret_keys = true   # service_role keys accepted from browsers (off by default)
//!
//! [[organization_members]]
//! organization_id = "6f1c…"
//! user_id = "…"
//! role = "owner"              # owner | admin | developer | read_only
//!
//! [[api_keys]]
//! id = "…"
//! project_ref = "demo"
//! role = "anon"               # anon | service_role
//! key_sha256 = "…64 hex…"
//! # revoked_at = "2026-01-01T00:00:00Z"
//!
//! [[project_issuers]]            # an identity provider whose user tokens the project accepts
//! id = "…"
//! project_ref = "demo"
//! issuer = "https://id.example.com"   # the tokens' iss, exactly
//! # jwks_url = "https://…/jwks.json"  # instead of OIDC discovery from issuer
//! # keys = '{"keys": […]}'            # or the JWKS inline (public keys only)
//! # algorithms = ["RS256", "ES256"]
//! # audience_claim = "aud"            # aud | azp | client_id
//! audiences = ["my-api"]              # [] = not checked (required: say so)
//! # role_claim = "role"               # absent: every user is authenticated
//! # allowed_roles = ["authenticated"] # subset of authenticated, anon
//! ```
//!
//! A file that fails to parse or validate on reload is refused with an error log and the
//! previous records keep serving.
//!
//! The gateway's own changes (an API key made, a project's module installed, …) are edits of the
//! file, comments and layout kept, written whole and renamed into place, off the request workers.
//! A change of a project's module or candidate is applied to the records in memory and checked
//! against them, record by record, rather than by parsing the written file again: with ten
//! thousand projects that parse is most of the time an install takes. The first edit after a
//! start, or after the file changed under the gateway, parses it in full.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use async_trait::async_trait;
use chrono::Utc;
use serde::Deserialize;
use uuid::Uuid;

use super::records::MAX_INLINE_KEYS;
use super::{
    ApiKeyRecord, ControlStore, IssuerRecord, KeyRole, MAX_ISSUERS, MAX_REPLICAS, MemberRecord,
    OrgRole, OrganizationRecord, PolicyCandidateRecord, PolicyEventRecord, ProjectPolicyRecord,
    ProjectRecord, StoreError,
};
use crate::config::is_sha256_hex;
use crate::files::{Stamp, stamp};

/// The file's content.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControlFile {
    #[serde(default)]
    pub organizations: Vec<OrganizationRecord>,
    #[serde(default)]
    pub projects: Vec<ProjectRecord>,
    #[serde(default)]
    pub organization_members: Vec<MemberRecord>,
    #[serde(default)]
    pub api_keys: Vec<ApiKeyRecord>,
    /// Modules installed by projects; the modules themselves are files
    /// `modules/<digest>.wasm` next to the control file.
    #[serde(default)]
    pub project_policies: Vec<ProjectPolicyRecord>,
    /// Modules projects try next to the ones in force (shadow or canary).
    #[serde(default)]
    pub policy_candidates: Vec<PolicyCandidateRecord>,
    /// Identity providers projects trust for their users' tokens.
    #[serde(default)]
    pub project_issuers: Vec<IssuerRecord>,
}

/// The records, indexed. Each index is shared: an edit of one copies that one only.
#[derive(Debug, Default, Clone)]
struct Snapshot {
    keys: Arc<HashMap<String, ApiKeyRecord>>,
    projects: Arc<HashMap<String, ProjectRecord>>,
    organizations: Arc<HashSet<Uuid>>,
    members: Arc<HashMap<(Uuid, Uuid), OrgRole>>,
    policies: Arc<HashMap<(String, String), ProjectPolicyRecord>>,
    candidates: Arc<HashMap<(String, String), PolicyCandidateRecord>>,
}

/// An edit of the records in memory, checked against them (a message naming the record when
/// refused).
type ApplyEdit = Box<dyn FnOnce(&mut Snapshot) -> Result<(), String> + Send>;

/// How an edit's records in memory follow the written file.
enum Records {
    /// The written file is parsed and checked again, whole.
    Parse,
    /// The edit applied to the records in memory and checked against them (a message naming
    /// the record when refused).
    Apply(ApplyEdit),
}

impl Records {
    fn apply(edit: impl FnOnce(&mut Snapshot) -> Result<(), String> + Send + 'static) -> Self {
        Records::Apply(Box::new(edit))
    }
}

/// A project's module record's own constraints; `project_exists`: whether its project does.
fn check_policy(p: &ProjectPolicyRecord, project_exists: bool) -> Result<(), String> {
    if !project_exists {
        return Err(format!(
            "project_policies: project {:?} does not exist",
            p.project_ref
        ));
    }
    if !is_sha256_hex(&p.digest) {
        return Err(format!(
            "project_policies.{}: digest must be 64 lower-case hex digits",
            p.project_ref
        ));
    }
    Ok(())
}

/// A candidate record's own constraints; `project_exists`: whether its project does.
fn check_candidate(c: &PolicyCandidateRecord, project_exists: bool) -> Result<(), String> {
    let name = format!("policy_candidates.{}.{}", c.project_ref, c.stage);
    if !project_exists {
        return Err(format!("{name}: project does not exist"));
    }
    if !is_sha256_hex(&c.digest) {
        return Err(format!("{name}: digest must be 64 lower-case hex digits"));
    }
    match (c.mode.as_str(), c.percent) {
        ("shadow", 0) | ("canary", 1..=100) => Ok(()),
        ("shadow", _) => Err(format!("{name}: a shadow has no percent")),
        ("canary", _) => Err(format!("{name}: percent must be 1 to 100")),
        (other, _) => Err(format!(
            "{name}: mode {other:?} is not one of shadow, canary"
        )),
    }
}

impl ControlFile {
    /// Parses and checks the same constraints as the Postgres schema (keys, references,
    /// uniqueness), naming the offending record.
    pub fn parse(text: &str) -> Result<Self, String> {
        let file: ControlFile = toml::from_str(text).map_err(|e| e.to_string())?;
        file.check()?;
        Ok(file)
    }

    fn check(&self) -> Result<(), String> {
        let mut orgs = HashSet::new();
        for o in &self.organizations {
            if !orgs.insert(o.id) {
                return Err(format!("organizations: id {} appears twice", o.id));
            }
        }
        let mut projects = HashSet::new();
        for p in &self.projects {
            if p.project_ref.is_empty() {
                return Err("projects: ref must not be empty".into());
            }
            if !projects.insert(p.project_ref.as_str()) {
                return Err(format!("projects: ref {:?} appears twice", p.project_ref));
            }
            if !orgs.contains(&p.organization_id) {
                return Err(format!(
                    "projects.{}: organization {} does not exist",
                    p.project_ref, p.organization_id
                ));
            }
            check_replicas(p)?;
        }
        let mut members = HashSet::new();
        for m in &self.organization_members {
            if !orgs.contains(&m.organization_id) {
                return Err(format!(
                    "organization_members: organization {} does not exist",
                    m.organization_id
                ));
            }
            if !members.insert((m.organization_id, m.user_id)) {
                return Err(format!(
                    "organization_members: user {} appears twice in organization {}",
                    m.user_id, m.organization_id
                ));
            }
        }
        let mut ids = HashSet::new();
        let mut hashes = HashSet::new();
        for k in &self.api_keys {
            if !ids.insert(k.id) {
                return Err(format!("api_keys: id {} appears twice", k.id));
            }
            if !is_sha256_hex(&k.key_sha256) {
                return Err(format!(
                    "api_keys.{}: key_sha256 must be 64 lower-case hex digits",
                    k.id
                ));
            }
            if !hashes.insert(k.key_sha256.as_str()) {
                return Err(format!("api_keys.{}: key_sha256 appears twice", k.id));
            }
            if !projects.contains(k.project_ref.as_str()) {
                return Err(format!(
                    "api_keys.{}: project {:?} does not exist",
                    k.id, k.project_ref
                ));
            }
        }
        let mut policies = HashSet::new();
        for p in &self.project_policies {
            check_policy(p, projects.contains(p.project_ref.as_str()))?;
            if !policies.insert((p.project_ref.as_str(), p.stage.as_str())) {
                return Err(format!(
                    "project_policies: {} has two modules for {}",
                    p.project_ref, p.stage
                ));
            }
        }
        let mut candidates = HashSet::new();
        for c in &self.policy_candidates {
            check_candidate(c, projects.contains(c.project_ref.as_str()))?;
            if !candidates.insert((c.project_ref.as_str(), c.stage.as_str())) {
                return Err(format!(
                    "policy_candidates.{}.{}: appears twice",
                    c.project_ref, c.stage
                ));
            }
        }
        let mut issuer_ids = HashSet::new();
        let mut issuers = HashSet::new();
        let mut per_project: HashMap<&str, usize> = HashMap::new();
        for i in &self.project_issuers {
            let name = format!("project_issuers.{}", i.id);
            if !issuer_ids.insert(i.id) {
                return Err(format!("project_issuers: id {} appears twice", i.id));
            }
            if !projects.contains(i.project_ref.as_str()) {
                return Err(format!(
                    "{name}: project {:?} does not exist",
                    i.project_ref
                ));
            }
            if !issuers.insert((i.project_ref.as_str(), i.issuer.as_str())) {
                return Err(format!(
                    "{name}: project {:?} trusts issuer {:?} twice",
                    i.project_ref, i.issuer
                ));
            }
            let count = per_project.entry(i.project_ref.as_str()).or_default();
            *count += 1;
            if *count > MAX_ISSUERS {
                return Err(format!(
                    "{name}: project {:?} has more than {MAX_ISSUERS} issuers",
                    i.project_ref
                ));
            }
            i.check(MAX_INLINE_KEYS)
                .map_err(|e| format!("{name}.{e}"))?;
        }
        Ok(())
    }

    fn index(mut self) -> Snapshot {
        let mut issuers = std::mem::take(&mut self.project_issuers);
        issuers.sort_by_key(|a| (a.created_at, a.id));
        for issuer in issuers {
            if let Some(project) = self
                .projects
                .iter_mut()
                .find(|p| p.project_ref == issuer.project_ref)
            {
                project.issuers.push(issuer);
            }
        }
        Snapshot {
            organizations: Arc::new(self.organizations.iter().map(|o| o.id).collect()),
            members: Arc::new(
                self.organization_members
                    .iter()
                    .map(|m| ((m.organization_id, m.user_id), m.role))
                    .collect(),
            ),
            projects: Arc::new(
                self.projects
                    .into_iter()
                    .map(|p| (p.project_ref.clone(), p))
                    .collect(),
            ),
            keys: Arc::new(
                self.api_keys
                    .into_iter()
                    .map(|k| (k.key_sha256.clone(), k))
                    .collect(),
            ),
            policies: Arc::new(
                self.project_policies
                    .into_iter()
                    .map(|p| ((p.project_ref.clone(), p.stage.clone()), p))
                    .collect(),
            ),
            candidates: Arc::new(
                self.policy_candidates
                    .into_iter()
                    .map(|c| ((c.project_ref.clone(), c.stage.clone()), c))
                    .collect(),
            ),
        }
    }
}

/// The file-backed store.
#[derive(Debug)]
pub struct FileStore {
    path: Option<PathBuf>,
    snapshot: ArcSwap<Snapshot>,
    stamp: std::sync::Mutex<Option<Stamp>>,
    /// Serialises edits; holds the document the last edit wrote, with the file's stamp then: the
    /// next edit starts from it when the file was not changed since (a large file is not
    /// parsed again for every change).
    writing: tokio::sync::Mutex<Option<(Option<Stamp>, toml_edit::DocumentMut)>>,
    /// Bumped on every reload of the file.
    reloads: tokio::sync::watch::Sender<u64>,
    /// The policy history: files beside the control file, or memory without one.
    history: super::file_history::PolicyHistory,
}

impl FileStore {
    /// A store with no records (no file configured).
    pub fn empty() -> Self {
        Self {
            path: None,
            snapshot: ArcSwap::from_pointee(Snapshot::default()),
            stamp: std::sync::Mutex::new(None),
            writing: tokio::sync::Mutex::new(None),
            reloads: tokio::sync::watch::Sender::new(0),
            history: super::file_history::PolicyHistory::open(None),
        }
    }

    /// Loads `path`; an unreadable or invalid file is an error naming it.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let stamp = stamp(path);
        let snapshot = Self::read(path)?;
        Ok(Self {
            path: Some(path.to_path_buf()),
            snapshot: ArcSwap::from_pointee(snapshot),
            stamp: std::sync::Mutex::new(stamp),
            writing: tokio::sync::Mutex::new(None),
            reloads: tokio::sync::watch::Sender::new(0),
            history: super::file_history::PolicyHistory::open(Some(
                path.parent().unwrap_or_else(|| Path::new(".")),
            )),
        })
    }

    fn read(path: &Path) -> Result<Snapshot, StoreError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| StoreError::Invalid(format!("control file {}: {e}", path.display())))?;
        ControlFile::parse(&text)
            .map(ControlFile::index)
            .map_err(|e| StoreError::Invalid(format!("control file {}: {e}", path.display())))
    }

    /// Reloads the file if it changed since the last load. On an invalid file the previous
    /// records stay in force and the error is returned.
    pub fn reload_if_changed(&self) -> Result<bool, StoreError> {
        let Some(path) = &self.path else {
            return Ok(false);
        };
        let now = stamp(path);
        {
            let last = self
                .stamp
                .lock()
                .map_err(|_| StoreError::Invalid("poisoned".into()))?;
            if *last == now {
                return Ok(false);
            }
        }
        let result = Self::read(path);
        if let Ok(mut last) = self.stamp.lock() {
            *last = now;
        }
        let snapshot = result?;
        self.snapshot.store(Arc::new(snapshot));
        self.reloads.send_modify(|n| *n += 1);
        tracing::info!(file = %path.display(), "control file reloaded");
        Ok(true)
    }

    /// Polls the file every `every` and reloads it when it changes.
    pub fn watch(self: &Arc<Self>, every: Duration) {
        if self.path.is_none() {
            return;
        }
        let weak: Weak<Self> = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(store) = weak.upgrade() else { break };
                if let Err(e) = store.reload_if_changed() {
                    tracing::error!(error = %e, "control file refused; previous records stay in force");
                }
            }
        });
    }

    fn modules_dir(&self) -> Result<PathBuf, StoreError> {
        let path = self.path.as_ref().ok_or_else(|| {
            StoreError::Invalid("no control file is configured (control.file)".into())
        })?;
        Ok(path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default()
            .join("modules"))
    }

    /// Edits the file with `edit` (comments and layout kept) and writes it; the records in
    /// memory then follow as `records` says — or by parsing the written file, when the edit did
    /// not start from the document the last edit wrote (the first edit, or the file changed
    /// since). The document is read, written and checked on a blocking thread.
    async fn edit(
        &self,
        edit: impl FnOnce(&mut toml_edit::DocumentMut) -> Result<(), StoreError>,
        records: Records,
    ) -> Result<(), StoreError> {
        let path = self.path.clone().ok_or_else(|| {
            StoreError::Invalid("no control file is configured (control.file)".into())
        })?;
        let mut written = self.writing.lock().await;
        let before = stamp(&path);
        // The document the last edit wrote, unless the file changed since (or that edit failed:
        // nothing is kept then).
        let kept = written
            .take()
            .filter(|(at, _)| at.is_some() && *at == before)
            .map(|(_, doc)| doc);
        let (mut doc, records) = match kept {
            Some(doc) => (doc, records),
            None => {
                let from = path.clone();
                let doc = blocking(move || read_document(&from)).await??;
                (doc, Records::Parse)
            }
        };
        edit(&mut doc)?;
        let current = self.snapshot.load_full();
        let (doc, snapshot, now) = blocking(move || {
            let new_text = doc.to_string();
            let snapshot = match records {
                Records::Parse => ControlFile::parse(&new_text)
                    .map_err(StoreError::Invalid)?
                    .index(),
                Records::Apply(apply) => {
                    let mut snapshot = Snapshot::clone(&current);
                    apply(&mut snapshot).map_err(StoreError::Invalid)?;
                    snapshot
                }
            };
            let tmp = path.with_extension("tmp");
            std::fs::write(&tmp, &new_text)
                .and_then(|()| std::fs::rename(&tmp, &path))
                .map_err(|e| {
                    StoreError::Invalid(format!("control file {}: {e}", path.display()))
                })?;
            Ok::<_, StoreError>((doc, snapshot, stamp(&path)))
        })
        .await??;
        self.snapshot.store(Arc::new(snapshot));
        if let Ok(mut last) = self.stamp.lock() {
            *last = now;
        }
        *written = Some((now, doc));
        Ok(())
    }
}

/// Runs `work` on a blocking thread: reading, writing and parsing a large control file never
/// holds a request worker.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, StoreError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| StoreError::Invalid(format!("control file edit: {e}")))
}

/// The control file as an editable document.
fn read_document(path: &Path) -> Result<toml_edit::DocumentMut, StoreError> {
    std::fs::read_to_string(path)
        .map_err(|e| e.to_string())
        .and_then(|text| {
            text.parse::<toml_edit::DocumentMut>()
                .map_err(|e| e.to_string())
        })
        .map_err(|e| StoreError::Invalid(format!("control file {}: {e}", path.display())))
}

#[async_trait]
impl ControlStore for FileStore {
    async fn api_key_by_hash(&self, sha256_hex: &str) -> Result<Option<ApiKeyRecord>, StoreError> {
        Ok(self.snapshot.load().keys.get(sha256_hex).cloned())
    }

    async fn project(&self, project_ref: &str) -> Result<Option<ProjectRecord>, StoreError> {
        Ok(self.snapshot.load().projects.get(project_ref).cloned())
    }

    async fn organization_exists(&self, id: Uuid) -> Result<bool, StoreError> {
        Ok(self.snapshot.load().organizations.contains(&id))
    }

    async fn membership(
        &self,
        organization_id: Uuid,
        user_id: Uuid,
    ) -> Result<Option<OrgRole>, StoreError> {
        Ok(self
            .snapshot
            .load()
            .members
            .get(&(organization_id, user_id))
            .copied())
    }

    async fn create_api_key(
        &self,
        project_ref: &str,
        role: KeyRole,
        sha256_hex: &str,
    ) -> Result<ApiKeyRecord, StoreError> {
        if !self.snapshot.load().projects.contains_key(project_ref) {
            return Err(StoreError::NotFound(format!("project {project_ref:?}")));
        }
        let record = ApiKeyRecord {
            id: Uuid::new_v4(),
            project_ref: project_ref.to_owned(),
            role,
            key_sha256: sha256_hex.to_owned(),
            revoked_at: None,
        };
        let r = record.clone();
        self.edit(
            move |doc| {
                let mut table = toml_edit::Table::new();
                table["id"] = toml_edit::value(r.id.to_string());
                table["project_ref"] = toml_edit::value(r.project_ref.clone());
                table["role"] = toml_edit::value(r.role.as_str());
                table["key_sha256"] = toml_edit::value(r.key_sha256.clone());
                let keys = doc
                    .entry("api_keys")
                    .or_insert(toml_edit::Item::ArrayOfTables(
                        toml_edit::ArrayOfTables::new(),
                    ));
                keys.as_array_of_tables_mut()
                    .ok_or_else(|| {
                        StoreError::Invalid("api_keys must be an array of tables".into())
                    })?
                    .push(table);
                Ok(())
            },
            Records::Parse,
        )
        .await?;
        Ok(record)
    }

    async fn revoke_api_key(&self, id: Uuid) -> Result<bool, StoreError> {
        let now = Utc::now();
        let mut found = false;
        let mut changed = false;
        self.edit(
            |doc| {
                if let Some(keys) = doc
                    .get_mut("api_keys")
                    .and_then(|k| k.as_array_of_tables_mut())
                {
                    for table in keys.iter_mut() {
                        if table.get("id").and_then(|v| v.as_str()) == Some(id.to_string().as_str())
                        {
                            found = true;
                            if table.get("revoked_at").is_none() {
                                table["revoked_at"] = toml_edit::value(now.to_rfc3339());
                                changed = true;
                            }
                        }
                    }
                }
                if found {
                    Ok(())
                } else {
                    Err(StoreError::NotFound(format!("api key {id}")))
                }
            },
            Records::Parse,
        )
        .await?;
        Ok(changed)
    }

    async fn set_browser_secret_keys(
        &self,
        project_ref: &str,
        allowed: bool,
    ) -> Result<(), StoreError> {
        self.edit(
            |doc| {
                let set = |table: &mut dyn toml_edit::TableLike| {
                    if table.get("ref").and_then(|v| v.as_str()) != Some(project_ref) {
                        return false;
                    }
                    if allowed {
                        table.insert("browser_secret_keys", toml_edit::value(true));
                    } else {
                        table.remove("browser_secret_keys");
                    }
                    true
                };
                let mut found = false;
                match doc.get_mut("projects") {
                    Some(toml_edit::Item::ArrayOfTables(projects)) => {
                        for table in projects.iter_mut() {
                            found |= set(table);
                        }
                    }
                    Some(toml_edit::Item::Value(toml_edit::Value::Array(projects))) => {
                        for value in projects.iter_mut() {
                            if let Some(table) = value.as_inline_table_mut() {
                                found |= set(table);
                            }
                        }
                    }
                    _ => {}
                }
                if found {
                    Ok(())
                } else {
                    Err(StoreError::NotFound(format!("project {project_ref:?}")))
                }
            },
            Records::Parse,
        )
        .await
    }

    async fn add_issuer(&self, issuer: &IssuerRecord) -> Result<(), StoreError> {
        issuer
            .check(MAX_INLINE_KEYS)
            .map_err(|e| StoreError::Invalid(format!("project_issuers: {e}")))?;
        if !self
            .snapshot
            .load()
            .projects
            .contains_key(&issuer.project_ref)
        {
            return Err(StoreError::NotFound(format!(
                "project {:?}",
                issuer.project_ref
            )));
        }
        let record = issuer.clone();
        self.edit(
            move |doc| {
                let list = doc
                    .entry("project_issuers")
                    .or_insert(toml_edit::Item::ArrayOfTables(
                        toml_edit::ArrayOfTables::new(),
                    ))
                    .as_array_of_tables_mut()
                    .ok_or_else(|| {
                        StoreError::Invalid("project_issuers must be an array of tables".into())
                    })?;
                // Checked against the file itself, under the write lock: no other writer races.
                let of_project = list
                    .iter()
                    .filter(|t| {
                        t.get("project_ref").and_then(|v| v.as_str())
                            == Some(record.project_ref.as_str())
                    })
                    .collect::<Vec<_>>();
                if of_project.iter().any(|t| {
                    t.get("issuer").and_then(|v| v.as_str()) == Some(record.issuer.as_str())
                }) {
                    return Err(StoreError::issuer_exists());
                }
                if of_project.len() >= MAX_ISSUERS {
                    return Err(StoreError::too_many_issuers());
                }
                list.push(issuer_table(&record));
                Ok(())
            },
            Records::Parse,
        )
        .await
    }

    async fn remove_issuer(&self, project_ref: &str, id: Uuid) -> Result<bool, StoreError> {
        let mut removed = false;
        let id = id.to_string();
        let result = self
            .edit(
                |doc| {
                    if let Some(list) = doc
                        .get_mut("project_issuers")
                        .and_then(|i| i.as_array_of_tables_mut())
                    {
                        let before = list.len();
                        list.retain(|t| {
                            !(t.get("id").and_then(|v| v.as_str()) == Some(id.as_str())
                                && t.get("project_ref").and_then(|v| v.as_str())
                                    == Some(project_ref))
                        });
                        removed = list.len() < before;
                    }
                    if removed {
                        Ok(())
                    } else {
                        // Nothing to write.
                        Err(StoreError::NotFound(String::new()))
                    }
                },
                Records::Parse,
            )
            .await;
        match result {
            Ok(()) => Ok(true),
            Err(StoreError::NotFound(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    async fn append_policy_event(&self, event: &PolicyEventRecord) -> Result<(), StoreError> {
        let _guard = self.writing.lock().await;
        self.history.append(event)
    }

    async fn policy_events(
        &self,
        project_ref: Option<&str>,
        stage: Option<&str>,
        limit: usize,
    ) -> Result<Vec<PolicyEventRecord>, StoreError> {
        self.history.list(project_ref, stage, limit)
    }

    async fn policy_event_of(
        &self,
        project_ref: Option<&str>,
        stage: &str,
        digest: &str,
    ) -> Result<Option<PolicyEventRecord>, StoreError> {
        self.history.event_of(project_ref, stage, digest)
    }

    async fn put_module(&self, digest: &str, module: &[u8]) -> Result<(), StoreError> {
        let dir = self.modules_dir()?;
        std::fs::create_dir_all(&dir)
            .map_err(|e| StoreError::Invalid(format!("{}: {e}", dir.display())))?;
        let path = dir.join(format!("{digest}.wasm"));
        if path.is_file() {
            // Stored again: in use from now on.
            return self.touch_modules(&[digest.to_owned()]).await;
        }
        let tmp = dir.join(format!("{digest}.tmp"));
        std::fs::write(&tmp, module)
            .and_then(|()| std::fs::rename(&tmp, &path))
            .map_err(|e| StoreError::Invalid(format!("{}: {e}", path.display())))
    }

    async fn module(&self, digest: &str) -> Result<Option<Vec<u8>>, StoreError> {
        if !is_sha256_hex(digest) {
            return Ok(None);
        }
        let path = self.modules_dir()?.join(format!("{digest}.wasm"));
        match std::fs::read(&path) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(StoreError::Invalid(format!("{}: {e}", path.display()))),
        }
    }

    async fn set_project_policy(&self, policy: &ProjectPolicyRecord) -> Result<(), StoreError> {
        let p = policy.clone();
        let policy = policy.clone();
        self.edit(
            move |doc| {
                let list = doc
                    .entry("project_policies")
                    .or_insert(toml_edit::Item::ArrayOfTables(
                        toml_edit::ArrayOfTables::new(),
                    ))
                    .as_array_of_tables_mut()
                    .ok_or_else(|| {
                        StoreError::Invalid("project_policies must be an array of tables".into())
                    })?;
                let existing = list.iter_mut().find(|t| {
                    t.get("project_ref").and_then(|v| v.as_str()) == Some(p.project_ref.as_str())
                        && t.get("stage").and_then(|v| v.as_str()) == Some(p.stage.as_str())
                });
                match existing {
                    Some(table) => {
                        table["digest"] = toml_edit::value(p.digest.clone());
                        table["config"] = toml_edit::value(p.config.clone());
                    }
                    None => {
                        let mut table = toml_edit::Table::new();
                        table["project_ref"] = toml_edit::value(p.project_ref.clone());
                        table["stage"] = toml_edit::value(p.stage.clone());
                        table["digest"] = toml_edit::value(p.digest.clone());
                        table["config"] = toml_edit::value(p.config.clone());
                        list.push(table);
                    }
                }
                Ok(())
            },
            Records::apply(move |records| {
                let exists = records.projects.contains_key(&policy.project_ref);
                check_policy(&policy, exists)?;
                let key = (policy.project_ref.clone(), policy.stage.clone());
                Arc::make_mut(&mut records.policies).insert(key, policy);
                Ok(())
            }),
        )
        .await
    }

    async fn project_policy(
        &self,
        project_ref: &str,
        stage: &str,
    ) -> Result<Option<ProjectPolicyRecord>, StoreError> {
        Ok(self
            .snapshot
            .load()
            .policies
            .get(&(project_ref.to_owned(), stage.to_owned()))
            .cloned())
    }

    async fn delete_project_policy(
        &self,
        project_ref: &str,
        stage: &str,
    ) -> Result<bool, StoreError> {
        if self.project_policy(project_ref, stage).await?.is_none() {
            return Ok(false);
        }
        let key = (project_ref.to_owned(), stage.to_owned());
        self.edit(
            |doc| {
                if let Some(list) = doc
                    .get_mut("project_policies")
                    .and_then(|l| l.as_array_of_tables_mut())
                {
                    let index = list.iter().position(|t| {
                        t.get("project_ref").and_then(|v| v.as_str()) == Some(project_ref)
                            && t.get("stage").and_then(|v| v.as_str()) == Some(stage)
                    });
                    if let Some(i) = index {
                        list.remove(i);
                    }
                }
                Ok(())
            },
            Records::apply(move |records| {
                Arc::make_mut(&mut records.policies).remove(&key);
                Ok(())
            }),
        )
        .await?;
        Ok(true)
    }

    async fn project_policies(&self) -> Result<Vec<ProjectPolicyRecord>, StoreError> {
        Ok(self.snapshot.load().policies.values().cloned().collect())
    }

    async fn set_policy_candidate(
        &self,
        candidate: &PolicyCandidateRecord,
    ) -> Result<(), StoreError> {
        let c = candidate.clone();
        let candidate = candidate.clone();
        self.edit(
            move |doc| {
                let list = doc
                    .entry("policy_candidates")
                    .or_insert(toml_edit::Item::ArrayOfTables(
                        toml_edit::ArrayOfTables::new(),
                    ))
                    .as_array_of_tables_mut()
                    .ok_or_else(|| {
                        StoreError::Invalid("policy_candidates must be an array of tables".into())
                    })?;
                let index = list.iter().position(|t| {
                    t.get("project_ref").and_then(|v| v.as_str()) == Some(c.project_ref.as_str())
                        && t.get("stage").and_then(|v| v.as_str()) == Some(c.stage.as_str())
                });
                let mut table = toml_edit::Table::new();
                table["project_ref"] = toml_edit::value(c.project_ref.clone());
                table["stage"] = toml_edit::value(c.stage.clone());
                table["digest"] = toml_edit::value(c.digest.clone());
                table["config"] = toml_edit::value(c.config.clone());
                table["mode"] = toml_edit::value(c.mode.clone());
                table["percent"] = toml_edit::value(i64::from(c.percent));
                match index.and_then(|i| list.get_mut(i)) {
                    Some(existing) => *existing = table,
                    None => list.push(table),
                }
                Ok(())
            },
            Records::apply(move |records| {
                let exists = records.projects.contains_key(&candidate.project_ref);
                check_candidate(&candidate, exists)?;
                let key = (candidate.project_ref.clone(), candidate.stage.clone());
                Arc::make_mut(&mut records.candidates).insert(key, candidate);
                Ok(())
            }),
        )
        .await
    }

    async fn policy_candidate(
        &self,
        project_ref: &str,
        stage: &str,
    ) -> Result<Option<PolicyCandidateRecord>, StoreError> {
        Ok(self
            .snapshot
            .load()
            .candidates
            .get(&(project_ref.to_owned(), stage.to_owned()))
            .cloned())
    }

    async fn delete_policy_candidate(
        &self,
        project_ref: &str,
        stage: &str,
    ) -> Result<bool, StoreError> {
        if self.policy_candidate(project_ref, stage).await?.is_none() {
            return Ok(false);
        }
        let key = (project_ref.to_owned(), stage.to_owned());
        self.edit(
            |doc| {
                if let Some(list) = doc
                    .get_mut("policy_candidates")
                    .and_then(|l| l.as_array_of_tables_mut())
                {
                    list.retain(|t| {
                        t.get("project_ref").and_then(|v| v.as_str()) != Some(project_ref)
                            || t.get("stage").and_then(|v| v.as_str()) != Some(stage)
                    });
                }
                Ok(())
            },
            Records::apply(move |records| {
                Arc::make_mut(&mut records.candidates).remove(&key);
                Ok(())
            }),
        )
        .await?;
        Ok(true)
    }

    async fn policy_candidates(&self) -> Result<Vec<PolicyCandidateRecord>, StoreError> {
        Ok(self.snapshot.load().candidates.values().cloned().collect())
    }

    async fn touch_modules(&self, digests: &[String]) -> Result<(), StoreError> {
        let Ok(dir) = self.modules_dir() else {
            return Ok(());
        };
        let now = SystemTime::now();
        for digest in digests.iter().filter(|d| is_sha256_hex(d)) {
            let path = dir.join(format!("{digest}.wasm"));
            // The file's modification time is its last use.
            if let Ok(file) = std::fs::File::options().append(true).open(&path) {
                let _ = file.set_modified(now);
            }
        }
        Ok(())
    }

    async fn collect_modules(&self, grace: Duration) -> Result<Vec<String>, StoreError> {
        let Ok(dir) = self.modules_dir() else {
            return Ok(Vec::new());
        };
        let snapshot = self.snapshot.load();
        let referenced: std::collections::HashSet<String> = snapshot
            .policies
            .values()
            .map(|p| p.digest.clone())
            .chain(snapshot.candidates.values().map(|c| c.digest.clone()))
            .collect();
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return Ok(Vec::new());
        };
        let mut collected = Vec::new();
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(digest) = name.strip_suffix(".wasm").filter(|d| is_sha256_hex(d)) else {
                continue;
            };
            if referenced.contains(digest) {
                continue;
            }
            let idle = entry
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|at| at.elapsed().ok());
            if idle.is_some_and(|idle| idle >= grace) && std::fs::remove_file(entry.path()).is_ok()
            {
                collected.push(digest.to_owned());
            }
        }
        Ok(collected)
    }

    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }

    fn kind(&self) -> &'static str {
        "file"
    }

    fn reloads(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        Some(self.reloads.subscribe())
    }
}

/// An issuer as a `[[project_issuers]]` table.
fn issuer_table(record: &IssuerRecord) -> toml_edit::Table {
    let strings = |list: &[String]| {
        toml_edit::value(toml_edit::Array::from_iter(list.iter().map(String::as_str)))
    };
    let mut table = toml_edit::Table::new();
    table["id"] = toml_edit::value(record.id.to_string());
    table["project_ref"] = toml_edit::value(record.project_ref.clone());
    table["issuer"] = toml_edit::value(record.issuer.clone());
    if let Some(url) = &record.jwks_url {
        table["jwks_url"] = toml_edit::value(url.clone());
    }
    if let Some(keys) = &record.keys {
        table["keys"] = toml_edit::value(keys.clone());
    }
    table["algorithms"] = strings(&record.algorithms);
    table["audience_claim"] = toml_edit::value(record.audience_claim.clone());
    table["audiences"] = strings(&record.audiences);
    if let Some(claim) = &record.role_claim {
        table["role_claim"] = toml_edit::value(claim.clone());
    }
    table["allowed_roles"] = strings(&record.allowed_roles);
    let created_at = record.created_at.unwrap_or_else(Utc::now);
    table["created_at"] = toml_edit::value(created_at.to_rfc3339());
    if let Some(by) = &record.created_by {
        table["created_by"] = toml_edit::value(by.clone());
    }
    table
}

/// A project's read replicas as the Postgres store bounds them: `http(s)` URLs of at most 2048
/// bytes, each once, regions of 1 to 64 bytes, at most [`MAX_REPLICAS`].
fn check_replicas(project: &ProjectRecord) -> Result<(), String> {
    let key = format!("projects.{}.replicas", project.project_ref);
    if project.replicas.len() > MAX_REPLICAS {
        return Err(format!("{key}: at most {MAX_REPLICAS} replicas"));
    }
    let mut urls = HashSet::new();
    for (i, r) in project.replicas.iter().enumerate() {
        if !(r.url.starts_with("http://") || r.url.starts_with("https://")) || r.url.len() > 2048 {
            return Err(format!(
                "{key}[{i}].url: must be an http(s) URL of at most 2048 bytes"
            ));
        }
        if !urls.insert(r.url.as_str()) {
            return Err(format!("{key}[{i}].url: {:?} appears twice", r.url));
        }
        if r.region
            .as_ref()
            .is_some_and(|g| g.is_empty() || g.len() > 64)
        {
            return Err(format!("{key}[{i}].region: must be 1 to 64 bytes"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ORG: &str = "00000000-0000-4000-8000-0000000000aa";

    fn digest(n: u8) -> String {
        format!("{n:064x}")
    }

    fn policy(project: &str, n: u8) -> ProjectPolicyRecord {
        ProjectPolicyRecord {
            project_ref: project.into(),
            stage: "cors".into(),
            digest: digest(n),
            config: format!("{{\"n\": {n}}}"),
        }
    }

    fn candidate(project: &str, n: u8) -> PolicyCandidateRecord {
        PolicyCandidateRecord {
            project_ref: project.into(),
            stage: "cors".into(),
            digest: digest(n),
            config: "{}".into(),
            mode: "canary".into(),
            percent: 10,
        }
    }

    fn control_file(dir: &Path, projects: &[&str]) -> PathBuf {
        let mut text = format!("# kept\n[[organizations]]\nid = \"{ORG}\"\nname = \"o\"\n\n");
        for p in projects {
            text += &format!(
                "[[projects]]\nref = \"{p}\"\norganization_id = \"{ORG}\"\n\
                 db_engine = \"postgres\"\ntopology = \"shared\"\n\n"
            );
        }
        let path = dir.join("control.toml");
        std::fs::write(&path, text).expect("control file written");
        path
    }

    /// The records in memory, and the ones of the written file parsed whole: equal.
    fn assert_in_line(store: &FileStore, path: &Path) {
        let parsed = FileStore::read(path).expect("the written file is valid");
        let memory = store.snapshot.load();
        let sorted = |m: &HashMap<(String, String), ProjectPolicyRecord>| {
            let mut v: Vec<_> = m.values().cloned().collect();
            v.sort_by(|a, b| (&a.project_ref, &a.stage).cmp(&(&b.project_ref, &b.stage)));
            v
        };
        assert_eq!(sorted(&memory.policies), sorted(&parsed.policies));
        let mut a: Vec<_> = memory.candidates.values().cloned().collect();
        let mut b: Vec<_> = parsed.candidates.values().cloned().collect();
        a.sort_by(|x, y| x.project_ref.cmp(&y.project_ref));
        b.sort_by(|x, y| x.project_ref.cmp(&y.project_ref));
        assert_eq!(a, b);
        assert_eq!(memory.projects.len(), parsed.projects.len());
    }

    #[tokio::test]
    async fn module_changes_applied_in_memory_match_the_written_file_parsed_whole() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = control_file(dir.path(), &["a", "b", "c"]);
        let store = FileStore::open(&path).expect("opens");

        // The first edit parses the file; the next ones apply to the records in memory.
        store.set_project_policy(&policy("a", 1)).await.expect("a");
        assert_in_line(&store, &path);
        store.set_project_policy(&policy("b", 2)).await.expect("b");
        store
            .set_project_policy(&policy("a", 3))
            .await
            .expect("a again");
        assert_in_line(&store, &path);
        assert_eq!(
            store.project_policy("a", "cors").await.expect("read"),
            Some(policy("a", 3))
        );
        store
            .set_policy_candidate(&candidate("c", 4))
            .await
            .expect("candidate");
        assert_in_line(&store, &path);
        assert!(
            store
                .delete_policy_candidate("c", "cors")
                .await
                .expect("delete")
        );
        assert!(
            store
                .delete_project_policy("b", "cors")
                .await
                .expect("delete")
        );
        assert!(
            !store
                .delete_project_policy("b", "cors")
                .await
                .expect("gone")
        );
        assert_in_line(&store, &path);
        assert_eq!(
            store.project_policies().await.expect("list"),
            vec![policy("a", 3)]
        );
        let text = std::fs::read_to_string(&path).expect("read");
        assert!(text.starts_with("# kept\n"), "the file's comments are kept");
    }

    #[tokio::test]
    async fn a_module_of_a_project_that_is_not_there_is_refused_on_the_path_in_memory_too() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = control_file(dir.path(), &["a"]);
        let store = FileStore::open(&path).expect("opens");
        store.set_project_policy(&policy("a", 1)).await.expect("a");
        let before = std::fs::read_to_string(&path).expect("read");

        let error = store
            .set_project_policy(&policy("ghost", 2))
            .await
            .expect_err("no such project");
        assert!(
            error.to_string().contains("\"ghost\" does not exist"),
            "{error}"
        );
        let mut bad = candidate("a", 3);
        bad.percent = 0;
        let error = store
            .set_policy_candidate(&bad)
            .await
            .expect_err("bad percent");
        assert!(
            error.to_string().contains("percent must be 1 to 100"),
            "{error}"
        );
        let mut bad = policy("a", 4);
        bad.digest = "not-hex".into();
        let error = store
            .set_project_policy(&bad)
            .await
            .expect_err("bad digest");
        assert!(error.to_string().contains("64 lower-case hex"), "{error}");

        // Nothing refused was written or kept, and the next edit starts from the file.
        assert_eq!(std::fs::read_to_string(&path).expect("read"), before);
        assert_eq!(
            store.project_policies().await.expect("list"),
            vec![policy("a", 1)]
        );
        store.set_project_policy(&policy("a", 5)).await.expect("a");
        assert_in_line(&store, &path);
    }

    #[tokio::test]
    async fn a_change_made_to_the_file_by_hand_between_two_edits_is_kept_by_the_next() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = control_file(dir.path(), &["a"]);
        let store = FileStore::open(&path).expect("opens");
        store.set_project_policy(&policy("a", 1)).await.expect("a");

        // An operator adds a project by hand; the watch has not reloaded it yet.
        let mut text = std::fs::read_to_string(&path).expect("read");
        text += &format!(
            "\n[[projects]]\nref = \"hand\"\norganization_id = \"{ORG}\"\n\
             db_engine = \"postgres\"\ntopology = \"shared\"\n"
        );
        // A different length, so that the file's stamp changes even within one clock tick.
        std::fs::write(&path, text).expect("written by hand");

        store
            .set_project_policy(&policy("hand", 2))
            .await
            .expect("the new project's module");
        assert!(store.project("hand").await.expect("read").is_some());
        assert_in_line(&store, &path);
    }
}
