//! Tenant modules and quota rules under attack: what one project's module answers, uploads and
//! spins cannot stall Redis, grow the gateway, take its workers, or revert other changes.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use aura_gateway::planes::build_data_plane_router;
use aura_gateway::policy::Stage;
use aura_gateway::ratelimit::{QuotaLimiter, Rule};
use aura_gateway::state::AppState;
use axum::body::Body;
use axum::extract::ConnectInfo;
use base64::Engine as _;
use http::{Request, StatusCode};
use serde_json::json;
use tower::ServiceExt;

use crate::support::fixture::{CountingStore, Fixture, console_token};
use crate::support::gateway::{InProcess, Process, binary_config, metric, test_config};
use crate::support::nats_server::shared;
use crate::support::redis_server::RedisServer;
use crate::support::unique_prefix;
use crate::support::wasm;

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn testing_cors() -> Vec<u8> {
    std::fs::read(aura_gateway::policy::builtin::TESTING_PLUGIN_PATH).expect("testing plugin")
}

fn testing_quota() -> Vec<u8> {
    std::fs::read(aura_gateway::policy::builtin::TESTING_QUOTA_PLUGIN_PATH)
        .expect("testing quota plugin")
}

/// Installs `module` with `config` for `stage` of `project` through the management API.
async fn install(
    mgmt_url: &str,
    fx: &Fixture,
    project: &str,
    stage: &str,
    module: &[u8],
    config: serde_json::Value,
) -> reqwest::Response {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .expect("client")
        .put(format!("{mgmt_url}/v1/projects/{project}/policies/{stage}"))
        .bearer_auth(console_token(fx.admin))
        .json(&json!({ "module": b64(module), "config": config }))
        .send()
        .await
        .expect("upload answered")
}

/// [`install`], which must succeed.
async fn install_ok(
    mgmt_url: &str,
    fx: &Fixture,
    project: &str,
    stage: &str,
    module: &[u8],
    config: serde_json::Value,
) {
    let r = install(mgmt_url, fx, project, stage, module, config).await;
    assert_eq!(
        r.status(),
        StatusCode::OK,
        "{}",
        r.text().await.unwrap_or_default()
    );
}

