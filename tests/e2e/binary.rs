//! The real binary: commands, configuration, both planes, plugin swap by path, shutdown.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use aura_gateway::policy::builtin::TESTING_PLUGIN_PATH;
use reqwest::StatusCode;

use crate::support::SECURITY_HEADERS;
use crate::support::call::{Answer, Call, IntoCall, client};
use crate::support::cli::{check_config, failed_saying, run, stderr, succeeded};
use crate::support::config::{METRICS_TOKEN, binary, write_config};
use crate::support::gateway::Process;
use crate::support::metrics::metric;
use crate::support::poll::poll_tries;
use crate::support::records::e2e_control_file;
use crate::support::responder::{Bus, Responder, reply};

fn example(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples")
        .join(path)
}

fn example_config() -> PathBuf {
    example("configs/local.toml")
}

#[tokio::test]
async fn the_example_config_serves_health_on_both_planes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let gw = Process::serve(&example_config(), dir.path());
    for url in [gw.data_url("/health"), gw.mgmt_url("/health")] {
        let response = Call::get(&url).read().await;
        assert_eq!(response.status, StatusCode::OK, "{url}");
        for h in SECURITY_HEADERS {
            assert!(response.headers.contains_key(*h), "{url}: {h}");
        }
        assert!(response.headers.contains_key("x-request-id"));
    }
}

#[test]
fn check_config_accepts_the_example_and_names_the_key_of_a_bad_one() {
    succeeded(&check_config(&example_config()));
    let dir = tempfile::tempdir().expect("tempdir");
    let bad = write_config(dir.path(), "[server]\nmax_body_byte = 10\n");
    failed_saying(&check_config(&bad), "max_body_byte");
    let bad = write_config(dir.path(), "[timeouts]\nfunctions_ms = 0\n");
    failed_saying(&check_config(&bad), "timeouts.functions_ms");
}

#[test]
fn a_wildcard_management_origin_fails_check_config_and_serve() {
    let dir = tempfile::tempdir().expect("tempdir");
    let origins = "[\"https://studio.example\", \"*\"]";
    let toml = format!("[management_plane.plugins.cors.config]\nallow_origins = {origins}\n");
    let path = write_config(dir.path(), &toml);
    failed_saying(&check_config(&path), "management_plane.plugins.cors");
    let port = || crate::support::free_port().to_string();
    let mut serve = Command::new(binary());
    serve.args(["serve", "--config"]).arg(&path);
    serve
        .env("AURA_PORT", port())
        .env("AURA_MANAGEMENT_PORT", port());
    let serve = serve.output().expect("run serve");
    assert!(!serve.status.success(), "serve must refuse to start");
    assert!(stderr(&serve).contains("refused"));
}

/// A CORS preflight from `https://app.example` to `url`.
async fn app_preflight(url: String) -> Answer {
    Call::preflight(url, "https://app.example").read().await
}

#[tokio::test]
async fn pointing_the_cors_stage_at_another_module_changes_the_answer_without_rebuilding() {
    let dir = tempfile::tempdir().expect("tempdir");
    let builtin = write_config(dir.path(), "");
    let gw = Process::serve(&builtin, dir.path());
    let r = app_preflight(gw.data_url("/v1/db/x")).await;
    assert_eq!(r.headers["access-control-allow-origin"], "*");
    drop(gw);

    let module = format!("[data_plane.plugins.cors]\nmodule = {TESTING_PLUGIN_PATH:?}\n");
    let swapped = write_config(dir.path(), &module);
    let gw = Process::serve(&swapped, dir.path());
    let r = app_preflight(gw.data_url("/v1/db/x")).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    assert_eq!(
        r.headers["access-control-allow-origin"],
        "https://app.example"
    );
    assert_eq!(r.headers["access-control-allow-headers"], "x-testing");
}

/// A gateway binary with the testing CORS module on the data plane and `plugins` settings.
fn with_testing_cors(dir: &Path, head: &str, plugins: &str) -> Process {
    let cors = format!("[data_plane.plugins.cors]\nmodule = {TESTING_PLUGIN_PATH:?}\n");
    let path = write_config(dir, &format!("{head}[plugins]\n{plugins}\n{cors}"));
    Process::serve(&path, dir)
}

