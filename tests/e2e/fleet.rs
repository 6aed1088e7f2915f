//! Three gateway instances on one control store and a three-node NATS cluster (each instance
//! given the three seeds): a change made on one instance, or in PostgreSQL by someone else,
//! applies on every instance within a second — far sooner than the caches' lifetimes and the
//! tenant refresh period, which are set long here.

use std::time::{Duration, Instant};

use base64::Engine as _;
use reqwest::StatusCode;

use crate::support::fixture::{Fixture, console_token};
use crate::support::gateway::{METRICS_TOKEN, Process, binary, binary_config, cors_probe, metric};
use crate::support::nats_server::shared;
use crate::support::postgres::TestDatabase;
use crate::support::topology::NatsCluster;
use crate::support::unique_prefix;

/// Three instances over `db` and `nats` (seed URLs), with PostgreSQL's notifications on or off.
fn fleet(
    dir: &std::path::Path,
    db: &TestDatabase,
    nats: &str,
    notifications: bool,
) -> Vec<Process> {
    let prefix = unique_prefix();
    (0..3)
        .map(|i| {
            let sub = dir.join(format!("gw{i}"));
            std::fs::create_dir_all(&sub).expect("dir");
            let config = sub.join("gateway.toml");
            std::fs::write(
                &config,
                format!(
                    r#"host = "127.0.0.1"

[nats]
url = "{nats}"
subject_prefix = "{prefix}"
fleet_secret = "{fleet}"

[control]
store = "postgres"
database_url = "{db}"
notifications = {notifications}

[auth]
key_cache_ttl_secs = 30
project_cache_ttl_secs = 30

[auth.console_jwt]
hs256_secret = "{console}"

[plugins]
tenant_refresh_secs = 3600
call_deadline_ms = 2000

[metrics]
token = "{METRICS_TOKEN}"
"#,
                    db = db.url,
                    console = crate::support::fixture::CONSOLE_SECRET,
                    fleet = crate::support::gateway::FLEET_SECRET,
                ),
            )
            .expect("config");
            Process::serve(&config, &sub)
        })
        .collect()
}

