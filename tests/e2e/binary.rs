//! The real binary: commands, configuration, both planes, plugin swap by path, shutdown.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use aura_gateway::policy::builtin::TESTING_PLUGIN_PATH;
use reqwest::StatusCode;

use crate::support::gateway::{METRICS_TOKEN, Process, binary, metric};
use crate::support::nats_server::shared;
use crate::support::responder::{Responder, reply};
use crate::support::unique_prefix;

fn example_config() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/configs/local.toml")
}

fn write_config(dir: &Path, toml: &str) -> PathBuf {
    let path = dir.join("gateway.toml");
    std::fs::write(&path, toml).expect("write config");
    path
}

fn check_config(path: &Path) -> std::process::Output {
    Command::new(binary())
        .args(["check-config", "--config"])
        .arg(path)
        .output()
        .expect("run check-config")
}

use crate::support::SECURITY_HEADERS;

#[tokio::test]
async fn the_example_config_serves_health_on_both_planes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let gw = Process::serve(&example_config(), dir.path());
    for url in [gw.data_url("/health"), gw.mgmt_url("/health")] {
        let response = reqwest::get(&url).await.expect("health");
        assert_eq!(response.status(), StatusCode::OK, "{url}");
        for h in SECURITY_HEADERS {
            assert!(response.headers().contains_key(*h), "{url}: {h}");
        }
        assert!(response.headers().contains_key("x-request-id"));
    }
}

#[test]
fn check_config_accepts_the_example_and_names_the_key_of_a_bad_one() {
    let ok = check_config(&example_config());
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );

    let dir = tempfile::tempdir().expect("tempdir");
    let bad = write_config(dir.path(), "[server]\nmax_body_byte = 10\n");
    let out = check_config(&bad);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("max_body_byte"), "{stderr}");

    let bad = write_config(dir.path(), "[timeouts]\nfunctions_ms = 0\n");
    let out = check_config(&bad);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("timeouts.functions_ms"));
}

#[test]
fn a_wildcard_management_origin_fails_check_config_and_serve() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = write_config(
        dir.path(),
        "[management_plane.plugins.cors.config]\nallow_origins = [\"https://studio.example\", \"*\"]\n",
    );
    let out = check_config(&path);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("management_plane.plugins.cors"), "{stderr}");
    let serve = Command::new(binary())
        .args(["serve", "--config"])
        .arg(&path)
        .env("AURA_PORT", crate::support::free_port().to_string())
        .env(
            "AURA_MANAGEMENT_PORT",
            crate::support::free_port().to_string(),
        )
        .output()
        .expect("run serve");
    assert!(!serve.status.success(), "serve must refuse to start");
    assert!(String::from_utf8_lossy(&serve.stderr).contains("refused"));
}

#[tokio::test]
async fn pointing_the_cors_stage_at_another_module_changes_the_answer_without_rebuilding() {
    let dir = tempfile::tempdir().expect("tempdir");
    let preflight = |url: String| async move {
        reqwest::Client::new()
            .request(reqwest::Method::OPTIONS, url)
            .header("origin", "https://app.example")
            .header("access-control-request-method", "GET")
            .send()
            .await
            .expect("preflight")
    };
    let builtin = write_config(dir.path(), "");
    let gw = Process::serve(&builtin, dir.path());
    let r = preflight(gw.data_url("/v1/db/x")).await;
    assert_eq!(r.headers()["access-control-allow-origin"], "*");
    drop(gw);

    let swapped = write_config(
        dir.path(),
        &format!("[data_plane.plugins.cors]\nmodule = {TESTING_PLUGIN_PATH:?}\n"),
    );
    let gw = Process::serve(&swapped, dir.path());
    let r = preflight(gw.data_url("/v1/db/x")).await;
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    assert_eq!(
        r.headers()["access-control-allow-origin"],
        "https://app.example"
    );
    assert_eq!(r.headers()["access-control-allow-headers"], "x-testing");
}

