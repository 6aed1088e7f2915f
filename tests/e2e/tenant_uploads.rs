//! Projects' module uploads, through the real binary: a compile stopped at its time or memory
//! limit and remembered, parallel uploads that keep the gateway small, a module refused at
//! refresh compiled once, unused module files and their metric series collected, a refresh that
//! never reverts a change made meanwhile, a module that always overruns its deadline refused at
//! upload, and an install whose client gave up run to its end; and the compile worker, confined,
//! still compiling every plugin.

use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::json;

use crate::support::builder::{Gateway, Started, offline};
use crate::support::call::IntoCall;
use crate::support::cli::{run, succeeded};
use crate::support::fixture::{CountingStore, Fixture};
use crate::support::gateway::Process;
use crate::support::metrics::metric;
use crate::support::policy::{Policies, admin, b64, cors_probe, digest, testing_cors};
use crate::support::poll::wait_until;
use crate::support::wasm;

/// A gateway binary with `plugins` settings, and its management URL.
fn compiling_gateway(plugins: &str) -> Started {
    offline("compile", &format!("[plugins]\n{plugins}\n"))
}

#[tokio::test]
async fn a_slow_compile_is_stopped_at_its_time_limit_and_remembered() {
    let Started { gw, fx, dir: _dir } = compiling_gateway("tenant_max_compile_ms = 2000");
    let before = gw.rss_mib();
    let admin = admin(gw.mgmt_url(""), &fx);
    let (status, body, took) = timed_install(&admin, &wasm::slow_to_compile()).await;
    println!("slow module answered in {took:?}: {body}");
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["code"], "policy_refused");
    let message = body["error"]["message"].as_str();
    let named = message.is_some_and(|m| m.contains("longer than 2000 ms"));
    assert!(named, "{body}");
    assert!(
        took < Duration::from_secs(6),
        "stopped while compiling: {took:?}"
    );

    // The same module again: refused at once, not compiled again.
    let started = Instant::now();
    let r = admin
        .install("cors", &wasm::slow_to_compile(), json!({}))
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(started.elapsed() < Duration::from_secs(1), "remembered");
    let text = gw.metrics().await;
    let compiles = |result: &str| {
        let label = format!("result=\"{result}\"");
        metric(&text, "aura_tenant_compiles_total", &[&label])
    };
    assert_eq!(compiles("timeout"), 1.0);
    assert!(compiles("remembered") >= 1.0);
    compiled_in_little_memory(&gw, before, "slow");
}

/// Installs `module` as alpha's CORS module: the status, the JSON body, and how long it took.
async fn timed_install(
    admin: &Policies,
    module: &[u8],
) -> (StatusCode, serde_json::Value, Duration) {
    let started = Instant::now();
    let r = admin.install("cors", module, json!({})).await;
    (r.status, r.json(), started.elapsed())
}

/// The gateway grew by less than 40 MiB since `before` while compiling the `what` upload.
fn compiled_in_little_memory(gw: &Process, before: f64, what: &str) {
    let grown = gw.rss_mib() - before;
    println!("gateway RSS after the {what} upload: {grown:+.1} MiB");
    assert!(
        grown < 40.0,
        "the gateway grew by {grown:.1} MiB while compiling"
    );
}

#[tokio::test]
async fn a_memory_hungry_compile_is_stopped_at_its_memory_limit() {
    let Started { gw, fx, dir: _dir } = compiling_gateway(
        "tenant_max_compile_ms = 60000\ntenant_max_compile_memory_bytes = 268435456",
    );
    let before = gw.rss_mib();
    let admin = admin(gw.mgmt_url(""), &fx);
    let (_, body, took) = timed_install(&admin, &wasm::memory_hungry()).await;
    println!("memory-hungry module answered in {took:?}: {body}");
    assert_eq!(body["error"]["code"], "policy_refused", "{body}");
    let message = body["error"]["message"].as_str();
    assert!(message.is_some_and(|m| m.contains("memory")), "{body}");
    let text = gw.metrics().await;
    let labels = ["result=\"memory\""];
    assert_eq!(metric(&text, "aura_tenant_compiles_total", &labels), 1.0);
    compiled_in_little_memory(&gw, before, "memory-hungry");
}

