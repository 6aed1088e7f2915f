//! The example plugins of `examples/plugins` — every stage in Rust, Python and JavaScript —
//! built as an author builds them (the Python and JavaScript toolchains installed from PyPI and
//! npm when missing), pass `plugin check` with the author vectors beside them, and, in force in a
//! gateway binary, decide its requests; what they log reaches the gateway's log with the id of
//! the request.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use reqwest::StatusCode;

use crate::support::fixture::Fixture;
use crate::support::gateway::{Process, binary, binary_config};
use crate::support::nats_server::shared;
use crate::support::responder::{Responder, reply};
use crate::support::unique_prefix;
use crate::support::upstream::Recorder;

const STAGES: [&str; 4] = ["api-key", "cors", "quota", "db-routing"];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn examples() -> PathBuf {
    root().join("examples/plugins")
}

/// `cargo build --target wasm32-wasip2 --release` in `folder`, as an author runs it (with a
/// target folder shared by the tests); returns the release output folder.
fn cargo_build_wasm(folder: &Path) -> PathBuf {
    let target_dir = root().join("target/examples");
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(folder)
        .args([
            "build",
            "--quiet",
            "--target",
            "wasm32-wasip2",
            "--release",
            "--target-dir",
        ])
        .arg(&target_dir)
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .status()
        .expect("cargo");
    assert!(status.success(), "building {}", folder.display());
    target_dir.join("wasm32-wasip2/release")
}

fn build_rust(stage: &str) -> PathBuf {
    cargo_build_wasm(&examples().join("rust").join(stage))
        .join(format!("aura_example_{}.wasm", stage.replace('-', "_")))
}

/// `examples/plugins/build` for every Python and JavaScript example, once per test run.
fn built_by_script() -> &'static Path {
    static OUT: OnceLock<PathBuf> = OnceLock::new();
    static BUILDING: Mutex<()> = Mutex::new(());
    let _one_at_a_time = BUILDING.lock();
    OUT.get_or_init(|| {
        let out = root().join("target/examples/plugins");
        let status = Command::new(examples().join("build"))
            .arg("--out")
            .arg(&out)
            .status()
            .expect("examples/plugins/build");
        assert!(status.success(), "examples/plugins/build");
        out
    })
}

fn module(lang: &str, stage: &str) -> PathBuf {
    match lang {
        "rust" => build_rust(stage),
        _ => built_by_script().join(format!("{lang}-{stage}.wasm")),
    }
}

fn stage_key(stage: &str) -> String {
    stage.replace('-', "_")
}

/// Where the example modules are kept compiled, by `plugin check` and then by the gateways:
/// a Python or JavaScript runtime takes tens of seconds to compile in a debug build.
fn compile_cache() -> PathBuf {
    root().join("target/examples/compile-cache")
}

/// `plugin check` with the example's configuration and author vectors; returns its output.
fn check(module: &Path, stage: &str) -> String {
    let cases = examples().join("vectors").join(stage);
    let out = Command::new(binary())
        .args(["plugin", "check"])
        .arg(module)
        .arg("--compile-cache-dir")
        .arg(compile_cache())
        .args(["--stage", &stage_key(stage), "--config"])
        .arg(cases.join("config.toml"))
        .arg("--vectors")
        .arg(cases.join("vectors.toml"))
        .output()
        .expect("plugin check");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{}: {stdout}\n{}",
        module.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("written against aura:gateway@0.2.0"),
        "{stdout}"
    );
    assert!(stdout.contains(" passed, 0 failed"), "{stdout}");
    assert!(stdout.ends_with("plugin check passed\n"), "{stdout}");
    stdout
}

/// The example's `config.toml` as an inline TOML table, for the gateway's configuration.
fn inline_config(stage: &str) -> String {
    let text = std::fs::read_to_string(examples().join("vectors").join(stage).join("config.toml"))
        .expect("config.toml");
    let table: toml::Table = toml::from_str(&text).expect("valid TOML");
    toml::Value::Table(table).to_string()
}

fn log_line_with<'a>(log: &'a str, parts: &[&str]) -> Option<&'a str> {
    log.lines().find(|l| parts.iter().all(|p| l.contains(p)))
}