async fn wait_until(what: &str, within: Duration, mut check: impl AsyncFnMut() -> bool) {
    let started = Instant::now();
    while !check().await {
        assert!(started.elapsed() < within, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn redis_conn(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("redis")
}

async fn used_memory(conn: &mut redis::aio::MultiplexedConnection) -> i64 {
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query_async(conn)
        .await
        .expect("info");
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("used_memory")
}

#[tokio::test]
async fn a_rule_of_4294967295_costs_redis_one_small_key_and_no_time() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let fx = Fixture::new();
    let config = binary_config(
        dir.path(),
        &fx,
        "",
        "nats://127.0.0.1:1",
        "hostile",
        &format!(
            "[rate_limit]\nredis_url = \"{}\"\nredis_timeout_ms = 2000\n",
            redis.url()
        ),
    );
    let gw = Process::serve(&config, dir.path());
    let client = reqwest::Client::new();
    let storage = |key: &str| {
        client
            .get(gw.data_url("/v1/storage/object/x"))
            .header("apikey", key)
            .send()
    };
    wait_until(
        "quotas shared through Redis",
        Duration::from_secs(20),
        async || {
            let _ = storage(&fx.anon_key).await;
            metric(&gw.metrics().await, "aura_ratelimit_shared", &[]) == 1.0
        },
    )
    .await;
    let mut conn = redis_conn(&redis.url()).await;
    let _: () = redis::cmd("SLOWLOG")
        .arg("RESET")
        .query_async(&mut conn)
        .await
        .expect("slowlog reset");
    let before = used_memory(&mut conn).await;

    // One tenant account: the default quota module, configured as hostile as it allows.
    let max = u64::from(u32::MAX);
    install_ok(
        &gw.mgmt_url(""),
        &fx,
        "alpha",
        "quota",
        aura_gateway::policy::builtin::QUOTA,
        json!({ "rate_per_second": max, "burst": max, "costs": { "storage": max } }),
    )
    .await;
    let started = Instant::now();
    for _ in 0..5 {
        let r = storage(&fx.anon_key).await.expect("answered");
        assert_ne!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
    }
    let took = started.elapsed();
    let ping_started = Instant::now();
    let pong: String = redis::cmd("PING")
        .query_async(&mut conn)
        .await
        .expect("Redis answers at once");
    assert_eq!(pong, "PONG");
    let ping = ping_started.elapsed();
    let grown = used_memory(&mut conn).await - before;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("aura:rl:*")
        .query_async(&mut conn)
        .await
        .expect("keys");
    let mut longest_ttl_ms = 0i64;
    for key in &keys {
        let ttl: i64 = redis::cmd("PTTL")
            .arg(key)
            .query_async(&mut conn)
            .await
            .expect("pttl");
        longest_ttl_ms = longest_ttl_ms.max(ttl);
    }
    let slowlog: Vec<redis::Value> = redis::cmd("SLOWLOG")
        .arg("GET")
        .arg(100)
        .query_async(&mut conn)
        .await
        .expect("slowlog");
    println!(
        "hostile rule: 5 requests in {:.1} ms; Redis PING {:.2} ms after, {} keys, used_memory {grown:+} bytes, longest TTL {longest_ttl_ms} ms, {} slow-log entries",
        took.as_secs_f64() * 1e3,
        ping.as_secs_f64() * 1e3,
        keys.len(),
        slowlog.len()
    );
    assert!(
        took < Duration::from_secs(2),
        "the requests waited on Redis: {took:?}"
    );
    assert!(grown < 64 * 1024, "Redis grew by {grown} bytes");
    assert!(keys.len() <= 3, "one key per bucket: {keys:?}");
    assert!(
        longest_ttl_ms <= 3_600_000,
        "a key outlives rate_limit.max_bucket_ttl_secs: {longest_ttl_ms} ms"
    );
    // Default slow-log threshold: 10 ms. Nothing the gateway ran comes near it.
    assert!(slowlog.is_empty(), "slow Redis commands: {slowlog:?}");
    let text = gw.metrics().await;
    for field in ["rate", "burst", "cost"] {
        assert!(
            metric(
                &text,
                "aura_quota_rules_clamped_total",
                &["source=\"tenant\"", &format!("field=\"{field}\"")]
            ) >= 5.0,
            "{field} clamped and counted"
        );
    }
}

#[tokio::test]
async fn the_shared_limiter_keeps_the_token_bucket_semantics() {
    let redis = RedisServer::start();
    let mut config = test_config("nats://127.0.0.1:1", "gcra").rate_limit;
    config.redis_url = Some(redis.url());
    config.redis_timeout_ms = 1_000;
    let limiter = QuotaLimiter::new(&config, aura_gateway::metrics::Metrics::new());
    let rule = |bucket: &str, cost| Rule {
        bucket: bucket.into(),
        rate_per_second: 10,
        burst: 20,
        cost,
    };
    wait_until("Redis connected", Duration::from_secs(10), async || {
        limiter.check(&rule("warm-up", 1)).await;
        limiter.is_shared()
    })
    .await;
    // A full burst at once, then nothing.
    for i in 0..20 {
        let d = limiter.check(&rule("b", 1)).await;
        assert!(d.allowed, "request {i} of the burst");
        assert_eq!(d.remaining, 19 - i);
    }
    let denied = limiter.check(&rule("b", 1)).await;
    assert!(!denied.allowed);
    assert!(
        denied.reset > Duration::ZERO && denied.reset <= Duration::from_millis(110),
        "retry after one emission interval: {:?}",
        denied.reset
    );
    // Then the rate: about 10 per second.
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let mut allowed = 0;
    for _ in 0..20 {
        allowed += u32::from(limiter.check(&rule("b", 1)).await.allowed);
    }
    assert!(
        (9..=12).contains(&allowed),
        "{allowed} admitted after 1 s at 10/s"
    );
    // A cost takes that many tokens; a cost over the burst takes the whole burst.
    assert!(limiter.check(&rule("c", 15)).await.allowed);
    assert!(!limiter.check(&rule("c", 15)).await.allowed);
    assert!(limiter.check(&rule("d", 500)).await.allowed);
    assert!(!limiter.check(&rule("d", 1)).await.allowed);
    assert!(limiter.is_shared(), "every answer came from Redis");
}

#[tokio::test]
async fn bucket_names_of_a_mebibyte_fail_closed_and_the_gateway_does_not_grow() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fx = Fixture::new();
    // Room for the module to build its 1 MiB names on a loaded machine: the refusal is the
    // host's, not a deadline.
    let config = binary_config(
        dir.path(),
        &fx,
        "",
        "nats://127.0.0.1:1",
        "names",
        "[plugins]\ncall_deadline_ms = 2000\n",
    );
    let gw = Process::serve(&config, dir.path());
    install_ok(
        &gw.mgmt_url(""),
        &fx,
        "alpha",
        "quota",
        &testing_quota(),
        json!({}),
    )
    .await;
    let client = reqwest::Client::new();
    let ask = |path: String| {
        client
            .get(gw.data_url(&path))
            .header("apikey", &fx.anon_key)
            .send()
    };
    // Warm up the path once, then measure.
    let _ = ask("/v1/functions/bucket-bytes/100".into()).await;
    let before = gw.rss_mib();
    for _ in 0..200 {
        let r = ask("/v1/functions/bucket-bytes/1048576".into())
            .await
            .expect("answered");
        assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let body: serde_json::Value = r.json().await.expect("json");
        assert_eq!(body["error"]["code"], "policy_failed");
    }
    let grown = gw.rss_mib() - before;
    println!("RSS after 200 requests naming 1 MiB buckets: {grown:+.1} MiB");
    assert!(grown < 40.0, "the gateway grew by {grown:.1} MiB");
    let text = gw.metrics().await;
    assert_eq!(
        metric(
            &text,
            "aura_quota_rules_refused_total",
            &["reason=\"bucket_name_too_long\"", "source=\"tenant\""]
        ),
        200.0
    );
    // A name within the cap is fine.
    let r = ask("/v1/functions/bucket-bytes/100".into())
        .await
        .expect("r");
    assert_ne!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
}

fn from(peer: &str, request: http::request::Builder) -> Request<Body> {
    let peer: SocketAddr = peer.parse().expect("addr");
    let mut request = request.body(Body::empty()).expect("request");
    request.extensions_mut().insert(ConnectInfo(peer));
    request
}

async fn prepare_and_apply(
    state: &AppState,
    project: &str,
    stage: Stage,
    module: &[u8],
    config: &str,
) -> String {
    let prepared = state
        .policies
        .tenants
        .prepare(project, stage, module, config)
        .await
        .expect("module accepted");
    let digest = prepared.installed.digest().to_owned();
    state
        .policies
        .tenants
        .apply(project, stage, Some(prepared.installed));
    digest
}

#[tokio::test]
async fn local_buckets_are_weighed_in_bytes_under_their_ceiling() {
    let mut config = test_config("nats://127.0.0.1:1", "weigh").rate_limit;
    config.local_buckets_max_bytes = 1 << 20;
    let limiter = QuotaLimiter::new(&config, aura_gateway::metrics::Metrics::new());
    // 20,000 distinct names of 100 bytes, as a tenant module naming a new bucket per request
    // would (about 7 MiB of buckets without a ceiling).
    for i in 0..20_000u32 {
        let rule = Rule {
            bucket: format!("t:5:alpha:{i:0>90}"),
            rate_per_second: 100,
            burst: 1000,
            cost: 1,
        };
        assert!(limiter.check(&rule).await.allowed);
    }
    let bytes = limiter.local_bytes();
    println!("local buckets after 20,000 distinct 100-byte names: {bytes} bytes");
    assert!(bytes <= 1 << 20, "{bytes} bytes over a 1 MiB ceiling");
    assert!(bytes > 900 << 10, "the buckets filled the ceiling: {bytes}");
}

#[tokio::test]
async fn a_tenant_never_draws_on_a_bucket_of_the_operator_or_another_project() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fx = Fixture::new();
    let mut config = test_config("nats://127.0.0.1:1", "names2");
    // The operator's rule: one request per key, at once.
    config.data_plane.plugins.quota.config = json!({ "rate_per_second": 1, "burst": 1 });
    let state = AppState::build_with_store(config, None, Arc::new(fx.file_store(dir.path())))
        .await
        .expect("state");
    prepare_and_apply(&state, "alpha", Stage::Quota, &testing_quota(), "{}").await;
    let router = build_data_plane_router(state.clone());
    let send = |key: &str, path: &str| {
        router.clone().oneshot(from(
            "198.51.100.2:1",
            Request::get(path).header("apikey", key),
        ))
    };
    // "other"'s key id, as the operator's module names its bucket.
    let other_id = state
        .auth
        .resolve_key(&fx.other_project_key)
        .await
        .expect("store")
        .expect("known")
        .id;
    for forged in [
        format!("key:{other_id}"),
        format!("o:key:{other_id}"),
        format!("tenant:other:key:{other_id}"),
    ] {
        let r = send(&fx.anon_key, &format!("/v1/functions/bucket/{forged}"))
            .await
            .expect("infallible");
        assert_ne!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
    }
    let r = send(&fx.other_project_key, "/v1/functions/x")
        .await
        .expect("infallible");
    assert_ne!(
        r.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "other's one request was not taken by alpha's module"
    );
}

