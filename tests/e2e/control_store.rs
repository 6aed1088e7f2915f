//! One suite, run against both control store implementations: they must behave the same.

use std::sync::Arc;
use std::time::Duration;

use aura_gateway::auth::keys::hash_key;
use aura_gateway::control::{
    ControlStore, DbEngine, IssuerRecord, KeyRole, OrgRole, StoreError, Topology,
};
use uuid::Uuid;

use crate::support::fixture::Fixture;
use crate::support::poll::poll_tries;
use crate::support::postgres::TestDatabase;

async fn contract(store: &dyn ControlStore, fx: &Fixture) {
    let now = chrono::Utc::now();
    let key = async |key: &str| store.api_key_by_hash(&hash_key(key)).await.expect("lookup");
    let anon = key(&fx.anon_key).await.expect("the anon key exists");
    assert_eq!(anon.id, fx.anon_key_id);
    assert_eq!(anon.project_ref, "alpha");
    assert_eq!(anon.role, KeyRole::Anon);
    assert!(!anon.is_revoked(now));
    let service = key(&fx.service_key).await.expect("exists");
    assert_eq!(service.role, KeyRole::ServiceRole);
    let revoked = key(&fx.revoked_key)
        .await
        .expect("revoked keys are still found");
    assert!(revoked.is_revoked(now));
    assert!(key("aura_pk_nope").await.is_none());

    let project = async |r: &str| store.project(r).await.expect("lookup");
    let alpha = project("alpha").await.expect("alpha");
    assert_eq!(alpha.organization_id, fx.org_a);
    let kind = (alpha.db_engine, alpha.topology);
    assert_eq!(kind, (DbEngine::Postgres, Topology::Shared));
    assert_eq!(alpha.plan, "free");
    assert_eq!(project("beta").await.expect("beta").plan, "pro");
    let gamma = project("gamma").await.expect("gamma");
    assert_eq!(gamma.topology, Topology::Dedicated);
    assert_eq!(gamma.postgrest_url, None);
    let replicas: Vec<(&str, Option<&str>)> = gamma
        .replicas
        .iter()
        .map(|r| (r.url.as_str(), r.region.as_deref()))
        .collect();
    let expected: Vec<(&str, Option<&str>)> = crate::support::fixture::GAMMA_REPLICAS
        .iter()
        .map(|(url, region)| (*url, Some(*region)))
        .collect();
    assert_eq!(replicas, expected, "the project's read replicas");
    assert!(project("alpha").await.expect("alpha").replicas.is_empty());
    assert!(project("missing").await.is_none());

    assert!(store.organization_exists(fx.org_a).await.expect("lookup"));
    assert!(
        !store
            .organization_exists(Uuid::new_v4())
            .await
            .expect("lookup")
    );
    let member = async |org, user| store.membership(org, user).await.expect("lookup");
    assert_eq!(member(fx.org_a, fx.owner).await, Some(OrgRole::Owner));
    assert_eq!(member(fx.org_a, fx.reader).await, Some(OrgRole::ReadOnly));
    assert_eq!(member(fx.org_a, fx.outsider).await, None);
    assert_eq!(member(fx.org_b, fx.outsider).await, Some(OrgRole::Owner));

    let new_key = "aura_sk_created_by_the_suite_0123456789abcdef";
    let new_hash = hash_key(new_key);
    let created = store.create_api_key("beta", KeyRole::ServiceRole, &new_hash);
    let created = created.await.expect("create");
    let found = key(new_key).await.expect("created key is found");
    assert_eq!(found.id, created.id);
    assert_eq!(found.project_ref, "beta");
    let missing = store
        .create_api_key("missing", KeyRole::Anon, &hash_key("x"))
        .await;
    assert!(matches!(missing, Err(StoreError::NotFound(_))));
    assert!(store.revoke_api_key(created.id).await.expect("revoke"));
    assert!(
        !store
            .revoke_api_key(created.id)
            .await
            .expect("second revoke")
    );
    let found = key(new_key).await.expect("still found");
    assert!(found.is_revoked(chrono::Utc::now()));
    let unknown = store.revoke_api_key(Uuid::new_v4()).await;
    assert!(matches!(unknown, Err(StoreError::NotFound(_))));
    // Project policy modules, content-addressed.
    let module = b"\0asm-not-really-a-module".to_vec();
    let digest = aura_gateway::policy::digest_of(&module);
    store
        .put_module(&digest, &module)
        .await
        .expect("put module");
    store
        .put_module(&digest, &module)
        .await
        .expect("idempotent");
    assert_eq!(store.module(&digest).await.expect("get"), Some(module));
    assert_eq!(store.module(&"0".repeat(64)).await.expect("get"), None);
    let policy = aura_gateway::control::ProjectPolicyRecord {
        project_ref: "alpha".into(),
        stage: "cors".into(),
        digest: digest.clone(),
        config: r#"{"origins":["https://a.example"]}"#.into(),
    };
    store.set_project_policy(&policy).await.expect("set");
    let read = store.project_policy("alpha", "cors").await.expect("get");
    assert_eq!(read, Some(policy.clone()));
    let changed = aura_gateway::control::ProjectPolicyRecord {
        config: "{}".into(),
        ..policy
    };
    store.set_project_policy(&changed).await.expect("replace");
    assert_eq!(store.project_policies().await.expect("list"), vec![changed]);
    let beta = store.project_policy("beta", "cors").await.expect("get");
    assert!(beta.is_none());
    let deleted = store.delete_project_policy("alpha", "cors").await;
    assert!(deleted.expect("delete"));
    let again = store.delete_project_policy("alpha", "cors").await;
    assert!(!again.expect("delete again"));
    assert!(store.project_policies().await.expect("list").is_empty());

    // A candidate next to the module in force: set, replaced, listed, removed once.
    let shadow = aura_gateway::control::PolicyCandidateRecord {
        project_ref: "alpha".into(),
        stage: "cors".into(),
        digest: digest.clone(),
        config: "{}".into(),
        mode: "shadow".into(),
        percent: 0,
    };
    store.set_policy_candidate(&shadow).await.expect("set");
    let read = store.policy_candidate("alpha", "cors").await.expect("get");
    assert_eq!(read, Some(shadow.clone()));
    let canary = aura_gateway::control::PolicyCandidateRecord {
        mode: "canary".into(),
        percent: 10,
        ..shadow
    };
    store.set_policy_candidate(&canary).await.expect("replace");
    assert_eq!(store.policy_candidates().await.expect("list"), vec![canary]);
    let quota = store.policy_candidate("alpha", "quota").await.expect("get");
    assert!(quota.is_none());
    let first = store
        .delete_policy_candidate("alpha", "cors")
        .await
        .expect("delete");
    let second = store
        .delete_policy_candidate("alpha", "cors")
        .await
        .expect("again");
    assert!(first && !second, "removed once");
    assert!(store.policy_candidates().await.expect("list").is_empty());

    // Stored modules nobody references nor used within the grace are collected; referenced or
    // recently used ones are kept.
    let kept_module = b"\0asm-referenced".to_vec();
    let kept = aura_gateway::policy::digest_of(&kept_module);
    let used_module = b"\0asm-in-use-by-an-instance".to_vec();
    let used = aura_gateway::policy::digest_of(&used_module);
    let tried_module = b"\0asm-on-trial".to_vec();
    let tried = aura_gateway::policy::digest_of(&tried_module);
    for (d, m) in [
        (&kept, &kept_module),
        (&used, &used_module),
        (&tried, &tried_module),
    ] {
        store.put_module(d, m).await.expect("put module");
    }
    let trial = aura_gateway::control::PolicyCandidateRecord {
        project_ref: "beta".into(),
        stage: "cors".into(),
        digest: tried.clone(),
        config: "{}".into(),
        mode: "shadow".into(),
        percent: 0,
    };
    store.set_policy_candidate(&trial).await.expect("set");
    let referenced = aura_gateway::control::ProjectPolicyRecord {
        project_ref: "beta".into(),
        stage: "quota".into(),
        digest: kept.clone(),
        config: "{}".into(),
    };
    store.set_project_policy(&referenced).await.expect("set");
    // Margins of 1.5 s either side of the grace: a machine loaded by other tests may pause
    // this test for a second.
    let grace = std::time::Duration::from_secs(4);
    let early = store.collect_modules(grace).await.expect("collect");
    assert!(early.is_empty(), "everything was stored within the grace");
    tokio::time::sleep(std::time::Duration::from_millis(2_500)).await;
    store
        .touch_modules(std::slice::from_ref(&used))
        .await
        .expect("touch");
    tokio::time::sleep(std::time::Duration::from_millis(2_500)).await;
    let collected = store.collect_modules(grace).await.expect("collect");
    assert_eq!(collected, vec![digest.clone()], "only the unused module");
    assert_eq!(store.module(&digest).await.expect("get"), None);
    assert!(store.module(&kept).await.expect("get").is_some());
    assert!(store.module(&used).await.expect("get").is_some());
    let on_trial = store.module(&tried).await.expect("get").is_some();
    assert!(on_trial, "a candidate's module is kept");
    issuers_and_auth_settings(store).await;
    store.ping().await.expect("ping");
}