/// The four examples of `lang` checked, then in force together on the data plane of a gateway
/// binary, each shown deciding a request the default plugin would decide otherwise.
async fn in_force(lang: &str) {
    let modules: Vec<PathBuf> = STAGES.iter().map(|s| module(lang, s)).collect();
    for (stage, module) in STAGES.iter().zip(&modules) {
        check(module, stage);
    }

    let storage = Recorder::start().await;
    let postgrest = Recorder::start().await;
    let nats = shared();
    let prefix = unique_prefix();
    let _db = Responder::start(
        &nats.url(),
        &format!("{prefix}.db.http"),
        Duration::ZERO,
        |_| reply(200, &[], b"over nats"),
    )
    .await;
    let (ded_key, unr_key) = (
        "aura_pk_examples_dedicated_0123456789abcdef",
        "aura_pk_examples_unresolved_0123456789abcde",
    );
    let fx = Fixture::new();
    let hash = aura_gateway::auth::keys::hash_key;
    let records = format!(
        "[[projects]]\nref = \"ded\"\norganization_id = \"{org}\"\ndb_engine = \"postgres\"\ntopology = \"dedicated\"\nplan = \"pro\"\npostgrest_url = \"{pg}\"\n\n\
         [[projects]]\nref = \"unr\"\norganization_id = \"{org}\"\ndb_engine = \"postgres\"\ntopology = \"dedicated\"\nplan = \"free\"\n\n\
         [[api_keys]]\nid = \"00000000-0000-4000-8000-00000000e0d1\"\nproject_ref = \"ded\"\nrole = \"anon\"\nkey_sha256 = \"{ded}\"\n\n\
         [[api_keys]]\nid = \"00000000-0000-4000-8000-00000000e0d2\"\nproject_ref = \"unr\"\nrole = \"anon\"\nkey_sha256 = \"{unr}\"\n",
        org = fx.org_a,
        pg = postgrest.url,
        ded = hash(ded_key),
        unr = hash(unr_key),
    );
    let mut plugins = format!(
        "[upstreams]\nstorage_url = \"{}\"\npostgrest_allowed_targets = [\"127.0.0.0/8\"]\n\n[plugins]\nwatch = false\ncompile_cache_dir = {:?}\n# Generous for a debug build on a loaded machine; deadlines have tests of their own.\ncall_deadline_ms = 1000\n\n",
        storage.url,
        compile_cache().display().to_string()
    );
    for (stage, module) in STAGES.iter().zip(&modules) {
        plugins += &format!(
            "[data_plane.plugins.{}]\nmodule = {:?}\nconfig = {}\n\n",
            stage_key(stage),
            module.display().to_string(),
            inline_config(stage)
        );
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let config = binary_config(dir.path(), &fx, &records, &nats.url(), &prefix, &plugins);
    let gw = Process::serve(&config, dir.path());
    let c = reqwest::Client::new();
    // Ready: the control store answered and the NATS connection is up.
    for _ in 0..200 {
        let ready = c.get(gw.mgmt_url("/ready")).send().await.expect("answer");
        if ready.status() == StatusCode::OK {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // api-key: the key in `x-aura-key`, which the default plugin does not read (401).
    let r = c
        .get(gw.data_url("/v1/storage/object/a.txt"))
        .header("x-aura-key", ded_key)
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status(), StatusCode::OK, "{}", gw.log_text());
    assert!(
        storage
            .last()
            .is_some_and(|s| s.target.ends_with("/object/a.txt"))
    );
    // quota: the `pro` plan's burst of the example's configuration (the default: 1000).
    assert_eq!(r.headers()["ratelimit-limit"], "5000");

    // db-routing: reads of a dedicated project to its PostgREST, writes over NATS (the default
    // plugin sends both to PostgREST).
    let r = c
        .get(gw.data_url("/v1/db/todos?select=*"))
        .header("x-aura-key", ded_key)
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status(), StatusCode::OK, "{:?}", r.text().await);
    assert_eq!(
        postgrest.last().map(|s| s.target),
        Some("/todos?select=*".to_owned())
    );
    let r = c
        .post(gw.data_url("/v1/db/todos"))
        .header("x-aura-key", ded_key)
        .body("{}")
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status(), StatusCode::OK, "{:?}", r.text().await);
    assert_eq!(r.text().await.expect("body"), "over nats");
    // ... and a read of a project whose PostgREST is unknown fails closed, logged by the plugin.
    let r = c
        .get(gw.data_url("/v1/db/todos"))
        .header("x-aura-key", unr_key)
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    let unresolved_id = r.headers()["x-request-id"].to_str().expect("id").to_owned();
    assert!(
        r.text()
            .await
            .expect("body")
            .contains("db_target_unresolved")
    );

    // cors: an allow-list echoing the origin (the default data-plane plugin answers `*`).
    let preflight = |origin: &'static str| {
        c.request(reqwest::Method::OPTIONS, gw.data_url("/v1/db/x"))
            .header("origin", origin)
            .header("access-control-request-method", "POST")
            .send()
    };
    let r = preflight("https://eu.example.org").await.expect("answer");
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    assert_eq!(
        r.headers()["access-control-allow-origin"],
        "https://eu.example.org"
    );
    assert_eq!(r.headers()["access-control-max-age"], "600");
    let r = preflight("https://evil.example").await.expect("answer");
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let denied_id = r.headers()["x-request-id"].to_str().expect("id").to_owned();

    // What the plugins logged, with the request it was deciding.
    let mut log = String::new();
    for _ in 0..300 {
        log = gw.log_text();
        if log_line_with(&log, &["origin https://evil.example denied", &denied_id]).is_some()
            && log_line_with(&log, &["no PostgREST target", &unresolved_id]).is_some()
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let line = log_line_with(&log, &["origin https://evil.example denied", &denied_id]);
    assert!(
        line.is_some_and(|l| l.contains("aura::plugin") && l.contains("cors")),
        "no plugin line with the request id {denied_id}:\n{log}"
    );
    assert!(
        log_line_with(
            &log,
            &["no PostgREST target for /v1/db/todos", &unresolved_id]
        )
        .is_some_and(|l| l.contains("WARN")),
        "{log}"
    );
    // `configure` logs at load, outside any request.
    assert!(
        log_line_with(&log, &["configured: 1 origins, 1 domains", "aura::plugin"]).is_some(),
        "{log}"
    );
}