/// `GET /health` from `origin`: a request fails closed, the next one from `ok.test` is served.
async fn fails_closed_then_serves(gw: &Process, client: &reqwest::Client, origin: &str) -> Answer {
    let health = |origin: &str| client.get(gw.data_url("/health")).call().origin(origin);
    let r = health(origin).read().await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR, "{origin}");
    let next = health("https://ok.test").status().await;
    assert_eq!(next, StatusCode::OK, "served after {origin}");
    r
}

#[tokio::test]
async fn a_trapping_or_looping_plugin_fails_its_request_closed_and_the_next_is_served() {
    let dir = tempfile::tempdir().expect("tempdir");
    let gw = with_testing_cors(dir.path(), "", "call_deadline_ms = 50");
    let client = reqwest::Client::new();
    for origin in [
        "https://trap.test",
        "https://loop.test",
        "https://grow.test",
    ] {
        let r = fails_closed_then_serves(&gw, &client, origin).await;
        assert!(r.headers.contains_key("x-request-id"));
        assert_eq!(r.code(), "policy_failed", "{origin}");
    }
    // Idle, the epoch ticker sleeps: its thread is not switched in at all for a while.
    let ticker = || {
        gw.thread_switches("aura-epoch")
            .expect("an aura-epoch thread")
    };
    let waited = std::time::Instant::now();
    loop {
        let before = ticker();
        tokio::time::sleep(Duration::from_millis(500)).await;
        let after = ticker();
        if after == before {
            break;
        }
        let waking = format!("{} wake-ups in 500 ms", after - before);
        assert!(
            waited.elapsed() < Duration::from_secs(10),
            "idle ticker: {waking}"
        );
    }
    // A loop started now wakes it, and is stopped at its deadline.
    let looping = fails_closed_then_serves(&gw, &client, "https://loop.test");
    let r = tokio::time::timeout(Duration::from_secs(10), looping)
        .await
        .expect("a loop started while the ticker slept is stopped");
    assert_eq!(r.code(), "policy_failed");
    let log = gw.log_text();
    assert!(log.contains("policy plugin failed"), "{log}");
    let stage = log.contains("stage=cors") || log.contains("stage\":\"cors");
    assert!(stage, "{log}");
    let named = log.contains(TESTING_PLUGIN_PATH);
    assert!(named, "the log names the plugin: {log}");
}

