//! Three gateway instances on one control store and a three-node NATS cluster (each instance
//! given the three seeds): a change made on one instance, or in PostgreSQL by someone else,
//! applies on every instance within a second — far sooner than the caches' lifetimes and the
//! tenant refresh period, which are set long here.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::json;

use crate::support::builder::{Gateway, Started};
use crate::support::call::Call;
use crate::support::cli::{run, succeeded};
use crate::support::fixture::{Fixture, console_token};
use crate::support::gateway::Process;
use crate::support::metrics::metric;
use crate::support::policy::{Policies, cors_probe, testing_cors};
use crate::support::poll::poll_every;
use crate::support::postgres::{TestDatabase, long_cached};
use crate::support::topology::NatsCluster;

/// Three instances over `fx`'s records in a database of their own and a NATS cluster of their
/// own (given the three seeds), with PostgreSQL's notifications on or off.
struct Fleet {
    gws: Vec<Process>,
    db: TestDatabase,
    _cluster: NatsCluster,
    _dir: tempfile::TempDir,
}

async fn fleet(fx: &Fixture, notifications: bool) -> Fleet {
    let dir = tempfile::tempdir().expect("tempdir");
    let (db, _) = TestDatabase::seeded(fx).await;
    let cluster = NatsCluster::start().await;
    let (nats, prefix) = (cluster.seeds(), crate::support::unique_prefix());
    let toml = long_cached(&db.url, notifications) + "call_deadline_ms = 2000\n";
    let instance = |i| {
        let sub = dir.path().join(format!("gw{i}"));
        std::fs::create_dir_all(&sub).expect("dir");
        let gw = Gateway::builder()
            .nats(&nats)
            .prefix(&prefix)
            .fixture(fx)
            .dir(&sub);
        gw.toml(&toml).binary().gw
    };
    let gws = (0..3).map(instance).collect();
    Fleet {
        gws,
        db,
        _cluster: cluster,
        _dir: dir,
    }
}

/// How long until `check` holds on every instance (polled every 20 ms), or `None` after `limit`.
async fn until_all(
    fleet: &[Process],
    limit: Duration,
    check: impl AsyncFn(&Process) -> bool,
) -> Option<Duration> {
    let started = Instant::now();
    let mut done = vec![false; fleet.len()];
    let every = Duration::from_millis(20);
    poll_every(limit, every, async || {
        for (i, gw) in fleet.iter().enumerate() {
            if !done[i] {
                done[i] = check(gw).await;
            }
        }
        done.iter().all(|d| *d).then(|| started.elapsed())
    })
    .await
}

async fn status_with_key(gw: &Process, key: &str) -> StatusCode {
    Call::get(gw.data_url("/v1/storage/object/x"))
        .key(key)
        .status()
        .await
}

async fn alphas_module_answers(gw: &Process, fx: &Fixture) -> bool {
    let probe = cors_probe(gw.data_url("/health"), &fx.anon_key).await;
    let exposed = probe.headers.get("access-control-expose-headers");
    let exposed = exposed.and_then(|v| v.to_str().ok());
    exposed.is_some_and(|v| v.contains("x-testing-plugin"))
}

/// The longest tenant compilation of the instances, from their metrics.
async fn longest_compilation(gws: &[Process]) -> Duration {
    let mut compile = Duration::ZERO;
    for gw in gws {
        let seconds = metric(&gw.metrics().await, "aura_tenant_compile_seconds_sum", &[]);
        compile = compile.max(Duration::from_secs_f64(seconds));
    }
    compile
}

/// `aura_change_events_total` from `source` of `kind` on `gw`, at least once.
async fn told(gw: &Process, source: &str, kind: &str) {
    let text = gw.metrics().await;
    let labels = [format!("source=\"{source}\""), format!("kind=\"{kind}\"")];
    let events = metric(&text, "aura_change_events_total", &[&labels[0], &labels[1]]);
    assert!(events >= 1.0, "{text}");
}

#[tokio::test]
async fn a_tenant_module_installed_on_one_instance_is_in_force_on_all_within_a_second() {
    let fx = Fixture::new();
    // PostgreSQL's notifications off: only the instances' own NATS events carry the change.
    let fleet = fleet(&fx, false).await;
    let gws = &fleet.gws;
    for gw in gws {
        assert!(!alphas_module_answers(gw, &fx).await);
    }
    let on = |i: usize| Policies::new(gws[i].mgmt_url(""), console_token(fx.admin));
    let installed = on(0).install("cors", &testing_cors(), json!({})).await;
    assert_eq!(installed.status, StatusCode::OK);
    // Every instance compiles the module itself: the change must reach them within a second
    // plus the longest of those compilations (each instance's own, from its metrics).
    let answers = async |gw: &Process| alphas_module_answers(gw, &fx).await;
    let took = until_all(gws, Duration::from_secs(10), answers).await;
    let took = took.expect("the module reached every instance");
    let compile = longest_compilation(gws).await;
    eprintln!(
        "tenant module in force on 3 instances after {took:?} (longest compilation: {compile:?})"
    );
    assert!(
        took < Duration::from_secs(1) + compile,
        "took {took:?}, compile {compile:?}"
    );
    told(&gws[2], "nats", "tenant_modules").await;
    // And removed everywhere.
    assert_eq!(on(1).delete("cors").await.status, StatusCode::NO_CONTENT);
    let gone = async |gw: &Process| !alphas_module_answers(gw, &fx).await;
    let took = until_all(gws, Duration::from_secs(10), gone).await;
    let took = took.expect("the module left every instance");
    assert!(took < Duration::from_secs(1), "took {took:?}");
}

