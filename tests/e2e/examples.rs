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

use crate::support::builder::{Gateway, Started};
use crate::support::call::{Answer, IntoCall};
use crate::support::cli::{plugin_check, run, stderr, stdout, succeeded};
use crate::support::fixture::Fixture;
use crate::support::poll::poll_tries;
use crate::support::responder::{Bus, reply};
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
        .args(["build", "--quiet", "--release"])
        .args(["--target", "wasm32-wasip2", "--target-dir"])
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
    let (config, vectors) = (cases.join("config.toml"), cases.join("vectors.toml"));
    let out = plugin_check(
        module,
        &stage_key(stage),
        &config,
        &vectors,
        Some(&compile_cache()),
    );
    let stdout = stdout(&out);
    let module = module.display();
    assert!(out.status.success(), "{module}: {stdout}\n{}", stderr(&out));
    let versioned = stdout.contains("written against aura:gateway@0.5.0");
    assert!(versioned, "{stdout}");
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
    let bus = Bus::shared();
    let _db = bus.respond("db", |_| reply(200, &[], b"over nats")).await;
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
        let (key, module, config) = (stage_key(stage), module.display(), inline_config(stage));
        plugins += &format!(
            "[data_plane.plugins.{key}]\nmodule = {:?}\nconfig = {config}\n\n",
            module.to_string()
        );
    }
    let gw = Gateway::builder()
        .bus(&bus)
        .fixture(&fx)
        .records(records)
        .toml(plugins);
    let Started { gw, .. } = gw.binary();
    let c = reqwest::Client::new();
    // Ready: the control store answered and the NATS connection is up.
    let _ = poll_tries(200, Duration::from_millis(50), async || {
        let ready = c.get(gw.mgmt_url("/ready")).call().status().await;
        (ready == StatusCode::OK).then_some(())
    })
    .await;
    let with_key =
        |request: reqwest::RequestBuilder, key: &str| request.call().header("x-aura-key", key);

    // api-key: the key in `x-aura-key`, which the default plugin does not read (401).
    let r = with_key(c.get(gw.data_url("/v1/storage/object/a.txt")), ded_key)
        .read()
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", gw.log_text());
    assert!(
        storage
            .last()
            .is_some_and(|s| s.target.ends_with("/object/a.txt"))
    );
    // quota: the `pro` plan's burst of the example's configuration (the default: 1000).
    assert_eq!(r.headers["ratelimit-limit"], "5000");

    // db-routing: reads of a dedicated project to its PostgREST, writes over NATS (the default
    // plugin sends both to PostgREST).
    let todos = |request: reqwest::RequestBuilder| async move {
        let r = with_key(request, ded_key).read().await;
        assert_eq!(r.status, StatusCode::OK, "{:?}", r.text());
        r
    };
    todos(c.get(gw.data_url("/v1/db/todos?select=*"))).await;
    let routed = postgrest.last().map(|s| s.target);
    assert_eq!(routed, Some("/todos?select=*".to_owned()));
    let r = todos(c.post(gw.data_url("/v1/db/todos")).body("{}")).await;
    assert_eq!(r.text(), "over nats");
    // ... and a read of a project whose PostgREST is unknown fails closed, logged by the plugin.
    let r = with_key(c.get(gw.data_url("/v1/db/todos")), unr_key)
        .read()
        .await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    let unresolved_id = r.request_id();
    assert!(r.text().contains("db_target_unresolved"));

    // cors: an allow-list echoing the origin (the default data-plane plugin answers `*`).
    let preflight = async |origin: &str| -> Answer {
        let preflight = c
            .request(reqwest::Method::OPTIONS, gw.data_url("/v1/db/x"))
            .call();
        let preflight = preflight.origin(origin);
        preflight
            .header("access-control-request-method", "POST")
            .read()
            .await
    };
    let r = preflight("https://eu.example.org").await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    assert_eq!(
        r.headers["access-control-allow-origin"],
        "https://eu.example.org"
    );
    assert_eq!(r.headers["access-control-max-age"], "600");
    let r = preflight("https://evil.example").await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    let denied_id = r.request_id();

    // What the plugins logged, with the request it was deciding.
    let mut log = String::new();
    let denied = ["origin https://evil.example denied", &denied_id];
    let _ = poll_tries(300, Duration::from_millis(100), async || {
        log = gw.log_text();
        let unresolved = log_line_with(&log, &["no PostgREST target", &unresolved_id]);
        (log_line_with(&log, &denied).is_some() && unresolved.is_some()).then_some(())
    })
    .await;
    let line = log_line_with(&log, &denied);
    let plugin_line = line.is_some_and(|l| l.contains("aura::plugin") && l.contains("cors"));
    assert!(
        plugin_line,
        "no plugin line with the request id {denied_id}:\n{log}"
    );
    let unresolved = ["no PostgREST target for /v1/db/todos", &unresolved_id];
    let warned = log_line_with(&log, &unresolved).is_some_and(|l| l.contains("WARN"));
    assert!(warned, "{log}");
    // `configure` logs at load, outside any request.
    let configured = log_line_with(&log, &["configured: 1 origins, 1 domains", "aura::plugin"]);
    assert!(configured.is_some(), "{log}");
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
    let config = examples().join("vectors/cors/config.toml");
    let out = plugin_check(&module, "cors", &config, &vectors, None);
    let (stdout, stderr) = (stdout(&out), stderr(&out));
    assert!(!out.status.success(), "{stdout}");
    let named = stdout.contains("wrongly expected to be allowed");
    let told = named && stdout.contains("FAIL: expected allow, got deny");
    assert!(told, "{stdout}");
    assert!(stdout.contains("1 passed, 1 failed"), "{stdout}");
    assert!(!stdout.contains("plugin check passed"), "{stdout}");
    let failed = stderr.contains("author vectors failed: wrongly expected to be allowed");
    assert!(failed, "{stderr}");
}

