//! One set of control records, loadable into either store, and tokens for its users.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use aura_gateway::auth::keys::hash_key;
use aura_gateway::control::file::FileStore;
use aura_gateway::control::{
    ApiKeyRecord, ControlStore, IssuerRecord, KeyRole, OrgRole, PolicyCandidateRecord as Candidate,
    PolicyEventRecord as Event, ProjectPolicyRecord, ProjectRecord, StoreError,
};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use uuid::Uuid;

use super::postgres::TestDatabase;

pub const USER_SECRET: &str = "test-user-jwt-secret-0123456789abcdef";
pub const CONSOLE_SECRET: &str = "test-console-jwt-secret-0123456789abcdef";

/// The records: organization A (projects `alpha`, `beta`, dedicated `gamma`), organization B
/// (project `other`), members of A with every role, and keys.
#[derive(Debug, Clone)]
pub struct Fixture {
    pub org_a: Uuid,
    pub org_b: Uuid,
    pub owner: Uuid,
    pub admin: Uuid,
    pub developer: Uuid,
    pub reader: Uuid,
    pub outsider: Uuid,
    pub anon_key: String,
    pub service_key: String,
    pub other_project_key: String,
    pub revoked_key: String,
    pub anon_key_id: Uuid,
    pub service_key_id: Uuid,
}

impl Default for Fixture {
    fn default() -> Self {
        Self::new()
    }
}

impl Fixture {
    pub fn new() -> Self {
        let rnd = || Uuid::new_v4().simple().to_string();
        Self {
            org_a: Uuid::new_v4(),
            org_b: Uuid::new_v4(),
            owner: Uuid::new_v4(),
            admin: Uuid::new_v4(),
            developer: Uuid::new_v4(),
            reader: Uuid::new_v4(),
            outsider: Uuid::new_v4(),
            anon_key: format!("aura_pk_{}", rnd()),
            service_key: format!("aura_sk_{}", rnd()),
            other_project_key: format!("aura_pk_{}", rnd()),
            revoked_key: format!("aura_pk_{}", rnd()),
            anon_key_id: Uuid::new_v4(),
            service_key_id: Uuid::new_v4(),
        }
    }

    fn keys(&self) -> Vec<(Uuid, &str, KeyRole, &str, bool)> {
        vec![
            (
                self.anon_key_id,
                "alpha",
                KeyRole::Anon,
                self.anon_key.as_str(),
                false,
            ),
            (
                self.service_key_id,
                "alpha",
                KeyRole::ServiceRole,
                self.service_key.as_str(),
                false,
            ),
            (
                Uuid::new_v4(),
                "other",
                KeyRole::Anon,
                self.other_project_key.as_str(),
                false,
            ),
            (
                Uuid::new_v4(),
                "alpha",
                KeyRole::Anon,
                self.revoked_key.as_str(),
                true,
            ),
        ]
    }

    fn members(&self) -> Vec<(Uuid, Uuid, OrgRole)> {
        vec![
            (self.org_a, self.owner, OrgRole::Owner),
            (self.org_a, self.admin, OrgRole::Admin),
            (self.org_a, self.developer, OrgRole::Developer),
            (self.org_a, self.reader, OrgRole::ReadOnly),
            (self.org_b, self.outsider, OrgRole::Owner),
        ]
    }

    /// The records as a control file.
    pub fn control_file(&self) -> String {
        let mut s = format!(
            "[[organizations]]\nid = \"{}\"\nname = \"A\"\n\n[[organizations]]\nid = \"{}\"\nname = \"B\"\n\n",
            self.org_a, self.org_b
        );
        for (r, org, topology, plan) in [
            ("alpha", self.org_a, "shared", "free"),
            ("beta", self.org_a, "shared", "pro"),
            ("gamma", self.org_a, "dedicated", "free"),
            ("other", self.org_b, "shared", "free"),
        ] {
            s += &format!(
                "[[projects]]\nref = \"{r}\"\norganization_id = \"{org}\"\ndb_engine = \"postgres\"\ntopology = \"{topology}\"\nplan = \"{plan}\"\n"
            );
            if r == "gamma" {
                let replicas: Vec<String> = GAMMA_REPLICAS
                    .iter()
                    .map(|(url, region)| format!("{{ url = \"{url}\", region = \"{region}\" }}"))
                    .collect();
                s += &format!("replicas = [{}]\n", replicas.join(", "));
            }
            s += "\n";
        }
        for (org, user, role) in self.members() {
            s += &format!(
                "[[organization_members]]\norganization_id = \"{org}\"\nuser_id = \"{user}\"\nrole = \"{}\"\n\n",
                role.as_str()
            );
        }
        for (id, project, role, key, revoked) in self.keys() {
            s += &format!(
                "[[api_keys]]\nid = \"{id}\"\nproject_ref = \"{project}\"\nrole = \"{}\"\nkey_sha256 = \"{}\"\n{}\n",
                role.as_str(),
                hash_key(key),
                if revoked {
                    "revoked_at = \"2020-01-01T00:00:00Z\"\n"
                } else {
                    ""
                }
            );
        }
        s
    }