#[tokio::test]
async fn forty_parallel_uploads_keep_the_gateway_small() {
    let Started { gw, fx, dir: _dir } = offline("uploads", "");
    let before = gw.rss_mib();
    let admin = admin(gw.mgmt_url(""), &fx);
    // Forty different modules: the same component with a different custom section.
    let mut uploads = Vec::new();
    for i in 0..40u8 {
        // A different digest, the same component.
        let module = wasm::with_custom_section(testing_cors(), b"pad", &[i]);
        let admin = admin.clone();
        uploads.push(tokio::spawn(async move {
            let r = admin.install("cors", &module, json!({})).await;
            (r.status, r.json_or_null())
        }));
    }
    let mut accepted = 0;
    let mut busy = 0;
    let mut peak = 0.0f64;
    for u in uploads {
        let (status, body) = u.await.expect("task");
        peak = peak.max(gw.rss_mib());
        match status {
            StatusCode::OK => accepted += 1,
            StatusCode::SERVICE_UNAVAILABLE => {
                assert_eq!(body["error"]["code"], "uploads_busy", "{body}");
                busy += 1;
            }
            other => panic!("unexpected {other}: {body}"),
        }
    }
    let grown = gw.rss_mib() - before;
    println!(
        "40 parallel uploads: {accepted} accepted, {busy} busy; RSS {grown:+.1} MiB (peak seen {:+.1})",
        peak - before
    );
    assert!(accepted >= 1);
    assert!(grown < 60.0, "the gateway grew by {grown:.1} MiB");
}