#[tokio::test]
async fn the_rust_examples_pass_their_vectors_and_decide_in_force() {
    in_force("rust").await;
}

#[tokio::test]
async fn the_python_examples_pass_their_vectors_and_decide_in_force() {
    in_force("python").await;
}

#[tokio::test]
async fn the_javascript_examples_pass_their_vectors_and_decide_in_force() {
    in_force("js").await;
}

/// An author vector that fails makes `plugin check` fail, naming the case.
#[test]
fn a_failing_author_vector_fails_the_check_with_its_name() {
    let module = module("rust", "cors");
    let dir = tempfile::tempdir().expect("tempdir");
    let vectors = dir.path().join("cases.toml");
    std::fs::write(
        &vectors,
        "[[case]]\nname = \"listed origin\"\n[case.input]\norigin = \"https://app.example.com\"\n[case.expect]\ndecision = \"allow\"\n\n\
         [[case]]\nname = \"wrongly expected to be allowed\"\n[case.input]\norigin = \"https://evil.example\"\n[case.expect]\ndecision = \"allow\"\n",
    )
    .expect("vectors");
    let out = Command::new(binary())
        .args(["plugin", "check"])
        .arg(&module)
        .args(["--stage", "cors", "--config"])
        .arg(examples().join("vectors/cors/config.toml"))
        .arg("--vectors")
        .arg(&vectors)
        .output()
        .expect("plugin check");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(!out.status.success(), "{stdout}");
    assert!(
        stdout.contains("wrongly expected to be allowed")
            && stdout.contains("FAIL: expected allow, got deny"),
        "{stdout}"
    );
    assert!(stdout.contains("1 passed, 1 failed"), "{stdout}");
    assert!(!stdout.contains("plugin check passed"), "{stdout}");
    assert!(
        stderr.contains("author vectors failed: wrongly expected to be allowed"),
        "{stderr}"
    );
}

