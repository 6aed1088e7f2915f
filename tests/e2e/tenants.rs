//! Per-project policy modules installed through the management plane.

use std::sync::Arc;

use base64::Engine as _;
use reqwest::StatusCode;
use serde_json::json;

use crate::support::fixture::{Fixture, console_token};
use crate::support::gateway::{InProcess, test_config};
use crate::support::nats_server::shared;
use crate::support::unique_prefix;

fn testing_module() -> String {
    let bytes =
        std::fs::read(aura_gateway::policy::builtin::TESTING_PLUGIN_PATH).expect("testing plugin");
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[tokio::test]
async fn a_tenant_installs_its_own_cors_and_quota_modules_and_other_projects_are_unaffected() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fx = Fixture::new();
    let mut config = test_config(&shared().url(), &unique_prefix());
    config.data_plane.project_host_suffix = Some(".api.test".into());
    let gw = InProcess::start_with_store(config, Arc::new(fx.file_store(dir.path()))).await;
    let client = reqwest::Client::new();
    let admin = console_token(fx.admin);
    let url = gw.mgmt_url("/v1/projects/alpha/policies/cors");

    // A module that traps on every call is refused at upload, with the reason.
    let r = client
        .put(&url)
        .bearer_auth(&admin)
        .json(&json!({ "module": testing_module(), "config": { "trap_always": true } }))
        .send()
        .await
        .expect("r");
    let status = r.status();
    let body: serde_json::Value = r.json().await.expect("json");
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["code"], "policy_refused");
    assert!(
        body["error"]["message"]
            .as_str()
            .expect("message")
            .contains("conformance"),
        "{body}"
    );

    // A developer may not install modules.
    let r = client
        .put(&url)
        .bearer_auth(console_token(fx.developer))
        .json(&json!({ "module": testing_module() }))
        .send()
        .await
        .expect("r");
    assert_eq!(r.status(), StatusCode::FORBIDDEN);

    let r = client
        .put(&url)
        .bearer_auth(&admin)
        .json(&json!({ "module": testing_module(), "config": {} }))
        .send()
        .await
        .expect("r");
    assert_eq!(
        r.status(),
        StatusCode::OK,
        "{}",
        r.text().await.unwrap_or_default()
    );
    let installed: serde_json::Value = client
        .get(&url)
        .bearer_auth(&admin)
        .send()
        .await
        .expect("r")
        .json()
        .await
        .expect("json");
    assert_eq!(installed["digest"].as_str().map(str::len), Some(64));

    let preflight = |host: &'static str| {
        client
            .request(reqwest::Method::OPTIONS, gw.data_url("/v1/db/todos"))
            .header("host", host)
            .header("origin", "https://tenant.example")
            .header("access-control-request-method", "GET")
            .send()
    };
    let r = preflight("alpha.api.test").await.expect("r");
    assert_eq!(
        r.headers()["access-control-allow-origin"],
        "https://tenant.example",
        "alpha's module"
    );
    assert_eq!(r.headers()["access-control-allow-headers"], "x-testing");
    let r = preflight("beta.api.test").await.expect("r");
    assert_eq!(
        r.headers()["access-control-allow-origin"],
        "*",
        "beta keeps the plane's module"
    );

    // An actual request of alpha (known by its key) follows alpha's module too.
    let r = client
        .get(gw.data_url("/health"))
        .header("apikey", &fx.anon_key)
        .header("origin", "https://tenant.example")
        .send()
        .await
        .expect("r");
    assert_eq!(
        r.headers()["access-control-allow-origin"],
        "https://tenant.example"
    );

    // A quota module for alpha: the builtin one, configured tighter.
    let quota =
        base64::engine::general_purpose::STANDARD.encode(aura_gateway::policy::builtin::QUOTA);
    let r = client
        .put(gw.mgmt_url("/v1/projects/alpha/policies/quota"))
        .bearer_auth(&admin)
        .json(&json!({ "module": quota, "config": { "rate_per_second": 1, "burst": 2 } }))
        .send()
        .await
        .expect("r");
    assert_eq!(r.status(), StatusCode::OK);
    let mut statuses = Vec::new();
    for _ in 0..3 {
        let r = client
            .get(gw.data_url("/v1/storage/x"))
            .header("apikey", &fx.anon_key)
            .send()
            .await
            .expect("r");
        statuses.push(r.status());
    }
    assert_eq!(
        statuses[2],
        StatusCode::TOO_MANY_REQUESTS,
        "alpha's own quota: {statuses:?}"
    );
    let r = client
        .get(gw.data_url("/v1/storage/x"))
        .header("apikey", &fx.other_project_key)
        .send()
        .await
        .expect("r");
    assert_ne!(
        r.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "another project is unaffected"
    );

    // Removing the module brings the plane's back.
    let r = client
        .delete(&url)
        .bearer_auth(&admin)
        .send()
        .await
        .expect("r");
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let r = preflight("alpha.api.test").await.expect("r");
    assert_eq!(r.headers()["access-control-allow-origin"], "*");
    let r = client
        .get(&url)
        .bearer_auth(&admin)
        .send()
        .await
        .expect("r");
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_failing_tenant_module_never_rolls_back_the_operators_modules() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fx = Fixture::new();
    let mut config = test_config(&shared().url(), &unique_prefix());
    config.plugins.rollback_min_calls = 5;
    let gw = InProcess::start_with_store(config, Arc::new(fx.file_store(dir.path()))).await;
    // A reload happened: there is a previous set of modules to roll back to.
    let reloaded =
        aura_gateway::policy::Policies::load(&gw.state.policies.runtime, &gw.state.config, None)
            .expect("policies");
    gw.state.policies.swap(reloaded);
    let in_force = gw.state.policies.snapshot();

    let client = reqwest::Client::new();
    let r = client
        .put(gw.mgmt_url("/v1/projects/alpha/policies/cors"))
        .bearer_auth(console_token(fx.admin))
        .json(&json!({ "module": testing_module(), "config": {} }))
        .send()
        .await
        .expect("r");
    assert_eq!(r.status(), StatusCode::OK);
    // Every call of alpha's module fails: alpha's requests fail closed…
    for _ in 0..40 {
        let r = client
            .get(gw.data_url("/health"))
            .header("apikey", &fx.anon_key)
            .header("origin", "https://trap.test")
            .send()
            .await
            .expect("r");
        assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
    }
    // …and nothing else changes: the operator's modules stay in force.
    assert!(
        Arc::ptr_eq(&in_force, &gw.state.policies.snapshot()),
        "a tenant module's failures rolled back the plane's modules"
    );
    assert!(
        !gw.state
            .metrics
            .render()
            .contains(r#"aura_policy_reloads_total{result="rolled_back"}"#)
    );
    let r = client
        .get(gw.data_url("/health"))
        .header("apikey", &fx.other_project_key)
        .header("origin", "https://trap.test")
        .send()
        .await
        .expect("r");
    assert_eq!(r.status(), StatusCode::OK, "another project is unaffected");
}

