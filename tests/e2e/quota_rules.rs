//! Quota rules and their buckets: a tenant's rule of 4294967295 costs Redis one small key and no
//! time, the limiter shared through Redis keeps the token bucket's semantics, bucket names of a
//! mebibyte fail closed, local buckets are weighed in bytes under their ceiling, and a tenant's
//! module never draws on a bucket of the operator or of another project.

use std::time::{Duration, Instant};

use aura_gateway::planes::build_data_plane_router;
use aura_gateway::policy::Stage;
use aura_gateway::ratelimit::{QuotaLimiter, Rule};
use http::{Request, StatusCode};
use serde_json::json;
use tower::ServiceExt;

use crate::support::builder::{Started, offline};
use crate::support::call::IntoCall;
use crate::support::config::test_config;
use crate::support::fixture::Fixture;
use crate::support::metrics::metric;
use crate::support::policy::{admin, testing_quota};
use crate::support::poll::wait_until;
use crate::support::redis_server::RedisServer;
use crate::support::router::{from, with_module};

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
    let quota = aura_gateway::policy::stages::builtin::QUOTA;
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
