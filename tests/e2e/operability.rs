//! Metrics and readiness.

use aura_gateway::policy::stages::builtin::TESTING_PLUGIN_PATH;
use reqwest::StatusCode;

use crate::support::builder::Gateway;
use crate::support::call::{Call, IntoCall, client};
use crate::support::config::{METRICS_TOKEN, binary, binary_config, compile_cache};
use crate::support::metrics::metric;

#[tokio::test]
async fn metrics_cover_requests_breakers_limits_plugins_and_nats() {
    let gw = Gateway::start_with(|c| c.data_plane.plugins.cors.module = TESTING_PLUGIN_PATH.into());
    let gw = gw.await;
    let c = client();
    let health = || c.get(gw.data_url("/health")).call();
    assert_eq!(health().status().await, StatusCode::OK);
    let trap = health().origin("https://trap.test").status().await;
    assert_eq!(trap, StatusCode::INTERNAL_SERVER_ERROR);
    let _ = c.get(gw.data_url("/v1/auth/user")).call().send().await;

    let unauthorized = Call::get(gw.data_url("/metrics")).status().await;
    assert_eq!(unauthorized, StatusCode::UNAUTHORIZED);
    let metrics = c.get(gw.data_url("/metrics")).call().bearer(METRICS_TOKEN);
    let text = metrics.read().await.text();
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
    let gw = Gateway::start().await;
    let body = Call::get(gw.mgmt_url("/ready"))
        .expect(StatusCode::OK)
        .await
        .json();
    assert_eq!(body["status"], "ready");
    assert_eq!(body["checks"]["nats"], "up");
    assert_eq!(body["checks"]["control_store"], "up");
    assert_eq!(body["checks"]["redis"], "not_configured");

    let dead_nats = format!("nats://127.0.0.1:{}", crate::support::free_port());
    let dead_redis = format!("redis://127.0.0.1:{}/", crate::support::free_port());
    let gw = Gateway::with(|c| c.rate_limit.redis_url = Some(dead_redis));
    let gw = gw.nats(dead_nats).start().await;
    let ready = Call::get(gw.mgmt_url("/ready"));
    let r = ready.expect(StatusCode::SERVICE_UNAVAILABLE).await;
    let body = r.json();
    assert_eq!(body["error"]["code"], "not_ready");
    assert_eq!(body["checks"]["nats"], "down");
    assert_eq!(body["checks"]["redis"], "down");
    // Liveness is not readiness.
    assert_eq!(
        Call::get(gw.data_url("/health")).status().await,
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
    let config = binary_config(dir.path(), &fx, "", "nats://127.0.0.1:1", "logs", "");
    let (port, management) = (crate::support::free_port(), crate::support::free_port());
    // stderr is a pipe this test never reads: once its buffer is full, every write blocks.
    let mut child = Command::new(binary())
        .args(["serve", "--config"])
        .arg(&config)
        .env("AURA_PORT", port.to_string())
        .env("AURA_MANAGEMENT_PORT", management.to_string())
        .env("AURA_LOG__BUFFER_LINES", "100")
        // About logs, not plugin deadlines: a loaded test machine must not fail a call.
        .env("AURA_PLUGINS__CALL_DEADLINE_MS", "2000")
        .env("AURA_PLUGINS__COMPILE_CACHE_DIR", compile_cache())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let _unread = child.stderr.take();
    let started = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        let running = child.try_wait().ok().flatten().is_none();
        let starting = started.elapsed() < Duration::from_secs(60) && running;
        assert!(starting, "gateway did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let client = reqwest::Client::new();
    let url = format!("http://127.0.0.1:{port}/health");
    // Far more access lines than a pipe holds (about 64 KiB, a few hundred lines).
    let started = Instant::now();
    let mut slowest = Duration::ZERO;
    for _ in 0..3_000 {
        let t = Instant::now();
        let health = tokio::time::timeout(Duration::from_secs(5), client.get(&url).send());
        let r = health.await.expect("a request stalled behind the log");
        assert_eq!(r.expect("answered").status(), StatusCode::OK);
        slowest = slowest.max(t.elapsed());
    }
    let took = started.elapsed();
    let metrics = client
        .get(format!("http://127.0.0.1:{port}/metrics"))
        .call();
    let text = metrics.bearer(METRICS_TOKEN).read().await.text();
    let dropped = metric(&text, "aura_log_lines_dropped_total", &[]);
    println!(
        "3,000 requests with an unread log pipe in {took:?} (slowest {slowest:?}); {dropped} lines dropped"
    );
    assert!(dropped > 0.0, "lines that did not fit were counted");
    let _ = child.kill();
    let _ = child.wait();
}