/// A project's trusted issuers and credential settings: added, listed oldest first, unique per
/// `iss`, at most eight, removed; the browser setting set and cleared.
async fn issuers_and_auth_settings(store: &dyn ControlStore) {
    let issuer = |n: u32| IssuerRecord {
        id: Uuid::new_v4(),
        project_ref: "beta".into(),
        issuer: format!("https://id-{n}.example"),
        jwks_url: (n == 1).then(|| "https://keys.example/jwks.json".to_owned()),
        keys: None,
        algorithms: vec!["ES256".into()],
        audience_claim: "azp".into(),
        audiences: vec!["app".into()],
        role_claim: (n == 1).then(|| "metadata.role".to_owned()),
        allowed_roles: vec!["authenticated".into(), "anon".into()],
        created_at: Some(chrono::Utc::now() + chrono::Duration::seconds(i64::from(n))),
        created_by: Some("someone".into()),
    };
    let beta = async || store.project("beta").await.expect("lookup").expect("beta");
    assert!(beta().await.issuers.is_empty());
    assert!(!beta().await.browser_secret_keys);
    let first = issuer(1);
    store.add_issuer(&first).await.expect("add");
    let listed = beta().await.issuers;
    assert_eq!(listed.len(), 1);
    let mut expected = first.clone();
    expected.created_at = listed[0].created_at;
    assert_eq!(listed[0], expected, "every field is kept");
    let mut again = issuer(2);
    again.issuer = first.issuer.clone();
    match store.add_issuer(&again).await {
        Err(StoreError::Conflict { code, .. }) => assert_eq!(code, "issuer_exists"),
        other => panic!("a second record for one iss: {other:?}"),
    }
    for n in 2..=8 {
        store.add_issuer(&issuer(n)).await.expect("add");
    }
    match store.add_issuer(&issuer(9)).await {
        Err(StoreError::Conflict { code, .. }) => assert_eq!(code, "too_many_issuers"),
        other => panic!("a ninth issuer: {other:?}"),
    }
    let listed = beta().await.issuers;
    assert_eq!(listed.len(), 8);
    assert_eq!(listed[0].id, first.id, "oldest first");
    let mut unknown = issuer(10);
    unknown.project_ref = "nope".into();
    assert!(matches!(
        store.add_issuer(&unknown).await,
        Err(StoreError::NotFound(_))
    ));
    let mut bad = issuer(11);
    bad.allowed_roles = vec!["service_role".into()];
    assert!(matches!(
        store.add_issuer(&bad).await,
        Err(StoreError::Invalid(_))
    ));
    assert!(store.remove_issuer("beta", first.id).await.expect("remove"));
    assert!(!store.remove_issuer("beta", first.id).await.expect("remove"));
    let other = issuer(12);
    assert!(
        !store
            .remove_issuer("alpha", listed[1].id)
            .await
            .expect("another project's"),
        "{other:?}"
    );
    assert_eq!(beta().await.issuers.len(), 7);
    assert!(
        store
            .project("alpha")
            .await
            .expect("lookup")
            .expect("alpha")
            .issuers
            .is_empty()
    );

    store
        .set_browser_secret_keys("beta", true)
        .await
        .expect("set");
    assert!(beta().await.browser_secret_keys);
    store
        .set_browser_secret_keys("beta", false)
        .await
        .expect("set");
    assert!(!beta().await.browser_secret_keys);
    assert!(matches!(
        store.set_browser_secret_keys("nope", true).await,
        Err(StoreError::NotFound(_))
    ));
}

