//! Rate limits (CONTRACT §8): per client IP before authentication ([`IpLimiter`]), per actor
//! after authentication ([`QuotaLimiter`], rules from the `quota` policy stage).
//!
//! Per-IP limits are local to each instance (governor, keyed by IP, IPv6 by /64). Quotas are
//! local too unless `rate_limit.redis_url` is set; then they are shared by every instance
//! through Redis ([`shared`]), with a short timeout and a breaker on Redis: while Redis is
//! unreachable or slow each instance limits locally — never unlimited — and goes back to Redis
//! as soon as it answers again.

pub mod client_ip;
pub mod local;
pub mod rules;
pub mod shared;

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use arc_swap::ArcSwapOption;

use self::local::{KeyedLimiter, LocalBuckets};
use self::shared::RedisBuckets;
use crate::breaker::{BreakerSettings, CircuitBreaker};
use crate::config::{BucketConfig, RateLimitConfig};
use crate::metrics::Metrics;

/// The outcome of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// Whether the request may go on.
    pub allowed: bool,
    /// `RateLimit-Limit`: the burst.
    pub limit: u32,
    /// `RateLimit-Remaining`.
    pub remaining: u32,
    /// `RateLimit-Reset`: until the bucket is full again (allowed) or the wait (denied).
    pub reset: Duration,
}

impl Decision {
    /// An allowed request.
    pub fn allowed(limit: u32, remaining: u32, reset: Duration) -> Self {
        Self {
            allowed: true,
            limit,
            remaining,
            reset,
        }
    }

    /// A refused request, to retry after `wait`.
    pub fn denied(limit: u32, wait: Duration) -> Self {
        Self {
            allowed: false,
            limit,
            remaining: 0,
            reset: wait,
        }
    }
}

/// A per-actor rule, as the `quota` stage decided it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub bucket: String,
    pub rate_per_second: u32,
    pub burst: u32,
    pub cost: u32,
}

/// The per-IP limiter of one plane.
#[derive(Debug)]
pub struct IpLimiter {
    limiter: Option<KeyedLimiter<IpAddr>>,
}

impl IpLimiter {
    /// A limiter for `config` (none when disabled), with its periodic cleanup.
    pub fn new(config: &BucketConfig, retain_every: Duration) -> Arc<Self> {
        let this = Arc::new(Self {
            limiter: config
                .enabled
                .then(|| KeyedLimiter::new(config.rate_per_second, config.burst)),
        });
        if this.limiter.is_some() {
            let weak = Arc::downgrade(&this);
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(retain_every);
                tick.tick().await;
                loop {
                    tick.tick().await;
                    let Some(this) = weak.upgrade() else { break };
                    if let Some(l) = &this.limiter {
                        l.retain_recent();
                    }
                }
            });
        }
        this
    }

    /// Takes one token for `ip`; `None` when the limit is disabled.
    pub fn check(&self, ip: IpAddr) -> Option<Decision> {
        self.limiter
            .as_ref()
            .map(|l| l.check(&client_ip::bucket_of(ip)))
    }
}

/// Per-actor quotas, shared through Redis when configured.
#[derive(Debug)]
pub struct QuotaLimiter {
    local: LocalBuckets,
    redis: Arc<ArcSwapOption<RedisBuckets>>,
    breaker: Arc<CircuitBreaker>,
    timeout: Duration,
    shared_mode: AtomicBool,
    configured: bool,
    metrics: Metrics,
}

impl QuotaLimiter {
    /// Builds the limiter; with a Redis URL it connects in the background (local meanwhile).
    pub fn new(config: &RateLimitConfig, metrics: Metrics) -> Arc<Self> {
        let redis: Arc<ArcSwapOption<RedisBuckets>> = Arc::new(ArcSwapOption::empty());
        let this = Arc::new(Self {
            local: LocalBuckets::new(
                config.local_buckets_max_bytes,
                Duration::from_secs(config.max_bucket_ttl_secs),
            ),
            redis: redis.clone(),
            breaker: CircuitBreaker::new(
                "redis",
                BreakerSettings {
                    failure_threshold: config.redis_failure_threshold,
                    open_for: Duration::from_millis(config.redis_retry_ms),
                    half_open_probes: 1,
                },
            ),
            timeout: Duration::from_millis(config.redis_timeout_ms),
            shared_mode: AtomicBool::new(false),
            configured: config.redis_url.is_some(),
            metrics,
        });
        this.metrics.ratelimit_shared.set(0);
        if let Some(url) = config.redis_url.clone() {
            let prefix = config.redis_key_prefix.clone();
            let timeout = Duration::from_millis(config.redis_timeout_ms.max(200));
            let retry = Duration::from_millis(config.redis_retry_ms);
            let max_ttl = Duration::from_secs(config.max_bucket_ttl_secs);
            let tls = config.redis_tls.clone();
            tokio::spawn(async move {
                loop {
                    match RedisBuckets::connect(&url, tls.as_ref(), &prefix, timeout, max_ttl).await
                    {
                        Ok(buckets) => {
                            tracing::info!("rate limits: Redis connected");
                            redis.store(Some(Arc::new(buckets)));
                            break;
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "rate limits: Redis not reachable; limiting locally");
                            tokio::time::sleep(retry).await;
                        }
                    }
                }
            });
        }
        this
    }

    /// `None` without Redis; otherwise whether it answers a PING within the timeout.
    pub async fn redis_up(&self) -> Option<bool> {
        if !self.configured {
            return None;
        }
        let Some(buckets) = self.redis.load_full() else {
            return Some(false);
        };
        Some(matches!(
            tokio::time::timeout(self.timeout.max(Duration::from_millis(500)), buckets.ping())
                .await,
            Ok(Ok(()))
        ))
    }

    /// The bytes the local buckets weigh now.
    pub fn local_bytes(&self) -> u64 {
        self.local.weighed_bytes()
    }

    /// Whether quotas are currently shared through Redis.
    pub fn is_shared(&self) -> bool {
        self.shared_mode.load(Ordering::Relaxed)
    }

    fn set_mode(&self, shared: bool) {
        if self.shared_mode.swap(shared, Ordering::Relaxed) != shared {
            self.metrics.ratelimit_shared.set(i64::from(shared));
            if shared {
                tracing::info!("rate limits: shared through Redis");
            } else if self.configured {
                tracing::warn!("rate limits: Redis unavailable; limiting locally");
            }
        }
    }

    /// Checks `rule`: through Redis when it answers in time, locally otherwise.
    pub async fn check(&self, rule: &Rule) -> Decision {
        if let Some(buckets) = self.redis.load_full()
            && let Ok(probe) = self.breaker.try_acquire_probe()
        {
            match tokio::time::timeout(self.timeout, buckets.check(rule)).await {
                Ok(Ok(decision)) => {
                    probe.record_success();
                    self.set_mode(true);
                    return decision;
                }
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "rate limits: Redis call failed");
                    probe.record_failure();
                }
                Err(_) => probe.record_failure(),
            }
        }
        self.set_mode(false);
        self.local.check(rule)
    }
}