/// `plugin new` scaffolds a plugin that builds and passes its own check, and `wit` prints the
/// package an author builds against.
#[test]
fn a_scaffolded_rust_plugin_builds_and_passes_its_check() {
    let dir = tempfile::tempdir().expect("tempdir");
    let plugin = dir.path().join("my-quota");
    let out = Command::new(binary())
        .args(["plugin", "new", "--stage", "quota", "--lang", "rust"])
        .arg(&plugin)
        .output()
        .expect("plugin new");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout)
            .contains("cargo build --release --target wasm32-wasip2")
    );
    let printed = Command::new(binary())
        .args(["wit", "--version", "0.2.0"])
        .output()
        .expect("wit");
    assert_eq!(
        std::fs::read(plugin.join("wit/gateway.wit")).expect("wit copy"),
        printed.stdout
    );
    let out_dir = dir.path().join("wit-copy");
    let wrote = Command::new(binary())
        .args(["wit", "--out"])
        .arg(&out_dir)
        .output()
        .expect("wit --out");
    assert!(wrote.status.success());
    assert_eq!(
        std::fs::read(out_dir.join("gateway.wit")).expect("written"),
        printed.stdout
    );
    let old = Command::new(binary())
        .args(["wit", "--version", "0.1.0"])
        .output()
        .expect("wit");
    assert!(String::from_utf8_lossy(&old.stdout).contains("package aura:gateway@0.1.0;"));

    let release = cargo_build_wasm(&plugin);
    let out = Command::new(binary())
        .args(["plugin", "check"])
        .arg(release.join("my_quota.wasm"))
        .args(["--stage", "quota", "--config"])
        .arg(plugin.join("config.toml"))
        .arg("--vectors")
        .arg(plugin.join("vectors.toml"))
        .output()
        .expect("plugin check");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains(" passed, 0 failed"), "{stdout}");
}

/// `plugin new` in Python and JavaScript: the scaffold builds with the command its README gives
/// (the toolchains `examples/plugins/build` installed) and passes its own vectors.
#[test]
fn scaffolded_python_and_javascript_plugins_build_and_pass_their_check() {
    let toolchains = built_by_script()
        .parent()
        .and_then(Path::parent)
        .expect("target")
        .join("plugin-toolchains");
    let dir = tempfile::tempdir().expect("tempdir");
    for (lang, stage, tool, args) in [
        (
            "python",
            "db_routing",
            toolchains.join("python/bin/componentize-py"),
            "-d wit -w db-routing-stage componentize app -o db_routing.wasm",
        ),
        (
            "js",
            "api_key",
            toolchains.join("js/node_modules/.bin/componentize-js"),
            "--wit wit --world-name api-key-stage --disable http fetch-event --out api_key.wasm plugin.js",
        ),
    ] {
        let plugin = dir.path().join(format!("my-{lang}"));
        let out = Command::new(binary())
            .args(["plugin", "new", "--stage", stage, "--lang", lang])
            .arg(&plugin)
            .output()
            .expect("plugin new");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let tool_name = tool.file_name().and_then(|n| n.to_str()).expect("name");
        assert!(stdout.contains(&format!("{tool_name} {args}")), "{stdout}");
        let status = Command::new(&tool)
            .current_dir(&plugin)
            .args(args.split(' '))
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .status()
            .expect("build tool");
        assert!(status.success(), "{lang}: {tool_name} {args}");
        let out = Command::new(binary())
            .args(["plugin", "check"])
            .arg(plugin.join(format!("{stage}.wasm")))
            .args(["--stage", stage, "--config"])
            .arg(plugin.join("config.toml"))
            .arg("--vectors")
            .arg(plugin.join("vectors.toml"))
            .arg("--compile-cache-dir")
            .arg(compile_cache())
            .output()
            .expect("plugin check");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{lang}: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.contains(" passed, 0 failed"), "{stdout}");
    }
}
