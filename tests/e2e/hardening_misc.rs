//! The smaller findings of the third hardening round, through the real binary: secrets in URL
//! queries, a planted link under `wit --out`, the compile worker's confinement, `/ready` as a
//! store-ping amplifier, `rediss://…#insecure`, `..;` segments, and management routes on the
//! data plane.

use std::time::Duration;

use reqwest::StatusCode;

use crate::support::builder::{Gateway, Started};
use crate::support::call::{Call, IntoCall};
use crate::support::cli::{check_config, failed_saying, run, succeeded};
use crate::support::config::{FLEET_SECRET, write_config};
use crate::support::fixture::Fixture;
use crate::support::pg_counter::PgCounter;
use crate::support::postgres::{TestDatabase, control_table};
use crate::support::raw::exchange;
use crate::support::upstream::Recorder;

const ADMIN_TOKEN: &str = "admin-token-0123456789abcdef";

/// A password given as `?password=` in the database URL used to be shown by
/// `/v1/admin/config`.
#[tokio::test]
async fn the_effective_configuration_never_shows_a_secret_in_a_url_query() {
    let fx = Fixture::new();
    let (db, _store) = TestDatabase::seeded(&fx).await;
    // Trust authentication on the test server: the password is carried, not checked.
    let url = format!(
        "{}?password=hunter2-query-secret&application_name=aura",
        db.url
    );
    let store = control_table(&url);
    let admin = format!("\n[admin]\ntoken = \"{ADMIN_TOKEN}\"\n");
    let Started { gw, .. } = Gateway::builder()
        .fixture(&fx)
        .toml(store + &admin)
        .binary();
    let config = Call::get(gw.mgmt_url("/v1/admin/config")).bearer(ADMIN_TOKEN);
    let text = config.expect(StatusCode::OK).await.text();
    assert!(!text.contains("hunter2-query-secret"), "{text}");
    let redacted = text.contains("password=[redacted]&application_name=aura");
    assert!(redacted, "{text}");
    assert!(!text.contains(FLEET_SECRET), "{text}");
}

/// `wit --out DIR` used to write through a link planted at `DIR/gateway.wit`.
#[test]
fn wit_out_replaces_a_planted_link_and_never_writes_through_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (victim, out) = (dir.path().join("victim"), dir.path().join("wit"));
    std::fs::write(&victim, "precious").expect("write");
    std::fs::create_dir_all(&out).expect("dir");
    std::os::unix::fs::symlink(&victim, out.join("gateway.wit")).expect("link");
    succeeded(&run(&["wit", "--out", &out.display().to_string()], None));
    assert_eq!(std::fs::read_to_string(&victim).expect("read"), "precious");
    let written = out.join("gateway.wit");
    assert!(
        !std::fs::symlink_metadata(&written)
            .expect("meta")
            .is_symlink()
    );
    let wit = std::fs::read_to_string(&written).expect("read");
    assert!(wit.contains("package aura:gateway"));
}

/// The process compiling an uploaded module used to run as the gateway's user with its files
/// and network. Confined, it can open, create or run nothing and reach no socket, and as root
/// it drops to `nobody`.
#[test]
fn the_compile_worker_can_reach_no_file_socket_or_program() {
    let worker = run(&["compile-worker", "--check-sandbox"], None);
    succeeded(&worker);
    let report: serde_json::Value =
        serde_json::from_slice(&worker.stdout).expect("the worker's report");
    eprintln!("compile worker confinement: {report}");
    assert!(report["error"].is_null(), "{report}");
    for what in ["read_file", "create_file", "socket", "execute"] {
        assert_eq!(report[what], "denied", "{what}: {report}");
    }
    assert_eq!(report["confinement"]["seccomp"], true);
    if rustix::process::geteuid().is_root() {
        let nobody = aura_gateway::policy::confine::UNPRIVILEGED_ID;
        assert_eq!(report["confinement"]["uid"], nobody);
    }
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

/// `rediss://…#insecure` turned off certificate checks silently; it is refused, naming the key.
#[test]
fn a_redis_url_turning_off_certificate_checks_is_refused_by_check_config() {
    let dir = tempfile::tempdir().expect("tempdir");
    let redis = "[rate_limit]\nredis_url = \"rediss://cache.internal:6380/0#insecure\"\n";
    let out = check_config(&write_config(dir.path(), redis));
    failed_saying(&out, "rate_limit.redis_url");
    failed_saying(&out, "#insecure");
}

/// `..;` is `..` to backends that strip path parameters (Tomcat, Jetty, Spring); it reached
/// them. Such a segment is `400 invalid_path` now, and nothing is forwarded.
#[tokio::test]
async fn dot_segments_with_parameters_never_reach_a_backend() {
    let storage = Recorder::start().await;
    let upstreams = format!("[upstreams]\nstorage_url = \"{}\"\n", storage.url);
    let Started { gw, fx, dir: _dir } = Gateway::builder().toml(upstreams).binary();
    for path in [
        "/v1/storage/object/..;/..;/admin",
        "/v1/storage/object/a/..;jsessionid=x/b",
        "/v1/storage/object/.;/b",
        "/v1/storage/object/a/..%3B/b",
    ] {
        let key = &fx.anon_key;
        let raw = format!(
            "GET {path} HTTP/1.1\r\nhost: gw\r\napikey: {key}\r\nconnection: close\r\n\r\n"
        );
        let answer = exchange(gw.port, raw).await;
        assert!(answer.starts_with("HTTP/1.1 400"), "{path}: {answer}");
        assert!(answer.contains("invalid_path"), "{path}: {answer}");
    }
    assert!(storage.seen().is_empty(), "{:?}", storage.seen());
    // A parameter that is not on a dot segment is the backend's business.
    let object = Call::get(gw.data_url("/v1/storage/object/a;v=1/b")).key(&fx.anon_key);
    object.expect(StatusCode::OK).await;
}

/// The management plane's own routes answered `401` on the data plane (the API key check ran
/// first); they do not exist there: `404`, whatever the credentials.
#[tokio::test]
async fn management_routes_do_not_exist_on_the_data_plane() {
    let admin = format!(
        "[admin]\ntoken = \"{ADMIN_TOKEN}\"\n\n[plugins]\nadmin_token = \"{ADMIN_TOKEN}\"\n"
    );
    let Started { gw, fx, dir: _dir } = Gateway::builder().toml(admin).binary();
    let c = reqwest::Client::new();
    for path in [
        "/v1/admin/config",
        "/v1/admin/status",
        "/v1/policies/reload",
        "/ready",
        "/v1/projects/alpha",
        "/v1/organizations/x/projects",
    ] {
        for key in [None, Some(fx.anon_key.as_str())] {
            let mut request = c.get(gw.data_url(path)).call().bearer(ADMIN_TOKEN);
            if let Some(key) = key {
                request = request.key(key);
            }
            let r = request.read().await;
            assert_eq!(r.status, StatusCode::NOT_FOUND, "{path} with key {key:?}");
            assert_eq!(r.json()["error"]["code"], "not_found", "{path}");
        }
    }
    // Where they live, they answer.
    let status = c
        .get(gw.mgmt_url("/v1/admin/status"))
        .call()
        .bearer(ADMIN_TOKEN);
    status.expect(StatusCode::OK).await;
}
