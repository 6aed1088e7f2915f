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
use http::{Request, StatusCode};
use serde_json::json;
use tower::ServiceExt;

use crate::support::builder::{Gateway, Started};
use crate::support::call::IntoCall;
use crate::support::config::test_config;
use crate::support::fixture::{CountingStore, Fixture, console_token};
use crate::support::gateway::Process;
use crate::support::metrics::metric;
use crate::support::policy::{Policies, cors_probe, digest, testing_cors, testing_quota};
use crate::support::poll::wait_until;
use crate::support::redis_server::RedisServer;
use crate::support::wasm;

/// The fixture's admin on `gw`'s alpha, uploads given up after a minute.
fn admin(gw_mgmt: String, fx: &Fixture) -> Policies {
    Policies::new(gw_mgmt, console_token(fx.admin)).timeout(Duration::from_secs(60))
}

/// A gateway binary off NATS (subject prefix `prefix`) with `toml`.
fn offline(prefix: &str, toml: &str) -> Started {
    let gw = Gateway::builder().nats("nats://127.0.0.1:1").prefix(prefix);
    gw.toml(toml).binary()
}

async fn redis_conn(url: &str) -> redis::aio::MultiplexedConnection {
    let client = redis::Client::open(url).expect("url");
    client
        .get_multiplexed_async_connection()
        .await
        .expect("redis")
}

/// `command` with `args` on `conn`.
async fn redis<T: redis::FromRedisValue>(
    conn: &mut redis::aio::MultiplexedConnection,
    command: &str,
    args: &[&str],
) -> T {
    let mut cmd = redis::cmd(command);
    cmd.arg(args);
    cmd.query_async(conn).await.expect(command)
}

async fn used_memory(conn: &mut redis::aio::MultiplexedConnection) -> i64 {
    let info: String = redis(conn, "INFO", &["memory"]).await;
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("used_memory")
}

#[tokio::test]
async fn a_rule_of_4294967295_costs_redis_one_small_key_and_no_time() {
    let redis_server = RedisServer::start();
    let redis_url = redis_server.url();
    let Started { gw, fx, dir: _dir } = offline(
        "hostile",
        &format!("[rate_limit]\nredis_url = \"{redis_url}\"\nredis_timeout_ms = 2000\n"),
    );
    let client = reqwest::Client::new();
    let storage = |key: &str| {
        client
            .get(gw.data_url("/v1/storage/object/x"))
            .call()
            .key(key)
    };
    wait_until(
        "quotas shared through Redis",
        Duration::from_secs(20),
        async || {
            let _ = storage(&fx.anon_key).try_send().await;
            metric(&gw.metrics().await, "aura_ratelimit_shared", &[]) == 1.0
        },
    )
    .await;
    let mut conn = redis_conn(&redis_url).await;
    let () = redis(&mut conn, "SLOWLOG", &["RESET"]).await;
    let before = used_memory(&mut conn).await;

    // One tenant account: the default quota module, configured as hostile as it allows.
    let max = u64::from(u32::MAX);
    let hostile = json!({ "rate_per_second": max, "burst": max, "costs": { "storage": max } });
    let quota = aura_gateway::policy::builtin::QUOTA;
    admin(gw.mgmt_url(""), &fx)
        .install_ok("quota", quota, hostile)
        .await;
    let started = Instant::now();
    for _ in 0..5 {
        let status = storage(&fx.anon_key).status().await;
        assert_ne!(status, StatusCode::INTERNAL_SERVER_ERROR);
    }
    let took = started.elapsed();
    let ping_started = Instant::now();
    let pong: String = redis(&mut conn, "PING", &[]).await;
    assert_eq!(pong, "PONG", "Redis answers at once");
    let ping = ping_started.elapsed();
    let grown = used_memory(&mut conn).await - before;
    let keys: Vec<String> = redis(&mut conn, "KEYS", &["aura:rl:*"]).await;
    let mut longest_ttl_ms = 0i64;
    for key in &keys {
        longest_ttl_ms = longest_ttl_ms.max(redis(&mut conn, "PTTL", &[key]).await);
    }
    let slowlog: Vec<redis::Value> = redis(&mut conn, "SLOWLOG", &["GET", "100"]).await;
    println!(
        "hostile rule: 5 requests in {:.1} ms; Redis PING {:.2} ms after, {} keys, used_memory {grown:+} bytes, longest TTL {longest_ttl_ms} ms, {} slow-log entries",
        took.as_secs_f64() * 1e3,
        ping.as_secs_f64() * 1e3,
        keys.len(),
        slowlog.len()
    );
    let waited = took >= Duration::from_secs(2);
    assert!(!waited, "the requests waited on Redis: {took:?}");
    assert!(grown < 64 * 1024, "Redis grew by {grown} bytes");
    assert!(keys.len() <= 3, "one key per bucket: {keys:?}");
    let outlives = longest_ttl_ms > 3_600_000;
    assert!(
        !outlives,
        "a key outlives rate_limit.max_bucket_ttl_secs: {longest_ttl_ms} ms"
    );
    // Default slow-log threshold: 10 ms. Nothing the gateway ran comes near it.
    assert!(slowlog.is_empty(), "slow Redis commands: {slowlog:?}");
    let text = gw.metrics().await;
    for field in ["rate", "burst", "cost"] {
        let labels = ["source=\"tenant\"", &format!("field=\"{field}\"")];
        let clamped = metric(&text, "aura_quota_rules_clamped_total", &labels);
        assert!(clamped >= 5.0, "{field} clamped and counted");
    }
}

