//! Rate limits: per IP before auth, per actor after auth, shared through Redis with a local
//! fallback.

use std::sync::Arc;
use std::time::{Duration, Instant};

use aura_gateway::planes::build_data_plane_router;
use aura_gateway::ratelimit::Rule;
use aura_gateway::ratelimit::local::LocalBuckets;
use aura_gateway::state::AppState;
use governor::clock::FakeRelativeClock;
use http::{Request, StatusCode};
use tower::ServiceExt;

use crate::support::builder::Gateway;
use crate::support::call::{Call, IntoCall, client};
use crate::support::config::test_config;
use crate::support::fixture::{CountingStore, Fixture};
use crate::support::gateway::InProcess;
use crate::support::poll::poll_every;
use crate::support::redis_server::RedisServer;
use crate::support::router::from;

#[tokio::test]
async fn a_flood_from_one_ip_gets_the_burst_then_429_and_no_auth_work() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fx = Fixture::new();
    let counting = Arc::new(CountingStore::new(Arc::new(fx.file_store(dir.path()))));
    let mut config = test_config("nats://127.0.0.1:1", "flood");
    config.rate_limit.data_plane_per_ip.rate_per_second = 100;
    config.rate_limit.data_plane_per_ip.burst = 1000;
    let state = AppState::build_with_store(config, None, counting.clone())
        .await
        .expect("state");
    let router = build_data_plane_router(state);
    let started = Instant::now();
    let (mut passed, mut limited) = (0, 0);
    for i in 0..2_000 {
        // A different unknown key each time: every request that gets past the limit costs a
        // store lookup, so the lookups count the requests auth saw.
        let key = format!("aura_pk_flood_{i:06}_0123456789abcdefghijklmnop");
        let response = router
            .clone()
            .oneshot(from(
                "198.51.100.20:5555",
                Request::get("/v1/auth/user").header("apikey", key),
            ))
            .await
            .expect("infallible");
        match response.status() {
            StatusCode::UNAUTHORIZED => passed += 1,
            StatusCode::TOO_MANY_REQUESTS => {
                limited += 1;
                assert!(response.headers().contains_key("retry-after"));
                assert_eq!(response.headers()["ratelimit-limit"], "1000");
                assert_eq!(response.headers()["ratelimit-remaining"], "0");
                assert!(response.headers().contains_key("x-request-id"));
            }
            other => panic!("unexpected {other}"),
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let refill = (elapsed * 100.0).ceil() as i32;
    assert!(
        (1_000..=1_000 + refill + 1).contains(&passed),
        "{passed} passed in {elapsed:.2} s (burst 1000, 100/s)"
    );
    assert_eq!(passed + limited, 2_000);
    assert_eq!(
        counting.total.load(std::sync::atomic::Ordering::SeqCst),
        passed as usize,
        "no auth work for limited requests"
    );
    // Another address is not affected.
    let other = router
        .clone()
        .oneshot(from("198.51.100.21:5555", Request::get("/health")))
        .await
        .expect("infallible");
    assert_eq!(other.status(), StatusCode::OK);
}

#[tokio::test]
async fn forwarded_for_counts_only_from_trusted_proxies() {
    let mut config = test_config("nats://127.0.0.1:1", "xff");
    config.rate_limit.data_plane_per_ip.rate_per_second = 1;
    config.rate_limit.data_plane_per_ip.burst = 5;
    config.rate_limit.trusted_proxies = vec!["10.0.0.0/8".parse().expect("net")];
    let state = AppState::build(config, None).await.expect("state");
    let router = build_data_plane_router(state);
    let send = |peer: &'static str, xff: String| {
        router.clone().oneshot(from(
            peer,
            Request::get("/health").header("x-forwarded-for", xff),
        ))
    };
    // An untrusted peer cannot spread itself over forged addresses.
    let mut statuses = Vec::new();
    for i in 0..10 {
        statuses.push(
            send("203.0.113.9:1", format!("192.0.2.{i}"))
                .await
                .expect("infallible")
                .status(),
        );
    }
    assert_eq!(
        statuses.iter().filter(|s| **s == StatusCode::OK).count(),
        5,
        "{statuses:?}"
    );
    // Behind a trusted proxy, each client has its own bucket.
    for i in 0..10 {
        let status = send("10.0.0.7:1", format!("6.6.6.6, 192.0.2.{i}"))
            .await
            .expect("infallible")
            .status();
        assert_eq!(status, StatusCode::OK);
    }
}

#[tokio::test]
async fn the_quota_stage_rule_is_enforced_per_key() {
    let rule = serde_json::json!({ "rate_per_second": 1, "burst": 5 });
    let gw = Gateway::start_with(|c| c.data_plane.plugins.quota.config = rule).await;
    let c = client();
    let user = || c.get(gw.data_url("/v1/auth/user")).call().read();
    let mut remaining = Vec::new();
    for _ in 0..5 {
        let r = user().await;
        assert_ne!(r.status, StatusCode::TOO_MANY_REQUESTS);
        remaining.push(r.header("ratelimit-remaining").to_owned());
    }
    assert_eq!(remaining, ["4", "3", "2", "1", "0"]);
    let r = user().await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(r.headers.contains_key("retry-after"));
    assert_eq!(r.code(), "rate_limited");
    // Public paths without a key are exempt from the actor quota.
    assert_eq!(
        Call::get(gw.data_url("/health")).status().await,
        StatusCode::OK
    );
}

