//! The smaller findings of the third hardening round, through the real binary: secrets in URL
//! queries, a planted link under `wit --out`, the compile worker's confinement, `/ready` as a
//! store-ping amplifier, `rediss://…#insecure`, `..;` segments, and management routes on the
//! data plane.

use std::time::Duration;

use reqwest::StatusCode;

use crate::support::fixture::Fixture;
use crate::support::gateway::{
    Process, Started, binary, binary_config, serve_binary, start_binary,
};
use crate::support::nats_server::shared;
use crate::support::pg_counter::PgCounter;
use crate::support::postgres::TestDatabase;
use crate::support::unique_prefix;
use crate::support::upstream::Recorder;

const ADMIN_TOKEN: &str = "admin-token-0123456789abcdef";

/// A password given as `?password=` in the database URL used to be shown by
/// `/v1/admin/config`.
#[tokio::test]
async fn the_effective_configuration_never_shows_a_secret_in_a_url_query() {
    let db = TestDatabase::create().await;
    db.store().await;
    let fx = Fixture::new();
    fx.seed(&db).await;
    let dir = tempfile::tempdir().expect("tempdir");
    // Trust authentication on the test server: the password is carried, not checked.
    let url = format!(
        "{}?password=hunter2-query-secret&application_name=aura",
        db.url
    );
    let gw = serve_binary(
        dir.path(),
        &fx,
        "",
        &format!(
            "[control]\nstore = \"postgres\"\ndatabase_url = \"{url}\"\n\n[admin]\ntoken = \"{ADMIN_TOKEN}\"\n"
        ),
    );
    let r = reqwest::Client::new()
        .get(gw.mgmt_url("/v1/admin/config"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status(), StatusCode::OK);
    let text = r.text().await.expect("text");
    assert!(!text.contains("hunter2-query-secret"), "{text}");
    assert!(
        text.contains("password=[redacted]&application_name=aura"),
        "{text}"
    );
    assert!(
        !text.contains(crate::support::gateway::FLEET_SECRET),
        "{text}"
    );
}

/// `wit --out DIR` used to write through a link planted at `DIR/gateway.wit`.
#[test]
fn wit_out_replaces_a_planted_link_and_never_writes_through_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let victim = dir.path().join("victim");
    std::fs::write(&victim, "precious").expect("write");
    let out = dir.path().join("wit");
    std::fs::create_dir_all(&out).expect("dir");
    std::os::unix::fs::symlink(&victim, out.join("gateway.wit")).expect("link");
    let run = std::process::Command::new(binary())
        .args(["wit", "--out"])
        .arg(&out)
        .output()
        .expect("wit");
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert_eq!(std::fs::read_to_string(&victim).expect("read"), "precious");
    let written = out.join("gateway.wit");
    assert!(
        !std::fs::symlink_metadata(&written)
            .expect("meta")
            .is_symlink()
    );
    assert!(
        std::fs::read_to_string(&written)
            .expect("read")
            .contains("package aura:gateway"),
    );
}

/// The process compiling an uploaded module used to run as the gateway's user with its files
/// and network. Confined, it can open, create or run nothing and reach no socket, and as root
/// it drops to `nobody`.
#[test]
fn the_compile_worker_can_reach_no_file_socket_or_program() {
    let run = std::process::Command::new(binary())
        .args(["compile-worker", "--check-sandbox"])
        .output()
        .expect("worker");
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let report: serde_json::Value =
        serde_json::from_slice(&run.stdout).expect("the worker's report");
    eprintln!("compile worker confinement: {report}");
    assert!(report["error"].is_null(), "{report}");
    for what in ["read_file", "create_file", "socket", "execute"] {
        assert_eq!(report[what], "denied", "{what}: {report}");
    }
    assert_eq!(report["confinement"]["seccomp"], true);
    if rustix::process::geteuid().is_root() {
        assert_eq!(
            report["confinement"]["uid"],
            aura_gateway::policy::confine::UNPRIVILEGED_ID
        );
    }
}

