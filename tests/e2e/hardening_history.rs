//! Stage configurations and the policy history under attack, through the real binary: a
//! configuration of megabytes, installs in a loop, history reads by any member, and one
//! project's installs cutting the history of every other.

use base64::Engine as _;
use reqwest::StatusCode;

use crate::support::fixture::{Fixture, console_token};
use crate::support::gateway::{Process, binary, serve_binary};
use crate::support::postgres::TestDatabase;

fn testing_module() -> String {
    base64::engine::general_purpose::STANDARD
        .encode(std::fs::read(aura_gateway::policy::builtin::TESTING_PLUGIN_PATH).expect("module"))
}

async fn put(
    gw: &Process,
    token: &str,
    project: &str,
    body: &serde_json::Value,
) -> (StatusCode, serde_json::Value) {
    let r = reqwest::Client::new()
        .put(gw.mgmt_url(&format!("/v1/projects/{project}/policies/cors")))
        .bearer_auth(token)
        .json(body)
        .send()
        .await
        .expect("answer");
    let status = r.status();
    (status, r.json().await.unwrap_or_default())
}

async fn history(gw: &Process, token: &str, project: &str) -> Vec<serde_json::Value> {
    let r = reqwest::Client::new()
        .get(gw.mgmt_url(&format!(
            "/v1/projects/{project}/policies/cors/history?limit=1000"
        )))
        .bearer_auth(token)
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status(), StatusCode::OK);
    let body: serde_json::Value = r.json().await.expect("json");
    body["events"].as_array().cloned().unwrap_or_default()
}

/// A configuration of megabytes is refused `413 config_too_large` naming the limit; a hundred
/// installs with configurations just under it, then history reads by a `read_only` member and
/// a rollback, keep the gateway small (the listings never read configurations; the rollback
/// reads the one it restores). One project's refused upload leaves another's history whole.
#[tokio::test]
async fn stage_configurations_are_bounded_and_history_reads_never_load_them() {
    let db = TestDatabase::create().await;
    db.store().await;
    let fx = Fixture::new();
    fx.seed(&db).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let gw = serve_binary(
        dir.path(),
        &fx,
        "",
        &format!(
            "[control]\nstore = \"postgres\"\ndatabase_url = \"{}\"\n\n[plugins]\ncall_deadline_ms = 2000\n",
            db.url
        ),
    );
    let admin = console_token(fx.admin);
    let module = testing_module();
    // Beta's history: one install.
    let (status, installed) = put(
        &gw,
        &admin,
        "beta",
        &serde_json::json!({ "module": module, "config": { "n": "beta" } }),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{installed}");
    let digest = installed["digest"].as_str().expect("digest").to_owned();

    // 4 MiB of configuration: refused before any check, naming the limit.
    let huge = "x".repeat(4 << 20);
    let (status, refused) = put(
        &gw,
        &admin,
        "alpha",
        &serde_json::json!({ "digest": digest, "config": { "pad": huge } }),
    )
    .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(refused["error"]["code"], "config_too_large");
    let message = refused["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("65536") && message.contains("plugins.max_config_bytes"),
        "{message}"
    );
    assert_eq!(
        history(&gw, &admin, "beta").await.len(),
        1,
        "beta's history is whole"
    );

    // A hundred installs with configurations of 60 KiB.
    for i in 0..100 {
        let pad = format!("{i:03}{}", "y".repeat(60 * 1024));
        let (status, body) = put(
            &gw,
            &admin,
            "alpha",
            &serde_json::json!({ "digest": digest, "config": { "pad": pad, "i": i } }),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "install {i}: {body}");
    }
    let before = gw.rss_mib();
    let reader = console_token(fx.reader);
    for _ in 0..7 {
        let events = history(&gw, &reader, "alpha").await;
        assert_eq!(events.len(), 100);
        assert!(
            events.iter().all(|e| e.get("config").is_none()),
            "no configuration listed"
        );
    }
    // A rollback reads the one configuration it restores.
    let r = reqwest::Client::new()
        .post(gw.mgmt_url("/v1/projects/alpha/policies/cors/rollback"))
        .bearer_auth(&admin)
        .json(&serde_json::json!({ "digest": digest }))
        .send()
        .await
        .expect("rollback");
    assert_eq!(
        r.status(),
        StatusCode::OK,
        "{}",
        r.text().await.unwrap_or_default()
    );
    let after = gw.rss_mib();
    eprintln!(
        "RSS {before:.1} MiB before seven history reads and a rollback, {after:.1} MiB after"
    );
    assert!(after - before < 40.0, "{before:.1} -> {after:.1} MiB");
    let r = reqwest::Client::new()
        .get(gw.mgmt_url("/v1/projects/alpha/policies/cors"))
        .bearer_auth(&admin)
        .send()
        .await
        .expect("answer");
    let body: serde_json::Value = r.json().await.expect("json");
    assert_eq!(
        body["config"]["i"], 99,
        "the rollback restored the newest configuration"
    );
    assert_eq!(history(&gw, &admin, "beta").await.len(), 1);
}

/// With the file store, one project's upload used to cut the whole history file; now each
/// project's stage keeps its own, and a configuration over the bound is refused anyway.
#[tokio::test]
async fn a_projects_uploads_never_erase_another_projects_history_in_the_file_store() {
    let crate::support::gateway::Started { gw, fx, dir } =
        crate::support::gateway::start_binary("[plugins]\ncall_deadline_ms = 2000\n");
    let admin = console_token(fx.admin);
    let module = testing_module();
    let (status, installed) = put(
        &gw,
        &admin,
        "beta",
        &serde_json::json!({ "module": module, "config": {} }),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{installed}");
    let digest = installed["digest"].as_str().expect("digest").to_owned();
    let (status, _) = put(
        &gw,
        &admin,
        "alpha",
        &serde_json::json!({ "digest": digest, "config": { "pad": "z".repeat(5 << 20) } }),
    )
    .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    for i in 0..30 {
        let (status, _) = put(
            &gw,
            &admin,
            "alpha",
            &serde_json::json!({ "digest": digest, "config": { "pad": "w".repeat(60_000), "i": i } }),
        )
        .await;
        assert_eq!(status, StatusCode::OK);
    }
    assert_eq!(
        history(&gw, &admin, "beta").await.len(),
        1,
        "beta's history is whole"
    );
    assert_eq!(history(&gw, &admin, "alpha").await.len(), 30);
    // One file per project and stage, the configurations beside it.
    let streams = std::fs::read_dir(dir.path().join("policy-history"))
        .expect("history folder")
        .count();
    assert_eq!(streams, 2, "alpha's and beta's");
}

/// An operator configuration over the bound is refused at start and by `check-config`, naming
/// the key and the limit.
#[tokio::test]
async fn an_operator_stage_configuration_over_the_bound_is_refused_naming_the_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("gateway.toml");
    std::fs::write(
        &config,
        format!(
            "[data_plane.plugins.cors.config]\nallow_origins = [\"*\"]\npad = \"{}\"\n",
            "p".repeat(70_000)
        ),
    )
    .expect("config");
    let out = std::process::Command::new(binary())
        .args(["check-config", "--config"])
        .arg(&config)
        .output()
        .expect("check-config");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("data_plane.plugins.cors.config")
            && stderr.contains("plugins.max_config_bytes"),
        "{stderr}"
    );
}