#[tokio::test]
async fn a_fifty_megabyte_module_is_refused_before_it_is_read_and_the_gateway_keeps_serving() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fx = Fixture::new();
    let gw = InProcess::start_with_store(
        test_config(&shared().url(), &unique_prefix()),
        Arc::new(fx.file_store(dir.path())),
    )
    .await;
    let client = reqwest::Client::new();
    let module = "A".repeat(50 * 1024 * 1024 / 3 * 4);
    let started = std::time::Instant::now();
    let r = client
        .put(gw.mgmt_url("/v1/projects/alpha/policies/quota"))
        .bearer_auth(console_token(fx.admin))
        .json(&json!({ "module": module }))
        .send()
        .await;
    // Refused with 413, or the connection closed while the client was still sending.
    if let Ok(r) = r {
        assert_eq!(r.status(), StatusCode::PAYLOAD_TOO_LARGE);
    }
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    let r = client
        .get(gw.data_url("/health"))
        .send()
        .await
        .expect("still serving");
    assert_eq!(r.status(), StatusCode::OK);
    let r = client
        .get(gw.mgmt_url("/v1/projects/alpha/policies/quota"))
        .bearer_auth(console_token(fx.admin))
        .send()
        .await
        .expect("r");
    assert_eq!(r.status(), StatusCode::NOT_FOUND, "nothing was installed");
}

/// `bytes` with a custom section of `pad` bytes appended: still a valid component.
fn padded(bytes: Vec<u8>, pad: usize) -> Vec<u8> {
    crate::support::wasm::with_custom_section(bytes, b"padding", &vec![0; pad])
}

#[tokio::test]
async fn a_module_up_to_the_configured_size_is_accepted_and_a_larger_one_gets_a_json_413() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fx = Fixture::new();
    let gw = InProcess::start_with_store(
        test_config(&shared().url(), &unique_prefix()),
        Arc::new(fx.file_store(dir.path())),
    )
    .await;
    // 3 MiB: under `plugins.tenant_max_module_bytes` (4 MiB), 4 MiB once base64 in JSON.
    let bytes =
        std::fs::read(aura_gateway::policy::builtin::TESTING_PLUGIN_PATH).expect("testing plugin");
    let upload = |module: Vec<u8>| {
        reqwest::Client::new()
            .put(gw.mgmt_url("/v1/projects/alpha/policies/cors"))
            .bearer_auth(console_token(fx.admin))
            .json(&json!({
                "module": base64::engine::general_purpose::STANDARD.encode(&module),
                "config": {},
            }))
            .send()
    };
    let r = upload(padded(bytes.clone(), 3 * 1024 * 1024))
        .await
        .expect("r");
    assert_eq!(
        r.status(),
        StatusCode::OK,
        "{}",
        r.text().await.unwrap_or_default()
    );
    // 5 MiB: over the module limit, under the body limit: the gateway's own JSON 413.
    let r = upload(padded(bytes, 5 * 1024 * 1024)).await.expect("r");
    assert_eq!(r.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let body: serde_json::Value = r.json().await.expect("a JSON error");
    assert_eq!(body["error"]["code"], "payload_too_large", "{body}");
}