#[tokio::test]
async fn a_trapping_or_looping_plugin_fails_its_request_closed_and_the_next_is_served() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = write_config(
        dir.path(),
        &format!(
            "[plugins]\ncall_deadline_ms = 50\n[data_plane.plugins.cors]\nmodule = {TESTING_PLUGIN_PATH:?}\n"
        ),
    );
    let gw = Process::serve(&path, dir.path());
    let client = reqwest::Client::new();
    for origin in [
        "https://trap.test",
        "https://loop.test",
        "https://grow.test",
    ] {
        let r = client
            .get(gw.data_url("/health"))
            .header("origin", origin)
            .send()
            .await
            .expect("request");
        assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR, "{origin}");
        assert!(r.headers().contains_key("x-request-id"));
        let body: serde_json::Value = r.json().await.expect("json");
        assert_eq!(body["error"]["code"], "policy_failed", "{origin}");
        let next = client
            .get(gw.data_url("/health"))
            .header("origin", "https://ok.test")
            .send()
            .await
            .expect("request");
        assert_eq!(next.status(), StatusCode::OK, "served after {origin}");
    }
    let log = gw.log_text();
    assert!(log.contains("policy plugin failed"), "{log}");
    assert!(
        log.contains("stage=cors") || log.contains("stage\":\"cors"),
        "{log}"
    );
    assert!(
        log.contains(TESTING_PLUGIN_PATH),
        "the log names the plugin: {log}"
    );
}

/// What a plugin writes is bounded and attributed; the WASI it gets reaches nothing outside;
/// a plugin that tries to wait, to take a socket or to make the host allocate for it fails
/// its own request and nothing else.
#[tokio::test]
async fn a_plugin_logs_within_bounds_and_nothing_in_its_wasi_reaches_out() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = write_config(
        dir.path(),
        &format!(
            "[metrics]\ntoken = {METRICS_TOKEN:?}\n[plugins]\ncall_deadline_ms = 1000\n\
             [data_plane.plugins.cors]\nmodule = {TESTING_PLUGIN_PATH:?}\n"
        ),
    );
    let gw = Process::serve(&path, dir.path());
    let client = reqwest::Client::new();
    let get = |origin: &'static str| {
        client
            .get(gw.data_url("/health"))
            .header("origin", origin)
            .send()
    };
    let id = |r: &reqwest::Response| r.headers()["x-request-id"].to_str().expect("id").to_owned();

    // `log`, stdout and stderr, each with the request id; a newline cannot forge a line.
    let r = get("https://log.test").await.expect("answer");
    assert_eq!(r.status(), StatusCode::OK);
    let logged = id(&r);
    // 1,000 lines of 1 MiB and 1 MiB of stdout: the call keeps 16 lines of at most 1 KiB.
    let r = get("https://flood.test").await.expect("answer");
    assert_eq!(r.status(), StatusCode::OK);
    let flooded = id(&r);
    fn plugin_lines<'a>(log: &'a str, id: &str) -> Vec<&'a str> {
        log.lines()
            .filter(|l| l.contains("aura::plugin") && l.contains(id))
            .collect()
    }
    // The log is written by a thread of its own: on a loaded machine it may lag.
    let mut log = String::new();
    for _ in 0..300 {
        log = gw.log_text();
        if plugin_lines(&log, &logged).len() >= 3 && plugin_lines(&log, &flooded).len() >= 16 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let lines = |id: &str| plugin_lines(&log, id);
    let of_logged = lines(&logged);
    assert!(
        of_logged
            .iter()
            .any(|l| l.contains("WARN") && l.contains("testing plugin saw log.test forged line")),
        "{log}"
    );
    assert!(of_logged.iter().any(|l| l.contains("to stdout")), "{log}");
    assert!(of_logged.iter().any(|l| l.contains("to stderr")), "{log}");
    assert!(
        !log.lines().any(|l| l.starts_with("forged line")),
        "a plugin's newline started a line of its own"
    );
    let of_flood = lines(&flooded);
    assert_eq!(of_flood.len(), 16, "lines kept for one call");
    assert!(of_flood.iter().all(|l| l.len() < 1_500), "lines are cut");
    let metrics = gw.metrics().await;
    for reason in ["per_call", "bytes"] {
        assert!(
            metric(
                &metrics,
                "aura_plugin_log_dropped_total",
                &[&format!("reason=\"{reason}\"")]
            ) >= 1.0,
            "{reason}: {metrics}"
        );
    }

    // No file, no environment: the plugin could do neither, so it denies the preflight.
    let r = client
        .request(reqwest::Method::OPTIONS, gw.data_url("/v1/db/x"))
        .header("origin", "https://file.test")
        .header("access-control-request-method", "GET")
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status(), StatusCode::FORBIDDEN);

    // A sleep, a socket, 1 MiB of host randomness: that request fails closed at once, the
    // next one is served.
    for origin in [
        "https://sleep.test",
        "https://socket.test",
        "https://random.test",
    ] {
        let started = std::time::Instant::now();
        let r = get(origin).await.expect("answer");
        assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR, "{origin}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{origin} waited"
        );
        let body: serde_json::Value = r.json().await.expect("json");
        assert_eq!(body["error"]["code"], "policy_failed", "{origin}");
        let next = get("https://ok.test").await.expect("answer");
        assert_eq!(next.status(), StatusCode::OK, "served after {origin}");
    }
    let log = gw.log_text();
    assert!(log.contains("a plugin may not wait"), "{log}");
    assert!(log.contains("is not granted to plugins"), "{log}");
}