/// How long until `check` holds on every instance (polled every 20 ms), or `None` after `limit`.
async fn until_all(
    fleet: &[Process],
    limit: Duration,
    check: impl AsyncFn(&Process) -> bool,
) -> Option<Duration> {
    let started = Instant::now();
    let mut done = vec![false; fleet.len()];
    while started.elapsed() < limit {
        for (i, gw) in fleet.iter().enumerate() {
            if !done[i] {
                done[i] = check(gw).await;
            }
        }
        if done.iter().all(|d| *d) {
            return Some(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

async fn status_with_key(gw: &Process, key: &str) -> StatusCode {
    reqwest::Client::new()
        .get(gw.data_url("/v1/storage/object/x"))
        .header("apikey", key)
        .send()
        .await
        .expect("answer")
        .status()
}

async fn alphas_module_answers(gw: &Process, fx: &Fixture) -> bool {
    cors_probe(gw, &fx.anon_key)
        .await
        .headers()
        .get("access-control-expose-headers")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("x-testing-plugin"))
}

#[tokio::test]
async fn a_tenant_module_installed_on_one_instance_is_in_force_on_all_within_a_second() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fx = Fixture::new();
    let db = TestDatabase::create().await;
    db.store().await;
    fx.seed(&db).await;
    // PostgreSQL's notifications off: only the instances' own NATS events carry the change.
    let cluster = NatsCluster::start().await;
    let gws = fleet(dir.path(), &db, &cluster.seeds(), false);
    for gw in &gws {
        assert!(!alphas_module_answers(gw, &fx).await);
    }
    let module = base64::engine::general_purpose::STANDARD
        .encode(std::fs::read(aura_gateway::policy::builtin::TESTING_PLUGIN_PATH).expect("module"));
    let r = reqwest::Client::new()
        .put(gws[0].mgmt_url("/v1/projects/alpha/policies/cors"))
        .bearer_auth(console_token(fx.admin))
        .json(&serde_json::json!({ "module": module, "config": {} }))
        .send()
        .await
        .expect("upload");
    assert_eq!(r.status(), StatusCode::OK);
    // Every instance compiles the module itself: the change must reach them within a second
    // plus the longest of those compilations (each instance's own, from its metrics).
    let took = until_all(&gws, Duration::from_secs(10), async |gw| {
        alphas_module_answers(gw, &fx).await
    })
    .await
    .expect("the module reached every instance");
    let mut compile = Duration::ZERO;
    for gw in &gws {
        let seconds = metric(&gw.metrics().await, "aura_tenant_compile_seconds_sum", &[]);
        compile = compile.max(Duration::from_secs_f64(seconds));
    }
    eprintln!(
        "tenant module in force on 3 instances after {took:?} (longest compilation: {compile:?})"
    );
    assert!(
        took < Duration::from_secs(1) + compile,
        "took {took:?}, compile {compile:?}"
    );
    let text = gws[2].metrics().await;
    assert!(
        metric(
            &text,
            "aura_change_events_total",
            &["source=\"nats\"", "kind=\"tenant_modules\""]
        ) >= 1.0,
        "{text}"
    );
    // And removed everywhere.
    let r = reqwest::Client::new()
        .delete(gws[1].mgmt_url("/v1/projects/alpha/policies/cors"))
        .bearer_auth(console_token(fx.admin))
        .send()
        .await
        .expect("delete");
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let took = until_all(&gws, Duration::from_secs(10), async |gw| {
        !alphas_module_answers(gw, &fx).await
    })
    .await
    .expect("the module left every instance");
    assert!(took < Duration::from_secs(1), "took {took:?}");
}

#[tokio::test]
async fn a_key_revoked_in_postgres_by_someone_else_stops_working_on_all_within_a_second() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fx = Fixture::new();
    let db = TestDatabase::create().await;
    db.store().await;
    fx.seed(&db).await;
    let cluster = NatsCluster::start().await;
    let gws = fleet(dir.path(), &db, &cluster.seeds(), true);
    // Every instance has the key cached as valid (30 s).
    for gw in &gws {
        assert_eq!(
            status_with_key(gw, &fx.anon_key).await,
            StatusCode::SERVICE_UNAVAILABLE
        );
    }
    // Wait until each is listening (it says so in its log).
    let started = Instant::now();
    while !gws
        .iter()
        .all(|gw| gw.log_text().contains("listening to PostgreSQL"))
    {
        assert!(started.elapsed() < Duration::from_secs(10), "not listening");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A key created in the database while every instance has it cached as unknown (30 s).
    let new_key = format!("aura_pk_{}", uuid::Uuid::new_v4().simple());
    for gw in &gws {
        assert_eq!(
            status_with_key(gw, &new_key).await,
            StatusCode::UNAUTHORIZED
        );
    }
    db.execute(&format!(
        "INSERT INTO aura_control.api_keys VALUES ('{}', 'alpha', 'anon', '{}', NULL)",
        uuid::Uuid::new_v4(),
        aura_gateway::auth::keys::hash_key(&new_key)
    ))
    .await;
    // Accepted: past authentication, to the storage route (no backend configured here).
    let took = until_all(&gws, Duration::from_secs(10), async |gw| {
        status_with_key(gw, &new_key).await == StatusCode::SERVICE_UNAVAILABLE
    })
    .await
    .expect("the new key reached every instance");
    eprintln!("key created on 3 instances after {took:?}");
    assert!(took < Duration::from_secs(1), "took {took:?}");
    // The control service revokes it, in the database, without telling the gateways.
    db.execute(&format!(
        "UPDATE aura_control.api_keys SET revoked_at = now() WHERE id = '{}'",
        fx.anon_key_id
    ))
    .await;
    let took = until_all(&gws, Duration::from_secs(10), async |gw| {
        status_with_key(gw, &fx.anon_key).await == StatusCode::UNAUTHORIZED
    })
    .await
    .expect("the revocation reached every instance");
    eprintln!("key revoked on 3 instances after {took:?}");
    assert!(took < Duration::from_secs(1), "took {took:?}");
    // A membership removed in the database: the console user is refused everywhere at once
    // (roles are read on every request).
    let console = console_token(fx.developer);
    let as_developer = async |gw: &Process| {
        reqwest::Client::new()
            .get(gw.mgmt_url("/v1/projects/alpha"))
            .bearer_auth(&console)
            .send()
            .await
            .expect("answer")
            .status()
    };
    for gw in &gws {
        assert_ne!(as_developer(gw).await, StatusCode::FORBIDDEN);
    }
    db.execute(&format!(
        "DELETE FROM aura_control.organization_members WHERE user_id = '{}'",
        fx.developer
    ))
    .await;
    let took = until_all(&gws, Duration::from_secs(10), async |gw| {
        as_developer(gw).await == StatusCode::FORBIDDEN
    })
    .await
    .expect("the removal reached every instance");
    eprintln!("membership removed on 3 instances after {took:?}");
    assert!(took < Duration::from_secs(1), "took {took:?}");
    let text = gws[0].metrics().await;
    assert!(
        metric(
            &text,
            "aura_change_events_total",
            &["source=\"postgres\"", "kind=\"api_key\""]
        ) >= 1.0,
        "{text}"
    );
}

#[tokio::test]
async fn a_control_file_change_applies_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fx = Fixture::new();
    let prefix = unique_prefix();
    let config = binary_config(
        dir.path(),
        &fx,
        "",
        &shared().url(),
        &prefix,
        "[auth]\nkey_cache_ttl_secs = 30\n",
    );
    let gw = Process::serve(&config, dir.path());
    assert_eq!(
        status_with_key(&gw, &fx.anon_key).await,
        StatusCode::SERVICE_UNAVAILABLE
    );

    // The key revoked in the control file: refused at once, not after the 30 s cache lifetime.
    let revoke = std::process::Command::new(binary())
        .args([
            "keys",
            "revoke",
            "--id",
            &fx.anon_key_id.to_string(),
            "--config",
        ])
        .arg(&config)
        .output()
        .expect("keys revoke");
    assert!(
        revoke.status.success(),
        "{}",
        String::from_utf8_lossy(&revoke.stderr)
    );
    let revoked = Instant::now();
    loop {
        if status_with_key(&gw, &fx.anon_key).await == StatusCode::UNAUTHORIZED {
            break;
        }
        assert!(
            revoked.elapsed() < Duration::from_secs(2),
            "the revocation waited for the cache"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!(
        "key revoked in the control file, refused after {:?}",
        revoked.elapsed()
    );
    assert!(
        metric(
            &gw.metrics().await,
            "aura_change_events_total",
            &["source=\"file\"", "kind=\"everything\""]
        ) >= 1.0
    );
}
