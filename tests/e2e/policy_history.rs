//! The history of the modules in force, with both control stores: who installed, deleted or
//! rolled back a project's module, a rollback that puts a previous module back with the
//! configuration it had, and the operator's reloads on the admin route.
//!
//! Its bounds, through the real binary: a stage configuration over `plugins.max_config_bytes` is
//! refused (at upload, at start and by `check-config`), history reads never load
//! configurations, and one project's installs never cut another project's history.

use std::sync::Arc;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::builder::{Gateway, Started};
use crate::support::call::Call;
use crate::support::cli::{check_config, failed_saying};
use crate::support::config::write_config;
use crate::support::fixture::{Fixture, console_token};
use crate::support::gateway::{InProcess, Process};
use crate::support::policy::{Policies, b64, digest, testing_cors};
use crate::support::postgres::{TestDatabase, control_table};
use crate::support::records::file_history_lines;
use crate::support::wasm::with_custom_section;

const ADMIN_TOKEN: &str = "admin-token-for-history-0123456789";

/// Two different cors modules (the same code, another digest).
fn modules() -> (Vec<u8>, Vec<u8>) {
    let a = testing_cors();
    let b = with_custom_section(a.clone(), b"history-test", b"b");
    (a, b)
}

/// `method` on the admin route `path` with `token`.
fn admin_route(gw: &InProcess, method: reqwest::Method, path: &str, token: &str) -> Call {
    Call::new(method, gw.mgmt_url(&format!("/v1/admin/policies{path}"))).bearer(token)
}