#[tokio::test]
async fn the_file_store_honours_the_contract() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fx = Fixture::new();
    let store = fx.file_store(dir.path());
    contract(&store, &fx).await;
}

#[tokio::test]
async fn the_postgres_store_honours_the_contract() {
    let fx = Fixture::new();
    let (db, store) = TestDatabase::seeded(&fx).await;
    contract(&store, &fx).await;
    // A change of a project's replicas is logged as a change of the project (the fleet's
    // project caches drop it), and the store reads the new set.
    db.execute(
        "DELETE FROM aura_control.change_log;
         DELETE FROM aura_control.project_replicas WHERE url LIKE '%gamma-us%';",
    )
    .await;
    let gamma = store
        .project("gamma")
        .await
        .expect("lookup")
        .expect("gamma");
    assert_eq!(gamma.replicas.len(), 1);
    let logged: Vec<(String, Option<String>)> = db
        .query("SELECT kind, project_ref FROM aura_control.change_log")
        .await;
    assert_eq!(logged, [("project".to_owned(), Some("gamma".to_owned()))]);
    // Issuers and credential settings are part of the project too; a row that breaks the
    // bounds (written by hand) is skipped, the project still served.
    db.execute(
        "DELETE FROM aura_control.change_log;
         UPDATE aura_control.project_auth SET browser_secret_keys = true WHERE project_ref = 'beta';
         INSERT INTO aura_control.project_issuers (id, project_ref, issuer, keys, audiences)
             VALUES (gen_random_uuid(), 'alpha', 'https://hand.example', '{\"keys\": []}', '{}');",
    )
    .await;
    let logged: Vec<(String, Option<String>)> = db
        .query("SELECT kind, project_ref FROM aura_control.change_log ORDER BY id")
        .await;
    assert_eq!(
        logged,
        [
            ("project".to_owned(), Some("beta".to_owned())),
            ("project".to_owned(), Some("alpha".to_owned()))
        ]
    );
    let alpha = store
        .project("alpha")
        .await
        .expect("lookup")
        .expect("alpha");
    assert!(alpha.issuers.is_empty(), "an invalid row is not trusted");
    // Deleting the project deletes what hangs on it.
    db.execute("DELETE FROM aura_control.api_keys WHERE project_ref = 'beta'; DELETE FROM aura_control.projects WHERE ref = 'beta';")
        .await;
    let left: Vec<(i64,)> = db
        .query("SELECT count(*) FROM aura_control.project_issuers WHERE project_ref = 'beta'")
        .await;
    assert_eq!(left, [(0,)]);
}

