//! The history of the modules in force, with both control stores: who installed, deleted or
//! rolled back a project's module, a rollback that puts a previous module back with the
//! configuration it had, and the operator's reloads on the admin route.

use std::sync::Arc;

use base64::Engine as _;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::fixture::{Fixture, console_token};
use crate::support::gateway::{InProcess, test_config};
use crate::support::nats_server::shared;
use crate::support::postgres::TestDatabase;
use crate::support::unique_prefix;
use crate::support::wasm::with_custom_section;

const ADMIN_TOKEN: &str = "admin-token-for-history-0123456789";

/// Two different cors modules (the same code, another digest).
fn modules() -> (Vec<u8>, Vec<u8>) {
    let a = std::fs::read(aura_gateway::policy::builtin::TESTING_PLUGIN_PATH).expect("plugin");
    let b = with_custom_section(a.clone(), b"history-test", b"b");
    (a, b)
}

fn digest(bytes: &[u8]) -> String {
    aura_gateway::policy::tenants::digest_of(bytes)
}

async fn json(r: reqwest::Response) -> (StatusCode, Value) {
    let status = r.status();
    (status, r.json().await.unwrap_or(Value::Null))
}

async fn history(gw: &InProcess, token: &str) -> Vec<Value> {
    let (status, body) = json(
        reqwest::Client::new()
            .get(gw.mgmt_url("/v1/projects/alpha/policies/cors/history"))
            .bearer_auth(token)
            .send()
            .await
            .expect("answer"),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["events"].as_array().expect("events").clone()
}

/// The operator's history once it holds `events` events (it is written off the request path).
async fn operator_history(gw: &InProcess, events: usize) -> Vec<Value> {
    let mut operator = Vec::new();
    for _ in 0..100 {
        let (_, body) = json(
            reqwest::Client::new()
                .get(gw.mgmt_url("/v1/admin/policies/history"))
                .bearer_auth(ADMIN_TOKEN)
                .send()
                .await
                .expect("answer"),
        )
        .await;
        operator = body["events"].as_array().cloned().unwrap_or_default();
        if operator.len() >= events {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    operator
}

async fn scenario(gw: &InProcess, fx: &Fixture) {
    let c = reqwest::Client::new();
    let (a, b) = modules();
    let (da, db) = (digest(&a), digest(&b));
    let b64 = |m: &[u8]| base64::engine::general_purpose::STANDARD.encode(m);
    let url = gw.mgmt_url("/v1/projects/alpha/policies/cors");
    let (admin, owner) = (console_token(fx.admin), console_token(fx.owner));

    // Installed by the admin, then replaced by the owner with another configuration.
    let r = c
        .put(&url)
        .bearer_auth(&admin)
        .json(&json!({ "module": b64(&a), "config": {} }))
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status(), StatusCode::OK);
    // Its health on this instance: calls, failures by kind, call times.
    for origin in ["https://ok.test", "https://trap.test", "https://ok.test"] {
        c.get(gw.data_url("/health"))
            .header("apikey", &fx.anon_key)
            .header("origin", origin)
            .send()
            .await
            .expect("answer");
    }
    let (_, installed) = json(
        c.get(&url)
            .bearer_auth(&admin)
            .send()
            .await
            .expect("answer"),
    )
    .await;
    let health = &installed["health"];
    assert!(
        health["calls"].as_u64().is_some_and(|n| n >= 3),
        "{installed}"
    );
    assert_eq!(health["failures"]["trap"], 1, "{installed}");
    assert_eq!(health["failures"]["deadline"], 0);
    assert!(
        health["p99_us"].as_f64().is_some_and(|v| v > 0.0),
        "{installed}"
    );
    let r = c
        .put(&url)
        .bearer_auth(&owner)
        .json(&json!({ "module": b64(&b), "config": { "note": "b" } }))
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status(), StatusCode::OK);
    let events = history(gw, &admin).await;
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
    assert_eq!(history(gw, &console_token(fx.reader)).await.len(), 2);
    let r = c
        .post(format!("{url}/rollback"))
        .bearer_auth(console_token(fx.developer))
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    // Another organization sees nothing of it.
    let r = c
        .get(format!("{url}/history"))
        .bearer_auth(console_token(fx.outsider))
        .send()
        .await
        .expect("answer");
    assert!(
        matches!(r.status(), StatusCode::FORBIDDEN | StatusCode::NOT_FOUND),
        "{}",
        r.status()
    );

    // Rollback: the previous module, with the configuration it had.
    let (status, body) = json(
        c.post(format!("{url}/rollback"))
            .bearer_auth(&admin)
            .send()
            .await
            .expect("answer"),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["digest"], da.as_str());
    let (_, installed) = json(
        c.get(&url)
            .bearer_auth(&admin)
            .send()
            .await
            .expect("answer"),
    )
    .await;
    assert_eq!(installed["digest"], da.as_str());
    assert_eq!(installed["config"], json!({}));
    let events = history(gw, &admin).await;
    assert_eq!(events[0]["action"], "rollback");
    assert_eq!(events[0]["actor"], fx.admin.to_string());
    assert_eq!(events[0]["digest_before"], db.as_str());
    assert_eq!(events[0]["digest_after"], da.as_str());
    // ... and forward again to a named digest, its configuration restored too.
    let (status, body) = json(
        c.post(format!("{url}/rollback"))
            .bearer_auth(&owner)
            .json(&json!({ "digest": db }))
            .send()
            .await
            .expect("answer"),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (_, installed) = json(
        c.get(&url)
            .bearer_auth(&admin)
            .send()
            .await
            .expect("answer"),
    )
    .await;
    assert_eq!(installed["digest"], db.as_str());
    assert_eq!(installed["config"], json!({ "note": "b" }));
    // A digest that was never in force here is refused.
    let (status, body) = json(
        c.post(format!("{url}/rollback"))
            .bearer_auth(&owner)
            .json(&json!({ "digest": "0".repeat(64) }))
            .send()
            .await
            .expect("answer"),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["code"], "not_in_history");

    // A delete is recorded, and the history bounded by `limit`.
    let r = c
        .delete(&url)
        .bearer_auth(&owner)
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let events = history(gw, &admin).await;
    assert_eq!(events.len(), 5);
    assert_eq!(events[0]["action"], "delete");
    assert_eq!(events[0]["digest_before"], db.as_str());
    assert_eq!(events[0]["digest_after"], Value::Null);
    let (_, limited) = json(
        c.get(format!("{url}/history?limit=2"))
            .bearer_auth(&admin)
            .send()
            .await
            .expect("answer"),
    )
    .await;
    assert_eq!(limited["events"].as_array().map(Vec::len), Some(2));

    // The operator's reload is recorded on the admin route, not in a project's history.
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("gateway.toml");
    std::fs::write(
        &path,
        format!(
            "[plugins]\nwatch = false\n[data_plane.plugins.cors]\nmodule = {:?}\n",
            aura_gateway::policy::builtin::TESTING_PLUGIN_PATH
        ),
    )
    .expect("config");
    gw.state.config_path.set(path).expect("once");
    gw.state.reload_policies("test").await.expect("applied");
    let operator = operator_history(gw, 1).await;
    assert_eq!(
        operator.len(),
        1,
        "only the data plane's cors changed: {operator:?}"
    );
    assert_eq!(operator[0]["actor"], "operator");
    assert_eq!(operator[0]["action"], "operator_reload");
    assert_eq!(operator[0]["stage"], "cors");
    assert_eq!(operator[0]["project"], Value::Null);
    assert_eq!(operator[0]["digest_after"], da.as_str());
    assert_eq!(history(gw, &admin).await.len(), 5);
    // The operator puts the previous modules back on the admin route: recorded as theirs.
    let rollback = gw.mgmt_url("/v1/admin/policies/rollback");
    let r = c
        .post(&rollback)
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status(), StatusCode::OK);
    let builtin = digest(aura_gateway::policy::builtin::CORS);
    let operator = operator_history(gw, 2).await;
    assert_eq!(operator[0]["action"], "rollback", "{operator:?}");
    assert_eq!(operator[0]["actor"], "operator");
    assert_eq!(operator[0]["digest_before"], da.as_str());
    assert_eq!(operator[0]["digest_after"], builtin.as_str());
    let (status, body) = json(
        c.post(&rollback)
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .expect("answer"),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["code"], "no_previous_modules");
    let r = c
        .post(&rollback)
        .bearer_auth("not-the-token-0123456789")
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let r = c
        .get(gw.mgmt_url("/v1/admin/policies/history"))
        .bearer_auth("not-the-token-0123456789")
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
}

fn config() -> aura_gateway::config::Config {
    let mut config = test_config(&shared().url(), &unique_prefix());
    config.admin.token = Some(ADMIN_TOKEN.into());
    config.plugins.call_deadline_ms = 2_000;
    config
}

#[tokio::test]
async fn the_file_store_keeps_the_history_and_a_rollback_restores_a_module() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fx = Fixture::new();
    let gw = InProcess::start_with_store(config(), Arc::new(fx.file_store(dir.path()))).await;
    scenario(&gw, &fx).await;
    // One JSON line per change beside the control file (one file per project and stage).
    assert_eq!(crate::support::gateway::file_history_lines(dir.path()), 7);
}