/// What a plugin writes is bounded and attributed; the WASI it gets reaches nothing outside;
/// a plugin that tries to wait, to take a socket or to make the host allocate for it fails
/// its own request and nothing else.
#[tokio::test]
async fn a_plugin_logs_within_bounds_and_nothing_in_its_wasi_reaches_out() {
    let dir = tempfile::tempdir().expect("tempdir");
    let metrics = format!("[metrics]\ntoken = {METRICS_TOKEN:?}\n");
    let gw = with_testing_cors(dir.path(), &metrics, "call_deadline_ms = 1000");
    let client = reqwest::Client::new();
    let get = |origin: &'static str| client.get(gw.data_url("/health")).call().origin(origin);

    // `log`, stdout and stderr, each with the request id; a newline cannot forge a line.
    let logged = get("https://log.test")
        .expect(StatusCode::OK)
        .await
        .request_id();
    // 1,000 lines of 1 MiB and 1 MiB of stdout: the call keeps 16 lines of at most 1 KiB.
    let flooded = get("https://flood.test")
        .expect(StatusCode::OK)
        .await
        .request_id();
    fn plugin_lines<'a>(log: &'a str, id: &str) -> Vec<&'a str> {
        log.lines()
            .filter(|l| l.contains("aura::plugin") && l.contains(id))
            .collect()
    }
    // The log is written by a thread of its own: on a loaded machine it may lag.
    let mut log = String::new();
    let _ = poll_tries(300, Duration::from_millis(100), async || {
        log = gw.log_text();
        let of = |id: &str| plugin_lines(&log, id).len();
        (of(&logged) >= 3 && of(&flooded) >= 16).then_some(())
    })
    .await;
    let lines = |id: &str| plugin_lines(&log, id);
    let of_logged = lines(&logged);
    let warned =
        |l: &&str| l.contains("WARN") && l.contains("testing plugin saw log.test forged line");
    assert!(of_logged.iter().any(warned), "{log}");
    assert!(of_logged.iter().any(|l| l.contains("to stdout")), "{log}");
    assert!(of_logged.iter().any(|l| l.contains("to stderr")), "{log}");
    let forged = log.lines().any(|l| l.starts_with("forged line"));
    assert!(!forged, "a plugin's newline started a line of its own");
    let of_flood = lines(&flooded);
    assert_eq!(of_flood.len(), 16, "lines kept for one call");
    assert!(of_flood.iter().all(|l| l.len() < 1_500), "lines are cut");
    let metrics = gw.metrics().await;
    for reason in ["per_call", "bytes"] {
        let label = format!("reason=\"{reason}\"");
        let dropped = metric(&metrics, "aura_plugin_log_dropped_total", &[&label]);
        assert!(dropped >= 1.0, "{reason}: {metrics}");
    }

    // No file, no environment: the plugin could do neither, so it denies the preflight.
    let preflight = client
        .request(reqwest::Method::OPTIONS, gw.data_url("/v1/db/x"))
        .call();
    let preflight = preflight.origin("https://file.test");
    let preflight = preflight.header("access-control-request-method", "GET");
    assert_eq!(preflight.status().await, StatusCode::FORBIDDEN);

    // A sleep, a socket, 1 MiB of host randomness: that request fails closed at once, the
    // next one is served.
    for origin in [
        "https://sleep.test",
        "https://socket.test",
        "https://random.test",
    ] {
        let started = std::time::Instant::now();
        let r = get(origin).read().await;
        assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR, "{origin}");
        let waited = started.elapsed() >= Duration::from_secs(5);
        assert!(!waited, "{origin} waited");
        assert_eq!(r.code(), "policy_failed", "{origin}");
        let next = get("https://ok.test").status().await;
        assert_eq!(next, StatusCode::OK, "served after {origin}");
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
    let chmod = |mode| std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(mode));
    chmod(0o777).expect("chmod");
    let toml = format!(
        "[plugins]\ncompile_cache_dir = \"cache\"\n[data_plane.plugins.cors]\nmodule = {TESTING_PLUGIN_PATH:?}\n"
    );
    let config = || write_config(dir.path(), &toml);
    let out = check_config(&config());
    assert!(!out.status.success());
    let stderr = stderr(&out);
    let named =
        stderr.contains("plugins.compile_cache_dir") && stderr.contains("writable by no one else");
    assert!(named, "{stderr}");

    chmod(0o700).expect("chmod");
    succeeded(&check_config(&config()));
    let files = std::fs::read_dir(&cache).expect("cache");
    let mut files: Vec<_> = files.map(|e| e.expect("entry").path()).collect();
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
    let gw = Process::serve(&config(), dir.path());
    let health = Call::get(gw.data_url("/health")).origin("https://ok.test");
    let r = health.expect(StatusCode::OK).await;
    let origin = &r.headers["access-control-allow-origin"];
    assert_eq!(origin, "https://ok.test", "the testing plugin is in force");
    let log = gw.log_text();
    assert!(log.contains("does not load; compiling again"), "{log}");
    for file in &files {
        assert_ne!(std::fs::read(file).expect("file"), b"not a compiled module");
    }
}

/// The gateway binary on the shared bus with `server` (lines of its `[server]` table) and the
/// e2e control file, `functions` answered `answer` after `delay`; returned once the gateway's
/// own NATS connection is up.
async fn with_slow_functions(
    server: &str,
    delay: Duration,
    answer: &'static [u8],
) -> (Process, Responder, tempfile::TempDir) {
    let bus = Bus::shared();
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("control.toml"), e2e_control_file()).expect("control file");
    let (nats, prefix) = (&bus.url, &bus.prefix);
    let toml = format!(
        "[server]\n{server}\n[nats]\nurl = {nats:?}\nsubject_prefix = {prefix:?}\n\
         [control]\nfile = \"control.toml\"\n"
    );
    let gw = Process::serve(&write_config(dir.path(), &toml), dir.path());
    let responder = bus
        .respond_after("functions", delay, move |_| reply(200, &[], answer))
        .await;
    let client = client();
    let _ = poll_tries(100, Duration::from_millis(50), async || {
        let r = client.get(gw.data_url("/v1/auth/x")).call().read().await;
        let up = r.status != StatusCode::SERVICE_UNAVAILABLE || r.text().contains("no_responders");
        up.then_some(())
    })
    .await;
    (gw, responder, dir)
}

