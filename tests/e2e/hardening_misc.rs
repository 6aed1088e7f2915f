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
/// and network, and its system call filter, a deny-list, let it signal the gateway (`kill`,
/// `tgkill`), take its descriptors (`pidfd_open`, `pidfd_getfd`), advise on its memory
/// (`process_madvise`), fork, and make any x32 call. Confined under an allow-list, it can open,
/// create or run nothing, reach no socket and no other process, and as root it drops to
/// `nobody`; it can still start threads and signal its own (what compiling and its abort on a
/// refused allocation need).
#[test]
fn the_compile_worker_can_reach_no_file_socket_program_or_other_process() {
    use std::os::unix::process::CommandExt as _;
    // A process of the worker's own user, which the kernel would let it signal: the filter
    // refuses. As root, both run as `nobody` (the worker's user once confined).
    let root = rustix::process::geteuid().is_root();
    let nobody = aura_gateway::policy::confine::UNPRIVILEGED_ID;
    let as_nobody = |command: &mut std::process::Command| {
        if root {
            command.uid(nobody).gid(nobody);
        }
    };
    let mut sleeper = std::process::Command::new("sleep");
    sleeper.arg("60");
    as_nobody(&mut sleeper);
    let mut target = sleeper.spawn().expect("sleep");
    let mut check = std::process::Command::new(crate::support::config::binary());
    check.args(["compile-worker", "--check-sandbox", "--target-pid"]);
    check.arg(target.id().to_string());
    as_nobody(&mut check);
    let worker = check.output().expect("the sandbox check");
    let _ = target.kill();
    let _ = target.wait();
    succeeded(&worker);
    confined_as_it_should_be(&worker.stdout);

    // Started by the test (the gateway's place), aimed at it.
    let worker = run(&["compile-worker", "--check-sandbox"], None);
    succeeded(&worker);
    confined_as_it_should_be(&worker.stdout);
}

/// `report` (what `--check-sandbox` printed) shows every forbidden operation denied.
fn confined_as_it_should_be(report: &[u8]) {
    let report: serde_json::Value = serde_json::from_slice(report).expect("the worker's report");
    eprintln!("compile worker confinement: {report}");
    assert!(report["error"].is_null(), "{report}");
    for what in [
        "read_file",
        "create_file",
        "socket",
        "execute",
        "fork",
        "kill",
        "tgkill",
        "pidfd_open",
        "pidfd_getfd",
        "process_madvise",
        "x32",
    ] {
        assert_eq!(report[what], "denied", "{what}: {report}");
    }
    for what in ["thread", "signal_own_thread"] {
        assert_eq!(report[what], "allowed", "{what}: {report}");
    }
    assert_eq!(report["confinement"]["seccomp"], true);
    if rustix::process::geteuid().is_root() {
        let nobody = aura_gateway::policy::confine::UNPRIVILEGED_ID;
        assert_eq!(report["confinement"]["uid"], nobody);
    }
}

/// The confined worker still compiles every plugin: each stage's default and each test plugin,
/// fed on stdin as the gateway feeds it, answers a header saying so and the artefact.
#[test]
fn the_confined_compile_worker_compiles_every_plugin() {
    use aura_gateway::policy::builtin;
    use std::io::Write as _;
    use std::process::{Command, Stdio};
    let mut modules: Vec<(String, Vec<u8>)> = aura_gateway::stage::Stage::ALL
        .iter()
        .map(|&s| {
            (
                s.key().to_owned(),
                aura_gateway::policy::builtin_module(s).to_vec(),
            )
        })
        .collect();
    for path in [
        builtin::TESTING_PLUGIN_PATH,
        builtin::TESTING_QUOTA_PLUGIN_PATH,
        builtin::TESTING_LEGACY_PLUGIN_PATH,
        builtin::TESTING_DB_PLUGIN_PATH,
        builtin::TESTING_QUOTA_INPUTS_PLUGIN_PATH,
        builtin::TESTING_API_KEY_PLUGIN_PATH,
    ] {
        let name = std::path::Path::new(path).file_name().expect("name");
        let module = std::fs::read(path).expect("test plugin");
        modules.push((name.to_string_lossy().into_owned(), module));
    }
    for (name, module) in modules {
        let mut worker = Command::new(crate::support::config::binary())
            .arg("compile-worker")
            .env_clear()
            .env("MIMALLOC_ARENA_RESERVE", "16MiB")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the compile worker");
        let mut stdin = worker.stdin.take().expect("stdin");
        stdin.write_all(&module).expect("the module");
        drop(stdin);
        let out = worker.wait_with_output().expect("the worker's answer");
        let newline = out.stdout.iter().position(|&b| b == b'\n');
        let header: serde_json::Value = newline
            .and_then(|n| serde_json::from_slice(&out.stdout[..n]).ok())
            .unwrap_or_default();
        let stderr = String::from_utf8_lossy(&out.stderr);
        eprintln!("{name}: {header}");
        assert!(out.status.success(), "{name}: {:?} {stderr}", out.status);
        assert_eq!(header["ok"], true, "{name}: {header} {stderr}");
        let artefact = out.stdout.len() - newline.unwrap_or(0) - 1;
        assert_eq!(header["artefact_bytes"], artefact as u64, "{name}");
        assert!(artefact > 0, "{name}");
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