#[tokio::test]
async fn the_file_store_reloads_changes_and_keeps_serving_on_a_bad_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fx = Fixture::new();
    let store = Arc::new(fx.file_store(dir.path()));
    store.watch(Duration::from_millis(50));
    let path = dir.path().join("control.toml");
    let newcomer = Uuid::new_v4();
    let text = fx.control_file()
        + &format!(
            "[[organization_members]]\norganization_id = \"{}\"\nuser_id = \"{newcomer}\"\nrole = \"developer\"\n",
            fx.org_a
        );
    std::fs::write(&path, &text).expect("write");
    let mut seen = None;
    let _ = poll_tries(100, Duration::from_millis(20), async || {
        seen = store.membership(fx.org_a, newcomer).await.expect("lookup");
        seen.map(|_| ())
    })
    .await;
    assert_eq!(seen, Some(OrgRole::Developer), "the change was picked up");

    std::fs::write(&path, "[[projects]]\nref = 1\n").expect("write a broken file");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        store.membership(fx.org_a, newcomer).await.expect("lookup"),
        Some(OrgRole::Developer),
        "a broken file is refused and the previous records keep serving"
    );
}

#[test]
fn the_file_store_checks_references_like_the_database() {
    use aura_gateway::control::file::ControlFile;
    let err = ControlFile::parse(
        "[[projects]]\nref = \"p\"\norganization_id = \"00000000-0000-4000-8000-000000000001\"\ndb_engine = \"postgres\"\ntopology = \"shared\"\n",
    )
    .expect_err("unknown organization");
    assert!(err.contains("does not exist"), "{err}");
    let err = ControlFile::parse("[[api_keys]]\nid = \"00000000-0000-4000-8000-000000000001\"\nproject_ref = \"p\"\nrole = \"anon\"\nkey_sha256 = \"XYZ\"\n")
        .expect_err("bad hash");
    assert!(err.contains("key_sha256"), "{err}");
    let err = ControlFile::parse("[[organizations]]\nid = \"00000000-0000-4000-8000-000000000001\"\nname = \"a\"\nextra = 1\n")
        .expect_err("unknown field");
    assert!(err.contains("extra"), "{err}");
}

