//! Three gateway instances on one control store and a three-node NATS cluster (each instance
//! given the three seeds): a change made on one instance, or in PostgreSQL by someone else,
//! applies on every instance within a second — far sooner than the caches' lifetimes and the
//! tenant refresh period, which are set long here.
//!
//! The change events themselves, through the real binary: a notification any database login may
//! send or listen to drives nothing and tells nothing, and an event on NATS is acted on only
//! signed, fresh and once, bursts coalesced. Statements reaching the control store are counted
//! at the wire ([`PgCounter`]).

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::json;
use sqlx::Connection as _;

use crate::support::builder::{Gateway, Started};
use crate::support::call::Call;
use crate::support::cli::{run, succeeded};
use crate::support::config::FLEET_SECRET;
use crate::support::fixture::{Fixture, console_token};
use crate::support::gateway::Process;
use crate::support::metrics::metric;
use crate::support::nats_server::shared;
use crate::support::pg_counter::PgCounter;
use crate::support::policy::{Policies, cors_probe, testing_cors};
use crate::support::poll::poll_every;
use crate::support::postgres::{TestDatabase, admin_url, long_cached};
use crate::support::topology::NatsCluster;
use crate::support::unique_prefix;

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
    // The event named alpha: the others read alpha's records again, and alpha's next request
    // loaded its one module — nothing else was loaded anywhere.
    for gw in &gws[1..] {
        let text = gw.metrics().await;
        let loads = |reason: &str| {
            let labels = [
                format!("reason=\"{reason}\""),
                "result=\"loaded\"".to_owned(),
            ];
            metric(
                &text,
                "aura_tenant_module_loads_total",
                &[&labels[0], &labels[1]],
            )
        };
        assert_eq!((loads("first_call"), loads("changed")), (1.0, 0.0));
    }
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

/// Publishes `payload` on `subject` with `signature` in the fleet's signature header.
async fn publish(nats: &async_nats::Client, subject: &str, payload: Vec<u8>, signature: &str) {
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(aura_gateway::fleet::SIGNATURE_HEADER, signature);
    nats.publish_with_headers(subject.to_owned(), headers, payload.into())
        .await
        .expect("publish");
}

async fn keyed(gw: &Process, key: &str) -> StatusCode {
    Call::get(gw.data_url("/v1/storage/object/x"))
        .key(key)
        .status()
        .await
}

/// A gateway binary over `fx`'s records in a new database, through a statement counter, NATS
/// under `prefix`; caches and the tenant refresh set long, so that only events make it ask the
/// store.
async fn gateway(
    fx: &Fixture,
    prefix: &str,
    notifications: bool,
) -> (Process, PgCounter, TestDatabase) {
    let (db, _) = TestDatabase::seeded(fx).await;
    let counter = PgCounter::start(&db.url).await;
    let toml = long_cached(&counter.url, notifications) + "module_gc_interval_secs = 3600\n";
    let started = Gateway::builder()
        .prefix(prefix)
        .fixture(fx)
        .toml(toml)
        .binary();
    if notifications {
        let every = Duration::from_millis(20);
        let listening = poll_every(Duration::from_secs(10), every, async || {
            started
                .gw
                .log_text()
                .contains("listening to PostgreSQL")
                .then_some(())
        });
        assert!(listening.await.is_some(), "not listening");
    }
    (started.gw, counter, db)
}

/// The reloads `text` counts as applied.
fn applied_reloads(text: &str) -> f64 {
    metric(text, "aura_policy_reloads_total", &["result=\"applied\""])
}

/// The metrics text of `gw` once `done` holds on it (polled every 50 ms); fails naming `what`
/// after 5 s.
async fn metrics_once(gw: &Process, what: &str, done: impl Fn(&str) -> bool) -> String {
    let every = Duration::from_millis(50);
    let text = poll_every(Duration::from_secs(5), every, async || {
        let text = gw.metrics().await;
        done(&text).then_some(text)
    });
    text.await.unwrap_or_else(|| panic!("{what}"))
}

/// A login role of its own on the test server, dropped with the guard.
struct Role(String);

impl Role {
    async fn create(db: &TestDatabase) -> Self {
        let name = format!("intruder_{}", db.name);
        db.execute(&format!(
            "DROP ROLE IF EXISTS {name}; CREATE ROLE {name} LOGIN"
        ))
        .await;
        Self(name)
    }

    fn url(&self, db: &TestDatabase) -> String {
        let admin = admin_url();
        let (scheme, rest) = admin.split_once("://").expect("url");
        let host = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
        let host = host.split('/').next().unwrap_or(host);
        format!("{scheme}://{}@{host}/{}", self.0, db.name)
    }
}