#[tokio::test]
async fn the_shared_limiter_keeps_the_token_bucket_semantics() {
    let redis = RedisServer::start();
    let mut config = test_config("nats://127.0.0.1:1", "gcra").rate_limit;
    (config.redis_url, config.redis_timeout_ms) = (Some(redis.url()), 1_000);
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
    let (reset, interval) = (denied.reset, Duration::from_millis(110));
    let one_interval = reset > Duration::ZERO && reset <= interval;
    assert!(one_interval, "retry after one emission interval: {reset:?}");
    // Then the rate: about 10 per second.
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let mut allowed = 0;
    for _ in 0..20 {
        allowed += u32::from(limiter.check(&rule("b", 1)).await.allowed);
    }
    let about_ten = (9..=12).contains(&allowed);
    assert!(about_ten, "{allowed} admitted after 1 s at 10/s");
    // A cost takes that many tokens; a cost over the burst takes the whole burst.
    assert!(limiter.check(&rule("c", 15)).await.allowed);
    assert!(!limiter.check(&rule("c", 15)).await.allowed);
    assert!(limiter.check(&rule("d", 500)).await.allowed);
    assert!(!limiter.check(&rule("d", 1)).await.allowed);
    assert!(limiter.is_shared(), "every answer came from Redis");
}

#[tokio::test]
async fn bucket_names_of_a_mebibyte_fail_closed_and_the_gateway_does_not_grow() {
    // Room for the module to build its 1 MiB names on a loaded machine: the refusal is the
    // host's, not a deadline.
    let Started { gw, fx, dir: _dir } = offline("names", "[plugins]\ncall_deadline_ms = 2000\n");
    let quota = testing_quota();
    admin(gw.mgmt_url(""), &fx)
        .install_ok("quota", &quota, json!({}))
        .await;
    let client = reqwest::Client::new();
    let ask = |bytes: usize| {
        let path = format!("/v1/functions/bucket-bytes/{bytes}");
        client.get(gw.data_url(&path)).call().key(&fx.anon_key)
    };
    // Warm up the path once, then measure.
    let _ = ask(100).try_send().await;
    let before = gw.rss_mib();
    for _ in 0..200 {
        let r = ask(1_048_576)
            .expect(StatusCode::INTERNAL_SERVER_ERROR)
            .await;
        assert_eq!(r.code(), "policy_failed");
    }
    let grown = gw.rss_mib() - before;
    println!("RSS after 200 requests naming 1 MiB buckets: {grown:+.1} MiB");
    assert!(grown < 40.0, "the gateway grew by {grown:.1} MiB");
    let text = gw.metrics().await;
    let labels = ["reason=\"bucket_name_too_long\"", "source=\"tenant\""];
    let refused = metric(&text, "aura_quota_rules_refused_total", &labels);
    assert_eq!(refused, 200.0);
    // A name within the cap is fine.
    assert_ne!(ask(100).status().await, StatusCode::INTERNAL_SERVER_ERROR);
}