/// The compile cache holds native code: a folder others may write to is refused with its key,
/// and a file that is not a compiled module is compiled again, neither trusted nor fatal.
#[tokio::test]
async fn the_compile_cache_refuses_an_open_folder_and_recompiles_a_bad_file() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = dir.path().join("cache");
    std::fs::create_dir(&cache).expect("mkdir");
    std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let config = |extra: &str| {
        write_config(
            dir.path(),
            &format!(
                "[plugins]\ncompile_cache_dir = \"cache\"\n[data_plane.plugins.cors]\nmodule = {TESTING_PLUGIN_PATH:?}\n{extra}"
            ),
        )
    };
    let out = check_config(&config(""));
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("plugins.compile_cache_dir") && stderr.contains("writable by no one else"),
        "{stderr}"
    );

    std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let out = check_config(&config(""));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut files: Vec<_> = std::fs::read_dir(&cache)
        .expect("cache")
        .map(|e| e.expect("entry").path())
        .collect();
    files.sort();
    assert_eq!(
        files.len(),
        5,
        "the testing plugin and the 4 defaults: {files:?}"
    );
    // Every file replaced by garbage: the gateway compiles again, serves, and rewrites them.
    for file in &files {
        std::fs::write(file, b"not a compiled module").expect("overwrite");
    }
    let gw = Process::serve(&config(""), dir.path());
    let r = reqwest::Client::new()
        .get(gw.data_url("/health"))
        .header("origin", "https://ok.test")
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(
        r.headers()["access-control-allow-origin"],
        "https://ok.test",
        "the testing plugin is in force"
    );
    assert!(
        gw.log_text().contains("does not load; compiling again"),
        "{}",
        gw.log_text()
    );
    for file in &files {
        assert_ne!(std::fs::read(file).expect("file"), b"not a compiled module");
    }
}

