//! Per-project policy modules installed through the management plane.

use std::sync::Arc;

use reqwest::StatusCode;
use serde_json::json;

use crate::support::builder::Gateway;
use crate::support::call::Call;
use crate::support::fixture::{Fixture, console_token};
use crate::support::policy::{Policies, b64, testing_cors};

#[tokio::test]
async fn a_tenant_installs_its_own_cors_and_quota_modules_and_other_projects_are_unaffected() {
    let fx = Fixture::new();
    let gw = Gateway::with(|c| c.data_plane.project_host_suffix = Some(".api.test".into()));
    let gw = gw.fixture(&fx).start().await;
    let admin = Policies::new(gw.mgmt_url(""), console_token(fx.admin));
    let module = b64(&testing_cors());

    // A module that traps on every call is refused at upload, with the reason.
    let trapping = json!({ "module": module, "config": { "trap_always": true } });
    let (status, body) = admin.put("cors", trapping).await.parts();
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["code"], "policy_refused");
    let message = body["error"]["message"].as_str().expect("message");
    assert!(message.contains("conformance"), "{body}");

    // A developer may not install modules.
    let developer = Policies::new(gw.mgmt_url(""), console_token(fx.developer));
    let r = developer.put("cors", json!({ "module": module })).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);

    let r = admin
        .put("cors", json!({ "module": module, "config": {} }))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let installed = admin.get("cors").await.json();
    assert_eq!(installed["digest"].as_str().map(str::len), Some(64));

    let preflight = |host: &'static str| {
        let url = gw.data_url("/v1/db/todos");
        Call::preflight(url, "https://tenant.example")
            .host(host)
            .read()
    };
    let r = preflight("alpha.api.test").await;
    let allowed = &r.headers["access-control-allow-origin"];
    assert_eq!(allowed, "https://tenant.example", "alpha's module");
    assert_eq!(r.headers["access-control-allow-headers"], "x-testing");
    let r = preflight("beta.api.test").await;
    let allowed = &r.headers["access-control-allow-origin"];
    assert_eq!(allowed, "*", "beta keeps the plane's module");

    // An actual request of alpha (known by its key) follows alpha's module too.
    let health = Call::get(gw.data_url("/health")).key(&fx.anon_key);
    let r = health.origin("https://tenant.example").read().await;
    let allowed = &r.headers["access-control-allow-origin"];
    assert_eq!(allowed, "https://tenant.example");

    // A quota module for alpha: the builtin one, configured tighter.
    let quota = aura_gateway::policy::builtin::QUOTA;
    let tight = json!({ "rate_per_second": 1, "burst": 2 });
    assert_eq!(
        admin.install("quota", quota, tight).await.status,
        StatusCode::OK
    );
    let storage = |key: &str| Call::get(gw.data_url("/v1/storage/x")).key(key).status();
    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(storage(&fx.anon_key).await);
    }
    let limited = statuses[2] == StatusCode::TOO_MANY_REQUESTS;
    assert!(limited, "alpha's own quota: {statuses:?}");
    let other = storage(&fx.other_project_key).await;
    assert_ne!(
        other,
        StatusCode::TOO_MANY_REQUESTS,
        "another project is unaffected"
    );

    // Removing the module brings the plane's back.
    assert_eq!(admin.delete("cors").await.status, StatusCode::NO_CONTENT);
    let r = preflight("alpha.api.test").await;
    assert_eq!(r.headers["access-control-allow-origin"], "*");
    assert_eq!(admin.get("cors").await.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_failing_tenant_module_never_rolls_back_the_operators_modules() {
    let fx = Fixture::new();
    let gw = Gateway::with(|c| c.plugins.rollback_min_calls = 5);
    let gw = gw.fixture(&fx).start().await;
    // A reload happened: there is a previous set of modules to roll back to.
    let policies = &gw.state.policies;
    let reloaded = aura_gateway::policy::Policies::load(&policies.runtime, &gw.state.config, None);
    policies.swap(reloaded.expect("policies"));
    let in_force = policies.snapshot();

    let admin = Policies::new(gw.mgmt_url(""), console_token(fx.admin));
    let installed = admin.install("cors", &testing_cors(), json!({})).await;
    assert_eq!(installed.status, StatusCode::OK);
    // Every call of alpha's module fails: alpha's requests fail closed…
    let trap = |key: &str| {
        let health = Call::get(gw.data_url("/health")).key(key);
        health.origin("https://trap.test").status()
    };
    for _ in 0..40 {
        assert_eq!(trap(&fx.anon_key).await, StatusCode::INTERNAL_SERVER_ERROR);
    }
    // …and nothing else changes: the operator's modules stay in force.
    let kept = Arc::ptr_eq(&in_force, &policies.snapshot());
    assert!(
        kept,
        "a tenant module's failures rolled back the plane's modules"
    );
    let metrics = gw.state.metrics.render();
    assert!(!metrics.contains(r#"aura_policy_reloads_total{result="rolled_back"}"#));
    let other = trap(&fx.other_project_key).await;
    assert_eq!(other, StatusCode::OK, "another project is unaffected");
}

#[tokio::test]
async fn a_fifty_megabyte_module_is_refused_before_it_is_read_and_the_gateway_keeps_serving() {
    let fx = Fixture::new();
    let gw = Gateway::builder().fixture(&fx).start().await;
    let admin = Policies::new(gw.mgmt_url(""), console_token(fx.admin));
    let module = "A".repeat(50 * 1024 * 1024 / 3 * 4);
    let started = std::time::Instant::now();
    let upload = admin.call(reqwest::Method::PUT, "quota", "");
    let r = upload.json(&json!({ "module": module })).try_send().await;
    // Refused with 413, or the connection closed while the client was still sending.
    if let Ok(r) = r {
        assert_eq!(r.status(), StatusCode::PAYLOAD_TOO_LARGE);
    }
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    let health = Call::get(gw.data_url("/health")).status().await;
    assert_eq!(health, StatusCode::OK, "still serving");
    let quota = admin.get("quota").await.status;
    assert_eq!(quota, StatusCode::NOT_FOUND, "nothing was installed");
}

/// `bytes` with a custom section of `pad` bytes appended: still a valid component.
fn padded(bytes: Vec<u8>, pad: usize) -> Vec<u8> {
    crate::support::wasm::with_custom_section(bytes, b"padding", &vec![0; pad])
}

#[tokio::test]
async fn a_module_up_to_the_configured_size_is_accepted_and_a_larger_one_gets_a_json_413() {
    let fx = Fixture::new();
    let gw = Gateway::builder().fixture(&fx).start().await;
    let admin = Policies::new(gw.mgmt_url(""), console_token(fx.admin));
    // 3 MiB: under `plugins.tenant_max_module_bytes` (4 MiB), 4 MiB once base64 in JSON.
    let upload = async |module: Vec<u8>| admin.install("cors", &module, json!({})).await;
    let r = upload(padded(testing_cors(), 3 * 1024 * 1024)).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    // 5 MiB: over the module limit, under the body limit: the gateway's own JSON 413.
    let r = upload(padded(testing_cors(), 5 * 1024 * 1024)).await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE);
    let body = r.json();
    assert_eq!(body["error"]["code"], "payload_too_large", "{body}");
}
