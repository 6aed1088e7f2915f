//! Local limiters, with governor's GCRA (a token bucket): per IP (a keyed limiter whose idle
//! keys are dropped by a periodic retain), and per named bucket with its own rate and burst
//! (one direct limiter per bucket, held in a Moka cache that forgets a bucket once it has been
//! idle long enough to be full again — forgetting it then changes nothing). The cache is
//! weighed in bytes (names included) under `rate_limit.local_buckets_max_bytes`, and no bucket
//! is kept past `rate_limit.max_bucket_ttl_secs`. A [`HotTable`] in front of the cache answers
//! the buckets in use; see [`HOT_TTL`] for why that changes no limit.

use std::hash::Hash;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

use governor::clock::{Clock, DefaultClock, QuantaClock};
use governor::middleware::StateInformationMiddleware;
use governor::state::keyed::DashMapStateStore;
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter};

use super::{Decision, Rule};
use crate::hot::{self, HotTable};

fn quota(rate: u32, burst: u32) -> Quota {
    let rate = NonZeroU32::new(rate.max(1)).expect("at least 1");
    let burst = NonZeroU32::new(burst.max(1)).expect("at least 1");
    Quota::per_second(rate).allow_burst(burst)
}

fn reset_of(rate: u32, burst: u32, remaining: u32) -> Duration {
    // Time until the bucket is full again.
    Duration::from_secs_f64(f64::from(burst.saturating_sub(remaining)) / f64::from(rate.max(1)))
}

/// The keyed store: governor's `DashMap`, hashed with foldhash (seeded per limiter) rather than
/// the standard library's SipHash, which the map runs twice a request (once for its shard, once
/// in it): about 400 instructions a request, where foldhash takes a few dozen. The keys are
/// client addresses (an IPv6 one by its /64), as in the decision cache's partitions.
type Keyed<K, C> = RateLimiter<
    K,
    DashMapStateStore<K, foldhash::fast::RandomState>,
    C,
    StateInformationMiddleware,
>;

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
        let limiter = RateLimiter::dashmap_with_clock_and_hasher(
            quota(rate, burst),
            clock.clone(),
            foldhash::fast::RandomState::default(),
        )
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

/// How long the hot table answers a bucket before the cache is read again.
///
/// The cache forgets a bucket once nobody read it there for its idle time; uses answered by
/// the table are not reads there. So the idle time is the time to refill plus one second plus
/// this: when the cache forgets a bucket, its last use (at most this long after the last read)
/// is at least the refill time plus a second ago, the bucket is full, and a new one changes
/// nothing, as before.
pub const HOT_TTL: Duration = Duration::from_secs(1);

/// Slots of the hot table for a byte budget: a sixteenth of it at the longest names a module
/// may answer (1 KiB and a tenant prefix), so that the table adds at most an eighth of the
/// budget (the slots are rounded up to a power of two); between 64 and
/// [`hot::DEFAULT_SLOTS`].
pub fn hot_slots(max_bytes: u64) -> usize {
    let per_slot = 1024 + 64 + u64::from(BUCKET_OVERHEAD_BYTES);
    usize::try_from(max_bytes / 16 / per_slot)
        .unwrap_or(usize::MAX)
        .clamp(64, hot::DEFAULT_SLOTS)
}

/// What one bucket costs besides its name: the limiter, its `Arc`, and the cache entry.
pub const BUCKET_OVERHEAD_BYTES: u32 = 256;