#[tokio::test]
async fn a_spinning_tenant_module_cannot_take_the_workers_of_other_projects() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fx = Fixture::new();
    let config = binary_config(
        dir.path(),
        &fx,
        "",
        "nats://127.0.0.1:1",
        "spin",
        "[plugins]\ncall_deadline_ms = 1500\ntenant_threads = 2\ntenant_max_concurrent_calls = 1\n\n[data_plane]\nproject_host_suffix = \".api.test\"\n\n[data_plane.plugins.quota.config]\nrate_per_second = 1000000\nburst = 1000000\n",
    );
    let gw = Process::serve(&config, dir.path());
    install_ok(
        &gw.mgmt_url(""),
        &fx,
        "alpha",
        "cors",
        &testing_cors(),
        json!({}),
    )
    .await;
    let client = reqwest::Client::new();
    let spin = || {
        client
            .request(reqwest::Method::OPTIONS, gw.data_url("/v1/db/todos"))
            .header("host", "alpha.api.test")
            .header("origin", "https://loop.test")
            .header("access-control-request-method", "GET")
            .send()
    };
    let other = || {
        client
            .get(gw.data_url("/health"))
            .header("apikey", &fx.other_project_key)
            .header("origin", "https://app.example")
            .send()
    };
    assert_eq!(other().await.expect("r").status(), StatusCode::OK);

    // Four spinning calls at once, then a request of another project.
    let started = Instant::now();
    let spinners: Vec<_> = (0..4)
        .map(|_| {
            let f = spin();
            tokio::spawn(async move {
                let r = f.await.expect("answered");
                (r.status(), started.elapsed())
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let r = other().await.expect("answered");
    let other_done = started.elapsed();
    assert_eq!(r.status(), StatusCode::OK);
    let mut spun = Vec::new();
    for s in spinners {
        spun.push(s.await.expect("task"));
    }
    // The calls that ran alpha's module (the others were refused at its cap).
    let first_spinner_done = spun
        .iter()
        .filter(|(s, _)| *s == StatusCode::INTERNAL_SERVER_ERROR)
        .map(|(_, at)| *at)
        .min()
        .expect("a spinning call ran");
    println!("other project answered at {other_done:?}; spinners: {spun:?}");
    assert!(
        other_done < first_spinner_done,
        "another project waited for alpha's spinning module ({other_done:?} vs {first_spinner_done:?})"
    );
    let statuses: Vec<u16> = spun.iter().map(|(s, _)| s.as_u16()).collect();
    assert!(
        statuses.iter().all(|s| *s == 500 || *s == 503),
        "alpha's own requests fail closed: {statuses:?}"
    );
    assert!(
        statuses.contains(&503),
        "past the project's cap: 503 policy_busy"
    );

    // Sustained: alpha's module spins on every call while another project measures latency.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut load = Vec::new();
    for _ in 0..8 {
        let stop = stop.clone();
        let url = gw.data_url("/v1/db/todos");
        load.push(tokio::spawn(async move {
            let c = reqwest::Client::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = c
                    .request(reqwest::Method::OPTIONS, &url)
                    .header("host", "alpha.api.test")
                    .header("origin", "https://loop.test")
                    .header("access-control-request-method", "GET")
                    .send()
                    .await;
            }
        }));
    }
    let mut latencies = Vec::new();
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        let t = Instant::now();
        assert_eq!(other().await.expect("r").status(), StatusCode::OK);
        latencies.push(t.elapsed());
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for l in load {
        let _ = l.await;
    }
    latencies.sort();
    let at = |q: f64| latencies[((latencies.len() - 1) as f64 * q) as usize];
    println!(
        "other project while alpha's module spins: {} requests, p50 {:?}, p90 {:?}, p99 {:?}",
        latencies.len(),
        at(0.5),
        at(0.9),
        at(0.99)
    );
}

#[tokio::test]
async fn a_preflight_flood_is_limited_per_ip_before_any_module_runs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fx = Fixture::new();
    let mut config = test_config("nats://127.0.0.1:1", "preflight");
    config.data_plane.project_host_suffix = Some(".api.test".into());
    config.rate_limit.data_plane_per_ip.rate_per_second = 1;
    config.rate_limit.data_plane_per_ip.burst = 5;
    let state = AppState::build_with_store(config, None, Arc::new(fx.file_store(dir.path())))
        .await
        .expect("state");
    let digest = prepare_and_apply(&state, "alpha", Stage::Cors, &testing_cors(), "{}").await;
    let calls = || {
        metric(
            &state.metrics.render(),
            "aura_plugin_calls_total",
            &["stage=\"cors\"", &format!("digest=\"{digest}\"")],
        )
    };
    let before = calls();
    let router = build_data_plane_router(state.clone());
    let mut statuses = Vec::new();
    for _ in 0..20 {
        let r = router
            .clone()
            .oneshot(from(
                "198.51.100.3:1",
                Request::options("/v1/db/todos")
                    .header("host", "alpha.api.test")
                    .header("origin", "https://tenant.example")
                    .header("access-control-request-method", "GET"),
            ))
            .await
            .expect("infallible");
        statuses.push(r.status().as_u16());
    }
    assert_eq!(
        statuses.iter().filter(|s| **s == 204).count(),
        5,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|s| **s == 429).count(),
        15,
        "{statuses:?}"
    );
    assert_eq!(
        calls() - before,
        5.0,
        "only the admitted preflights reached the module"
    );
}