#[tokio::test]
async fn sigterm_lets_in_flight_requests_finish() {
    let nats = shared();
    let prefix = unique_prefix();
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("control.toml"),
        crate::support::gateway::e2e_control_file(),
    )
    .expect("control file");
    let path = write_config(
        dir.path(),
        &format!(
            "[nats]\nurl = {:?}\nsubject_prefix = {prefix:?}\n[control]\nfile = \"control.toml\"\n",
            nats.url()
        ),
    );
    let mut gw = Process::serve(&path, dir.path());
    let _responder = Responder::start(
        &nats.url(),
        &format!("{prefix}.functions.http"),
        Duration::from_millis(1_000),
        |_| reply(200, &[], b"finished"),
    )
    .await;
    // Wait until the gateway's own NATS connection is up.
    let client = crate::support::gateway::client();
    for _ in 0..100 {
        let r = client
            .get(gw.data_url("/v1/auth/x"))
            .send()
            .await
            .expect("request");
        if r.status() != StatusCode::SERVICE_UNAVAILABLE
            || r.text().await.unwrap_or_default().contains("no_responders")
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let url = gw.data_url("/v1/functions/slow");
    let in_flight =
        tokio::spawn(async move { crate::support::gateway::client().get(url).send().await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    crate::support::gateway::terminate(&gw.child);
    let response = in_flight
        .await
        .expect("task")
        .expect("in-flight request completes");
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.text().await.expect("body"), "finished");
    let status = tokio::task::spawn_blocking(move || gw.child.wait())
        .await
        .expect("join")
        .expect("wait");
    assert!(status.success(), "clean exit after SIGTERM: {status:?}");
}

#[tokio::test]
async fn keys_create_gives_a_working_key_and_revoke_stops_it() {
    let nats = shared();
    let prefix = unique_prefix();
    let dir = tempfile::tempdir().expect("tempdir");
    let control = dir.path().join("control.toml");
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/control/local.toml"),
        &control,
    )
    .expect("copy the example control file");
    let path = write_config(
        dir.path(),
        &format!(
            "[nats]\nurl = {:?}\nsubject_prefix = {prefix:?}\n[control]\nfile = \"control.toml\"\nreload_interval_ms = 100\n[auth]\nkey_cache_ttl_secs = 1\n[log]\nlevel = \"debug\"\n",
            nats.url()
        ),
    );
    let create = Command::new(binary())
        .args([
            "keys",
            "create",
            "--project",
            "demo",
            "--role",
            "anon",
            "--config",
        ])
        .arg(&path)
        .output()
        .expect("keys create");
    assert!(
        create.status.success(),
        "{}",
        String::from_utf8_lossy(&create.stderr)
    );
    let key = String::from_utf8(create.stdout)
        .expect("utf8")
        .trim()
        .to_owned();
    assert!(key.starts_with("aura_pk_"), "{key}");
    let stored = std::fs::read_to_string(&control).expect("read");
    assert!(!stored.contains(&key), "only the hash is stored");
    assert!(stored.contains(&aura_gateway::auth::keys::hash_key(&key)));
    let id = String::from_utf8_lossy(&create.stderr)
        .split_whitespace()
        .find_map(|w| uuid::Uuid::parse_str(w).ok())
        .expect("create names the key id");

    let gw = Process::serve(&path, dir.path());
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let _auth = Responder::start(
        &nats.url(),
        &format!("{prefix}.auth.http"),
        Duration::ZERO,
        move |e| {
            let _ = tx.send(e);
            reply(200, &[], b"{}")
        },
    )
    .await;
    let client = reqwest::Client::new();
    let r = client
        .get(gw.data_url("/v1/auth/user"))
        .header("apikey", &key)
        .send()
        .await
        .expect("r");
    assert_eq!(r.status(), StatusCode::OK);
    let envelope = rx.recv().await.expect("envelope");
    assert_eq!(envelope["actor"]["role"], "anon");
    assert_eq!(envelope["actor"]["project"], "demo");
    let r = client
        .get(gw.data_url("/v1/auth/user"))
        .send()
        .await
        .expect("r");
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);

    let revoke = Command::new(binary())
        .args(["keys", "revoke", "--id", &id.to_string(), "--config"])
        .arg(&path)
        .output()
        .expect("keys revoke");
    assert!(
        revoke.status.success(),
        "{}",
        String::from_utf8_lossy(&revoke.stderr)
    );
    let mut refused = false;
    for _ in 0..40 {
        let r = client
            .get(gw.data_url("/v1/auth/user"))
            .header("apikey", &key)
            .send()
            .await
            .expect("r");
        if r.status() == StatusCode::UNAUTHORIZED {
            refused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(refused, "the revoked key stopped working");
    let log = gw.log_text();
    assert!(!log.contains(&key), "the key never appears in the logs");
    assert!(!log.contains(&key[8..]), "not even without its prefix");
}

#[tokio::test]
async fn migrate_creates_the_control_schema() {
    let db = crate::support::postgres::TestDatabase::create().await;
    let out = Command::new(binary())
        .args(["migrate", "--database-url", &db.url])
        .output()
        .expect("migrate");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The tables are there with the contract's columns.
    db.execute(
        "INSERT INTO aura_control.organizations (id, name) VALUES ('00000000-0000-4000-8000-000000000001', 'o');
         INSERT INTO aura_control.projects (ref, organization_id, db_engine, topology)
           VALUES ('p', '00000000-0000-4000-8000-000000000001', 'postgres', 'shared');
         INSERT INTO aura_control.organization_members (organization_id, user_id, role)
           VALUES ('00000000-0000-4000-8000-000000000001', '00000000-0000-4000-8000-000000000002', 'owner');
         INSERT INTO aura_control.api_keys (id, project_ref, role, key_sha256, revoked_at)
           VALUES ('00000000-0000-4000-8000-000000000003', 'p', 'anon', 'h', NULL);",
    )
    .await;
    let again = Command::new(binary())
        .args(["migrate", "--database-url", &db.url])
        .output()
        .expect("migrate");
    assert!(again.status.success(), "migrations are idempotent");
}

#[tokio::test]
async fn dev_prints_requests_that_work_exactly_as_printed() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().expect("tempdir");
    let path = write_config(
        dir.path(),
        &format!(
            "[nats]\nurl = {:?}\n[log]\nlevel = \"warn\"\n",
            shared().url()
        ),
    );
    let (port, management_port) = (crate::support::free_port(), crate::support::free_port());
    let mut child = Command::new(binary())
        .args([
            "dev",
            "--port",
            &port.to_string(),
            "--management-port",
            &management_port.to_string(),
            "--config",
        ])
        .arg(&path)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("dev");
    let stdout = child.stdout.take().expect("stdout");
    let lines = tokio::task::spawn_blocking(move || {
        let mut lines = Vec::new();
        for line in BufReader::new(stdout).lines() {
            let line = line.expect("line");
            let done = line.starts_with("Ctrl-C");
            lines.push(line);
            if done {
                break;
            }
        }
        lines
    })
    .await
    .expect("join");
    let commands: Vec<&str> = lines
        .iter()
        .map(|l| l.trim())
        .filter(|l| l.starts_with("curl "))
        .collect();
    assert!(commands.len() >= 8, "{lines:?}");
    assert!(
        lines
            .iter()
            .any(|l| l.contains("anon key:") && l.contains("aura_pk_"))
    );
    assert!(lines.iter().any(|l| l.contains("console token:")));
    for command in commands {
        let streaming = command.starts_with("curl -N");
        let shell = if streaming {
            format!("{command} --max-time 2 2>/dev/null; true")
        } else {
            format!("{command} -s -o /dev/null -w '%{{http_code}}' --max-time 5")
        };
        let out = Command::new("bash")
            .args(["-c", &shell])
            .output()
            .expect("curl");
        let out = String::from_utf8_lossy(&out.stdout).to_string();
        if streaming {
            assert!(out.contains("event: tick"), "{command}: {out}");
        } else {
            assert_eq!(out, "200", "{command}");
        }
    }
    crate::support::gateway::terminate(&child);
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .expect("join")
        .expect("wait");
    assert!(status.success(), "{status:?}");
}