/// Sends quota-checked requests until the gateway has used Redis once; returns how many of them
/// Redis admitted (the last one).
async fn wait_shared(gw: &InProcess, c: &reqwest::Client) -> u32 {
    let shared = poll_every(
        Duration::from_secs(15),
        Duration::from_millis(50),
        async || {
            let r = c.get(gw.data_url("/v1/storage/x")).send().await.expect("r");
            let passed = u32::from(r.status() == StatusCode::SERVICE_UNAVAILABLE);
            gw.state.quotas.is_shared().then_some(passed)
        },
    );
    shared.await.expect("Redis mode not reached")
}

/// A Redis server, and a gateway sharing its quotas through it (the quota stage's rule at
/// `burst` and 1/s) once it does; a client sending the test key.
async fn sharing_at_once(burst: u32) -> (RedisServer, InProcess, reqwest::Client) {
    let redis = RedisServer::start();
    let gw = sharing(&redis, burst, false).await;
    let c = client();
    wait_shared(&gw, &c).await;
    (redis, gw, c)
}

/// Quotas are shared through Redis again within 10 s (Redis `what` just before).
async fn shared_again(gw: &InProcess, c: &reqwest::Client, what: &str) {
    let since = Instant::now();
    wait_shared(gw, c).await;
    let took = since.elapsed();
    println!(
        "shared again {:.2} s after Redis {what}",
        took.as_secs_f64()
    );
    assert!(took < Duration::from_secs(10));
}

/// A gateway sharing its quotas through `redis`, the quota stage's rule at `burst` and 1/s;
/// `patient`: Redis gets 2 s to answer.
async fn sharing(redis: &RedisServer, burst: u32, patient: bool) -> InProcess {
    let url = redis.url();
    Gateway::start_with(move |c| {
        (c.rate_limit.redis_url, c.rate_limit.redis_retry_ms) = (Some(url), 500);
        c.data_plane.plugins.quota.config =
            serde_json::json!({ "rate_per_second": 1, "burst": burst });
        if patient {
            c.rate_limit.redis_timeout_ms = 2_000;
        }
    })
    .await
}

#[tokio::test]
async fn two_instances_share_one_quota_through_redis() {
    let redis = RedisServer::start();
    // This test is about sharing, not the fallback: a loaded machine must not push it local.
    let a = sharing(&redis, 200, true).await;
    let b = sharing(&redis, 200, true).await;
    let c = client();
    let mut accepted = wait_shared(&a, &c).await + wait_shared(&b, &c).await;
    accepted += round_robin(&[&a, &b], &c, 600).await;
    assert!(
        (190..=210).contains(&accepted),
        "{accepted} accepted by two instances sharing a quota of 200"
    );
}

/// Sends `requests` quota-checked requests round-robin over `fleet`; how many passed the quota.
async fn round_robin(fleet: &[&InProcess], c: &reqwest::Client, requests: usize) -> u32 {
    let mut accepted = 0;
    for i in 0..requests {
        let gw = fleet[i % fleet.len()];
        let r = c.get(gw.data_url("/v1/storage/x")).send().await.expect("r");
        match r.status() {
            StatusCode::TOO_MANY_REQUESTS => {}
            // Past the quota; no storage backend is configured, so it stops there.
            StatusCode::SERVICE_UNAVAILABLE => accepted += 1,
            other => panic!("unexpected {other}"),
        }
    }
    accepted
}

#[tokio::test]
async fn three_instances_share_one_quota_within_five_percent_before_and_after_a_redis_outage() {
    let redis = RedisServer::start();
    let a = sharing(&redis, 300, true).await;
    let b = sharing(&redis, 300, true).await;
    let d = sharing(&redis, 300, true).await;
    let fleet = [&a, &b, &d];
    let c = client();
    let mut accepted = 0;
    for gw in fleet {
        accepted += wait_shared(gw, &c).await;
    }
    accepted += round_robin(&fleet, &c, 900).await;
    println!("three instances, shared quota of 300: {accepted} accepted");
    assert!(
        (285..=315).contains(&accepted),
        "{accepted} accepted by three instances sharing a quota of 300"
    );
    // Redis dies: each instance limits locally; it comes back (empty): all three share again.
    let port = redis.kill();
    let during = round_robin(&fleet, &c, 30).await;
    assert!(fleet.iter().all(|gw| !gw.state.quotas.is_shared()));
    let redis = RedisServer::start_on(port);
    let back = Instant::now();
    let mut accepted = 0;
    for gw in fleet {
        accepted += wait_shared(gw, &c).await;
    }
    println!(
        "all shared again {:.2} s after Redis restarted ({during} passed locally meanwhile)",
        back.elapsed().as_secs_f64()
    );
    assert!(back.elapsed() < Duration::from_secs(10));
    accepted += round_robin(&fleet, &c, 900).await;
    println!("after the outage: {accepted} accepted");
    assert!(
        (285..=315).contains(&accepted),
        "{accepted} accepted after the outage by three instances sharing a quota of 300"
    );
    drop(redis);
}