/// Within a second, `check` holds on every instance of `gws`; `what` is said with the time.
async fn within_a_second_on_all(
    gws: &[Process],
    what: &str,
    check: impl AsyncFn(&Process) -> bool,
) {
    let took = until_all(gws, Duration::from_secs(10), check).await;
    let took = took.unwrap_or_else(|| panic!("{what}: not on every instance"));
    eprintln!("{what} on 3 instances after {took:?}");
    assert!(took < Duration::from_secs(1), "took {took:?}");
}

#[tokio::test]
async fn a_key_revoked_in_postgres_by_someone_else_stops_working_on_all_within_a_second() {
    let fx = Fixture::new();
    let fleet = fleet(&fx, true).await;
    let (gws, db) = (&fleet.gws, &fleet.db);
    // Every instance has the key cached as valid (30 s).
    for gw in gws {
        let status = status_with_key(gw, &fx.anon_key).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    }
    // Wait until each is listening (it says so in its log).
    let listening = |gw: &Process| gw.log_text().contains("listening to PostgreSQL");
    let every = Duration::from_millis(20);
    let all_listening = poll_every(Duration::from_secs(10), every, async || {
        gws.iter().all(listening).then_some(())
    });
    assert!(all_listening.await.is_some(), "not listening");
    // A key created in the database while every instance has it cached as unknown (30 s).
    let new_key = format!("aura_pk_{}", uuid::Uuid::new_v4().simple());
    for gw in gws {
        assert_eq!(
            status_with_key(gw, &new_key).await,
            StatusCode::UNAUTHORIZED
        );
    }
    let (id, hash) = (
        uuid::Uuid::new_v4(),
        aura_gateway::auth::keys::hash_key(&new_key),
    );
    let insert = format!(
        "INSERT INTO aura_control.api_keys VALUES ('{id}', 'alpha', 'anon', '{hash}', NULL)"
    );
    db.execute(&insert).await;
    // Accepted: past authentication, to the storage route (no backend configured here).
    let accepted =
        async |gw: &Process| status_with_key(gw, &new_key).await == StatusCode::SERVICE_UNAVAILABLE;
    within_a_second_on_all(gws, "key created", accepted).await;
    // The control service revokes it, in the database, without telling the gateways.
    let id = fx.anon_key_id;
    db.execute(&format!(
        "UPDATE aura_control.api_keys SET revoked_at = now() WHERE id = '{id}'"
    ))
    .await;
    let refused =
        async |gw: &Process| status_with_key(gw, &fx.anon_key).await == StatusCode::UNAUTHORIZED;
    within_a_second_on_all(gws, "key revoked", refused).await;
    // A membership removed in the database: the console user is refused everywhere at once
    // (roles are read on every request).
    let console = console_token(fx.developer);
    let as_developer = async |gw: &Process| {
        Call::get(gw.mgmt_url("/v1/projects/alpha"))
            .bearer(&console)
            .status()
            .await
    };
    for gw in gws {
        assert_ne!(as_developer(gw).await, StatusCode::FORBIDDEN);
    }
    let member = fx.developer;
    db.execute(&format!(
        "DELETE FROM aura_control.organization_members WHERE user_id = '{member}'"
    ))
    .await;
    let forbidden = async |gw: &Process| as_developer(gw).await == StatusCode::FORBIDDEN;
    within_a_second_on_all(gws, "membership removed", forbidden).await;
    told(&gws[0], "postgres", "api_key").await;
}

#[tokio::test]
async fn a_control_file_change_applies_at_once() {
    let Started { gw, fx, dir } = Gateway::builder()
        .toml("[auth]\nkey_cache_ttl_secs = 30\n")
        .binary();
    assert_eq!(
        status_with_key(&gw, &fx.anon_key).await,
        StatusCode::SERVICE_UNAVAILABLE
    );

    // The key revoked in the control file: refused at once, not after the 30 s cache lifetime.
    let config = dir.path().join("gateway.toml");
    let id = fx.anon_key_id.to_string();
    succeeded(&run(&["keys", "revoke", "--id", &id], Some(&config)));
    let revoked = Instant::now();
    let every = Duration::from_millis(20);
    let refused = poll_every(Duration::from_secs(2), every, async || {
        (status_with_key(&gw, &fx.anon_key).await == StatusCode::UNAUTHORIZED).then_some(())
    });
    assert!(
        refused.await.is_some(),
        "the revocation waited for the cache"
    );
    eprintln!(
        "key revoked in the control file, refused after {:?}",
        revoked.elapsed()
    );
    let labels = ["source=\"file\"", "kind=\"everything\""];
    let events = metric(&gw.metrics().await, "aura_change_events_total", &labels);
    assert!(events >= 1.0);
}