/// A gateway binary with `plugins` settings, and its management URL.
fn compiling_gateway(dir: &std::path::Path, fx: &Fixture, plugins: &str) -> Process {
    let config = binary_config(
        dir,
        fx,
        "",
        "nats://127.0.0.1:1",
        "compile",
        &format!("[plugins]\n{plugins}\n"),
    );
    Process::serve(&config, dir)
}

#[tokio::test]
async fn a_slow_compile_is_stopped_at_its_time_limit_and_remembered() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fx = Fixture::new();
    let gw = compiling_gateway(dir.path(), &fx, "tenant_max_compile_ms = 2000");
    let before = gw.rss_mib();
    let mgmt = gw.mgmt_url("");
    let started = Instant::now();
    let r = install(
        &mgmt,
        &fx,
        "alpha",
        "cors",
        &wasm::slow_to_compile(),
        json!({}),
    )
    .await;
    let took = started.elapsed();
    let status = r.status();
    let body: serde_json::Value = r.json().await.expect("json");
    println!("slow module answered in {took:?}: {body}");
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["code"], "policy_refused");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("longer than 2000 ms")),
        "{body}"
    );
    assert!(
        took < Duration::from_secs(6),
        "stopped while compiling: {took:?}"
    );

    // The same module again: refused at once, not compiled again.
    let started = Instant::now();
    let r = install(
        &mgmt,
        &fx,
        "alpha",
        "cors",
        &wasm::slow_to_compile(),
        json!({}),
    )
    .await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert!(started.elapsed() < Duration::from_secs(1), "remembered");
    let text = gw.metrics().await;
    assert_eq!(
        metric(&text, "aura_tenant_compiles_total", &["result=\"timeout\""]),
        1.0
    );
    assert!(
        metric(
            &text,
            "aura_tenant_compiles_total",
            &["result=\"remembered\""]
        ) >= 1.0
    );
    let grown = gw.rss_mib() - before;
    println!("gateway RSS after the slow upload: {grown:+.1} MiB");
    assert!(
        grown < 40.0,
        "the gateway grew by {grown:.1} MiB while compiling"
    );
}

