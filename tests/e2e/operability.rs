//! Metrics and readiness.

use aura_gateway::policy::builtin::TESTING_PLUGIN_PATH;
use reqwest::StatusCode;

use crate::support::gateway::{InProcess, client, test_config};
use crate::support::nats_server::shared;
use crate::support::unique_prefix;

const TOKEN: &str = "test-metrics-token-0123456789";

#[tokio::test]
async fn metrics_cover_requests_breakers_limits_plugins_and_nats() {
    let mut config = test_config(&shared().url(), &unique_prefix());
    config.data_plane.plugins.cors.module = TESTING_PLUGIN_PATH.into();
    let gw = InProcess::start(config).await;
    let c = client();
    assert_eq!(
        c.get(gw.data_url("/health"))
            .send()
            .await
            .expect("r")
            .status(),
        StatusCode::OK
    );
    let r = c
        .get(gw.data_url("/health"))
        .header("origin", "https://trap.test")
        .send()
        .await
        .expect("r");
    assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let _ = c.get(gw.data_url("/v1/auth/user")).send().await.expect("r");

    let unauthorized = reqwest::get(gw.data_url("/metrics")).await.expect("r");
    assert_eq!(unauthorized.status(), StatusCode::UNAUTHORIZED);
    let text = c
        .get(gw.data_url("/metrics"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("r")
        .text()
        .await
        .expect("body");
    for needle in [
        r#"aura_http_requests_total{group="gateway",plane="data",status="200"}"#,
        "aura_http_request_duration_seconds_bucket{group=\"auth\",plane=\"data\"",
        r#"aura_breaker_state{breaker="functions"} 0"#,
        r#"aura_ratelimit_decisions_total{decision="allowed",limiter="ip",plane="data"}"#,
        r#"aura_ratelimit_decisions_total{decision="allowed",limiter="actor",plane="data"}"#,
        "aura_ratelimit_shared 0",
        r#"aura_plugin_calls_total{digest="#,
        r#"kind="trap",plane="data",stage="cors"}"#,
        "aura_plugin_call_duration_seconds_bucket",
        "aura_nats_connected 1",
    ] {
        assert!(text.contains(needle), "missing {needle} in:\n{text}");
    }
}

#[tokio::test]
async fn ready_reports_dependencies_and_fails_while_a_required_one_is_down() {
    let gw = InProcess::start(test_config(&shared().url(), &unique_prefix())).await;
    let r = reqwest::get(gw.mgmt_url("/ready")).await.expect("r");
    assert_eq!(r.status(), StatusCode::OK);
    let body: serde_json::Value = r.json().await.expect("json");
    assert_eq!(body["status"], "ready");
    assert_eq!(body["checks"]["nats"], "up");
    assert_eq!(body["checks"]["control_store"], "up");
    assert_eq!(body["checks"]["redis"], "not_configured");

    let dead_nats = format!("nats://127.0.0.1:{}", crate::support::free_port());
    let mut config = test_config(&dead_nats, &unique_prefix());
    config.rate_limit.redis_url = Some(format!(
        "redis://127.0.0.1:{}/",
        crate::support::free_port()
    ));
    let gw = InProcess::start(config).await;
    let r = reqwest::get(gw.mgmt_url("/ready")).await.expect("r");
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    let body: serde_json::Value = r.json().await.expect("json");
    assert_eq!(body["error"]["code"], "not_ready");
    assert_eq!(body["checks"]["nats"], "down");
    assert_eq!(body["checks"]["redis"], "down");
    // Liveness is not readiness.
    assert_eq!(
        reqwest::get(gw.data_url("/health"))
            .await
            .expect("r")
            .status(),
        StatusCode::OK
    );
}