#[tokio::test]
async fn a_frozen_redis_falls_back_to_local_limits_and_sharing_resumes() {
    let (redis, gw, c) = sharing_at_once(100_000).await;
    redis.freeze();
    let started = Instant::now();
    let mut worst = Duration::ZERO;
    for _ in 0..200 {
        let t = Instant::now();
        let r = c.get(gw.data_url("/health")).send().await.expect("r");
        worst = worst.max(t.elapsed());
        assert_eq!(r.status(), StatusCode::OK, "no error caused by Redis");
        let r = c.get(gw.data_url("/v1/storage/x")).call().read().await;
        let past = r.status == StatusCode::SERVICE_UNAVAILABLE;
        assert!(past, "past the quota, no Redis error: {}", r.status);
        assert_eq!(r.code(), "backend_not_configured");
    }
    assert!(
        !gw.state.quotas.is_shared(),
        "limiting locally while Redis is frozen"
    );
    println!(
        "redis frozen: 400 requests in {:.2} s, slowest {:.1} ms",
        started.elapsed().as_secs_f64(),
        worst.as_secs_f64() * 1000.0
    );
    redis.resume();
    shared_again(&gw, &c, "resumed").await;
}

#[tokio::test]
async fn a_killed_redis_under_load_limits_locally_without_errors_and_sharing_resumes() {
    let (redis, gw, c) = sharing_at_once(100).await;
    let port = redis.kill();
    // Eight clients at once, 400 requests: the local bucket (burst 100, 1/s) admits about 100.
    let statuses: Vec<StatusCode> = futures::future::join_all((0..8).map(|_| {
        let c = c.clone();
        let url = gw.data_url("/v1/storage/x");
        async move {
            let mut seen = Vec::new();
            for _ in 0..50 {
                seen.push(c.get(&url).send().await.expect("answered").status());
            }
            seen
        }
    }))
    .await
    .into_iter()
    .flatten()
    .collect();
    let counted = |status: StatusCode| statuses.iter().filter(|s| **s == status).count();
    let limited = counted(StatusCode::TOO_MANY_REQUESTS);
    let passed = counted(StatusCode::SERVICE_UNAVAILABLE);
    println!("redis killed: of 400 requests {passed} passed the quota, {limited} limited locally");
    assert_eq!(
        limited + passed,
        400,
        "only 429 or the route's own 503: {statuses:?}"
    );
    let local = limited >= 250;
    assert!(local, "limiting went on locally: {limited} limited");
    let burst = passed >= 50;
    assert!(burst, "the local bucket admitted its burst: {passed}");
    assert!(!gw.state.quotas.is_shared());
    let _redis = RedisServer::start_on(port);
    shared_again(&gw, &c, "restarted").await;
}

/// A reference token bucket: `burst` tokens, `rate` per second, continuous refill.
struct Model {
    tokens: f64,
    rate: f64,
    burst: f64,
}

impl Model {
    fn advance(&mut self, secs: f64) {
        self.tokens = (self.tokens + secs * self.rate).min(self.burst);
    }
    fn take(&mut self, cost: f64) -> bool {
        if self.tokens + 1e-9 >= cost {
            self.tokens -= cost;
            true
        } else {
            false
        }
    }
}

#[test]
fn the_local_limiter_behaves_like_a_token_bucket() {
    let clock = FakeRelativeClock::default();
    let buckets = LocalBuckets::with_clock(1 << 20, Duration::from_secs(3_600), clock.clone());
    let rule = |cost| Rule {
        bucket: "k".into(),
        rate_per_second: 10,
        burst: 20,
        cost,
    };
    let mut model = Model {
        tokens: 20.0,
        rate: 10.0,
        burst: 20.0,
    };
    let mut seed: u64 = 0x1234_5678_9abc_def1;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let (mut allowed, mut denied) = (0, 0);
    for step in 0..5_000 {
        let advance_ms = [0u64, 0, 0, 0, 0, 0, 10, 50, 100, 1_000][(next() % 10) as usize];
        clock.advance(Duration::from_millis(advance_ms));
        model.advance(advance_ms as f64 / 1000.0);
        let cost = 1 + (next() % 3) as u32;
        let decision = buckets.check(&rule(cost));
        let expected = model.take(f64::from(cost));
        assert_eq!(
            decision.allowed, expected,
            "step {step}: cost {cost}, model tokens {:.3}",
            model.tokens
        );
        if decision.allowed {
            allowed += 1;
        } else {
            denied += 1;
            assert!(
                decision.reset > Duration::ZERO,
                "a denial says when to retry"
            );
        }
    }
    assert!(
        allowed > 500 && denied > 500,
        "both paths exercised: {allowed} / {denied}"
    );
}
