//! Local limiters, with governor's GCRA (a token bucket): per IP (a keyed limiter whose idle
//! keys are dropped by a periodic retain), and per named bucket with its own rate and burst
//! (one direct limiter per bucket, held in a Moka cache that forgets a bucket once it has been
//! idle long enough to be full again — forgetting it then changes nothing). The cache is
//! weighed in bytes (names included) under `rate_limit.local_buckets_max_bytes`, and no bucket
//! is kept past `rate_limit.max_bucket_ttl_secs`.

use std::hash::Hash;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

use governor::clock::{Clock, DefaultClock, QuantaClock};
use governor::middleware::StateInformationMiddleware;
use governor::state::keyed::DefaultKeyedStateStore;
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter};

use super::{Decision, Rule};

fn quota(rate: u32, burst: u32) -> Quota {
    let rate = NonZeroU32::new(rate.max(1)).expect("at least 1");
    let burst = NonZeroU32::new(burst.max(1)).expect("at least 1");
    Quota::per_second(rate).allow_burst(burst)
}

fn reset_of(rate: u32, burst: u32, remaining: u32) -> Duration {
    // Time until the bucket is full again.
    Duration::from_secs_f64(f64::from(burst.saturating_sub(remaining)) / f64::from(rate.max(1)))
}

type Keyed<K, C> = RateLimiter<K, DefaultKeyedStateStore<K>, C, StateInformationMiddleware>;

/// A keyed limiter with one quota (per-IP).
#[derive(Debug)]
pub struct KeyedLimiter<K: Hash + Eq + Clone, C: Clock = DefaultClock> {
    limiter: Keyed<K, C>,
    clock: C,
    rate: u32,
    burst: u32,
}

impl<K: Hash + Eq + Clone> KeyedLimiter<K, DefaultClock> {
    /// A limiter on the system clock.
    pub fn new(rate: u32, burst: u32) -> Self {
        Self::with_clock(rate, burst, QuantaClock::default())
    }
}

impl<K: Hash + Eq + Clone, C: Clock + Clone> KeyedLimiter<K, C> {
    /// A limiter on `clock`.
    pub fn with_clock(rate: u32, burst: u32, clock: C) -> Self {
        let limiter = RateLimiter::dashmap_with_clock(quota(rate, burst), clock.clone())
            .with_middleware::<StateInformationMiddleware>();
        Self {
            limiter,
            clock,
            rate,
            burst,
        }
    }

    /// Takes one token for `key`.
    pub fn check(&self, key: &K) -> Decision {
        match self.limiter.check_key(key) {
            Ok(snapshot) => {
                let remaining = snapshot.remaining_burst_capacity();
                Decision::allowed(
                    self.burst,
                    remaining,
                    reset_of(self.rate, self.burst, remaining),
                )
            }
            Err(not_until) => {
                let wait = not_until.wait_time_from(self.clock.now());
                Decision::denied(self.burst, wait)
            }
        }
    }

    /// Drops keys whose buckets are full again (bounds memory); run periodically.
    pub fn retain_recent(&self) {
        self.limiter.retain_recent();
        self.limiter.shrink_to_fit();
    }

    /// Keys held.
    pub fn len(&self) -> usize {
        self.limiter.len()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

type Direct<C> = RateLimiter<NotKeyed, InMemoryState, C, StateInformationMiddleware>;

struct Bucket<C: Clock> {
    limiter: Direct<C>,
    idle: Duration,
    /// The figures the limiter was made with: a rule with other figures gets a new bucket.
    rate: u32,
    burst: u32,
}

struct IdleExpiry;

impl<C: Clock> moka::Expiry<String, Arc<Bucket<C>>> for IdleExpiry {
    fn expire_after_create(&self, _: &String, b: &Arc<Bucket<C>>, _: Instant) -> Option<Duration> {
        Some(b.idle)
    }
    fn expire_after_read(
        &self,
        _: &String,
        b: &Arc<Bucket<C>>,
        _: Instant,
        _: Option<Duration>,
        _: Instant,
    ) -> Option<Duration> {
        Some(b.idle)
    }
}

/// What one bucket costs besides its name: the limiter, its `Arc`, and the cache entry.
pub const BUCKET_OVERHEAD_BYTES: u32 = 256;

/// Named buckets, each with the rate and burst of its rule.
pub struct LocalBuckets<C: Clock = DefaultClock> {
    buckets: moka::sync::Cache<String, Arc<Bucket<C>>>,
    clock: C,
    max_idle: Duration,
}

impl<C: Clock> std::fmt::Debug for LocalBuckets<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalBuckets")
            .field("buckets", &self.buckets.entry_count())
            .finish()
    }
}

impl LocalBuckets<DefaultClock> {
    /// Buckets on the system clock, weighing at most `max_bytes`, none kept past `max_idle`.
    pub fn new(max_bytes: u64, max_idle: Duration) -> Self {
        Self::with_clock(max_bytes, max_idle, QuantaClock::default())
    }
}

impl<C: Clock + Clone + Send + Sync + 'static> LocalBuckets<C>
where
    C::Instant: Send + Sync,
{
    /// Buckets on `clock`.
    pub fn with_clock(max_bytes: u64, max_idle: Duration, clock: C) -> Self {
        Self {
            buckets: moka::sync::Cache::builder()
                .max_capacity(max_bytes)
                .weigher(|name: &String, _| {
                    u32::try_from(name.len())
                        .unwrap_or(u32::MAX)
                        .saturating_add(BUCKET_OVERHEAD_BYTES)
                })
                .expire_after(IdleExpiry)
                .build(),
            clock,
            max_idle,
        }
    }

    /// The bytes the buckets weigh now (after pending evictions are applied).
    pub fn weighed_bytes(&self) -> u64 {
        self.buckets.run_pending_tasks();
        self.buckets.weighted_size()
    }

    /// Takes `rule.cost` tokens from `rule.bucket` (a cost above the burst is taken as the burst).
    pub fn check(&self, rule: &Rule) -> Decision {
        // Looked up by the name as it is (no key built per request); a bucket whose rule changed
        // figures starts afresh.
        let bucket = match self.buckets.get(rule.bucket.as_str()) {
            Some(b) if b.rate == rule.rate_per_second && b.burst == rule.burst => b,
            _ => {
                let refill = f64::from(rule.burst) / f64::from(rule.rate_per_second.max(1));
                let b = Arc::new(Bucket {
                    limiter: RateLimiter::direct_with_clock(
                        quota(rule.rate_per_second, rule.burst),
                        self.clock.clone(),
                    )
                    .with_middleware::<StateInformationMiddleware>(),
                    idle: Duration::from_secs_f64(refill + 1.0).min(self.max_idle),
                    rate: rule.rate_per_second,
                    burst: rule.burst,
                });
                self.buckets.insert(rule.bucket.clone(), b.clone());
                b
            }
        };
        let cost = NonZeroU32::new(rule.cost.clamp(1, rule.burst.max(1))).expect("at least 1");
        match bucket.limiter.check_n(cost) {
            Ok(Ok(snapshot)) => {
                let remaining = snapshot.remaining_burst_capacity();
                Decision::allowed(
                    rule.burst,
                    remaining,
                    reset_of(rule.rate_per_second, rule.burst, remaining),
                )
            }
            Ok(Err(not_until)) => {
                Decision::denied(rule.burst, not_until.wait_time_from(self.clock.now()))
            }
            Err(_) => Decision::denied(rule.burst, Duration::from_secs(1)),
        }
    }
}