#[tokio::test]
async fn a_memory_hungry_compile_is_stopped_at_its_memory_limit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fx = Fixture::new();
    let gw = compiling_gateway(
        dir.path(),
        &fx,
        "tenant_max_compile_ms = 60000\ntenant_max_compile_memory_bytes = 268435456",
    );
    let before = gw.rss_mib();
    let started = Instant::now();
    let r = install(
        &gw.mgmt_url(""),
        &fx,
        "alpha",
        "cors",
        &wasm::memory_hungry(),
        json!({}),
    )
    .await;
    let took = started.elapsed();
    let body: serde_json::Value = r.json().await.expect("json");
    println!("memory-hungry module answered in {took:?}: {body}");
    assert_eq!(body["error"]["code"], "policy_refused", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("memory")),
        "{body}"
    );
    let text = gw.metrics().await;
    assert_eq!(
        metric(&text, "aura_tenant_compiles_total", &["result=\"memory\""]),
        1.0
    );
    let grown = gw.rss_mib() - before;
    println!("gateway RSS after the memory-hungry upload: {grown:+.1} MiB");
    assert!(
        grown < 40.0,
        "the gateway grew by {grown:.1} MiB while compiling"
    );
}

#[tokio::test]
async fn forty_parallel_uploads_keep_the_gateway_small() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fx = Fixture::new();
    let config = binary_config(dir.path(), &fx, "", "nats://127.0.0.1:1", "uploads", "");
    let gw = Process::serve(&config, dir.path());
    let before = gw.rss_mib();
    let mgmt = gw.mgmt_url("");
    // Forty different modules: the same component with a different custom section.
    let mut uploads = Vec::new();
    for i in 0..40u8 {
        // A different digest, the same component.
        let module = wasm::with_custom_section(testing_cors(), b"pad", &[i]);
        let (mgmt, fx) = (mgmt.clone(), fx.clone());
        uploads.push(tokio::spawn(async move {
            let r = install(&mgmt, &fx, "alpha", "cors", &module, json!({})).await;
            let status = r.status();
            let body: serde_json::Value = r.json().await.unwrap_or_default();
            (status, body)
        }));
    }
    let mut accepted = 0;
    let mut busy = 0;
    let mut peak = 0.0f64;
    for u in uploads {
        let (status, body) = u.await.expect("task");
        peak = peak.max(gw.rss_mib());
        match status {
            StatusCode::OK => accepted += 1,
            StatusCode::SERVICE_UNAVAILABLE => {
                assert_eq!(body["error"]["code"], "uploads_busy", "{body}");
                busy += 1;
            }
            other => panic!("unexpected {other}: {body}"),
        }
    }
    let grown = gw.rss_mib() - before;
    println!(
        "40 parallel uploads: {accepted} accepted, {busy} busy; RSS {grown:+.1} MiB (peak seen {:+.1})",
        peak - before
    );
    assert!(accepted >= 1);
    assert!(grown < 60.0, "the gateway grew by {grown:.1} MiB");
}