#[tokio::test]
async fn spans_are_exported_over_otlp_with_the_request_id() {
    let bodies: std::sync::Arc<std::sync::Mutex<Vec<u8>>> = Default::default();
    let sink = bodies.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: axum::body::Bytes| {
            sink.lock().expect("lock").extend_from_slice(&body);
            async { "" }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let collector = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });

    let dir = tempfile::tempdir().expect("tempdir");
    let path = write_config(
        dir.path(),
        &format!(
            "[tracing]\notlp_endpoint = \"http://{collector}\"\nservice_name = \"aura-gateway-e2e\"\n"
        ),
    );
    let mut gw = Process::serve(&path, dir.path());
    let r = reqwest::get(gw.data_url("/health")).await.expect("health");
    let id = r.headers()["x-request-id"].to_str().expect("id").to_owned();
    crate::support::gateway::terminate(&gw.child);
    let status = tokio::task::spawn_blocking(move || gw.child.wait())
        .await
        .expect("join")
        .expect("wait");
    assert!(status.success());
    let exported = String::from_utf8_lossy(&bodies.lock().expect("lock")).to_string();
    assert!(
        exported.contains(&id),
        "the request span carries the request id"
    );
    assert!(exported.contains("aura-gateway-e2e"), "service.name");
    assert!(exported.contains("request"), "the request span");
}

#[test]
fn the_config_and_each_default_plugin_print_their_json_schema() {
    let run = |args: &[&str]| {
        let out = Command::new(binary()).args(args).output().expect("run");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (ok, text) = run(&["config", "schema"]);
    assert!(ok);
    let schema: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    for key in ["server", "nats", "plugins", "rate_limit", "admin"] {
        assert!(schema["properties"].get(key).is_some(), "{key}");
    }
    let (ok, text) = run(&["plugin", "schema", "--stage", "cors"]);
    assert!(ok);
    let schema: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    assert!(
        schema["properties"].get("allow_origins").is_some(),
        "{schema}"
    );
    let (ok, _) = run(&["plugin", "schema", "--stage", "teapot"]);
    assert!(!ok, "an unknown stage is refused");
}

#[test]
fn plugin_check_passes_a_good_module_and_names_what_is_wrong_with_a_bad_one() {
    let ok = Command::new(binary())
        .args(["plugin", "check", TESTING_PLUGIN_PATH, "--stage", "cors"])
        .output()
        .expect("plugin check");
    let stdout = String::from_utf8_lossy(&ok.stdout);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(stdout.contains("data_plane.plugins.cors"), "{stdout}");
    assert!(
        stdout.contains("median") && stdout.contains("memory"),
        "per-call time and memory: {stdout}"
    );

    let dir = tempfile::tempdir().expect("tempdir");
    let refusing = dir.path().join("refuse.toml");
    std::fs::write(&refusing, "refuse = true\n").expect("write");
    let out = Command::new(binary())
        .args([
            "plugin",
            "check",
            TESTING_PLUGIN_PATH,
            "--stage",
            "cors",
            "--config",
        ])
        .arg(&refusing)
        .output()
        .expect("plugin check");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("refused as asked"));

    let quota = dir.path().join("quota.wasm");
    std::fs::write(&quota, aura_gateway::policy::builtin::QUOTA).expect("write");
    let out = Command::new(binary())
        .args(["plugin", "check"])
        .arg(&quota)
        .args(["--stage", "cors"])
        .output()
        .expect("plugin check");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("does not export the cors stage world"));
}