/// `plugin new` for `stage` in `lang` into `plugin`; what it printed.
fn plugin_new(stage: &str, lang: &str, plugin: &Path) -> String {
    let plugin = plugin.display().to_string();
    let out = run(
        &["plugin", "new", "--stage", stage, "--lang", lang, &plugin],
        None,
    );
    succeeded(&out);
    stdout(&out)
}

/// `plugin check` of a scaffold's module with its own configuration and vectors, which it passes.
fn scaffold_passes(module: &Path, stage: &str, plugin: &Path, cache: Option<&Path>, what: &str) {
    let (config, vectors) = (plugin.join("config.toml"), plugin.join("vectors.toml"));
    let out = plugin_check(module, stage, &config, &vectors, cache);
    let stdout = stdout(&out);
    assert!(out.status.success(), "{what}{stdout}{}", stderr(&out));
    assert!(stdout.contains(" passed, 0 failed"), "{stdout}");
}

/// `plugin new` scaffolds a plugin that builds and passes its own check, and `wit` prints the
/// package an author builds against.
#[test]
fn a_scaffolded_rust_plugin_builds_and_passes_its_check() {
    let dir = tempfile::tempdir().expect("tempdir");
    let plugin = dir.path().join("my-quota");
    let printed = plugin_new("quota", "rust", &plugin);
    assert!(printed.contains("cargo build --release --target wasm32-wasip2"));
    let printed = run(&["wit", "--version", "0.5.0"], None);
    let copy = std::fs::read(plugin.join("wit/gateway.wit")).expect("wit copy");
    assert_eq!(copy, printed.stdout);
    let out_dir = dir.path().join("wit-copy");
    let wrote = run(&["wit", "--out", &out_dir.display().to_string()], None);
    assert!(wrote.status.success());
    let written = std::fs::read(out_dir.join("gateway.wit")).expect("written");
    assert_eq!(written, printed.stdout);
    for version in ["0.4.0", "0.3.0", "0.1.0"] {
        let old = run(&["wit", "--version", version], None);
        let package = format!("package aura:gateway@{version};");
        assert!(stdout(&old).contains(&package), "{version}");
    }

    let release = cargo_build_wasm(&plugin);
    scaffold_passes(&release.join("my_quota.wasm"), "quota", &plugin, None, "");
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
        let printed = plugin_new(stage, lang, &plugin);
        let tool_name = tool.file_name().and_then(|n| n.to_str()).expect("name");
        assert!(
            printed.contains(&format!("{tool_name} {args}")),
            "{printed}"
        );
        let status = Command::new(&tool)
            .current_dir(&plugin)
            .args(args.split(' '))
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .status()
            .expect("build tool");
        assert!(status.success(), "{lang}: {tool_name} {args}");
        let module = plugin.join(format!("{stage}.wasm"));
        let cache = compile_cache();
        scaffold_passes(&module, stage, &plugin, Some(&cache), &format!("{lang}: "));
    }
}