/// Postgres goes away under a running gateway and comes back.
#[tokio::test]
async fn a_postgres_outage_fails_the_console_closed_keeps_known_keys_serving_and_heals() {
    use std::time::{Duration, Instant};

    use crate::support::builder::Gateway;
    use crate::support::call::{Answer, IntoCall};
    use crate::support::fixture::console_token;
    use crate::support::outage::Relay;
    use crate::support::poll::poll_every;
    use crate::support::responder::json_ok;

    let fx = Fixture::new();
    let (db, _store) = TestDatabase::seeded(&fx).await;
    let target: std::net::SocketAddr = {
        let rest = db.url.split_once('@').map_or(db.url.as_str(), |(_, r)| r);
        let host_port = rest.split('/').next().expect("host:port");
        let mut addresses = tokio::net::lookup_host(host_port).await.expect("resolve");
        addresses.next().expect("an address")
    };
    let relay = Relay::start(target).await;
    let (before, after) = db.url.split_once('@').expect("user@host");
    let tail = after.split_once('/').map(|(_, db)| db).expect("/db");
    let relayed = format!("{before}@{}/{tail}", relay.addr);

    let outage = |c: &mut aura_gateway::config::Config| {
        c.control.store = aura_gateway::config::StoreKind::Postgres;
        c.control.database_url = Some(relayed.clone());
        c.control.acquire_timeout_ms = 500;
        (c.auth.key_cache_ttl_secs, c.auth.project_cache_ttl_secs) = (1, 1);
    };
    let mut config = crate::support::config::test_config("", "");
    outage(&mut config);
    let store = aura_gateway::control::postgres::PostgresStore::connect(&relayed, &config.control);
    let store = std::sync::Arc::new(store.await.expect("store"));
    let gw = Gateway::with(outage).store(store).start().await;
    let services = ["auth", "control", "db", "provisioner"];
    let responders = gw.bus.record(&services, json_ok).await;
    let http = reqwest::Client::new();
    let data = |key: &str| http.get(gw.data_url("/v1/db/todos")).call().key(key);
    let developer = console_token(fx.developer);
    let console = || {
        http.get(gw.mgmt_url("/v1/projects/alpha"))
            .call()
            .bearer(&developer)
    };
    let r = data(&fx.anon_key).read().await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(console().status().await, 200);

    relay.cut();
    // Past the key and project cache lifetimes: only the last known records remain.
    tokio::time::sleep(Duration::from_millis(1_300)).await;

    let started = Instant::now();
    let r = console().send().await;
    let took = started.elapsed();
    let r = Answer::of(r).await;
    assert_eq!(r.status, 503, "the console fails closed");
    assert!(r.headers.contains_key("retry-after"));
    let body = r.json();
    assert_eq!(body["error"]["code"], "control_store_unavailable", "{body}");
    eprintln!("postgres outage: console failed closed in {took:?}");
    assert!(took < Duration::from_secs(2), "failed closed in {took:?}");

    let started = Instant::now();
    for _ in 0..20 {
        let status = data(&fx.anon_key).status().await;
        assert_eq!(status, 200, "a key seen before keeps serving");
    }
    let took = started.elapsed();
    eprintln!("postgres outage: 20 requests on a known key served in {took:?}");
    let waited = took >= Duration::from_secs(3);
    assert!(
        !waited,
        "20 requests on a known key took {took:?}: each waited for the store"
    );
    // A key the gateway never saw cannot be checked: refused, never let through.
    assert_eq!(data(&fx.service_key).status().await, 503);
    // The store answered before: its outage is reported, but the instance stays in the
    // balancer (known keys are served from the cache; a store outage must not pull the fleet).
    let (status, ready) = http.get(gw.mgmt_url("/ready")).call().read().await.parts();
    // The answer says which check failed, should one ever fail here.
    assert_eq!(status, 200, "still ready: {ready}");
    assert_eq!(ready["checks"]["control_store"], "down", "{ready}");

    relay.restore().await;
    let back = Instant::now();
    let mut last = None;
    let healed = poll_every(
        Duration::from_secs(15),
        Duration::from_millis(200),
        async || {
            let status = console().status().await;
            last = Some(status);
            (status == 200).then_some(())
        },
    );
    let healed = healed.await.is_some();
    assert!(healed, "the console did not recover: {last:?}");
    // The data plane tries the store again at most a second after it last found it down.
    let within = aura_gateway::auth::keys::STORE_RETRY * 3;
    let recovered = poll_every(within, Duration::from_millis(100), async || {
        let status = data(&fx.service_key).status().await;
        last = Some(status);
        (status == 200).then_some(())
    });
    let recovered = recovered.await.is_some();
    assert!(recovered, "the data plane did not recover: {last:?}");
    assert_eq!(data(&fx.anon_key).status().await, 200);
    eprintln!(
        "postgres outage: recovered {:?} after the store came back",
        back.elapsed()
    );
    drop(responders);
}
