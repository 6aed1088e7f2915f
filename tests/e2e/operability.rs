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

/// The access log in JSON is one object per line whatever a client put in its path: quotes,
/// backslashes and escapes cannot end a line or forge a field. Each line has the documented
/// fields, the request id the client was answered with and the key's id, never the key; a line
/// logged while the request was processed (its backend's failure) names the same request.
#[tokio::test]
async fn access_lines_in_json_are_one_object_each_whatever_the_path_holds() {
    use std::time::Duration;

    use crate::support::gateway::Process;
    use crate::support::raw::{exchange, get};

    let dir = tempfile::tempdir().expect("tempdir");
    let fx = crate::support::fixture::Fixture::new();
    let config = binary_config(dir.path(), &fx, "", "nats://127.0.0.1:1", "logs", "");
    let gw = Process::serve_with(&config, dir.path(), |command| {
        command
            .env("AURA_LOG__FORMAT", "json")
            // Nothing listens there: each request logs its backend's failure.
            .env("AURA_UPSTREAMS__STORAGE_URL", "http://127.0.0.1:1")
            .env("AURA_PLUGINS__COMPILE_CACHE_DIR", compile_cache());
    });
    let hostile = [
        r#"/v1/storage/object/a"b"#,
        r"/v1/storage/object/a\b",
        r#"/v1/storage/object/x","status":999,"y":"#,
        "/v1/storage/object/%0a%22forged",
        "/v1/storage/object/é",
    ];
    let mut sent = Vec::new();
    for path in hostile {
        let answer = exchange(gw.port, get(path, &[("apikey", &fx.anon_key)])).await;
        let id = answer
            .lines()
            .find_map(|l| l.strip_prefix("x-request-id: "))
            .map(str::to_owned);
        sent.push((path, id, answer));
    }
    let mut lines = Vec::new();
    let all_logged = crate::support::poll::poll_tries(100, Duration::from_millis(50), async || {
        let log = gw.log_text();
        lines = log
            .lines()
            .map(|l| (l.to_owned(), serde_json::from_str::<serde_json::Value>(l)))
            .collect::<Vec<_>>();
        let access = lines
            .iter()
            .filter(|(_, v)| v.as_ref().is_ok_and(|v| v["target"] == "aura::access"))
            .count();
        (access >= sent.iter().filter(|(_, _, a)| reached_the_chain(a)).count()).then_some(())
    })
    .await;
    assert!(all_logged.is_some(), "{:?}", lines);
    for (line, parsed) in &lines {
        assert!(parsed.is_ok(), "not one JSON object: {line:?}");
    }
    let access: Vec<&serde_json::Value> = lines
        .iter()
        .filter_map(|(_, v)| v.as_ref().ok())
        .filter(|v| v["target"] == "aura::access")
        .collect();
    let mut checked = 0;
    for (path, id, answer) in &sent {
        let id = id.as_ref().expect("every answer has a request id");
        if !reached_the_chain(answer) {
            // A path refused before the phases that log (a backslash, an encoded control
            // character): `400 invalid_path`, no access line.
            assert!(answer.contains("invalid_path"), "{path}: {answer}");
            assert!(!access.iter().any(|v| v["request_id"] == id.as_str()));
            continue;
        }
        let line = access
            .iter()
            .find(|v| v["request_id"] == id.as_str())
            .unwrap_or_else(|| panic!("no access line for {path} ({id}) in {access:?}"));
        assert_eq!(line["path"], *path, "{line}");
        assert_eq!(line["method"], "GET");
        assert_eq!(line["plane"], "data");
        assert_eq!(line["group"], "storage");
        assert_eq!(line["role"], "anon");
        assert_eq!(line["key_id"], fx.anon_key_id.to_string());
        assert_eq!(line["level"], "INFO");
        assert_eq!(line["message"], "access");
        let status = line["status"].as_u64().expect("a number");
        assert_eq!(answer.split(' ').nth(1), Some(status.to_string().as_str()));
        assert!(line["latency_us"].is_u64(), "{line}");
        let stamp = line["timestamp"].as_str().expect("a timestamp");
        assert!(stamp.len() == 27 && stamp.ends_with('Z'), "{stamp}");
        let failed = lines
            .iter()
            .filter_map(|(_, v)| v.as_ref().ok())
            .find(|v| v["message"] == "HTTP backend failed" && v["request_id"] == id.as_str());
        assert!(failed.is_some(), "no backend failure named {id}: {lines:?}");
        checked += 1;
    }
    assert!(
        checked >= 3,
        "most hostile paths reach the chain ({checked})"
    );

    /// Whether an answer came from the chain (not a path refused before it).
    fn reached_the_chain(answer: &str) -> bool {
        !answer.starts_with("HTTP/1.1 400")
    }
    let log = gw.log_text();
    assert!(!log.contains(&fx.anon_key), "the key is never logged");
}