#[tokio::test]
async fn no_key_or_token_text_reaches_the_log_even_at_debug_level() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/control/local.toml"),
        dir.path().join("control.toml"),
    )
    .expect("copy the example control file");
    let path = write_config(
        dir.path(),
        &format!(
            "[nats]\nurl = {:?}\n[control]\nfile = \"control.toml\"\n\
             [auth.user_jwt]\nhs256_secret = \"binary-user-jwt-secret-0123456789abcdef\"\n\
             [log]\nlevel = \"debug\"\nformat = \"json\"\n",
            shared().url()
        ),
    );
    let gw = Process::serve(&path, dir.path());
    let client = reqwest::Client::new();
    let demo = "aura_pk_localdemo_0123456789abcdefghijklmnopqrstuv";
    let mut secrets = Vec::new();
    for i in 0..200 {
        let guess = format!("aura_sk_guess{i:04}_{}", uuid::Uuid::new_v4().simple());
        let r = client
            .get(gw.data_url("/v1/functions/f"))
            .header(if i % 2 == 0 { "apikey" } else { "x-api-key" }, &guess)
            .send()
            .await
            .expect("r");
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
        let token = format!(
            "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ{i:04}{}.c2lnbmF0dXJl",
            uuid::Uuid::new_v4().simple()
        );
        let r = client
            .get(gw.data_url("/v1/functions/f"))
            .header("apikey", demo)
            .bearer_auth(&token)
            .send()
            .await
            .expect("r");
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
        secrets.push(guess);
        secrets.push(token);
    }
    // A real key, used: still never logged.
    let r = client
        .get(gw.data_url("/health"))
        .header("apikey", demo)
        .send()
        .await
        .expect("r");
    assert_eq!(r.status(), StatusCode::OK);
    secrets.push(demo.to_owned());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let log = gw.log_text();
    assert!(
        log.lines().count() > 400,
        "the debug log was written ({} lines)",
        log.lines().count()
    );
    for secret in &secrets {
        assert!(!log.contains(secret.as_str()), "{secret} is in the log");
        let body = &secret[8..];
        assert!(!log.contains(body), "part of {secret} is in the log");
    }
}

#[test]
fn an_api_key_module_asking_for_too_many_or_too_long_header_names_is_refused() {
    // Every request is searched for each name the `api-key` stage asks to read: the host bounds
    // the module's answer (here the default module, configured by the operator).
    let dir = tempfile::tempdir().expect("tempdir");
    let names = |n: usize, len: usize| {
        (0..n)
            .map(|i| format!("\"x-{}{i:02}\"", "k".repeat(len.saturating_sub(4))))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let config = |list: String| {
        write_config(
            dir.path(),
            &format!("[data_plane.plugins.api_key.config]\nheaders = [{list}]\n"),
        )
    };
    let at_limit = check_config(&config(names(16, 64)));
    assert!(
        at_limit.status.success(),
        "{}",
        String::from_utf8_lossy(&at_limit.stderr)
    );
    for (what, list, expected) in [
        (
            "17 names",
            names(17, 8),
            "17 header names to read, more than 16",
        ),
        (
            "a 65-byte name",
            names(1, 65),
            "not a lower-case header name of 1 to 64 bytes",
        ),
    ] {
        let out = check_config(&config(list));
        assert!(!out.status.success(), "{what}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("data_plane.plugins.api_key"),
            "{what}: {stderr}"
        );
        assert!(stderr.contains(expected), "{what}: {stderr}");
    }
}