    /// Control-file records of more shared projects of organization A, named `refs`, to append
    /// to the fixture's ([`super::builder::Builder::records`]): A's members manage them as they
    /// do `alpha`. The fixture's own records stay as they are.
    pub fn projects_of_a(&self, refs: &[String]) -> String {
        refs.iter()
            .map(|r| {
                format!(
                    "[[projects]]\nref = \"{r}\"\norganization_id = \"{}\"\ndb_engine = \"postgres\"\ntopology = \"shared\"\n\n",
                    self.org_a
                )
            })
            .collect()
    }

    /// A file store holding the records, in `dir`.
    pub fn file_store(&self, dir: &std::path::Path) -> FileStore {
        let path = dir.join("control.toml");
        std::fs::write(&path, self.control_file()).expect("write control file");
        FileStore::open(&path).expect("valid control file")
    }

    /// Inserts the records into a migrated database.
    pub async fn seed(&self, db: &TestDatabase) {
        db.execute(&self.seed_sql()).await;
    }

    /// The SQL inserting the records into a migrated database.
    pub fn seed_sql(&self) -> String {
        let mut sql = format!(
            "INSERT INTO aura_control.organizations (id, name) VALUES ('{}', 'A'), ('{}', 'B');\n",
            self.org_a, self.org_b
        );
        sql += &format!(
            "INSERT INTO aura_control.projects (ref, organization_id, db_engine, topology, plan) VALUES \
             ('alpha', '{a}', 'postgres', 'shared', 'free'), ('beta', '{a}', 'postgres', 'shared', 'pro'), \
             ('gamma', '{a}', 'postgres', 'dedicated', 'free'), ('other', '{b}', 'postgres', 'shared', 'free');\n",
            a = self.org_a,
            b = self.org_b
        );
        for (url, region) in GAMMA_REPLICAS {
            sql += &format!(
                "INSERT INTO aura_control.project_replicas VALUES ('gamma', '{url}', '{region}');\n"
            );
        }
        let members = self.members().into_iter().map(|(org, user, role)| {
            let role = role.as_str();
            format!("INSERT INTO aura_control.organization_members VALUES ('{org}', '{user}', '{role}');\n")
        });
        let keys = self.keys().into_iter().map(|(id, project, role, key, revoked)| {
            let (role, hash) = (role.as_str(), hash_key(key));
            let revoked_at = if revoked { "'2020-01-01T00:00:00Z'" } else { "NULL" };
            format!("INSERT INTO aura_control.api_keys VALUES ('{id}', '{project}', '{role}', '{hash}', {revoked_at});\n")
        });
        sql + &members.chain(keys).collect::<String>()
    }
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_secs()
}

/// Signs `claims` with HS256 and `secret`.
pub fn hs256(secret: &str, claims: serde_json::Value) -> String {
    jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(secret.as_bytes()).expect("secret"),
    )
    .expect("sign")
}

/// A valid user token for `project`.
pub fn user_token(project: &str, user: Uuid) -> String {
    hs256(
        USER_SECRET,
        serde_json::json!({ "sub": user.to_string(), "aud": "authenticated", "ref": project, "exp": now() + 600 }),
    )
}

/// A valid console token for `user`.
pub fn console_token(user: Uuid) -> String {
    console_token_with(
        serde_json::json!({ "sub": user.to_string(), "aud": "aurabase-control", "exp": now() + 600 }),
    )
}

/// A console token with these claims.
pub fn console_token_with(claims: serde_json::Value) -> String {
    hs256(CONSOLE_SECRET, claims)
}

/// The read replicas of project `gamma` (url, region), in the order of their URLs.
pub const GAMMA_REPLICAS: [(&str, &str); 2] = [
    ("http://gamma-eu.pg.internal:3000", "eu-west"),
    ("http://gamma-us.pg.internal:3000", "us-east"),
];

/// Seconds since the epoch.
pub fn epoch() -> u64 {
    now()
}

/// What a store answers.
type Found<T> = Result<T, StoreError>;

/// A store wrapper counting key lookups per hash, and able to hold a refresh of the project
/// policies between reading them and answering.
#[derive(Debug)]
pub struct CountingStore {
    pub inner: Arc<dyn ControlStore>,
    pub key_lookups: std::sync::Mutex<std::collections::HashMap<String, usize>>,
    pub total: AtomicUsize,
    hold: std::sync::Mutex<Option<Hold>>,
}

/// An armed hold: the next `project_policies` call reads its records, says so on `entered`,
/// then waits for `release` before answering them.
#[derive(Debug)]
struct Hold {
    entered: tokio::sync::oneshot::Sender<()>,
    release: tokio::sync::oneshot::Receiver<()>,
}