impl Drop for Role {
    fn drop(&mut self) {
        crate::support::postgres::run_as_admin(format!("DROP ROLE IF EXISTS {}", self.0));
    }
}

/// Any database login could `NOTIFY aura_control_changes` with `everything` (every instance
/// emptied its caches: a store lookup per request) or `operator_reload` (a reload each), and
/// `LISTEN` to read key hashes, refs and user ids. Now a notification carries a row id of the
/// change log and nothing else, the log is readable by the gateway's role alone, and a forged
/// notification costs at most a throttled read that finds nothing.
#[tokio::test]
async fn forged_postgres_notifications_drive_nothing_and_other_logins_read_nothing() {
    let fx = Fixture::new();
    let (gw, counter, db) = gateway(&fx, &unique_prefix(), true).await;
    let intruder = Role::create(&db).await;
    for _ in 0..10 {
        assert_eq!(
            keyed(&gw, &fx.anon_key).await,
            StatusCode::SERVICE_UNAVAILABLE
        );
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = counter.statements();

    let mut conn = sqlx::PgConnection::connect(&intruder.url(&db))
        .await
        .expect("the intruder logs in");
    // Each payload distinct (trailing spaces): PostgreSQL folds equal ones of a transaction.
    let pad = |text: &str, i: usize| format!("{text}{}", " ".repeat(i));
    let forged: Vec<String> = (0..100)
        .map(|i| pad(r#"{"kind":"everything"}"#, i))
        .chain((0..30).map(|i| pad(r#"{"kind":"operator_reload"}"#, i)))
        .chain((0..20).map(|i| pad("not an event", i)))
        .chain((0..50).map(|i| (999_999_000 + i).to_string()))
        .collect();
    let started = Instant::now();
    // In one transaction: delivered together at its commit, whatever the machine's speed.
    sqlx::query("SELECT pg_notify('aura_control_changes', p) FROM unnest($1::text[]) AS p")
        .bind(&forged)
        .execute(&mut conn)
        .await
        .expect("any login may notify");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for _ in 0..100 {
        assert_eq!(
            keyed(&gw, &fx.anon_key).await,
            StatusCode::SERVICE_UNAVAILABLE
        );
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let cost = counter.statements() - before;
    eprintln!(
        "200 forged notifications and 100 requests over {:?}: {cost} statements on the store",
        started.elapsed()
    );
    // The notifications arrive together: a read or two of the log (each at most two
    // statements: the pool's ping, the query); the requests cost none (their key is cached).
    assert!(cost <= 8, "{cost} statements");
    let text = gw.metrics().await;
    assert_eq!(applied_reloads(&text), 0.0, "a forged reload ran");
    let labels = ["source=\"postgres\"", "reason=\"invalid\""];
    assert!(metric(&text, "aura_change_events_refused_total", &labels) >= 150.0);

    // The log, the only place changes are told, is closed to other logins.
    let read = sqlx::query("SELECT * FROM aura_control.change_log")
        .execute(&mut conn)
        .await;
    let error = read
        .expect_err("another login reads the change log")
        .to_string();
    assert!(error.contains("permission denied"), "{error}");

    // What a listener learns of a real change: a number.
    let mut listener = sqlx::postgres::PgListener::connect(&intruder.url(&db))
        .await
        .expect("listener");
    listener
        .listen(aura_gateway::changes::PG_CHANNEL)
        .await
        .expect("any login may listen");
    db.execute(&format!(
        "UPDATE aura_control.api_keys SET revoked_at = now() WHERE id = '{}'",
        fx.anon_key_id
    ))
    .await;
    let heard = tokio::time::timeout(Duration::from_secs(5), listener.recv())
        .await
        .expect("a notification")
        .expect("payload");
    let payload = heard.payload();
    assert!(
        !payload.is_empty() && payload.bytes().all(|b| b.is_ascii_digit()),
        "a notification told {payload:?}"
    );
    // And the real change applies at once.
    let every = Duration::from_millis(20);
    let revoked = poll_every(Duration::from_secs(3), every, async || {
        (keyed(&gw, &fx.anon_key).await == StatusCode::UNAUTHORIZED).then_some(())
    });
    assert!(revoked.await.is_some(), "the revocation waited");
    drop(listener);
    drop(conn);
}

/// Anyone able to publish on the subject could drive every instance: reloads (CPU), refreshes
/// (store transactions). Events are signed by the fleet (HMAC-SHA256 under
/// `nats.fleet_secret`), fresh and never replayed; even valid ones are coalesced.
#[tokio::test]
async fn fleet_events_are_accepted_only_signed_fresh_and_once_and_bursts_are_coalesced() {
    let fx = Fixture::new();
    let prefix = unique_prefix();
    let (gw, counter, _db) = gateway(&fx, &prefix, false).await;
    let nats = async_nats::connect(shared().url()).await.expect("nats");
    let subject = aura_gateway::fleet::subject(&prefix);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = counter.statements();
    use aura_gateway::fleet::{Change, now_millis, signed_event};

    // Unsigned, forged, signed under another secret, oversized.
    let event = |secret: &[u8], seq, at, change| signed_event(secret, "peer", seq, at, change);
    let reload = |seq| {
        event(
            FLEET_SECRET.as_bytes(),
            seq,
            now_millis(),
            Change::OperatorReload,
        )
    };
    for i in 0..20 {
        let (payload, _) = reload(1000 + i);
        nats.publish(subject.clone(), payload.into())
            .await
            .expect("publish");
        let (payload, _) = reload(2000 + i);
        publish(
            &nats,
            &subject,
            payload,
            format!("v1={}", "0".repeat(64)).as_str(),
        )
        .await;
        let other = b"not-the-fleet-secret-0123456789abcdef";
        let (payload, signed) = event(other, 3000 + i, now_millis(), Change::OperatorReload);
        publish(&nats, &subject, payload, signed.as_str()).await;
    }
    for _ in 0..5 {
        publish(&nats, &subject, vec![b'x'; 8192], "v1=00").await;
    }
    nats.flush().await.expect("flush");
    let refused = |text: &str, reason: &str| {
        let labels = ["source=\"nats\"", &format!("reason=\"{reason}\"")];
        metric(text, "aura_change_events_refused_total", &labels)
    };
    let text = metrics_once(&gw, "forged events not refused", |text| {
        refused(text, "unsigned") >= 20.0
            && refused(text, "bad_signature") >= 40.0
            && refused(text, "invalid") >= 5.0
    });
    let text = text.await;
    assert_eq!(applied_reloads(&text), 0.0);
    assert!(
        counter.statements() - before <= 1,
        "forged events reached the store"
    );

    // A valid event sent ten times is acted on once; a stale one not at all.
    let alpha = || Change::TenantModules {
        project_ref: "alpha".into(),
    };
    let refresh = |seq, at| event(FLEET_SECRET.as_bytes(), seq, at, alpha());
    let (payload, signed) = refresh(1, now_millis());
    for _ in 0..10 {
        publish(&nats, &subject, payload.clone(), signed.as_str()).await;
    }
    let (payload, signed) = refresh(2, now_millis() - 60_000);
    publish(&nats, &subject, payload, signed.as_str()).await;
    nats.flush().await.expect("flush");
    let text = metrics_once(&gw, "replays not refused", |text| {
        refused(text, "replayed") >= 9.0 && refused(text, "stale") >= 1.0
    });
    let text = text.await;
    let labels = ["source=\"nats\"", "kind=\"tenant_modules\""];
    assert_eq!(metric(&text, "aura_change_events_total", &labels), 1.0);

    // A burst of valid events: refreshes and reloads coalesced, at most one per interval.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let before = counter.statements();
    let burst = Instant::now();
    for seq in 10..310 {
        let (payload, signed) = refresh(seq, now_millis());
        publish(&nats, &subject, payload, signed.as_str()).await;
    }
    for seq in 400..420 {
        let (payload, signed) = reload(seq);
        publish(&nats, &subject, payload, signed.as_str()).await;
    }
    nats.flush().await.expect("flush");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let text = gw.metrics().await;
    let action = |action: &str, outcome: &str| {
        let labels = [
            format!("action=\"{action}\""),
            format!("outcome=\"{outcome}\""),
        ];
        metric(
            &text,
            "aura_change_actions_total",
            &[&labels[0], &labels[1]],
        )
    };
    let refreshes = action("tenant_refresh", "run");
    let folded = action("tenant_refresh", "coalesced");
    let reloads = action("operator_reload", "run");
    let reloads_folded = action("operator_reload", "coalesced");
    let cost = counter.statements() - before;
    eprintln!(
        "300 refreshes and 20 reloads asked for in {:?}: {refreshes} refreshes ({folded} folded), {reloads} reloads ({reloads_folded} folded), {cost} statements",
        burst.elapsed()
    );
    let coalesced = refreshes <= 5.0 && folded >= 290.0;
    assert!(coalesced, "{refreshes} refreshes, {folded} folded");
    let coalesced = reloads <= 3.0 && reloads_folded >= 17.0;
    assert!(coalesced, "{reloads} reloads");
    assert!(cost <= 16, "{cost} statements");
}