/// Every unauthenticated `/ready` used to ping the store (and Redis): a flood of it was a flood
/// of store round trips. The checks are answered from the last one for a second.
#[tokio::test]
async fn ready_checks_reach_the_store_at_most_once_a_second() {
    let db = TestDatabase::create().await;
    db.store().await;
    let fx = Fixture::new();
    fx.seed(&db).await;
    let counter = PgCounter::start(&db.url).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = binary_config(
        dir.path(),
        &fx,
        "",
        &shared().url(),
        &unique_prefix(),
        &format!(
            "[control]\nstore = \"postgres\"\ndatabase_url = \"{}\"\nnotifications = false\n\n[plugins]\ntenant_refresh_secs = 3600\nmodule_gc_interval_secs = 3600\n",
            counter.url
        ),
    );
    let gw = Process::serve(&config, dir.path());
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = counter.statements();
    let started = std::time::Instant::now();
    let c = reqwest::Client::new();
    let mut answered = 0;
    while started.elapsed() < Duration::from_millis(1500) {
        let r = c.get(gw.mgmt_url("/ready")).send().await.expect("ready");
        assert!(matches!(r.status().as_u16(), 200 | 503));
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
    let config = dir.path().join("gateway.toml");
    std::fs::write(
        &config,
        "[rate_limit]\nredis_url = \"rediss://cache.internal:6380/0#insecure\"\n",
    )
    .expect("config");
    let run = std::process::Command::new(binary())
        .args(["check-config", "--config"])
        .arg(&config)
        .output()
        .expect("check-config");
    assert!(!run.status.success());
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        stderr.contains("rate_limit.redis_url") && stderr.contains("#insecure"),
        "{stderr}"
    );
}

/// `..;` is `..` to backends that strip path parameters (Tomcat, Jetty, Spring); it reached
/// them. Such a segment is `400 invalid_path` now, and nothing is forwarded.
#[tokio::test]
async fn dot_segments_with_parameters_never_reach_a_backend() {
    let storage = Recorder::start().await;
    let Started { gw, fx, dir: _dir } =
        start_binary(&format!("[upstreams]\nstorage_url = \"{}\"\n", storage.url));
    for path in [
        "/v1/storage/object/..;/..;/admin",
        "/v1/storage/object/a/..;jsessionid=x/b",
        "/v1/storage/object/.;/b",
        "/v1/storage/object/a/..%3B/b",
    ] {
        let raw = format!(
            "GET {path} HTTP/1.1\r\nhost: gw\r\napikey: {}\r\nconnection: close\r\n\r\n",
            fx.anon_key
        );
        let answer = crate::support::gateway::raw_exchange(("127.0.0.1", gw.port), raw.as_bytes());
        assert!(answer.starts_with("HTTP/1.1 400"), "{path}: {answer}");
        assert!(answer.contains("invalid_path"), "{path}: {answer}");
    }
    assert!(storage.seen().is_empty(), "{:?}", storage.seen());
    // A parameter that is not on a dot segment is the backend's business.
    let r = reqwest::Client::new()
        .get(gw.data_url("/v1/storage/object/a;v=1/b"))
        .header("apikey", &fx.anon_key)
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status(), StatusCode::OK);
}

/// The management plane's own routes answered `401` on the data plane (the API key check ran
/// first); they do not exist there: `404`, whatever the credentials.
#[tokio::test]
async fn management_routes_do_not_exist_on_the_data_plane() {
    let Started { gw, fx, dir: _dir } = start_binary(&format!(
        "[admin]\ntoken = \"{ADMIN_TOKEN}\"\n\n[plugins]\nadmin_token = \"{ADMIN_TOKEN}\"\n"
    ));
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
            let mut request = c.get(gw.data_url(path)).bearer_auth(ADMIN_TOKEN);
            if let Some(key) = key {
                request = request.header("apikey", key);
            }
            let r = request.send().await.expect("answer");
            assert_eq!(r.status(), StatusCode::NOT_FOUND, "{path} with key {key:?}");
            let body: serde_json::Value = r.json().await.expect("json");
            assert_eq!(body["error"]["code"], "not_found", "{path}");
        }
    }
    // Where they live, they answer.
    let r = c
        .get(gw.mgmt_url("/v1/admin/status"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status(), StatusCode::OK);
}
