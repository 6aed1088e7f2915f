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

/// A log reader that stops reading (a stuck collector, a full pipe) never stalls requests: the
/// lines that do not fit the writer's queue are dropped and counted.
#[tokio::test]
async fn a_stalled_log_reader_never_stalls_requests_and_dropped_lines_are_counted() {
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};

    let dir = tempfile::tempdir().expect("tempdir");
    let fx = crate::support::fixture::Fixture::new();
    let config = crate::support::gateway::binary_config(
        dir.path(),
        &fx,
        "",
        "nats://127.0.0.1:1",
        "logs",
        "",
    );
    let (port, management) = (crate::support::free_port(), crate::support::free_port());
    // stderr is a pipe this test never reads: once its buffer is full, every write blocks.
    let mut child = Command::new(crate::support::gateway::binary())
        .args(["serve", "--config"])
        .arg(&config)
        .env("AURA_PORT", port.to_string())
        .env("AURA_MANAGEMENT_PORT", management.to_string())
        .env("AURA_LOG__BUFFER_LINES", "100")
        // About logs, not plugin deadlines: a loaded test machine must not fail a call.
        .env("AURA_PLUGINS__CALL_DEADLINE_MS", "2000")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let _unread = child.stderr.take();
    let started = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(60)
                && child.try_wait().ok().flatten().is_none(),
            "gateway did not start"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let client = reqwest::Client::new();
    let url = format!("http://127.0.0.1:{port}/health");
    // Far more access lines than a pipe holds (about 64 KiB, a few hundred lines).
    let started = Instant::now();
    let mut slowest = Duration::ZERO;
    for _ in 0..3_000 {
        let t = Instant::now();
        let r = tokio::time::timeout(Duration::from_secs(5), client.get(&url).send())
            .await
            .expect("a request stalled behind the log")
            .expect("answered");
        assert_eq!(r.status(), StatusCode::OK);
        slowest = slowest.max(t.elapsed());
    }
    let took = started.elapsed();
    let text = client
        .get(format!("http://127.0.0.1:{port}/metrics"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    let dropped = crate::support::gateway::metric(&text, "aura_log_lines_dropped_total", &[]);
    println!(
        "3,000 requests with an unread log pipe in {took:?} (slowest {slowest:?}); {dropped} lines dropped"
    );
    assert!(dropped > 0.0, "lines that did not fit were counted");
    let _ = child.kill();
    let _ = child.wait();
}
