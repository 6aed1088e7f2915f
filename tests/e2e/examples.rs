//! The example plugins of `examples/plugins`, built as the plugin guide says, pass
//! `plugin check` and work once swapped in.

use std::path::{Path, PathBuf};
use std::process::Command;

use aura_gateway::reload::reload_and_log;
use reqwest::StatusCode;

use crate::support::gateway::{InProcess, binary, test_config};
use crate::support::nats_server::shared;
use crate::support::unique_prefix;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `cargo build --target wasm32-wasip2 --release` in the example's folder.
fn build(example: &str) -> PathBuf {
    let target_dir = root().join("target/examples");
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(root().join("examples/plugins").join(example))
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
    assert!(status.success(), "building {example}");
    target_dir.join(format!(
        "wasm32-wasip2/release/{}.wasm",
        example.replace('-', "_")
    ))
}

fn check(module: &Path, stage: &str, config: &Path) {
    let out = Command::new(binary())
        .args(["plugin", "check"])
        .arg(module)
        .args(["--stage", stage, "--config"])
        .arg(config)
        .output()
        .expect("plugin check");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("plugin check passed"));
}

#[tokio::test]
async fn the_example_plugins_build_pass_the_check_and_work_in_force() {
    let cors = build("tenant-cors");
    let quota = build("plan-quota");
    let examples = root().join("examples/plugins");
    check(&cors, "cors", &examples.join("tenant-cors/cors.toml"));
    check(&quota, "quota", &examples.join("plan-quota/quota.toml"));

    let gw = InProcess::start(test_config(&shared().url(), &unique_prefix())).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("gateway.toml");
    std::fs::write(
        &path,
        format!(
            "[plugins]\nwatch = false\n[data_plane.plugins.cors]\nmodule = {:?}\n\
             config = {{ origins = [\"https://app.example.com\"], subdomains_of = [\"example.org\"] }}\n\
             [data_plane.plugins.quota]\nmodule = {:?}\n\
             config = {{ plans = {{ free = {{ rate_per_second = 1, burst = 3 }} }}, costs = {{ functions = 3 }} }}\n",
            cors.display().to_string(),
            quota.display().to_string()
        ),
    )
    .expect("config");
    gw.state.config_path.set(path).expect("once");
    reload_and_log(&gw.state, "test").await.expect("applied");

    let preflight = |origin: &'static str| {
        reqwest::Client::new()
            .request(reqwest::Method::OPTIONS, gw.data_url("/v1/db/x"))
            .header("origin", origin)
            .header("access-control-request-method", "POST")
            .send()
    };
    let r = preflight("https://app.example.com").await.expect("r");
    assert_eq!(
        r.headers()["access-control-allow-origin"],
        "https://app.example.com"
    );
    let r = preflight("https://eu.example.org").await.expect("r");
    assert_eq!(
        r.headers()["access-control-allow-origin"],
        "https://eu.example.org"
    );
    let r = preflight("https://evil.example").await.expect("r");
    assert_eq!(r.status(), StatusCode::FORBIDDEN);

    // The plan quota: one functions call costs the whole free burst of 3.
    let c = crate::support::gateway::client();
    let first = c.get(gw.data_url("/v1/storage/x")).send().await.expect("r");
    assert_eq!(first.headers()["ratelimit-limit"], "3");
    let r = c
        .get(gw.data_url("/v1/functions/f"))
        .send()
        .await
        .expect("r");
    assert_eq!(
        r.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "2 tokens left, the call costs 3"
    );
}
