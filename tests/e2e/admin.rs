//! `/v1/admin/*`: what is in force on one instance, through the real binary; the effective
//! configuration never shows a secret carried in a URL's query. The management plane's routes do
//! not exist on the data plane, and a console user's database calls keep the console token in
//! the gateway and reach only allow-listed PostgREST targets.

use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::builder::{Gateway, Started};
use crate::support::call::{Call, IntoCall};
use crate::support::config::{FLEET_SECRET, METRICS_TOKEN};
use crate::support::edge::Edge;
use crate::support::fixture::{CONSOLE_SECRET, Fixture, USER_SECRET, console_token};
use crate::support::gateway::Process;
use crate::support::policy::{cors_probe, digest, testing_cors};
use crate::support::poll::poll_tries;
use crate::support::postgres::{TestDatabase, control_table};
use crate::support::raw::{get, status_of};
use crate::support::records::stored_cors_module;

const ADMIN_TOKEN: &str = "admin-token-0123456789abcdef";

/// `method url` with `token` as bearer and `body` as JSON (when given), given up after 10 s:
/// the status and the JSON body (`null` when it is not JSON).
async fn call(
    url: &str,
    method: Method,
    token: Option<&str>,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let mut call = Call::new(method, url).timeout(Duration::from_secs(10));
    if let Some(token) = token {
        call = call.bearer(token);
    }
    if let Some(body) = body {
        call = call.json(&body);
    }
    call.read().await.parts()
}

/// `GET path` on the management plane with the admin token: the JSON of its `200`.
async fn admin_get(gw: &Process, path: &str) -> Value {
    let (status, answer) = call(&gw.mgmt_url(path), Method::GET, Some(ADMIN_TOKEN), None).await;
    assert_eq!(status, StatusCode::OK, "{path}: {answer}");
    answer
}

/// The breakers `/v1/admin/breakers` lists.
fn breakers(answer: &Value) -> &Vec<Value> {
    answer["services"].as_array().expect("services")
}