/// Named buckets, each with the rate and burst of its rule.
pub struct LocalBuckets<C: Clock = DefaultClock> {
    /// Every bucket, hashed with foldhash as the hot table is (the standard library's SipHash
    /// took about 270 instructions a lookup).
    buckets: moka::sync::Cache<String, Arc<Bucket<C>>, foldhash::fast::RandomState>,
    /// The buckets in use: a fixed table ([`hot_slots`]).
    hot: HotTable<String, Arc<Bucket<C>>>,
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
                .build_with_hasher(foldhash::fast::RandomState::default()),
            hot: HotTable::new(hot_slots(max_bytes)),
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
        let same = |b: &Bucket<C>| b.rate == rule.rate_per_second && b.burst == rule.burst;
        let hash = self.hot.hash(rule.bucket.as_str());
        let now = Instant::now();
        let bucket = match self.hot.get(hash, rule.bucket.as_str(), now) {
            Some(b) if same(&b) => b,
            _ => {
                let ticket = self.hot.ticket(hash);
                let bucket = match self.buckets.get(rule.bucket.as_str()) {
                    Some(b) if same(&b) => b,
                    _ => {
                        let refill = f64::from(rule.burst) / f64::from(rule.rate_per_second.max(1));
                        let b = Arc::new(Bucket {
                            limiter: RateLimiter::direct_with_clock(
                                quota(rule.rate_per_second, rule.burst),
                                self.clock.clone(),
                            )
                            .with_middleware::<StateInformationMiddleware>(),
                            idle: Duration::from_secs_f64(refill + 1.0)
                                .saturating_add(HOT_TTL)
                                .min(self.max_idle),
                            rate: rule.rate_per_second,
                            burst: rule.burst,
                        });
                        self.buckets.insert(rule.bucket.clone(), b.clone());
                        b
                    }
                };
                self.hot.put(
                    hash,
                    rule.bucket.clone(),
                    bucket.clone(),
                    ticket,
                    now + HOT_TTL,
                );
                bucket
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

#[cfg(test)]
mod tests {
    use governor::clock::FakeRelativeClock;

    use super::*;

    fn rule(burst: u32) -> Rule {
        Rule {
            bucket: "key:k1".into(),
            rate_per_second: 1,
            burst,
            cost: 1,
        }
    }

    fn buckets() -> LocalBuckets<FakeRelativeClock> {
        LocalBuckets::with_clock(
            1 << 20,
            Duration::from_secs(3_600),
            FakeRelativeClock::default(),
        )
    }

    #[test]
    fn the_table_and_the_cache_hold_the_same_bucket() {
        let b = buckets();
        assert!(b.check(&rule(2)).allowed);
        let name = rule(2).bucket;
        let hot = b
            .hot
            .get(b.hot.hash(name.as_str()), name.as_str(), Instant::now())
            .expect("put in the table");
        let cached = b.buckets.get(name.as_str()).expect("put in the cache");
        assert!(Arc::ptr_eq(&hot, &cached), "one bucket, not two");
        // Taken from the table, counted in that one bucket.
        assert!(b.check(&rule(2)).allowed);
        assert!(!b.check(&rule(2)).allowed, "burst 2 spent");
    }

    #[test]
    fn a_rule_with_other_figures_starts_a_new_bucket_even_when_the_table_holds_the_old() {
        let b = buckets();
        assert!(b.check(&rule(2)).allowed);
        assert!(b.check(&rule(2)).allowed);
        assert!(!b.check(&rule(2)).allowed);
        let wider = b.check(&rule(3));
        assert!(wider.allowed, "a new bucket for burst 3");
        assert_eq!(wider.remaining, 2);
        assert!(b.check(&rule(2)).allowed, "and again for burst 2");
    }

    #[test]
    fn the_cache_keeps_a_bucket_past_its_refill_by_the_table_s_time_too() {
        let b = buckets();
        b.check(&rule(5));
        let bucket = b.buckets.get("key:k1").expect("cached");
        // 5 tokens at 1 per second: full after 5 s; kept a second more, and the table's time.
        assert_eq!(bucket.idle, Duration::from_secs(6) + HOT_TTL);
        let capped = LocalBuckets::with_clock(
            1 << 20,
            Duration::from_secs(3),
            FakeRelativeClock::default(),
        );
        capped.check(&rule(5));
        let bucket = capped.buckets.get("key:k1").expect("cached");
        assert_eq!(bucket.idle, Duration::from_secs(3), "never past the cap");
    }

    #[test]
    fn the_table_is_an_eighth_of_the_budget_at_most() {
        assert_eq!(hot_slots(0), 64);
        assert_eq!(hot_slots(u64::MAX), hot::DEFAULT_SLOTS);
        let budget = 16 * 1024 * 1024;
        let slots = hot_slots(budget).next_power_of_two() as u64;
        assert!(slots * (1024 + 64 + u64::from(BUCKET_OVERHEAD_BYTES)) <= budget / 8);
    }
}