impl CountingStore {
    pub fn new(inner: Arc<dyn ControlStore>) -> Self {
        Self {
            inner,
            key_lookups: Default::default(),
            total: AtomicUsize::new(0),
            hold: std::sync::Mutex::new(None),
        }
    }

    /// Holds the next read of the project policies after it read the records: returns when it
    /// has read them, and the sender that lets it answer.
    pub async fn hold_next_policy_read(&self) -> tokio::sync::oneshot::Sender<()> {
        let (entered_tx, entered_rx) = tokio::sync::oneshot::channel();
        let (release_tx, release_rx) = tokio::sync::oneshot::channel();
        *self.hold.lock().expect("lock") = Some(Hold {
            entered: entered_tx,
            release: release_rx,
        });
        entered_rx.await.expect("a refresh read the policies");
        release_tx
    }

    pub fn max_lookups_of_one_key(&self) -> usize {
        self.key_lookups
            .lock()
            .expect("lock")
            .values()
            .copied()
            .max()
            .unwrap_or(0)
    }
}

#[async_trait]
impl ControlStore for CountingStore {
    async fn api_key_by_hash(&self, h: &str) -> Found<Option<ApiKeyRecord>> {
        self.total.fetch_add(1, Ordering::SeqCst);
        *self
            .key_lookups
            .lock()
            .expect("lock")
            .entry(h.to_owned())
            .or_default() += 1;
        self.inner.api_key_by_hash(h).await
    }
    async fn project(&self, r: &str) -> Found<Option<ProjectRecord>> {
        self.inner.project(r).await
    }
    async fn organization_exists(&self, id: Uuid) -> Found<bool> {
        self.inner.organization_exists(id).await
    }
    async fn membership(&self, o: Uuid, u: Uuid) -> Found<Option<OrgRole>> {
        self.inner.membership(o, u).await
    }
    async fn create_api_key(&self, p: &str, r: KeyRole, h: &str) -> Found<ApiKeyRecord> {
        self.inner.create_api_key(p, r, h).await
    }
    async fn revoke_api_key(&self, id: Uuid) -> Found<bool> {
        self.inner.revoke_api_key(id).await
    }
    async fn set_browser_secret_keys(&self, p: &str, allowed: bool) -> Found<()> {
        self.inner.set_browser_secret_keys(p, allowed).await
    }
    async fn add_issuer(&self, issuer: &IssuerRecord) -> Found<()> {
        self.inner.add_issuer(issuer).await
    }
    async fn remove_issuer(&self, p: &str, id: Uuid) -> Found<bool> {
        self.inner.remove_issuer(p, id).await
    }
    async fn put_module(&self, d: &str, m: &[u8]) -> Found<()> {
        self.inner.put_module(d, m).await
    }
    async fn module(&self, d: &str) -> Found<Option<Vec<u8>>> {
        self.inner.module(d).await
    }
    async fn set_project_policy(&self, p: &ProjectPolicyRecord) -> Found<()> {
        self.inner.set_project_policy(p).await
    }
    async fn project_policies(&self) -> Found<Vec<ProjectPolicyRecord>> {
        let records = self.inner.project_policies().await;
        let hold = self.hold.lock().expect("lock").take();
        if let Some(hold) = hold {
            let _ = hold.entered.send(());
            let _ = hold.release.await;
        }
        records
    }
    async fn project_policy(&self, r: &str, s: &str) -> Found<Option<ProjectPolicyRecord>> {
        self.inner.project_policy(r, s).await
    }
    async fn delete_project_policy(&self, r: &str, s: &str) -> Found<bool> {
        self.inner.delete_project_policy(r, s).await
    }
    async fn append_policy_event(&self, event: &Event) -> Found<()> {
        self.inner.append_policy_event(event).await
    }
    async fn policy_events(&self, p: Option<&str>, s: Option<&str>, n: usize) -> Found<Vec<Event>> {
        self.inner.policy_events(p, s, n).await
    }
    async fn policy_event_of(&self, p: Option<&str>, s: &str, d: &str) -> Found<Option<Event>> {
        self.inner.policy_event_of(p, s, d).await
    }
    async fn set_policy_candidate(&self, c: &Candidate) -> Found<()> {
        self.inner.set_policy_candidate(c).await
    }
    async fn policy_candidate(&self, r: &str, s: &str) -> Found<Option<Candidate>> {
        self.inner.policy_candidate(r, s).await
    }
    async fn policy_candidates(&self) -> Found<Vec<Candidate>> {
        self.inner.policy_candidates().await
    }
    async fn delete_policy_candidate(&self, r: &str, s: &str) -> Found<bool> {
        self.inner.delete_policy_candidate(r, s).await
    }
    async fn touch_modules(&self, digests: &[String]) -> Found<()> {
        self.inner.touch_modules(digests).await
    }
    async fn collect_modules(&self, grace: std::time::Duration) -> Found<Vec<String>> {
        self.inner.collect_modules(grace).await
    }
    async fn ping(&self) -> Found<()> {
        self.inner.ping().await
    }
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }
}