/// The operator's history once it holds `events` events (it is written off the request path).
async fn operator_history(gw: &InProcess, events: usize) -> Vec<Value> {
    let mut operator = Vec::new();
    for _ in 0..100 {
        let history = admin_route(gw, reqwest::Method::GET, "/history", ADMIN_TOKEN);
        let body = history.read().await.json_or_null();
        operator = body["events"].as_array().cloned().unwrap_or_default();
        if operator.len() >= events {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    operator
}

async fn scenario(gw: &InProcess, fx: &Fixture) {
    let (a, b) = modules();
    let (da, db) = (digest(&a), digest(&b));
    let as_user = |user| Policies::new(gw.mgmt_url(""), console_token(user));
    let (admin, owner) = (as_user(fx.admin), as_user(fx.owner));

    // Installed by the admin, then replaced by the owner with another configuration.
    assert_eq!(
        admin.install("cors", &a, json!({})).await.status,
        StatusCode::OK
    );
    // Its health on this instance: calls, failures by kind, call times.
    for origin in ["https://ok.test", "https://trap.test", "https://ok.test"] {
        let health = Call::get(gw.data_url("/health")).key(&fx.anon_key);
        health.origin(origin).send().await;
    }
    let installed = admin.get("cors").await.json_or_null();
    let health = &installed["health"];
    let calls = health["calls"].as_u64();
    assert!(calls.is_some_and(|n| n >= 3), "{installed}");
    assert_eq!(health["failures"]["trap"], 1, "{installed}");
    assert_eq!(health["failures"]["deadline"], 0);
    let p99 = health["p99_us"].as_f64();
    assert!(p99.is_some_and(|v| v > 0.0), "{installed}");
    let replaced = owner.install("cors", &b, json!({ "note": "b" })).await;
    assert_eq!(replaced.status, StatusCode::OK);
    let events = admin.history("cors").await;
    assert_eq!(events.len(), 2, "{events:?}");
    assert_eq!(events[0]["action"], "install");
    assert_eq!(events[0]["actor"], fx.owner.to_string());
    assert_eq!(events[0]["digest_before"], da.as_str());
    assert_eq!(events[0]["digest_after"], db.as_str());
    assert_eq!(events[1]["actor"], fx.admin.to_string());
    assert_eq!(events[1]["digest_before"], Value::Null);
    assert_eq!(events[1]["digest_after"], da.as_str());
    assert_eq!(events[1]["plane"], "data");
    assert_eq!(events[1]["mode"], "enforce");
    // Any member reads the history; only an owner or admin rolls back.
    assert_eq!(as_user(fx.reader).history("cors").await.len(), 2);
    let developer = as_user(fx.developer).post("cors", "rollback").await;
    assert_eq!(developer.status, StatusCode::FORBIDDEN);
    // Another organization sees nothing of it.
    let outsider = as_user(fx.outsider);
    let history = outsider.call(reqwest::Method::GET, "cors", "/history");
    let status = history.status().await;
    let hidden = matches!(status, StatusCode::FORBIDDEN | StatusCode::NOT_FOUND);
    assert!(hidden, "{status}");

    // Rollback: the previous module, with the configuration it had.
    let back = admin.post("cors", "rollback").await;
    assert_eq!(back.status, StatusCode::OK, "{}", back.json_or_null());
    assert_eq!(back.json()["digest"], da.as_str());
    let installed = admin.get("cors").await.json_or_null();
    assert_eq!(installed["digest"], da.as_str());
    assert_eq!(installed["config"], json!({}));
    let events = admin.history("cors").await;
    assert_eq!(events[0]["action"], "rollback");
    assert_eq!(events[0]["actor"], fx.admin.to_string());
    assert_eq!(events[0]["digest_before"], db.as_str());
    assert_eq!(events[0]["digest_after"], da.as_str());
    // ... and forward again to a named digest, its configuration restored too.
    let rollback = |digest: &str| {
        let call = owner.call(reqwest::Method::POST, "cors", "/rollback");
        call.json(&json!({ "digest": digest })).read()
    };
    let forward = rollback(&db).await;
    assert_eq!(forward.status, StatusCode::OK, "{}", forward.json_or_null());
    let installed = admin.get("cors").await.json_or_null();
    assert_eq!(installed["digest"], db.as_str());
    assert_eq!(installed["config"], json!({ "note": "b" }));
    // A digest that was never in force here is refused.
    let never = rollback(&"0".repeat(64)).await;
    let body = never.json_or_null();
    assert_eq!(never.status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["code"], "not_in_history");

    // A delete is recorded, and the history bounded by `limit`.
    assert_eq!(owner.delete("cors").await.status, StatusCode::NO_CONTENT);
    let events = admin.history("cors").await;
    assert_eq!(events.len(), 5);
    assert_eq!(events[0]["action"], "delete");
    assert_eq!(events[0]["digest_before"], db.as_str());
    assert_eq!(events[0]["digest_after"], Value::Null);
    let limited = admin.call(reqwest::Method::GET, "cors", "/history?limit=2");
    let limited = limited.read().await.json_or_null();
    assert_eq!(limited["events"].as_array().map(Vec::len), Some(2));

    // The operator's reload is recorded on the admin route, not in a project's history.
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("gateway.toml");
    let testing = aura_gateway::policy::stages::builtin::TESTING_PLUGIN_PATH;
    let toml =
        format!("[plugins]\nwatch = false\n[data_plane.plugins.cors]\nmodule = {testing:?}\n");
    std::fs::write(&path, toml).expect("config");
    gw.state.config_path.set(path).expect("once");
    gw.state.reload_policies("test").await.expect("applied");
    let operator = operator_history(gw, 1).await;
    let one = operator.len() == 1;
    assert!(one, "only the data plane's cors changed: {operator:?}");
    assert_eq!(operator[0]["actor"], "operator");
    assert_eq!(operator[0]["action"], "operator_reload");
    assert_eq!(operator[0]["stage"], "cors");
    assert_eq!(operator[0]["project"], Value::Null);
    assert_eq!(operator[0]["digest_after"], da.as_str());
    assert_eq!(admin.history("cors").await.len(), 5);
    // The operator puts the previous modules back on the admin route: recorded as theirs.
    let post = |token: &'static str| admin_route(gw, reqwest::Method::POST, "/rollback", token);
    assert_eq!(post(ADMIN_TOKEN).status().await, StatusCode::OK);
    let builtin = digest(aura_gateway::policy::stages::builtin::CORS);
    let operator = operator_history(gw, 2).await;
    assert_eq!(operator[0]["action"], "rollback", "{operator:?}");
    assert_eq!(operator[0]["actor"], "operator");
    assert_eq!(operator[0]["digest_before"], da.as_str());
    assert_eq!(operator[0]["digest_after"], builtin.as_str());
    let again = post(ADMIN_TOKEN).read().await;
    let body = again.json_or_null();
    assert_eq!(again.status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["code"], "no_previous_modules");
    let wrong = "not-the-token-0123456789";
    assert_eq!(post(wrong).status().await, StatusCode::UNAUTHORIZED);
    let history = admin_route(gw, reqwest::Method::GET, "/history", wrong);
    assert_eq!(history.status().await, StatusCode::UNAUTHORIZED);
}

fn config(c: &mut aura_gateway::config::Config) {
    c.admin.token = Some(ADMIN_TOKEN.into());
    c.plugins.call_deadline_ms = 2_000;
}

#[tokio::test]
async fn the_file_store_keeps_the_history_and_a_rollback_restores_a_module() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fx = Fixture::new();
    let gw = Gateway::with(config)
        .fixture(&fx)
        .dir(dir.path())
        .start()
        .await;
    scenario(&gw, &fx).await;
    // One JSON line per change beside the control file (one file per project and stage).
    assert_eq!(file_history_lines(dir.path()), 7);
}

#[tokio::test]
async fn the_postgres_store_keeps_the_history_and_a_rollback_restores_a_module() {
    let fx = Fixture::new();
    let (_db, store) = TestDatabase::seeded(&fx).await;
    let gw = Gateway::with(config).store(Arc::new(store)).start().await;
    scenario(&gw, &fx).await;
}

/// The history cannot grow without bound, and one project's installs never cut another's
/// history: both stores keep the newest events of each project's stage, and a listing never
/// carries a configuration (a rollback reads the one it restores).
#[tokio::test]
async fn a_history_written_in_a_loop_stays_bounded_per_project_and_stage_in_both_stores() {
    use aura_gateway::control::ControlStore;
    let dir = tempfile::tempdir().expect("tempdir");
    let fx = Fixture::new();
    let (_db, pg) = TestDatabase::seeded(&fx).await;
    let file = fx.file_store(dir.path());
    let kept = aura_gateway::control::HISTORY_KEPT;
    let event = |project: &str, i: usize| {
        let mut e = aura_gateway::policy::history::event(
            &fx.admin.to_string(),
            Some(project),
            aura_gateway::plane::Plane::Data,
            aura_gateway::stage::Stage::Cors,
            aura_gateway::policy::history::Action::Install,
            None,
            Some(format!("{i:064}")),
            None,
        );
        let pad = "x".repeat(4_000);
        e.config = Some(format!("{{\"pad\": \"{pad}\", \"n\": {i}}}"));
        e
    };
    let stores = [&pg as &dyn ControlStore, &file];
    // Beta's one event, written first, outlives every cut of alpha's stream.
    for store in stores {
        store
            .append_policy_event(&event("beta", 7))
            .await
            .expect("append");
    }
    for i in 0..kept + 300 {
        for store in stores {
            store
                .append_policy_event(&event("alpha", i))
                .await
                .expect("append");
        }
    }
    let newest = format!("{:064}", kept + 299);
    for store in stores {
        let kind = store.kind();
        let rows = store
            .policy_events(Some("alpha"), Some("cors"), 10_000)
            .await;
        let rows = rows.expect("read");
        let bounded = rows.len() >= kept && rows.len() < kept + 300;
        assert!(
            bounded,
            "{} events of alpha kept by the {kind} store",
            rows.len()
        );
        assert_eq!(rows[0].digest_after.as_deref(), Some(newest.as_str()));
        let bare = rows.iter().all(|e| e.config.is_none());
        assert!(bare, "a listing carries no configuration");
        let restored = store.policy_event_of(Some("alpha"), "cors", &newest).await;
        let restored = restored.expect("read").expect("kept").config;
        let tail = format!("\"n\": {}}}", kept + 299);
        let whole = restored.as_deref().is_some_and(|c| c.ends_with(&tail));
        assert!(whole, "the {kind} store restores the configuration");
        let beta = store.policy_events(Some("beta"), Some("cors"), 10).await;
        let beta = beta.expect("read").len();
        assert_eq!(
            beta, 1,
            "beta's history survives alpha's in the {kind} store"
        );
    }
}

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