#[tokio::test]
async fn sigterm_lets_in_flight_requests_finish() {
    let (gw, _responder, _dir) =
        with_slow_functions("", Duration::from_millis(1_000), b"finished").await;
    let in_flight = tokio::spawn(
        crate::support::call::client()
            .get(gw.data_url("/v1/functions/slow"))
            .send(),
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    gw.signal("-TERM");
    let response = in_flight
        .await
        .expect("task")
        .expect("in-flight request completes");
    let response = Answer::of(response).await;
    assert_eq!(response.status, StatusCode::OK);
    assert_eq!(response.text(), "finished");
    let status = gw.exit().await;
    assert!(status.success(), "clean exit after SIGTERM: {status:?}");
}

/// Reads from `conn` until it ends (EOF or reset); every byte read.
async fn read_to_end(conn: &mut tokio::net::TcpStream) -> Vec<u8> {
    use tokio::io::AsyncReadExt as _;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match conn.read(&mut buf).await {
            Ok(0) | Err(_) => return got,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
}

#[tokio::test]
async fn sigterm_closes_idle_connections_at_once_and_cuts_what_outlives_the_grace() {
    use tokio::io::AsyncWriteExt as _;
    let grace = Duration::from_secs(3);
    // The backend answers long after the grace.
    let (gw, _responder, _dir) = with_slow_functions(
        &format!("shutdown_grace_secs = {}", grace.as_secs()),
        Duration::from_secs(60),
        b"too late",
    )
    .await;
    let addr = ("127.0.0.1", gw.port);
    // Keep-alive connections that were answered once and then sent nothing: many, as an edge
    // holds them.
    let mut idle = Vec::new();
    for _ in 0..20 {
        let mut conn = tokio::net::TcpStream::connect(addr).await.expect("connect");
        conn.write_all(b"GET /health HTTP/1.1\r\nhost: gateway\r\n\r\n")
            .await
            .expect("write");
        let mut buf = [0u8; 1024];
        use tokio::io::AsyncReadExt as _;
        let n = conn.read(&mut buf).await.expect("answer");
        assert!(
            buf[..n].starts_with(b"HTTP/1.1 200"),
            "{}",
            String::from_utf8_lossy(&buf[..n])
        );
        idle.push(conn);
    }
    // An HTTP/2 connection (prior knowledge) answered once, then idle: its connection task
    // ends when the gateway closes it.
    let h2_idle = {
        let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let (send, connection) = h2::client::handshake(tcp).await.expect("h2c");
        let ended = tokio::spawn(async move {
            let _ = connection.await;
            std::time::Instant::now()
        });
        let mut send = send.ready().await.expect("ready");
        let health = format!("http://127.0.0.1:{}/health", gw.port);
        let request = http::Request::get(health).body(()).expect("request");
        let (response, _) = send.send_request(request, true).expect("sent");
        assert_eq!(response.await.expect("answer").status(), 200);
        (send, ended)
    };
    // A request whose backend answers after the grace.
    let mut slow = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let head = format!(
        "GET /v1/functions/slow HTTP/1.1\r\nhost: gateway\r\napikey: {}\r\n\r\n",
        crate::support::records::TEST_KEY
    );
    slow.write_all(head.as_bytes()).await.expect("write");
    tokio::time::sleep(Duration::from_millis(300)).await;

    let signalled = std::time::Instant::now();
    gw.signal("-TERM");
    let idle_closed = tokio::time::timeout(grace * 3, async {
        for conn in &mut idle {
            assert!(
                read_to_end(conn).await.is_empty(),
                "an idle connection got bytes"
            );
        }
        signalled.elapsed()
    })
    .await
    .expect("the idle connections were closed");
    let h2_closed = tokio::time::timeout(grace * 3, h2_idle.1)
        .await
        .expect("the HTTP/2 connection was closed")
        .expect("joined")
        .duration_since(signalled);
    let cut = tokio::time::timeout(grace * 3, async {
        let got = read_to_end(&mut slow).await;
        (got, signalled.elapsed())
    })
    .await
    .expect("the request in flight was cut");
    let status = gw.exit().await;
    println!(
        "idle connections closed after {idle_closed:?}, HTTP/2 after {h2_closed:?}, \
         the slow request cut after {:?}",
        cut.1
    );
    // Closed when shutdown began (HTTP/2 after its GOAWAY), not when the grace ran out.
    assert!(
        idle_closed < grace / 2,
        "idle connections closed after {idle_closed:?}"
    );
    assert!(h2_closed < grace / 2, "HTTP/2 closed after {h2_closed:?}");
    // The request in flight had its grace, then its connection was dropped without an answer.
    assert!(cut.1 >= grace - Duration::from_millis(200), "{:?}", cut.1);
    assert!(cut.0.is_empty(), "{}", String::from_utf8_lossy(&cut.0));
    assert!(status.success(), "clean exit after SIGTERM: {status:?}");
}

#[tokio::test]
async fn keys_create_gives_a_working_key_and_revoke_stops_it() {
    let bus = Bus::shared();
    let dir = tempfile::tempdir().expect("tempdir");
    let control = dir.path().join("control.toml");
    let example_control = example("control/local.toml");
    std::fs::copy(example_control, &control).expect("copy the example control file");
    let (nats, prefix) = (&bus.url, &bus.prefix);
    let path = write_config(
        dir.path(),
        &format!(
            "[nats]\nurl = {nats:?}\nsubject_prefix = {prefix:?}\n[control]\nfile = \"control.toml\"\nreload_interval_ms = 100\n[auth]\nkey_cache_ttl_secs = 1\n[log]\nlevel = \"debug\"\n",
        ),
    );
    let create = run(
        &["keys", "create", "--project", "demo", "--role", "anon"],
        Some(&path),
    );
    succeeded(&create);
    let key = String::from_utf8(create.stdout.clone()).expect("utf8");
    let key = key.trim().to_owned();
    assert!(key.starts_with("aura_pk_"), "{key}");
    let stored = std::fs::read_to_string(&control).expect("read");
    assert!(!stored.contains(&key), "only the hash is stored");
    assert!(stored.contains(&aura_gateway::auth::keys::hash_key(&key)));
    let stderr = stderr(&create);
    let id = stderr
        .split_whitespace()
        .find_map(|w| uuid::Uuid::parse_str(w).ok());
    let id = id.expect("create names the key id");

    let gw = Process::serve(&path, dir.path());
    let mut envelopes = bus.record(&["auth"], |_| reply(200, &[], b"{}")).await;
    let client = reqwest::Client::new();
    let user = || client.get(gw.data_url("/v1/auth/user")).call();
    user().key(&key).expect(StatusCode::OK).await;
    let envelope = envelopes.next().await;
    assert_eq!(envelope["actor"]["role"], "anon");
    assert_eq!(envelope["actor"]["project"], "demo");
    assert_eq!(user().status().await, StatusCode::UNAUTHORIZED);

    succeeded(&run(
        &["keys", "revoke", "--id", &id.to_string()],
        Some(&path),
    ));
    let refused = poll_tries(40, Duration::from_millis(100), async || {
        let refused = user().key(&key).status().await == StatusCode::UNAUTHORIZED;
        refused.then_some(())
    });
    assert!(refused.await.is_some(), "the revoked key stopped working");
    let log = gw.log_text();
    assert!(!log.contains(&key), "the key never appears in the logs");
    assert!(!log.contains(&key[8..]), "not even without its prefix");
}

#[tokio::test]
async fn migrate_creates_the_control_schema() {
    let db = crate::support::postgres::TestDatabase::create().await;
    succeeded(&run(&["migrate", "--database-url", &db.url], None));
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
    let again = run(&["migrate", "--database-url", &db.url], None);
    assert!(again.status.success(), "migrations are idempotent");
}

#[tokio::test]
async fn dev_prints_requests_that_work_exactly_as_printed() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().expect("tempdir");
    let nats = crate::support::nats_server::shared().url();
    let path = write_config(
        dir.path(),
        &format!("[nats]\nurl = {nats:?}\n[log]\nlevel = \"warn\"\n"),
    );
    let (port, management_port) = (crate::support::free_port(), crate::support::free_port());
    let (port, management_port) = (port.to_string(), management_port.to_string());
    let mut child = Command::new(binary())
        .args([
            "dev",
            "--port",
            &port,
            "--management-port",
            &management_port,
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
    });
    let lines = lines.await.expect("join");
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
    let status = tokio::task::spawn_blocking(move || child.wait());
    let status = status.await.expect("join").expect("wait");
    assert!(status.success(), "{status:?}");
}

#[tokio::test]
async fn spans_are_exported_over_otlp_with_the_request_id() {
    let bodies: std::sync::Arc<std::sync::Mutex<Vec<u8>>> = Default::default();
    let sink = bodies.clone();
    let traces = axum::routing::post(move |body: axum::body::Bytes| {
        sink.lock().expect("lock").extend_from_slice(&body);
        async { "" }
    });
    let app = axum::Router::new().route("/v1/traces", traces);
    let collector = crate::support::upstream::serve_http(app).await;

    let dir = tempfile::tempdir().expect("tempdir");
    let tracing = format!(
        "[tracing]\notlp_endpoint = \"http://{collector}\"\nservice_name = \"aura-gateway-e2e\"\n"
    );
    let path = write_config(dir.path(), &tracing);
    let gw = Process::serve(&path, dir.path());
    let id = Call::get(gw.data_url("/health")).read().await.request_id();
    let status = gw.terminate().await;
    assert!(status.success());
    let exported = String::from_utf8_lossy(&bodies.lock().expect("lock")).to_string();
    let carried = exported.contains(&id);
    assert!(carried, "the request span carries the request id");
    assert!(exported.contains("aura-gateway-e2e"), "service.name");
    assert!(exported.contains("request"), "the request span");
}

#[test]
fn the_config_and_each_default_plugin_print_their_json_schema() {
    let schema = |args: &[&str]| {
        let out = run(args, None);
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (ok, text) = schema(&["config", "schema"]);
    assert!(ok);
    let config: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    for key in ["server", "nats", "plugins", "rate_limit", "admin"] {
        assert!(config["properties"].get(key).is_some(), "{key}");
    }
    let (ok, text) = schema(&["plugin", "schema", "--stage", "cors"]);
    assert!(ok);
    let cors: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    assert!(cors["properties"].get("allow_origins").is_some(), "{cors}");
    let (ok, _) = schema(&["plugin", "schema", "--stage", "teapot"]);
    assert!(!ok, "an unknown stage is refused");
}

#[test]
fn plugin_check_passes_a_good_module_and_names_what_is_wrong_with_a_bad_one() {
    let check = ["plugin", "check", TESTING_PLUGIN_PATH, "--stage", "cors"];
    let ok = run(&check, None);
    let stdout = String::from_utf8_lossy(&ok.stdout);
    succeeded(&ok);
    assert!(stdout.contains("data_plane.plugins.cors"), "{stdout}");
    let measured = stdout.contains("median") && stdout.contains("memory");
    assert!(measured, "per-call time and memory: {stdout}");
    // What the module declares and the schema it exports are printed.
    assert!(
        stdout.contains("declared inputs: not declared (called on every request)"),
        "{stdout}"
    );
    assert!(stdout.contains("configuration schema:\n{"), "{stdout}");
    assert!(
        stdout.contains("\"max_age_ms\""),
        "the testing plugin's schema: {stdout}"
    );

    let dir = tempfile::tempdir().expect("tempdir");
    let refusing = dir.path().join("refuse.toml");
    std::fs::write(&refusing, "refuse = true\n").expect("write");
    failed_saying(&run(&check, Some(&refusing)), "refused as asked");

    let quota = dir.path().join("quota.wasm");
    std::fs::write(&quota, aura_gateway::policy::builtin::QUOTA).expect("write");
    let quota = quota.display().to_string();
    let out = run(&["plugin", "check", &quota, "--stage", "quota"], None);
    succeeded(&out);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let declared = "declared inputs: route-group, role, plan, has-key, has-user (decisions kept";
    assert!(stdout.contains(declared), "{stdout}");
    // A configuration the schema refuses is named by its key.
    let wrong = dir.path().join("wrong.toml");
    std::fs::write(&wrong, "burst = \"lots\"\n").expect("write");
    failed_saying(
        &run(
            &["plugin", "check", &quota, "--stage", "quota"],
            Some(&wrong),
        ),
        "/burst",
    );
    let out = run(&["plugin", "check", &quota, "--stage", "cors"], None);
    failed_saying(&out, "does not export the cors stage world");
    // The api-key stage: the default module's `0.4.0` declaration, and a `0.3.0` module's four
    // flags read as they were.
    use aura_gateway::policy::PolicyStage;
    let api_key = dir.path().join("api-key.wasm");
    let builtin = aura_gateway::policy::stages::ApiKey::BUILTIN;
    std::fs::write(&api_key, builtin).expect("write");
    let api_key = api_key.display().to_string();
    let older = aura_gateway::policy::builtin::TESTING_API_KEY_PLUGIN_PATH;
    for (module, version, declared) in [
        (
            api_key.as_str(),
            "0.4.0",
            "query-keys, headers, path-with-query-keys",
        ),
        (older, "0.3.0", "path, query-keys, headers"),
    ] {
        let out = run(&["plugin", "check", module, "--stage", "api_key"], None);
        succeeded(&out);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let written = format!("written against aura:gateway@{version}");
        assert!(stdout.contains(&written), "{stdout}");
        let declared = format!("declared inputs: {declared} (decisions kept");
        assert!(stdout.contains(&declared), "{stdout}");
    }
}

#[tokio::test]
async fn no_key_or_token_text_reaches_the_log_even_at_debug_level() {
    let dir = tempfile::tempdir().expect("tempdir");
    let example_control = example("control/local.toml");
    std::fs::copy(example_control, dir.path().join("control.toml"))
        .expect("copy the example control file");
    let nats = crate::support::nats_server::shared().url();
    let path = write_config(
        dir.path(),
        &format!(
            "[nats]\nurl = {nats:?}\n[control]\nfile = \"control.toml\"\n\
             [auth.user_jwt]\nhs256_secret = \"binary-user-jwt-secret-0123456789abcdef\"\n\
             [log]\nlevel = \"debug\"\nformat = \"json\"\n",
        ),
    );
    let gw = Process::serve(&path, dir.path());
    let client = reqwest::Client::new();
    let f = || client.get(gw.data_url("/v1/functions/f")).call();
    let demo = "aura_pk_localdemo_0123456789abcdefghijklmnopqrstuv";
    let mut secrets = Vec::new();
    for i in 0..200 {
        let guess = format!("aura_sk_guess{i:04}_{}", uuid::Uuid::new_v4().simple());
        let header = if i % 2 == 0 { "apikey" } else { "x-api-key" };
        assert_eq!(
            f().header(header, &guess).status().await,
            StatusCode::UNAUTHORIZED
        );
        let id = uuid::Uuid::new_v4().simple();
        let token = format!("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ{i:04}{id}.c2lnbmF0dXJl");
        let with_token = f().key(demo).bearer(&token);
        assert_eq!(with_token.status().await, StatusCode::UNAUTHORIZED);
        secrets.push(guess);
        secrets.push(token);
    }
    // A real key, used: still never logged.
    let health = client.get(gw.data_url("/health")).call().key(demo);
    assert_eq!(health.status().await, StatusCode::OK);
    secrets.push(demo.to_owned());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let log = gw.log_text();
    let lines = log.lines().count();
    assert!(lines > 400, "the debug log was written ({lines} lines)");
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
        let name = |i| format!("\"x-{}{i:02}\"", "k".repeat(len.saturating_sub(4)));
        (0..n).map(name).collect::<Vec<_>>().join(", ")
    };
    let config = |list: String| {
        let toml = format!("[data_plane.plugins.api_key.config]\nheaders = [{list}]\n");
        write_config(dir.path(), &toml)
    };
    succeeded(&check_config(&config(names(16, 64))));
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
        let stderr = stderr(&out);
        let named = stderr.contains("data_plane.plugins.api_key");
        assert!(named, "{what}: {stderr}");
        assert!(stderr.contains(expected), "{what}: {stderr}");
    }
}