#[tokio::test]
async fn admin_routes_answer_the_admin_token_only_and_only_on_the_management_plane() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Project alpha has a CORS module of its own.
    let module = testing_cors();
    let record = stored_cors_module(dir.path(), "alpha", &module);
    // Storage refuses connections: its breaker opens after five failures.
    let gw = Gateway::builder().dir(dir.path()).records(record).toml(format!(
        "[admin]\ntoken = \"{ADMIN_TOKEN}\"\n\n[upstreams]\nstorage_url = \"http://127.0.0.1:1\"\n\n[breaker]\nfailure_threshold = 5\nopen_ms = 60000\n"
    ));
    let Started { gw, fx, .. } = gw.binary();
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
            let url = gw.mgmt_url(path);
            let (status, answer) = call(&url, method.clone(), token, body.clone()).await;
            assert_eq!(
                status,
                StatusCode::UNAUTHORIZED,
                "{path} with {who}: {answer}"
            );
            assert_eq!(answer["error"]["code"], "invalid_admin_token", "{path}");
        }
        // Never on the data plane, whatever the credentials.
        let r = Call::new(method.clone(), gw.data_url(path)).key(&fx.anon_key);
        let status = r.bearer(ADMIN_TOKEN).status().await;
        // A management route does not exist there: `404` before any credential is looked at.
        assert_eq!(
            status,
            StatusCode::NOT_FOUND,
            "{path} on the data plane: {status}"
        );
    }

    // Status.
    let answer = admin_get(&gw, "/v1/admin/status").await;
    assert_eq!(answer["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(answer["build_profile"], "debug");
    assert!(answer["uptime_secs"].as_u64().is_some(), "{answer}");
    let config_digest = answer["config_digest"].as_str().expect("digest");
    let hex = config_digest.bytes().all(|b| b.is_ascii_hexdigit());
    assert!(config_digest.len() == 64 && hex, "{answer}");
    let revision = answer["git_revision"].as_str().expect("revision");
    assert!(!revision.is_empty(), "{answer}");

    // Policies: each stage's module with its figures, and alpha's own module.
    for _ in 0..20 {
        let r = cors_probe(gw.data_url("/health"), &fx.anon_key).await;
        assert_eq!(r.status, StatusCode::OK);
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
    let p50 = api_key["p50_us"].as_f64().expect("p50");
    let p99 = api_key["p99_us"].as_f64().expect("p99");
    assert!(p50 > 0.0 && p99 >= p50, "{answer}");
    let management = answer["planes"]["management"]["api_key"].is_null();
    assert!(management, "{answer}");
    assert!(answer["rollback_candidate"].is_null(), "{answer}");
    let alpha = &answer["projects"]["alpha"]["cors"];
    assert_eq!(alpha["digest"], digest(&module), "{answer}");
    assert_eq!(alpha["name"], "tenant:alpha", "{answer}");
    assert!(alpha["calls"].as_u64().expect("calls") >= 1, "{answer}");

    // Breakers: every service listed, storage opened by five refused connections.
    let before = admin_get(&gw, "/v1/admin/breakers").await;
    let storage = |answer: &Value| {
        let storage = breakers(answer).iter().find(|b| b["name"] == "storage");
        storage.cloned().expect("storage breaker listed")
    };
    for service in ["auth", "storage", "functions", "realtime", "control"] {
        let closed = |b: &Value| b["name"] == service && b["state"] == "closed";
        assert!(breakers(&before).iter().any(closed), "{service}: {before}");
    }
    assert_eq!(storage(&before)["last_change"], Value::Null);
    for _ in 0..5 {
        let object = Call::get(gw.data_url("/v1/storage/object/a.txt")).key(&fx.anon_key);
        assert_eq!(object.status().await, StatusCode::BAD_GATEWAY);
    }
    let after = admin_get(&gw, "/v1/admin/breakers").await;
    let opened = storage(&after);
    assert_eq!(opened["state"], "open", "{after}");
    assert!(opened["last_change"].as_u64().is_some(), "{after}");

    // Config: effective, with every secret redacted.
    let config = Call::get(gw.mgmt_url("/v1/admin/config")).bearer(ADMIN_TOKEN);
    let text = config.expect(StatusCode::OK).await.text();
    for secret in [ADMIN_TOKEN, METRICS_TOKEN, CONSOLE_SECRET, USER_SECRET] {
        assert!(!text.contains(secret), "a secret in /v1/admin/config");
    }
    let answer: Value = serde_json::from_str(&text).expect("json");
    assert_eq!(answer["admin"]["token"], "[redacted]");
    assert_eq!(answer["metrics"]["token"], "[redacted]");
    assert_eq!(answer["auth"]["console_jwt"]["hs256_secret"], "[redacted]");
    assert_eq!(answer["upstreams"]["storage_url"], "http://127.0.0.1:1");
    assert_eq!(answer["breaker"]["failure_threshold"], 5);

    // Log level: access lines stop at `warn` and come back at `info`, without a restart.
    let log_level_url = gw.mgmt_url("/v1/admin/log-level");
    let log_level =
        async |body: Value| call(&log_level_url, Method::PUT, Some(ADMIN_TOKEN), Some(body)).await;
    let (status, answer) = log_level(json!({ "level": "warn" })).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let _ = Call::get(gw.data_url("/v1/nothing-while-warn"))
        .try_send()
        .await;
    assert_eq!(
        log_level(json!({ "level": "info" })).await.0,
        StatusCode::OK
    );
    let _ = Call::get(gw.data_url("/v1/nothing-while-info"))
        .try_send()
        .await;
    let mut logged = String::new();
    let _ = poll_tries(50, Duration::from_millis(50), async || {
        logged = gw.log_text();
        logged.contains("nothing-while-info").then_some(())
    })
    .await;
    assert!(logged.contains("nothing-while-info"), "access line at info");
    let at_warn = logged.contains("nothing-while-warn");
    assert!(!at_warn, "no access line at warn");
    let (status, answer) = log_level(json!({ "level": "info,=[" })).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert_eq!(answer["error"]["code"], "invalid_log_level");
    let (status, answer) = log_level(json!({ "lvl": 1 })).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
}

#[tokio::test]
async fn without_a_token_configured_the_admin_routes_do_not_exist() {
    let Started { gw, .. } = Gateway::builder().binary();
    let status = gw.mgmt_url("/v1/admin/status");
    let (status, answer) = call(&status, Method::GET, Some(ADMIN_TOKEN), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{answer}");
}

/// A password given as `?password=` in the database URL used to be shown by
/// `/v1/admin/config`.
#[tokio::test]
async fn the_effective_configuration_never_shows_a_secret_in_a_url_query() {
    let fx = Fixture::new();
    let (db, _store) = TestDatabase::seeded(&fx).await;
    // Trust authentication on the test server: the password is carried, not checked.
    let url = format!(
        "{}?password=hunter2-query-secret&application_name=aura",
        db.url
    );
    let store = control_table(&url);
    let admin = format!("\n[admin]\ntoken = \"{ADMIN_TOKEN}\"\n");
    let Started { gw, .. } = Gateway::builder()
        .fixture(&fx)
        .toml(store + &admin)
        .binary();
    let config = Call::get(gw.mgmt_url("/v1/admin/config")).bearer(ADMIN_TOKEN);
    let text = config.expect(StatusCode::OK).await.text();
    assert!(!text.contains("hunter2-query-secret"), "{text}");
    let redacted = text.contains("password=[redacted]&application_name=aura");
    assert!(redacted, "{text}");
    assert!(!text.contains(FLEET_SECRET), "{text}");
}

/// The management plane's own routes answered `401` on the data plane (the API key check ran
/// first); they do not exist there: `404`, whatever the credentials.
#[tokio::test]
async fn management_routes_do_not_exist_on_the_data_plane() {
    let admin = format!(
        "[admin]\ntoken = \"{ADMIN_TOKEN}\"\n\n[plugins]\nadmin_token = \"{ADMIN_TOKEN}\"\n"
    );
    let Started { gw, fx, dir: _dir } = Gateway::builder().toml(admin).binary();
    let c = reqwest::Client::new();
    for path in [
        "/v1/admin/config",
        "/v1/admin/status",
        "/v1/policies/reload",
        "/ready",
        "/v1/projects/alpha",
        "/v1/organizations/x/projects",
    ] {
        for key in [None, Some(fx.anon_key.as_str())] {
            let mut request = c.get(gw.data_url(path)).call().bearer(ADMIN_TOKEN);
            if let Some(key) = key {
                request = request.key(key);
            }
            let r = request.read().await;
            assert_eq!(r.status, StatusCode::NOT_FOUND, "{path} with key {key:?}");
            assert_eq!(r.json()["error"]["code"], "not_found", "{path}");
        }
    }
    // Where they live, they answer.
    let status = c
        .get(gw.mgmt_url("/v1/admin/status"))
        .call()
        .bearer(ADMIN_TOKEN);
    status.expect(StatusCode::OK).await;
}

#[tokio::test]
async fn the_console_token_stays_in_the_gateway_and_targets_are_allow_listed() {
    let edge = Edge::start("").await;
    let console = console_token(edge.fx.admin);
    let as_admin = |path: &str| {
        let call = Call::get(edge.gw.mgmt_url(path)).bearer(&console);
        call.header("x-aura-project", "ded")
    };
    as_admin("/v1/db/todos?select=*")
        .expect(StatusCode::OK)
        .await;
    let seen = edge.postgrest.last().expect("forwarded to ded's PostgREST");
    let reached = seen.one("authorization").is_some();
    assert!(!reached, "the console token reached PostgREST");
    assert_eq!(seen.one("x-aura-org-role").as_deref(), Some("admin"));
    // Over NATS the console token is still the backend's to see.
    assert_eq!(as_admin("/v1/db/sql").status().await, StatusCode::OK);

    // A dedicated target outside upstreams.postgrest_allowed_targets is never called.
    let started = Instant::now();
    let far = format!("{}_far", edge.ded_key);
    let todos = Call::get(edge.gw.data_url("/v1/db/todos")).key(far);
    let r = todos.expect(StatusCode::SERVICE_UNAVAILABLE).await;
    assert_eq!(r.code(), "db_target_not_allowed");
    let tried = started.elapsed() >= Duration::from_secs(1);
    assert!(!tried, "no connection was tried");

    // A path parameter that is not UTF-8 once decoded: the contract's JSON error.
    let bearer = format!("Bearer {console}");
    let raw = get(
        "/v1/projects/alpha/policies/%FF",
        &[("authorization", &bearer)],
    );
    let answer = edge.mgmt(raw).await;
    assert_eq!(status_of(&answer), 400, "{answer}");
    assert!(answer.contains("application/json"), "{answer}");
    assert!(answer.contains("\"invalid_path\""), "{answer}");
}
