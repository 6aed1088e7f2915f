//! `/v1/admin/*`: what is in force on one instance, through the real binary.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::support::fixture::{CONSOLE_SECRET, Fixture, USER_SECRET, console_token};
use crate::support::gateway::{METRICS_TOKEN, Process, serve_binary};

const ADMIN_TOKEN: &str = "admin-token-0123456789abcdef";

async fn call(
    url: &str,
    method: Method,
    token: Option<&str>,
    body: Option<serde_json::Value>,
) -> (StatusCode, serde_json::Value) {
    let mut request = reqwest::Client::new()
        .request(method, url)
        .timeout(Duration::from_secs(10));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    let r = request.send().await.expect("answer");
    let status = r.status();
    (status, r.json().await.unwrap_or(serde_json::Value::Null))
}

/// `GET path` on the management plane with the admin token: the JSON of its `200`.
async fn admin_get(gw: &Process, path: &str) -> serde_json::Value {
    let (status, answer) = call(&gw.mgmt_url(path), Method::GET, Some(ADMIN_TOKEN), None).await;
    assert_eq!(status, StatusCode::OK, "{path}: {answer}");
    answer
}

#[tokio::test]
async fn admin_routes_answer_the_admin_token_only_and_only_on_the_management_plane() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fx = Fixture::new();
    // Project alpha has a CORS module of its own.
    let module =
        std::fs::read(aura_gateway::policy::builtin::TESTING_PLUGIN_PATH).expect("testing plugin");
    let record = crate::support::gateway::stored_cors_module(dir.path(), "alpha", &module);
    // Storage refuses connections: its breaker opens after five failures.
    let gw = serve_binary(
        dir.path(),
        &fx,
        &record,
        &format!(
            "[admin]\ntoken = \"{ADMIN_TOKEN}\"\n\n[upstreams]\nstorage_url = \"http://127.0.0.1:1\"\n\n[breaker]\nfailure_threshold = 5\nopen_ms = 60000\n"
        ),
    );
    let routes = [
        (Method::GET, "/v1/admin/status", None),
        (Method::GET, "/v1/admin/policies", None),
        (Method::GET, "/v1/admin/breakers", None),
        (Method::GET, "/v1/admin/config", None),
        (
            Method::PUT,
            "/v1/admin/log-level",
            Some(json!({ "level": "info" })),
        ),
    ];
    let console = console_token(fx.admin);
    for (method, path, body) in &routes {
        for (who, token) in [
            ("no token", None),
            ("a wrong token", Some("admin-token-0123456789abcdeX")),
            (
                "an organization admin's console JWT",
                Some(console.as_str()),
            ),
            ("the metrics token", Some(METRICS_TOKEN)),
        ] {
            let (status, answer) =
                call(&gw.mgmt_url(path), method.clone(), token, body.clone()).await;
            assert_eq!(
                status,
                StatusCode::UNAUTHORIZED,
                "{path} with {who}: {answer}"
            );
            assert_eq!(answer["error"]["code"], "invalid_admin_token", "{path}");
        }
        // Never on the data plane, whatever the credentials.
        let r = reqwest::Client::new()
            .request(method.clone(), gw.data_url(path))
            .header("apikey", &fx.anon_key)
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .expect("r");
        // A management route does not exist there: `404` before any credential is looked at.
        assert_eq!(
            r.status(),
            StatusCode::NOT_FOUND,
            "{path} on the data plane: {}",
            r.status()
        );
    }

    // Status.
    let answer = admin_get(&gw, "/v1/admin/status").await;
    assert_eq!(answer["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(answer["build_profile"], "debug");
    assert!(answer["uptime_secs"].as_u64().is_some(), "{answer}");
    let digest = answer["config_digest"].as_str().expect("digest");
    assert!(
        digest.len() == 64 && digest.bytes().all(|b| b.is_ascii_hexdigit()),
        "{answer}"
    );
    let revision = answer["git_revision"].as_str().expect("revision");
    assert!(!revision.is_empty(), "{answer}");

    // Policies: each stage's module with its figures, and alpha's own module.
    for _ in 0..20 {
        let r = crate::support::gateway::cors_probe(&gw, &fx.anon_key).await;
        assert_eq!(r.status(), StatusCode::OK);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let answer = admin_get(&gw, "/v1/admin/policies").await;
    let data = &answer["planes"]["data"];
    for stage in ["api_key", "cors", "quota", "db_routing"] {
        let m = &data[stage];
        assert_eq!(m["name"], "builtin", "{stage}: {answer}");
        assert_eq!(m["digest"].as_str().map(str::len), Some(64), "{stage}");
        assert_eq!(m["failures"], 0, "{stage}");
        assert!(m["loaded_at"].as_u64().is_some(), "{stage}");
    }
    let api_key = &data["api_key"];
    assert!(api_key["calls"].as_u64().expect("calls") >= 20, "{answer}");
    let (p50, p99) = (
        api_key["p50_us"].as_f64().expect("p50"),
        api_key["p99_us"].as_f64().expect("p99"),
    );
    assert!(p50 > 0.0 && p99 >= p50, "{answer}");
    assert!(
        answer["planes"]["management"]["api_key"].is_null(),
        "{answer}"
    );
    assert!(answer["rollback_candidate"].is_null(), "{answer}");
    let alpha = &answer["projects"]["alpha"]["cors"];
    assert_eq!(
        alpha["digest"],
        aura_gateway::policy::tenants::digest_of(&module),
        "{answer}"
    );
    assert_eq!(alpha["name"], "tenant:alpha", "{answer}");
    assert!(alpha["calls"].as_u64().expect("calls") >= 1, "{answer}");

    // Breakers: every service listed, storage opened by five refused connections.
    let before = admin_get(&gw, "/v1/admin/breakers").await;
    let storage = |answer: &serde_json::Value| {
        answer["services"]
            .as_array()
            .expect("services")
            .iter()
            .find(|b| b["name"] == "storage")
            .cloned()
            .expect("storage breaker listed")
    };
    for service in ["auth", "storage", "functions", "realtime", "control"] {
        assert!(
            before["services"]
                .as_array()
                .expect("services")
                .iter()
                .any(|b| b["name"] == service && b["state"] == "closed"),
            "{service}: {before}"
        );
    }
    assert_eq!(storage(&before)["last_change"], serde_json::Value::Null);
    for _ in 0..5 {
        let r = reqwest::Client::new()
            .get(gw.data_url("/v1/storage/object/a.txt"))
            .header("apikey", &fx.anon_key)
            .send()
            .await
            .expect("r");
        assert_eq!(r.status(), StatusCode::BAD_GATEWAY);
    }
    let after = admin_get(&gw, "/v1/admin/breakers").await;
    let opened = storage(&after);
    assert_eq!(opened["state"], "open", "{after}");
    assert!(opened["last_change"].as_u64().is_some(), "{after}");

    // Config: effective, with every secret redacted.
    let r = reqwest::Client::new()
        .get(gw.mgmt_url("/v1/admin/config"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .expect("r");
    assert_eq!(r.status(), StatusCode::OK);
    let text = r.text().await.expect("body");
    for secret in [ADMIN_TOKEN, METRICS_TOKEN, CONSOLE_SECRET, USER_SECRET] {
        assert!(!text.contains(secret), "a secret in /v1/admin/config");
    }
    let answer: serde_json::Value = serde_json::from_str(&text).expect("json");
    assert_eq!(answer["admin"]["token"], "[redacted]");
    assert_eq!(answer["metrics"]["token"], "[redacted]");
    assert_eq!(answer["auth"]["console_jwt"]["hs256_secret"], "[redacted]");
    assert_eq!(answer["upstreams"]["storage_url"], "http://127.0.0.1:1");
    assert_eq!(answer["breaker"]["failure_threshold"], 5);

    // Log level: access lines stop at `warn` and come back at `info`, without a restart.
    let log_level_url = gw.mgmt_url("/v1/admin/log-level");
    let log_level = |level: &'static str| {
        let url = log_level_url.clone();
        async move {
            call(
                &url,
                Method::PUT,
                Some(ADMIN_TOKEN),
                Some(json!({ "level": level })),
            )
            .await
        }
    };
    let (status, answer) = log_level("warn").await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let _ = reqwest::get(gw.data_url("/v1/nothing-while-warn")).await;
    let (status, _) = log_level("info").await;
    assert_eq!(status, StatusCode::OK);
    let _ = reqwest::get(gw.data_url("/v1/nothing-while-info")).await;
    let mut logged = String::new();
    for _ in 0..50 {
        logged = gw.log_text();
        if logged.contains("nothing-while-info") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(logged.contains("nothing-while-info"), "access line at info");
    assert!(
        !logged.contains("nothing-while-warn"),
        "no access line at warn"
    );
    let (status, answer) = log_level("info,=[").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert_eq!(answer["error"]["code"], "invalid_log_level");
    let (status, answer) = call(
        &gw.mgmt_url("/v1/admin/log-level"),
        Method::PUT,
        Some(ADMIN_TOKEN),
        Some(json!({ "lvl": 1 })),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
}

#[tokio::test]
async fn without_a_token_configured_the_admin_routes_do_not_exist() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fx = Fixture::new();
    let gw = serve_binary(dir.path(), &fx, "", "");
    let (status, answer) = call(
        &gw.mgmt_url("/v1/admin/status"),
        Method::GET,
        Some(ADMIN_TOKEN),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{answer}");
}
