//! One suite, run against both control store implementations: they must behave the same.

use std::sync::Arc;
use std::time::Duration;

use aura_gateway::auth::keys::hash_key;
use aura_gateway::control::{ControlStore, DbEngine, KeyRole, OrgRole, StoreError, Topology};
use uuid::Uuid;

use crate::support::fixture::Fixture;
use crate::support::postgres::TestDatabase;

async fn contract(store: &dyn ControlStore, fx: &Fixture) {
    let now = chrono::Utc::now();
    let anon = store
        .api_key_by_hash(&hash_key(&fx.anon_key))
        .await
        .expect("lookup")
        .expect("the anon key exists");
    assert_eq!(anon.id, fx.anon_key_id);
    assert_eq!(anon.project_ref, "alpha");
    assert_eq!(anon.role, KeyRole::Anon);
    assert!(!anon.is_revoked(now));
    let service = store
        .api_key_by_hash(&hash_key(&fx.service_key))
        .await
        .expect("lookup")
        .expect("exists");
    assert_eq!(service.role, KeyRole::ServiceRole);
    let revoked = store
        .api_key_by_hash(&hash_key(&fx.revoked_key))
        .await
        .expect("lookup")
        .expect("revoked keys are still found");
    assert!(revoked.is_revoked(now));
    assert!(
        store
            .api_key_by_hash(&hash_key("aura_pk_nope"))
            .await
            .expect("lookup")
            .is_none()
    );

    let alpha = store
        .project("alpha")
        .await
        .expect("lookup")
        .expect("alpha");
    assert_eq!(alpha.organization_id, fx.org_a);
    assert_eq!(
        (alpha.db_engine, alpha.topology),
        (DbEngine::Postgres, Topology::Shared)
    );
    assert_eq!(alpha.plan, "free");
    assert_eq!(
        store
            .project("beta")
            .await
            .expect("lookup")
            .expect("beta")
            .plan,
        "pro"
    );
    let gamma = store
        .project("gamma")
        .await
        .expect("lookup")
        .expect("gamma");
    assert_eq!(gamma.topology, Topology::Dedicated);
    assert_eq!(gamma.postgrest_url, None);
    assert!(store.project("missing").await.expect("lookup").is_none());

    assert!(store.organization_exists(fx.org_a).await.expect("lookup"));
    assert!(
        !store
            .organization_exists(Uuid::new_v4())
            .await
            .expect("lookup")
    );
    assert_eq!(
        store.membership(fx.org_a, fx.owner).await.expect("lookup"),
        Some(OrgRole::Owner)
    );
    assert_eq!(
        store.membership(fx.org_a, fx.reader).await.expect("lookup"),
        Some(OrgRole::ReadOnly)
    );
    assert_eq!(
        store
            .membership(fx.org_a, fx.outsider)
            .await
            .expect("lookup"),
        None
    );
    assert_eq!(
        store
            .membership(fx.org_b, fx.outsider)
            .await
            .expect("lookup"),
        Some(OrgRole::Owner)
    );

    let new_key = "aura_sk_created_by_the_suite_0123456789abcdef";
    let created = store
        .create_api_key("beta", KeyRole::ServiceRole, &hash_key(new_key))
        .await
        .expect("create");
    let found = store
        .api_key_by_hash(&hash_key(new_key))
        .await
        .expect("lookup")
        .expect("created key is found");
    assert_eq!(found.id, created.id);
    assert_eq!(found.project_ref, "beta");
    assert!(matches!(
        store
            .create_api_key("missing", KeyRole::Anon, &hash_key("x"))
            .await,
        Err(StoreError::NotFound(_))
    ));
    assert!(store.revoke_api_key(created.id).await.expect("revoke"));
    assert!(
        !store
            .revoke_api_key(created.id)
            .await
            .expect("second revoke")
    );
    let found = store
        .api_key_by_hash(&hash_key(new_key))
        .await
        .expect("lookup")
        .expect("still found");
    assert!(found.is_revoked(chrono::Utc::now()));
    assert!(matches!(
        store.revoke_api_key(Uuid::new_v4()).await,
        Err(StoreError::NotFound(_))
    ));
    // Project policy modules, content-addressed.
    let module = b"\0asm-not-really-a-module".to_vec();
    let digest = aura_gateway::policy::tenants::digest_of(&module);
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
    assert_eq!(
        store.project_policy("alpha", "cors").await.expect("get"),
        Some(policy.clone())
    );
    let changed = aura_gateway::control::ProjectPolicyRecord {
        config: "{}".into(),
        ..policy
    };
    store.set_project_policy(&changed).await.expect("replace");
    assert_eq!(store.project_policies().await.expect("list"), vec![changed]);
    assert!(
        store
            .project_policy("beta", "cors")
            .await
            .expect("get")
            .is_none()
    );
    assert!(
        store
            .delete_project_policy("alpha", "cors")
            .await
            .expect("delete")
    );
    assert!(
        !store
            .delete_project_policy("alpha", "cors")
            .await
            .expect("delete again")
    );
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
    assert_eq!(
        store.policy_candidate("alpha", "cors").await.expect("get"),
        Some(shadow.clone())
    );
    let canary = aura_gateway::control::PolicyCandidateRecord {
        mode: "canary".into(),
        percent: 10,
        ..shadow
    };
    store.set_policy_candidate(&canary).await.expect("replace");
    assert_eq!(store.policy_candidates().await.expect("list"), vec![canary]);
    assert!(
        store
            .policy_candidate("alpha", "quota")
            .await
            .expect("get")
            .is_none()
    );
    assert!(
        store
            .delete_policy_candidate("alpha", "cors")
            .await
            .expect("delete")
    );
    assert!(
        !store
            .delete_policy_candidate("alpha", "cors")
            .await
            .expect("again")
    );
    assert!(store.policy_candidates().await.expect("list").is_empty());

    // Stored modules nobody references nor used within the grace are collected; referenced or
    // recently used ones are kept.
    let kept_module = b"\0asm-referenced".to_vec();
    let kept = aura_gateway::policy::tenants::digest_of(&kept_module);
    let used_module = b"\0asm-in-use-by-an-instance".to_vec();
    let used = aura_gateway::policy::tenants::digest_of(&used_module);
    let tried_module = b"\0asm-on-trial".to_vec();
    let tried = aura_gateway::policy::tenants::digest_of(&tried_module);
    for (d, m) in [
        (&kept, &kept_module),
        (&used, &used_module),
        (&tried, &tried_module),
    ] {
        store.put_module(d, m).await.expect("put module");
    }
    store
        .set_policy_candidate(&aura_gateway::control::PolicyCandidateRecord {
            project_ref: "beta".into(),
            stage: "cors".into(),
            digest: tried.clone(),
            config: "{}".into(),
            mode: "shadow".into(),
            percent: 0,
        })
        .await
        .expect("set");
    store
        .set_project_policy(&aura_gateway::control::ProjectPolicyRecord {
            project_ref: "beta".into(),
            stage: "quota".into(),
            digest: kept.clone(),
            config: "{}".into(),
        })
        .await
        .expect("set");
    let grace = std::time::Duration::from_secs(2);
    assert!(
        store
            .collect_modules(grace)
            .await
            .expect("collect")
            .is_empty(),
        "everything was stored within the grace"
    );
    tokio::time::sleep(std::time::Duration::from_millis(1_200)).await;
    store
        .touch_modules(std::slice::from_ref(&used))
        .await
        .expect("touch");
    tokio::time::sleep(std::time::Duration::from_millis(1_200)).await;
    let collected = store.collect_modules(grace).await.expect("collect");
    assert_eq!(collected, vec![digest.clone()], "only the unused module");
    assert_eq!(store.module(&digest).await.expect("get"), None);
    assert!(store.module(&kept).await.expect("get").is_some());
    assert!(store.module(&used).await.expect("get").is_some());
    assert!(
        store.module(&tried).await.expect("get").is_some(),
        "a candidate's module is kept"
    );
    store.ping().await.expect("ping");
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
    let db = TestDatabase::create().await;
    let store = db.store().await;
    let fx = Fixture::new();
    fx.seed(&db).await;
    contract(&store, &fx).await;
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
    for _ in 0..100 {
        seen = store.membership(fx.org_a, newcomer).await.expect("lookup");
        if seen.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
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

    use crate::support::fixture::console_token;
    use crate::support::gateway::InProcess;
    use crate::support::outage::Relay;
    use crate::support::responder::{Responder, reply};

    let db = TestDatabase::create().await;
    db.store().await; // migrated
    let fx = Fixture::new();
    fx.seed(&db).await;
    let target: std::net::SocketAddr = {
        let rest = db.url.split_once('@').map_or(db.url.as_str(), |(_, r)| r);
        let host_port = rest.split('/').next().expect("host:port");
        tokio::net::lookup_host(host_port)
            .await
            .expect("resolve")
            .next()
            .expect("an address")
    };
    let relay = Relay::start(target).await;
    let (before, after) = db.url.split_once('@').expect("user@host");
    let tail = after.split_once('/').map(|(_, db)| db).expect("/db");
    let relayed = format!("{before}@{}/{tail}", relay.addr);

    let nats = crate::support::nats_server::shared();
    let prefix = crate::support::unique_prefix();
    let mut config = crate::support::gateway::test_config(&nats.url(), &prefix);
    config.control.store = aura_gateway::config::StoreKind::Postgres;
    config.control.database_url = Some(relayed.clone());
    config.control.acquire_timeout_ms = 500;
    config.auth.key_cache_ttl_secs = 1;
    config.auth.project_cache_ttl_secs = 1;
    let store = aura_gateway::control::postgres::PostgresStore::connect(&relayed, &config.control)
        .await
        .expect("store");
    let gw = InProcess::start_with_store(config, std::sync::Arc::new(store)).await;
    let mut responders = Vec::new();
    for service in ["auth", "control", "db", "provisioner"] {
        responders.push(
            Responder::start(
                &nats.url(),
                &format!("{prefix}.{service}.http"),
                Duration::ZERO,
                |_| reply(200, &[("content-type", "application/json")], b"{}"),
            )
            .await,
        );
    }
    let http = reqwest::Client::new();
    let data = |key: String| {
        http.get(gw.data_url("/v1/db/todos"))
            .header("apikey", key)
            .send()
    };
    let console = || {
        http.get(gw.mgmt_url("/v1/projects/alpha"))
            .header(
                "authorization",
                format!("Bearer {}", console_token(fx.developer)),
            )
            .send()
    };
    let r = data(fx.anon_key.clone()).await.expect("r");
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
    assert_eq!(console().await.expect("r").status(), 200);

    relay.cut();
    // Past the key and project cache lifetimes: only the last known records remain.
    tokio::time::sleep(Duration::from_millis(1_300)).await;

    let started = Instant::now();
    let r = console().await.expect("r");
    let took = started.elapsed();
    assert_eq!(r.status(), 503, "the console fails closed");
    assert!(r.headers().contains_key("retry-after"));
    let body: serde_json::Value = r.json().await.expect("json");
    assert_eq!(body["error"]["code"], "control_store_unavailable", "{body}");
    eprintln!("postgres outage: console failed closed in {took:?}");
    assert!(took < Duration::from_secs(2), "failed closed in {took:?}");

    let started = Instant::now();
    for _ in 0..20 {
        let r = data(fx.anon_key.clone()).await.expect("r");
        assert_eq!(r.status(), 200, "a key seen before keeps serving");
    }
    let took = started.elapsed();
    eprintln!("postgres outage: 20 requests on a known key served in {took:?}");
    assert!(
        took < Duration::from_secs(3),
        "20 requests on a known key took {took:?}: each waited for the store"
    );
    // A key the gateway never saw cannot be checked: refused, never let through.
    let r = data(fx.service_key.clone()).await.expect("r");
    assert_eq!(r.status(), 503);
    // The store answered before: its outage is reported, but the instance stays in the
    // balancer (known keys are served from the cache; a store outage must not pull the fleet).
    let ready = http.get(gw.mgmt_url("/ready")).send().await.expect("ready");
    let status = ready.status();
    let ready: serde_json::Value = ready.json().await.expect("json");
    // The answer says which check failed, should one ever fail here.
    assert_eq!(status, 200, "still ready: {ready}");
    assert_eq!(ready["checks"]["control_store"], "down", "{ready}");

    relay.restore().await;
    let back = Instant::now();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let r = console().await.expect("r");
        if r.status() == 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the console did not recover: {}",
            r.status()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The data plane tries the store again at most a second after it last found it down.
    let deadline = Instant::now() + aura_gateway::auth::keys::STORE_RETRY * 3;
    loop {
        let r = data(fx.service_key.clone()).await.expect("r");
        if r.status() == 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the data plane did not recover: {}",
            r.status()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(data(fx.anon_key.clone()).await.expect("r").status(), 200);
    eprintln!(
        "postgres outage: recovered {:?} after the store came back",
        back.elapsed()
    );
    drop(responders);
}
