//! `/ready` and the drain: through the real binary. A flood of `/ready` reaches the store at most
//! once a second.

use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use reqwest::StatusCode;

use crate::support::builder::{Gateway, Started};
use crate::support::call::{Call, IntoCall};
use crate::support::config::binary;
use crate::support::fixture::Fixture;
use crate::support::gateway::Process;
use crate::support::metrics::metric;
use crate::support::pg_counter::PgCounter;
use crate::support::policy::{cors_probe, testing_cors};
use crate::support::poll::poll_every;
use crate::support::postgres::{TestDatabase, control_table};
use crate::support::records::stored_cors_module;

async fn ready(gw: &Process) -> (StatusCode, serde_json::Value) {
    let ready = Call::get(gw.mgmt_url("/ready")).timeout(Duration::from_secs(5));
    let r = ready.try_send().await.expect("/ready answers");
    let status = r.status();
    (status, r.json().await.expect("json"))
}

/// The body of `/ready` once it answers `status` (asked every `every_ms`), unless `within`
/// passes first.
async fn ready_once(
    gw: &Process,
    status: StatusCode,
    within: Duration,
    every_ms: u64,
) -> Option<serde_json::Value> {
    let every = Duration::from_millis(every_ms);
    poll_every(within, every, async || {
        let (answered, body) = ready(gw).await;
        (answered == status).then_some(body)
    })
    .await
}

/// Whether alpha's own CORS module (the testing plugin) answered this request.
async fn alphas_module_answers(gw: &Process, fx: &Fixture) -> bool {
    let r = cors_probe(gw.data_url("/health"), &fx.anon_key).await;
    assert_eq!(r.status, StatusCode::OK);
    let exposed = r.headers.get("access-control-expose-headers");
    let exposed = exposed.and_then(|v| v.to_str().ok());
    exposed.is_some_and(|v| v.contains("x-testing-plugin"))
}

#[tokio::test]
async fn ready_when_listed_a_first_request_waits_for_its_module_503_when_draining() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Project alpha has a CORS module of its own in the store.
    let record = stored_cors_module(dir.path(), "alpha", &testing_cors());
    // Compiling it takes three seconds (a compile worker that sleeps first): the instance is
    // ready once the stored modules are listed, and alpha's first request waits for its module.
    let worker = dir.path().join("slow-compile-worker");
    let script = format!("#!/bin/sh\nsleep 3\nexec '{}' \"$@\"\n", binary().display());
    std::fs::write(&worker, script).expect("worker");
    std::fs::set_permissions(&worker, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let worker = worker.display();
    let toml = format!(
        "[server]\ndrain_delay_secs = 2\n\n[plugins]\ntenant_compile_worker = \"{worker}\"\n"
    );
    let gw = Gateway::builder()
        .dir(dir.path())
        .records(record)
        .toml(toml);
    let Started { gw, fx, .. } = gw.binary();
    let started = Instant::now();

    let body = ready_once(&gw, StatusCode::OK, Duration::from_secs(30), 50).await;
    let became_ready = started.elapsed();
    let body = body.unwrap_or_else(|| panic!("never ready; log:\n{}", gw.log_text()));
    assert_eq!(body["checks"]["tenant_modules"], "listed", "{body}");
    println!("ready {became_ready:?} after the listeners opened");
    let first_calls = |text: &str| {
        let labels = ["reason=\"first_call\"", "result=\"loaded\""];
        metric(text, "aura_tenant_module_loads_total", &labels)
    };
    assert_eq!(
        first_calls(&gw.metrics().await),
        0.0,
        "ready with nothing loaded"
    );

    // Alpha's first request waits for alpha's module: the plane's never answers in its place.
    let asked = Instant::now();
    let alphas = alphas_module_answers(&gw, &fx).await;
    println!("alpha's first request answered after {:?}", asked.elapsed());
    assert!(
        alphas,
        "alpha's first request is answered by alpha's own module"
    );
    assert_eq!(first_calls(&gw.metrics().await), 1.0);

    // SIGTERM: /ready answers 503 at once, requests are still served for the drain delay.
    let term = Instant::now();
    gw.signal("-TERM");
    let within = Duration::from_millis(1_500).saturating_sub(term.elapsed());
    let draining = ready_once(&gw, StatusCode::SERVICE_UNAVAILABLE, within, 20).await;
    let draining_seen = term.elapsed();
    let body = draining.expect("/ready answered 503 after SIGTERM");
    assert_eq!(body["error"]["code"], "draining", "{body}");
    assert_eq!(body["checks"]["draining"], true, "{body}");
    let mut served_while_draining = 0;
    while term.elapsed() < Duration::from_millis(1_500) {
        let alphas = alphas_module_answers(&gw, &fx).await;
        assert!(alphas, "still served, by the same modules");
        served_while_draining += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!(
        "draining reported {draining_seen:?} after SIGTERM; {served_while_draining} requests served while draining"
    );
    assert!(served_while_draining >= 5);
    let status = gw.exit().await;
    let stopped_after = term.elapsed();
    println!("stopped {stopped_after:?} after SIGTERM");
    assert!(status.success(), "{status:?}");
    let early = stopped_after < Duration::from_secs(2);
    assert!(
        !early,
        "the listeners closed before the drain delay ({stopped_after:?})"
    );
    assert!(stopped_after < Duration::from_secs(10), "{stopped_after:?}");
}

/// Every unauthenticated `/ready` used to ping the store (and Redis): a flood of it was a flood
/// of store round trips. The checks are answered from the last one for a second.
#[tokio::test]
async fn ready_checks_reach_the_store_at_most_once_a_second() {
    let fx = Fixture::new();
    let (db, _store) = TestDatabase::seeded(&fx).await;
    let counter = PgCounter::start(&db.url).await;
    let store = control_table(&counter.url) + "notifications = false\n\n";
    let plugins = "[plugins]\ntenant_refresh_secs = 3600\nmodule_gc_interval_secs = 3600\n";
    let Started { gw, .. } = Gateway::builder()
        .fixture(&fx)
        .toml(store + plugins)
        .binary();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = counter.statements();
    let started = std::time::Instant::now();
    let c = reqwest::Client::new();
    let mut answered = 0;
    while started.elapsed() < Duration::from_millis(1500) {
        let status = c.get(gw.mgmt_url("/ready")).call().status().await;
        assert!(matches!(status.as_u16(), 200 | 503));
        answered += 1;
    }
    let pings = counter.statements() - before;
    eprintln!("{answered} /ready answers in 1.5 s cost {pings} store statements");
    assert!(answered > 20, "{answered}");
    // Two checks at most in 1.5 s (each at most two statements: the pool's ping, the query).
    assert!(pings <= 6, "{pings} statements");
}