#[tokio::test]
async fn the_postgres_store_keeps_the_history_and_a_rollback_restores_a_module() {
    let db = TestDatabase::create().await;
    let store = db.store().await;
    let fx = Fixture::new();
    fx.seed(&db).await;
    let gw = InProcess::start_with_store(config(), Arc::new(store)).await;
    scenario(&gw, &fx).await;
}

/// The history cannot grow without bound, and one project's installs never cut another's
/// history: both stores keep the newest events of each project's stage, and a listing never
/// carries a configuration (a rollback reads the one it restores).
#[tokio::test]
async fn a_history_written_in_a_loop_stays_bounded_per_project_and_stage_in_both_stores() {
    use aura_gateway::control::ControlStore;
    let db = TestDatabase::create().await;
    let pg = db.store().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let fx = Fixture::new();
    fx.seed(&db).await;
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
        e.config = Some(format!(
            "{{\"pad\": \"{}\", \"n\": {i}}}",
            "x".repeat(4_000)
        ));
        e
    };
    // Beta's one event, written first, outlives every cut of alpha's stream.
    for store in [&pg as &dyn ControlStore, &file] {
        store
            .append_policy_event(&event("beta", 7))
            .await
            .expect("append");
    }
    for i in 0..kept + 300 {
        pg.append_policy_event(&event("alpha", i))
            .await
            .expect("append");
        file.append_policy_event(&event("alpha", i))
            .await
            .expect("append");
    }
    let newest = format!("{:064}", kept + 299);
    for store in [&pg as &dyn ControlStore, &file] {
        let rows = store
            .policy_events(Some("alpha"), Some("cors"), 10_000)
            .await
            .expect("read");
        assert!(
            rows.len() >= kept && rows.len() < kept + 300,
            "{} events of alpha kept by the {} store",
            rows.len(),
            store.kind()
        );
        assert_eq!(rows[0].digest_after.as_deref(), Some(newest.as_str()));
        assert!(
            rows.iter().all(|e| e.config.is_none()),
            "a listing carries no configuration"
        );
        let restored = store
            .policy_event_of(Some("alpha"), "cors", &newest)
            .await
            .expect("read")
            .expect("kept");
        assert!(
            restored
                .config
                .as_deref()
                .is_some_and(|c| c.ends_with(&format!("\"n\": {}}}", kept + 299))),
            "the {} store restores the configuration",
            store.kind()
        );
        let beta = store
            .policy_events(Some("beta"), Some("cors"), 10)
            .await
            .expect("read");
        assert_eq!(
            beta.len(),
            1,
            "beta's history survives alpha's in the {} store",
            store.kind()
        );
    }
}