#[tokio::test]
async fn a_module_refused_at_refresh_is_compiled_once_not_every_refresh() {
    let dir = tempfile::tempdir().expect("tempdir");
    let module = wasm::slow_to_compile();
    // Written into the store directly, as another instance with other limits could have.
    let record = crate::support::records::stored_cors_module(dir.path(), "alpha", &module);
    let gw = Gateway::builder()
        .nats("nats://127.0.0.1:1")
        .prefix("refresh")
        .dir(dir.path());
    let gw = gw
        .records(record)
        .toml("[plugins]\ntenant_refresh_secs = 1\ntenant_max_compile_ms = 1000\n");
    let Started { gw, fx, .. } = gw.binary();
    // Alpha's first request loads it: the compilation overruns its limit, the module is refused
    // and alpha falls back to the plane's module; the refreshes and requests after it (alpha
    // is loaded here now) never compile it again.
    for _ in 0..5 {
        let r = cors_probe(gw.data_url("/health"), &fx.anon_key).await;
        assert_eq!(
            r.status,
            StatusCode::OK,
            "alpha falls back to the plane's module"
        );
        assert_eq!(r.headers["access-control-allow-origin"], "*");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let text = gw.metrics().await;
    let compiled = metric(&text, "aura_tenant_compiles_total", &["result=\"timeout\""]);
    assert_eq!(
        compiled, 1.0,
        "compiled once in five refreshes and requests"
    );
    let labels = ["reason=\"first_call\"", "result=\"refused\""];
    let refused = metric(&text, "aura_tenant_module_loads_total", &labels);
    assert_eq!(refused, 1.0, "refused once, then remembered");
}

#[tokio::test]
async fn unused_module_files_and_their_metric_series_are_collected() {
    let Started { gw, fx, dir } = offline(
        "gc",
        "[plugins]\nmodule_gc_interval_secs = 1\nmodule_gc_grace_secs = 1\n\
         compile_cache_dir = \"compiled\"\n",
    );
    let admin = admin(gw.mgmt_url(""), &fx);
    // The compile cache folder's files of a digest (one per engine it was compiled for).
    let compiled = |digest: &str| -> Vec<std::path::PathBuf> {
        std::fs::read_dir(dir.path().join("compiled"))
            .map(|entries| {
                entries
                    .flatten()
                    .map(|e| e.path())
                    .filter(|p| {
                        p.file_name()
                            .and_then(|n| n.to_str())
                            .is_some_and(|n| n.starts_with(digest) && n.ends_with(".cwasm"))
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let first = testing_cors();
    let first_digest = digest(&first);
    assert_eq!(
        admin.install("cors", &first, json!({})).await.status,
        StatusCode::OK
    );
    let file = dir.path().join(format!("modules/{first_digest}.wasm"));
    assert!(file.is_file());
    assert!(
        !compiled(&first_digest).is_empty(),
        "compiled into the folder"
    );
    let series = gw.metrics().await.contains(&first_digest);
    assert!(series, "the module's series exist");
    // Replaced by another module: the first is no longer used by anyone.
    let second = aura_gateway::policy::stages::builtin::CORS;
    let second_digest = digest(second);
    assert_eq!(
        admin.install("cors", second, json!({})).await.status,
        StatusCode::OK
    );
    let _ = cors_probe(gw.data_url("/health"), &fx.anon_key).await;
    let collected = async || !file.exists();
    wait_until(
        "the unused module file collected",
        Duration::from_secs(10),
        collected,
    )
    .await;
    let kept = dir.path().join(format!("modules/{second_digest}.wasm"));
    assert!(kept.is_file());
    // Its compiled files go with it; the module in use keeps its own.
    let files_gone = async || compiled(&first_digest).is_empty();
    wait_until(
        "the collected module's compiled files removed",
        Duration::from_secs(10),
        files_gone,
    )
    .await;
    assert!(
        !compiled(&second_digest).is_empty(),
        "the module in use stays compiled"
    );
    let text = gw.metrics().await;
    let gone = !text.contains(&first_digest);
    assert!(gone, "the replaced module's series are gone");
    assert!(text.contains(&second_digest));
    assert!(metric(&text, "aura_modules_collected_total", &[]) >= 1.0);
    let files = metric(&text, "aura_compile_cache_files_collected_total", &[]);
    assert!(files >= 1.0, "{text}");
}

#[tokio::test]
async fn a_put_or_delete_made_during_a_refresh_is_never_reverted_by_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fx = Fixture::new();
    let store = Arc::new(CountingStore::new(Arc::new(fx.file_store(dir.path()))));
    let gw = Gateway::with(|c| c.plugins.tenant_refresh_secs = 1)
        .with(|c| c.data_plane.project_host_suffix = Some(".api.test".into()))
        .store(store.clone());
    let gw = gw.start().await;
    let client = reqwest::Client::new();
    let preflight = async || {
        let preflight = client.request(reqwest::Method::OPTIONS, gw.data_url("/v1/db/todos"));
        let preflight = preflight
            .call()
            .host("alpha.api.test")
            .origin("https://tenant.example");
        let r = preflight
            .header("access-control-request-method", "GET")
            .read()
            .await;
        let allowed = r.headers.get("access-control-allow-origin");
        allowed.map(|v| v.to_str().unwrap_or_default().to_owned())
    };
    assert_eq!(preflight().await.as_deref(), Some("*"));

    // A refresh has read the store (no module yet) and is held; the PUT lands meanwhile.
    let admin = admin(gw.mgmt_url(""), &fx);
    let release = store.hold_next_policy_read().await;
    let r = admin.install("cors", &testing_cors(), json!({})).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(preflight().await.as_deref(), Some("https://tenant.example"));
    release.send(()).expect("release");
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let origin = preflight().await;
    let kept = origin.as_deref() == Some("https://tenant.example");
    assert!(kept, "the stale refresh did not revert the PUT: {origin:?}");

    // The same with a DELETE.
    let release = store.hold_next_policy_read().await;
    assert_eq!(admin.delete("cors").await.status, StatusCode::NO_CONTENT);
    release.send(()).expect("release");
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let origin = preflight().await;
    let gone = origin.as_deref() == Some("*");
    assert!(
        gone,
        "the stale refresh did not bring the deleted module back: {origin:?}"
    );
}

/// A project's module that runs out its deadline on every call is refused at upload: a
/// conformance vector stopped by its deadline is tried again (a loaded machine may deschedule
/// one call), never forgiven when every attempt overran. The upload answers in bounded time and
/// the gateway keeps serving.
#[tokio::test]
async fn a_module_that_always_overruns_its_deadline_is_refused_at_upload() {
    let gw = offline("overrun", "[plugins]\ncall_deadline_ms = 50\n");
    let Started { gw, fx, .. } = gw;
    let admin = admin(gw.mgmt_url(""), &fx);
    let started = Instant::now();
    let config = json!({ "spin_always": true });
    let (status, body) = admin.install("cors", &testing_cors(), config).await.parts();
    let took = started.elapsed();
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["code"], "policy_refused");
    let message = body["error"]["message"].as_str().expect("message");
    assert!(
        message.contains("conformance") && message.contains("deadline"),
        "{body}"
    );
    assert!(took < Duration::from_secs(30), "refused in {took:?}");
    let r = cors_probe(gw.data_url("/health"), &fx.anon_key).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        r.headers["access-control-allow-origin"], "*",
        "the plane's module"
    );
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
    let nobody = aura_gateway::policy::runtime::confine::UNPRIVILEGED_ID;
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
        let nobody = aura_gateway::policy::runtime::confine::UNPRIVILEGED_ID;
        assert_eq!(report["confinement"]["uid"], nobody);
    }
}

/// The confined worker still compiles every plugin: each stage's default and each test plugin,
/// fed on stdin as the gateway feeds it, answers a header saying so and the artefact.
#[test]
fn the_confined_compile_worker_compiles_every_plugin() {
    use aura_gateway::policy::stages::builtin;
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

/// A project's module compiled once is kept in `plugins.compile_cache_dir`: after a restart, the
/// project's first request maps it from there instead of compiling it again.
#[tokio::test]
async fn a_projects_module_compiled_once_is_mapped_from_the_compile_cache_after_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let record = crate::support::records::stored_cors_module(dir.path(), "alpha", &testing_cors());
    let start = || {
        Gateway::builder()
            .nats("nats://127.0.0.1:1")
            .prefix("compiled")
            .dir(dir.path())
            .records(&record)
            .toml("[plugins]\ncompile_cache_dir = \"compiled\"\n")
            .binary()
    };
    // Alpha's first request on each start: alpha's own module answers (it exposes a header
    // of its own), compiled on the first start and mapped from the folder on the second.
    for (start_no, (compiled, mapped)) in [(1, (1.0, 0.0)), (2, (0.0, 1.0))] {
        let Started { gw, fx, .. } = start();
        let r = cors_probe(gw.data_url("/health"), &fx.anon_key).await;
        assert_eq!(r.status, StatusCode::OK, "start {start_no}");
        let exposed = r.headers.get("access-control-expose-headers");
        let exposed = exposed.and_then(|v| v.to_str().ok()).unwrap_or_default();
        assert!(
            exposed.contains("x-testing-plugin"),
            "start {start_no}: {exposed}"
        );
        let text = gw.metrics().await;
        let compiles = |result: &str| {
            let label = format!("result=\"{result}\"");
            metric(&text, "aura_tenant_compiles_total", &[&label])
        };
        assert_eq!(
            (compiles("ok"), compiles("disk")),
            (compiled, mapped),
            "start {start_no}"
        );
    }
}

/// A client that gives up on its `PUT` while the module is checked does not stop the change half
/// way: the change runs to its end on a task of its own. The store holds the module, this
/// instance decides with it, the history has the install with its console user, and the only
/// upload place (`tenant_max_concurrent_uploads = 1`) is given back when the change ends.
#[tokio::test]
async fn an_install_whose_client_gives_up_runs_to_its_end() {
    let Started { gw, fx, dir: _dir } =
        offline("given-up", "[plugins]\ntenant_max_concurrent_uploads = 1\n");
    let admin = admin(gw.mgmt_url(""), &fx);
    // A digest never compiled here: its check takes far longer than the client waits.
    let module = wasm::with_custom_section(testing_cors(), b"pad", b"given-up");
    let body = json!({ "module": b64(&module), "config": {} });
    let gave_up = admin
        .call(reqwest::Method::PUT, "cors", "")
        .json(&body)
        .timeout(Duration::from_millis(20))
        .try_send()
        .await;
    assert!(
        gave_up.as_ref().is_err_and(reqwest::Error::is_timeout),
        "the client gave up before the answer: {gave_up:?}"
    );

    let installed = digest(&module);
    wait_until(
        "the install in force",
        Duration::from_secs(60),
        async || {
            let r = admin.get("cors").await;
            r.status == StatusCode::OK && r.json()["digest"] == installed.as_str()
        },
    )
    .await;
    let probe = cors_probe(gw.data_url("/health"), &fx.anon_key).await;
    let exposed = probe.headers.get("access-control-expose-headers");
    let exposed = exposed.and_then(|v| v.to_str().ok());
    assert!(
        exposed.is_some_and(|v| v.contains("x-testing-plugin")),
        "alpha's module decides: {:?}",
        probe.headers
    );
    let history = admin.history("cors").await;
    let installs: Vec<_> = history
        .iter()
        .filter(|e| e["action"] == "install" && e["digest_after"] == installed.as_str())
        .collect();
    assert_eq!(installs.len(), 1, "{history:?}");
    assert_eq!(installs[0]["actor"], fx.admin.to_string(), "{history:?}");

    // The upload place is free again: the next upload is taken, not `503 uploads_busy`.
    let r = admin.install("cors", &testing_cors(), json!({})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
}