#[tokio::test]
async fn a_module_refused_at_refresh_is_compiled_once_not_every_refresh() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fx = Fixture::new();
    let module = wasm::slow_to_compile();
    // Written into the store directly, as another instance with other limits could have.
    let record = crate::support::gateway::stored_cors_module(dir.path(), "alpha", &module);
    let config = binary_config(
        dir.path(),
        &fx,
        &record,
        "nats://127.0.0.1:1",
        "refresh",
        "[plugins]\ntenant_refresh_secs = 1\ntenant_max_compile_ms = 1000\n",
    );
    let gw = Process::serve(&config, dir.path());
    tokio::time::sleep(Duration::from_secs(5)).await;
    let text = gw.metrics().await;
    let compiled = metric(&text, "aura_tenant_compiles_total", &["result=\"timeout\""]);
    assert_eq!(compiled, 1.0, "compiled once in five refreshes");
    let r = crate::support::gateway::cors_probe(&gw, &fx.anon_key).await;
    assert_eq!(
        r.status(),
        StatusCode::OK,
        "alpha falls back to the plane's module"
    );
    assert_eq!(r.headers()["access-control-allow-origin"], "*");
}

#[tokio::test]
async fn unused_module_files_and_their_metric_series_are_collected() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fx = Fixture::new();
    let config = binary_config(
        dir.path(),
        &fx,
        "",
        "nats://127.0.0.1:1",
        "gc",
        "[plugins]\nmodule_gc_interval_secs = 1\nmodule_gc_grace_secs = 1\n",
    );
    let gw = Process::serve(&config, dir.path());
    let mgmt = gw.mgmt_url("");
    let first = testing_cors();
    let first_digest = aura_gateway::policy::tenants::digest_of(&first);
    assert_eq!(
        install(&mgmt, &fx, "alpha", "cors", &first, json!({}))
            .await
            .status(),
        StatusCode::OK
    );
    let file = dir.path().join(format!("modules/{first_digest}.wasm"));
    assert!(file.is_file());
    assert!(
        gw.metrics().await.contains(&first_digest),
        "the module's series exist"
    );
    // Replaced by another module: the first is no longer used by anyone.
    let second = aura_gateway::policy::builtin::CORS;
    let second_digest = aura_gateway::policy::tenants::digest_of(second);
    assert_eq!(
        install(&mgmt, &fx, "alpha", "cors", second, json!({}))
            .await
            .status(),
        StatusCode::OK
    );
    let _ = reqwest::Client::new()
        .get(gw.data_url("/health"))
        .header("apikey", &fx.anon_key)
        .header("origin", "https://a.example")
        .send()
        .await;
    wait_until(
        "the unused module file collected",
        Duration::from_secs(10),
        async || !file.exists(),
    )
    .await;
    assert!(
        dir.path()
            .join(format!("modules/{second_digest}.wasm"))
            .is_file()
    );
    let text = gw.metrics().await;
    assert!(
        !text.contains(&first_digest),
        "the replaced module's series are gone"
    );
    assert!(text.contains(&second_digest));
    assert!(metric(&text, "aura_modules_collected_total", &[]) >= 1.0);
}