fn from(peer: &str, request: http::request::Builder) -> Request<Body> {
    let peer: SocketAddr = peer.parse().expect("addr");
    let mut request = request.body(Body::empty()).expect("request");
    request.extensions_mut().insert(ConnectInfo(peer));
    request
}

/// The state of a gateway over `fx`'s records with `config`, with `module` in force for
/// `stage` of alpha; and its digest.
async fn with_module(
    config: aura_gateway::config::Config,
    fx: &Fixture,
    stage: Stage,
    module: &[u8],
) -> (AppState, String, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Arc::new(fx.file_store(dir.path()));
    let state = AppState::build_with_store(config, None, store);
    let state = state.await.expect("state");
    let tenants = &state.policies.tenants;
    let prepared = tenants.prepare("alpha", stage, module, "{}").await;
    let prepared = prepared.expect("module accepted");
    let digest = prepared.installed.digest().to_owned();
    tenants.apply("alpha", stage, Some(prepared.installed));
    (state, digest, dir)
}

#[tokio::test]
async fn local_buckets_are_weighed_in_bytes_under_their_ceiling() {
    let mut config = test_config("nats://127.0.0.1:1", "weigh").rate_limit;
    config.local_buckets_max_bytes = 1 << 20;
    let limiter = QuotaLimiter::new(&config, aura_gateway::metrics::Metrics::new());
    // 20,000 distinct names of 100 bytes, as a tenant module naming a new bucket per request
    // would (about 7 MiB of buckets without a ceiling).
    for i in 0..20_000u32 {
        let bucket = format!("t:5:alpha:{i:0>90}");
        let rule = Rule {
            bucket,
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
    let fx = Fixture::new();
    let mut config = test_config("nats://127.0.0.1:1", "names2");
    // The operator's rule: one request per key, at once.
    config.data_plane.plugins.quota.config = json!({ "rate_per_second": 1, "burst": 1 });
    let quota = testing_quota();
    let (state, _, _dir) = with_module(config, &fx, Stage::Quota, &quota).await;
    let router = build_data_plane_router(state.clone());
    let send = |key: &str, path: &str| {
        let request = Request::get(path).header("apikey", key);
        router.clone().oneshot(from("198.51.100.2:1", request))
    };
    // "other"'s key id, as the operator's module names its bucket.
    let other = state.auth.resolve_key(&fx.other_project_key).await;
    let other_id = other.expect("store").expect("known").id;
    for forged in [
        format!("key:{other_id}"),
        format!("o:key:{other_id}"),
        format!("tenant:other:key:{other_id}"),
    ] {
        let path = format!("/v1/functions/bucket/{forged}");
        let r = send(&fx.anon_key, &path).await.expect("infallible");
        assert_ne!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
    }
    let r = send(&fx.other_project_key, "/v1/functions/x").await;
    let limited = r.expect("infallible").status() == StatusCode::TOO_MANY_REQUESTS;
    assert!(
        !limited,
        "other's one request was not taken by alpha's module"
    );
}

#[tokio::test]
async fn a_spinning_tenant_module_cannot_take_the_workers_of_other_projects() {
    let Started { gw, fx, dir: _dir } = offline(
        "spin",
        "[plugins]\ncall_deadline_ms = 1500\ntenant_threads = 2\ntenant_max_concurrent_calls = 1\n\n[data_plane]\nproject_host_suffix = \".api.test\"\n\n[data_plane.plugins.quota.config]\nrate_per_second = 1000000\nburst = 1000000\n",
    );
    let cors = testing_cors();
    admin(gw.mgmt_url(""), &fx)
        .install_ok("cors", &cors, json!({}))
        .await;
    let client = reqwest::Client::new();
    let url = gw.data_url("/v1/db/todos");
    let spin = || {
        let preflight = client.request(reqwest::Method::OPTIONS, &url);
        let preflight = preflight
            .header("host", "alpha.api.test")
            .header("origin", "https://loop.test");
        preflight
            .header("access-control-request-method", "GET")
            .send()
    };
    let other = || {
        let health = client
            .get(gw.data_url("/health"))
            .header("apikey", &fx.other_project_key);
        health.header("origin", "https://app.example").send()
    };
    assert_eq!(other().await.expect("r").status(), StatusCode::OK);

    // Four spinning calls at once, then a request of another project.
    let started = Instant::now();
    let spinners: Vec<_> = (0..4)
        .map(|_| {
            let f = spin();
            tokio::spawn(async move { (f.await.expect("answered").status(), started.elapsed()) })
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
    let ran = spun
        .iter()
        .filter(|(s, _)| *s == StatusCode::INTERNAL_SERVER_ERROR);
    let first_spinner_done = ran.map(|(_, at)| *at).min().expect("a spinning call ran");
    println!("other project answered at {other_done:?}; spinners: {spun:?}");
    assert!(
        other_done < first_spinner_done,
        "another project waited for alpha's spinning module ({other_done:?} vs {first_spinner_done:?})"
    );
    let statuses: Vec<u16> = spun.iter().map(|(s, _)| s.as_u16()).collect();
    let closed = statuses.iter().all(|s| *s == 500 || *s == 503);
    assert!(closed, "alpha's own requests fail closed: {statuses:?}");
    let busy = statuses.contains(&503);
    assert!(busy, "past the project's cap: 503 policy_busy");

    // Sustained: alpha's module spins on every call while another project measures latency.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut load = Vec::new();
    for _ in 0..8 {
        let (stop, url) = (stop.clone(), url.clone());
        load.push(tokio::spawn(async move {
            let c = reqwest::Client::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let preflight = c.request(reqwest::Method::OPTIONS, &url).call();
                let preflight = preflight.host("alpha.api.test").origin("https://loop.test");
                let _ = preflight
                    .header("access-control-request-method", "GET")
                    .try_send()
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
    let fx = Fixture::new();
    let mut config = test_config("nats://127.0.0.1:1", "preflight");
    config.data_plane.project_host_suffix = Some(".api.test".into());
    config.rate_limit.data_plane_per_ip.rate_per_second = 1;
    config.rate_limit.data_plane_per_ip.burst = 5;
    let cors = testing_cors();
    let (state, digest, _dir) = with_module(config, &fx, Stage::Cors, &cors).await;
    let calls = || {
        let labels = ["stage=\"cors\"", &format!("digest=\"{digest}\"")];
        metric(&state.metrics.render(), "aura_plugin_calls_total", &labels)
    };
    let before = calls();
    let router = build_data_plane_router(state.clone());
    let mut statuses = Vec::new();
    for _ in 0..20 {
        let preflight = Request::options("/v1/db/todos").header("host", "alpha.api.test");
        let preflight = preflight.header("origin", "https://tenant.example");
        let preflight = preflight.header("access-control-request-method", "GET");
        let r = router
            .clone()
            .oneshot(from("198.51.100.3:1", preflight))
            .await;
        statuses.push(r.expect("infallible").status().as_u16());
    }
    let count = |status: u16| statuses.iter().filter(|s| **s == status).count();
    assert_eq!(count(204), 5, "{statuses:?}");
    assert_eq!(count(429), 15, "{statuses:?}");
    let reached = calls() - before;
    assert_eq!(
        reached, 5.0,
        "only the admitted preflights reached the module"
    );
}

/// A gateway binary with `plugins` settings, and its management URL.
fn compiling_gateway(plugins: &str) -> Started {
    offline("compile", &format!("[plugins]\n{plugins}\n"))
}

#[tokio::test]
async fn a_slow_compile_is_stopped_at_its_time_limit_and_remembered() {
    let Started { gw, fx, dir: _dir } = compiling_gateway("tenant_max_compile_ms = 2000");
    let before = gw.rss_mib();
    let admin = admin(gw.mgmt_url(""), &fx);
    let (status, body, took) = timed_install(&admin, &wasm::slow_to_compile()).await;
    println!("slow module answered in {took:?}: {body}");
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["code"], "policy_refused");
    let message = body["error"]["message"].as_str();
    let named = message.is_some_and(|m| m.contains("longer than 2000 ms"));
    assert!(named, "{body}");
    assert!(
        took < Duration::from_secs(6),
        "stopped while compiling: {took:?}"
    );

    // The same module again: refused at once, not compiled again.
    let started = Instant::now();
    let r = admin
        .install("cors", &wasm::slow_to_compile(), json!({}))
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(started.elapsed() < Duration::from_secs(1), "remembered");
    let text = gw.metrics().await;
    let compiles = |result: &str| {
        let label = format!("result=\"{result}\"");
        metric(&text, "aura_tenant_compiles_total", &[&label])
    };
    assert_eq!(compiles("timeout"), 1.0);
    assert!(compiles("remembered") >= 1.0);
    compiled_in_little_memory(&gw, before, "slow");
}

/// Installs `module` as alpha's CORS module: the status, the JSON body, and how long it took.
async fn timed_install(
    admin: &Policies,
    module: &[u8],
) -> (StatusCode, serde_json::Value, Duration) {
    let started = Instant::now();
    let r = admin.install("cors", module, json!({})).await;
    (r.status, r.json(), started.elapsed())
}

/// The gateway grew by less than 40 MiB since `before` while compiling the `what` upload.
fn compiled_in_little_memory(gw: &Process, before: f64, what: &str) {
    let grown = gw.rss_mib() - before;
    println!("gateway RSS after the {what} upload: {grown:+.1} MiB");
    assert!(
        grown < 40.0,
        "the gateway grew by {grown:.1} MiB while compiling"
    );
}

#[tokio::test]
async fn a_memory_hungry_compile_is_stopped_at_its_memory_limit() {
    let Started { gw, fx, dir: _dir } = compiling_gateway(
        "tenant_max_compile_ms = 60000\ntenant_max_compile_memory_bytes = 268435456",
    );
    let before = gw.rss_mib();
    let admin = admin(gw.mgmt_url(""), &fx);
    let (_, body, took) = timed_install(&admin, &wasm::memory_hungry()).await;
    println!("memory-hungry module answered in {took:?}: {body}");
    assert_eq!(body["error"]["code"], "policy_refused", "{body}");
    let message = body["error"]["message"].as_str();
    assert!(message.is_some_and(|m| m.contains("memory")), "{body}");
    let text = gw.metrics().await;
    let labels = ["result=\"memory\""];
    assert_eq!(metric(&text, "aura_tenant_compiles_total", &labels), 1.0);
    compiled_in_little_memory(&gw, before, "memory-hungry");
}

#[tokio::test]
async fn forty_parallel_uploads_keep_the_gateway_small() {
    let Started { gw, fx, dir: _dir } = offline("uploads", "");
    let before = gw.rss_mib();
    let admin = admin(gw.mgmt_url(""), &fx);
    // Forty different modules: the same component with a different custom section.
    let mut uploads = Vec::new();
    for i in 0..40u8 {
        // A different digest, the same component.
        let module = wasm::with_custom_section(testing_cors(), b"pad", &[i]);
        let admin = admin.clone();
        uploads.push(tokio::spawn(async move {
            let r = admin.install("cors", &module, json!({})).await;
            (r.status, r.json_or_null())
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
    let module = wasm::slow_to_compile();
    // Written into the store directly, as another instance with other limits could have.
    let record = crate::support::records::stored_cors_module(dir.path(), "alpha", &module);
    let gw = Gateway::builder()
        .nats("nats://127.0.0.1:1")
        .prefix("refresh")
        .dir(dir.path());
    let gw = gw
        .records(record)
        .toml("[plugins]\ntenant_refresh_secs = 1\ntenant_max_compile_ms = 1000\n");
    let Started { gw, fx, .. } = gw.binary();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let text = gw.metrics().await;
    let compiled = metric(&text, "aura_tenant_compiles_total", &["result=\"timeout\""]);
    assert_eq!(compiled, 1.0, "compiled once in five refreshes");
    let r = cors_probe(gw.data_url("/health"), &fx.anon_key).await;
    assert_eq!(
        r.status,
        StatusCode::OK,
        "alpha falls back to the plane's module"
    );
    assert_eq!(r.headers["access-control-allow-origin"], "*");
}

#[tokio::test]
async fn unused_module_files_and_their_metric_series_are_collected() {
    let Started { gw, fx, dir } = offline(
        "gc",
        "[plugins]\nmodule_gc_interval_secs = 1\nmodule_gc_grace_secs = 1\n",
    );
    let admin = admin(gw.mgmt_url(""), &fx);
    let first = testing_cors();
    let first_digest = digest(&first);
    assert_eq!(
        admin.install("cors", &first, json!({})).await.status,
        StatusCode::OK
    );
    let file = dir.path().join(format!("modules/{first_digest}.wasm"));
    assert!(file.is_file());
    let series = gw.metrics().await.contains(&first_digest);
    assert!(series, "the module's series exist");
    // Replaced by another module: the first is no longer used by anyone.
    let second = aura_gateway::policy::builtin::CORS;
    let second_digest = digest(second);
    assert_eq!(
        admin.install("cors", second, json!({})).await.status,
        StatusCode::OK
    );
    let _ = cors_probe(gw.data_url("/health"), &fx.anon_key).await;
    let collected = async || !file.exists();
    wait_until(
        "the unused module file collected",
        Duration::from_secs(10),
        collected,
    )
    .await;
    let kept = dir.path().join(format!("modules/{second_digest}.wasm"));
    assert!(kept.is_file());
    let text = gw.metrics().await;
    let gone = !text.contains(&first_digest);
    assert!(gone, "the replaced module's series are gone");
    assert!(text.contains(&second_digest));
    assert!(metric(&text, "aura_modules_collected_total", &[]) >= 1.0);
}

#[tokio::test]
async fn a_put_or_delete_made_during_a_refresh_is_never_reverted_by_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fx = Fixture::new();
    let store = Arc::new(CountingStore::new(Arc::new(fx.file_store(dir.path()))));
    let gw = Gateway::with(|c| c.plugins.tenant_refresh_secs = 1)
        .with(|c| c.data_plane.project_host_suffix = Some(".api.test".into()))
        .store(store.clone());
    let gw = gw.start().await;
    let client = reqwest::Client::new();
    let preflight = async || {
        let preflight = client.request(reqwest::Method::OPTIONS, gw.data_url("/v1/db/todos"));
        let preflight = preflight
            .call()
            .host("alpha.api.test")
            .origin("https://tenant.example");
        let r = preflight
            .header("access-control-request-method", "GET")
            .read()
            .await;
        let allowed = r.headers.get("access-control-allow-origin");
        allowed.map(|v| v.to_str().unwrap_or_default().to_owned())
    };
    assert_eq!(preflight().await.as_deref(), Some("*"));

    // A refresh has read the store (no module yet) and is held; the PUT lands meanwhile.
    let admin = admin(gw.mgmt_url(""), &fx);
    let release = store.hold_next_policy_read().await;
    let r = admin.install("cors", &testing_cors(), json!({})).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(preflight().await.as_deref(), Some("https://tenant.example"));
    release.send(()).expect("release");
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let origin = preflight().await;
    let kept = origin.as_deref() == Some("https://tenant.example");
    assert!(kept, "the stale refresh did not revert the PUT: {origin:?}");

    // The same with a DELETE.
    let release = store.hold_next_policy_read().await;
    assert_eq!(admin.delete("cors").await.status, StatusCode::NO_CONTENT);
    release.send(()).expect("release");
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let origin = preflight().await;
    let gone = origin.as_deref() == Some("*");
    assert!(
        gone,
        "the stale refresh did not bring the deleted module back: {origin:?}"
    );
}

/// A project's module that runs out its deadline on every call is refused at upload: a
/// conformance vector stopped by its deadline is tried again (a loaded machine may deschedule
/// one call), never forgiven when every attempt overran. The upload answers in bounded time and
/// the gateway keeps serving.
#[tokio::test]
async fn a_module_that_always_overruns_its_deadline_is_refused_at_upload() {
    let gw = offline("overrun", "[plugins]\ncall_deadline_ms = 50\n");
    let Started { gw, fx, .. } = gw;
    let admin = admin(gw.mgmt_url(""), &fx);
    let started = Instant::now();
    let config = json!({ "spin_always": true });
    let (status, body) = admin.install("cors", &testing_cors(), config).await.parts();
    let took = started.elapsed();
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["code"], "policy_refused");
    let message = body["error"]["message"].as_str().expect("message");
    assert!(
        message.contains("conformance") && message.contains("deadline"),
        "{body}"
    );
    assert!(took < Duration::from_secs(30), "refused in {took:?}");
    let r = cors_probe(gw.data_url("/health"), &fx.anon_key).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        r.headers["access-control-allow-origin"], "*",
        "the plane's module"
    );
}
