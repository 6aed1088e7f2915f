//! The fleet's change events under attack, through the real binary: any database login sending
//! `NOTIFY` or listening to it, and anyone able to publish on NATS. Statements reaching the
//! control store are counted at the wire ([`PgCounter`]).

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use sqlx::Connection as _;

use crate::support::builder::Gateway;
use crate::support::call::Call;
use crate::support::config::FLEET_SECRET;
use crate::support::fixture::Fixture;
use crate::support::gateway::Process;
use crate::support::metrics::metric;
use crate::support::nats_server::shared;
use crate::support::pg_counter::PgCounter;
use crate::support::poll::poll_every;
use crate::support::postgres::{TestDatabase, admin_url, long_cached};
use crate::support::unique_prefix;

/// Publishes `payload` on `subject` with `signature` in the fleet's signature header.
async fn publish(nats: &async_nats::Client, subject: &str, payload: Vec<u8>, signature: &str) {
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(aura_gateway::changes::SIGNATURE_HEADER, signature);
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
    let subject = aura_gateway::changes::subject(&prefix);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = counter.statements();
    use aura_gateway::changes::{Change, now_millis, signed_event};

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
        refused(text, "unsigned") >= 20.0 && refused(text, "bad_signature") >= 40.0
    });
    let text = text.await;
    assert!(refused(&text, "invalid") >= 5.0, "{text}");
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