#[tokio::test]
async fn a_put_or_delete_made_during_a_refresh_is_never_reverted_by_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fx = Fixture::new();
    let store = Arc::new(CountingStore::new(Arc::new(fx.file_store(dir.path()))));
    let mut config = test_config(&shared().url(), &unique_prefix());
    config.plugins.tenant_refresh_secs = 1;
    config.data_plane.project_host_suffix = Some(".api.test".into());
    let gw = InProcess::start_with_store(config, store.clone()).await;
    let client = reqwest::Client::new();
    let preflight = || async {
        client
            .request(reqwest::Method::OPTIONS, gw.data_url("/v1/db/todos"))
            .header("host", "alpha.api.test")
            .header("origin", "https://tenant.example")
            .header("access-control-request-method", "GET")
            .send()
            .await
            .expect("r")
            .headers()
            .get("access-control-allow-origin")
            .map(|v| v.to_str().unwrap_or_default().to_owned())
    };
    assert_eq!(preflight().await.as_deref(), Some("*"));

    // A refresh has read the store (no module yet) and is held; the PUT lands meanwhile.
    let release = store.hold_next_policy_read().await;
    let r = install(
        &gw.mgmt_url(""),
        &fx,
        "alpha",
        "cors",
        &testing_cors(),
        json!({}),
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(preflight().await.as_deref(), Some("https://tenant.example"));
    release.send(()).expect("release");
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(
        preflight().await.as_deref(),
        Some("https://tenant.example"),
        "the stale refresh did not revert the PUT"
    );

    // The same with a DELETE.
    let release = store.hold_next_policy_read().await;
    let r = client
        .delete(gw.mgmt_url("/v1/projects/alpha/policies/cors"))
        .bearer_auth(console_token(fx.admin))
        .send()
        .await
        .expect("r");
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    release.send(()).expect("release");
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(
        preflight().await.as_deref(),
        Some("*"),
        "the stale refresh did not bring the deleted module back"
    );
}
