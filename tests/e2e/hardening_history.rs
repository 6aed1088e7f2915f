//! Stage configurations and the policy history under attack, through the real binary: a
//! configuration of megabytes, installs in a loop, history reads by any member, and one
//! project's installs cutting the history of every other.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::builder::{Gateway, Started};
use crate::support::cli::{check_config, failed_saying};
use crate::support::config::write_config;
use crate::support::fixture::{Fixture, console_token};
use crate::support::gateway::Process;
use crate::support::policy::{Policies, b64, testing_cors};
use crate::support::postgres::{TestDatabase, control_table};

/// The admin of `fx`'s organization (and its reader) on `gw`'s CORS stage of alpha.
fn admin_of(gw: &Process, fx: &Fixture) -> (Policies, Policies) {
    let as_user = |user| Policies::new(gw.mgmt_url(""), console_token(user));
    (as_user(fx.admin), as_user(fx.reader))
}

/// `PUT` of `body` on `project`'s CORS stage: the status and the JSON body.
async fn put(policies: &Policies, project: &str, body: Value) -> (StatusCode, Value) {
    policies.of(project).put("cors", body).await.parts()
}

/// Installs the testing module for beta (configured `config`): its digest.
async fn beta_installs(admin: &Policies, config: Value) -> String {
    let module = json!({ "module": b64(&testing_cors()), "config": config });
    let (status, installed) = put(admin, "beta", module).await;
    assert_eq!(status, StatusCode::OK, "{installed}");
    installed["digest"].as_str().expect("digest").to_owned()
}

/// `project`'s CORS history (up to 1000 events).
async fn history(policies: &Policies, project: &str) -> Vec<Value> {
    policies.of(project).history_of("cors", "?limit=1000").await
}

/// A configuration of megabytes is refused `413 config_too_large` naming the limit; a hundred
/// installs with configurations just under it, then history reads by a `read_only` member and
/// a rollback, keep the gateway small (the listings never read configurations; the rollback
/// reads the one it restores). One project's refused upload leaves another's history whole.
#[tokio::test]
async fn stage_configurations_are_bounded_and_history_reads_never_load_them() {
    let fx = Fixture::new();
    let (db, _store) = TestDatabase::seeded(&fx).await;
    let toml = control_table(&db.url) + "\n[plugins]\ncall_deadline_ms = 2000\n";
    let Started { gw, .. } = Gateway::builder().fixture(&fx).toml(toml).binary();
    let (admin, reader) = admin_of(&gw, &fx);
    // Beta's history: one install.
    let digest = beta_installs(&admin, json!({ "n": "beta" })).await;

    // 4 MiB of configuration: refused before any check, naming the limit.
    let huge = json!({ "digest": digest, "config": { "pad": "x".repeat(4 << 20) } });
    let (status, refused) = put(&admin, "alpha", huge).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(refused["error"]["code"], "config_too_large");
    let message = refused["error"]["message"].as_str().unwrap_or_default();
    let named = message.contains("65536") && message.contains("plugins.max_config_bytes");
    assert!(named, "{message}");
    let beta = history(&admin, "beta").await.len();
    assert_eq!(beta, 1, "beta's history is whole");

    // A hundred installs with configurations of 60 KiB.
    for i in 0..100 {
        let pad = format!("{i:03}{}", "y".repeat(60 * 1024));
        let config = json!({ "digest": digest, "config": { "pad": pad, "i": i } });
        let (status, body) = put(&admin, "alpha", config).await;
        assert_eq!(status, StatusCode::OK, "install {i}: {body}");
    }
    let before = gw.rss_mib();
    for _ in 0..7 {
        let events = history(&reader, "alpha").await;
        assert_eq!(events.len(), 100);
        let bare = events.iter().all(|e| e.get("config").is_none());
        assert!(bare, "no configuration listed");
    }
    // A rollback reads the one configuration it restores.
    let rollback = admin.call(reqwest::Method::POST, "cors", "/rollback");
    let r = rollback.json(&json!({ "digest": digest })).read().await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let after = gw.rss_mib();
    eprintln!(
        "RSS {before:.1} MiB before seven history reads and a rollback, {after:.1} MiB after"
    );
    assert!(after - before < 40.0, "{before:.1} -> {after:.1} MiB");
    let restored = admin.get("cors").await.json()["config"]["i"].clone();
    assert_eq!(
        restored, 99,
        "the rollback restored the newest configuration"
    );
    assert_eq!(history(&admin, "beta").await.len(), 1);
}

/// With the file store, one project's upload used to cut the whole history file; now each
/// project's stage keeps its own, and a configuration over the bound is refused anyway.
#[tokio::test]
async fn a_projects_uploads_never_erase_another_projects_history_in_the_file_store() {
    let plugins = "[plugins]\ncall_deadline_ms = 2000\n";
    let Started { gw, fx, dir } = Gateway::builder().toml(plugins).binary();
    let (admin, _) = admin_of(&gw, &fx);
    let digest = beta_installs(&admin, json!({})).await;
    let over = json!({ "digest": digest, "config": { "pad": "z".repeat(5 << 20) } });
    assert_eq!(
        put(&admin, "alpha", over).await.0,
        StatusCode::PAYLOAD_TOO_LARGE
    );
    for i in 0..30 {
        let config = json!({ "digest": digest, "config": { "pad": "w".repeat(60_000), "i": i } });
        assert_eq!(put(&admin, "alpha", config).await.0, StatusCode::OK);
    }
    let beta = history(&admin, "beta").await.len();
    assert_eq!(beta, 1, "beta's history is whole");
    assert_eq!(history(&admin, "alpha").await.len(), 30);
    // One file per project and stage, the configurations beside it.
    let streams = std::fs::read_dir(dir.path().join("policy-history"));
    let streams = streams.expect("history folder").count();
    assert_eq!(streams, 2, "alpha's and beta's");
}

/// An operator configuration over the bound is refused at start and by `check-config`, naming
/// the key and the limit.
#[tokio::test]
async fn an_operator_stage_configuration_over_the_bound_is_refused_naming_the_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pad = "p".repeat(70_000);
    let toml =
        format!("[data_plane.plugins.cors.config]\nallow_origins = [\"*\"]\npad = \"{pad}\"\n");
    let out = check_config(&write_config(dir.path(), &toml));
    failed_saying(&out, "data_plane.plugins.cors.config");
    failed_saying(&out, "plugins.max_config_bytes");
}
