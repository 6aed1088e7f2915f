//! One ceiling for every decision cache of an instance (`plugins.decision_cache.total_bytes`),
//! shared fairly between the caches.
//!
//! Each [`DecisionCache`](super::decision_cache::DecisionCache) is created with the instance's
//! [`CacheBudget`] and accounts what it keeps there: an entry's bytes are reserved before it is
//! inserted and given back when it is evicted, replaced, reclaimed or dropped with its module,
//! so the bytes the caches keep together never exceed the ceiling. A lookup touches none of it:
//! the only shared counter is moved by inserts and evictions, which follow a module's call.
//!
//! **Fair shares.** Every cache's share is the same, the ceiling over the caches that keep
//! entries, so the cache furthest over its share is the largest. An insert that finds no room
//! under the ceiling has the largest caches give back entries — each from its largest
//! partitions, oldest first — until the total is a 256th of the ceiling under it
//! ([`SLACK_DIVISOR`]: one reclaim makes room for many inserts); a cache gives back only down to the next largest
//! before that one gives too. So a module flooded with unique inputs gives up its own entries,
//! and a module under its share keeps its entries while another is over.
//!
//! **Idle caches.** [`CacheBudget::sweep`], run every [`sweep_interval`] by the task
//! [`CacheBudget::spawn_sweeps`] starts, empties each shard of a cache that no request looked up
//! for `plugins.decision_cache.idle_secs`, or for its module's maximum age when that is shorter
//! (every entry it keeps has expired then): a module swapped out but kept for a rollback, or a
//! project that stopped sending requests, gives its bytes back. A module unloaded (replaced,
//! removed, a candidate dropped) gives them back when its cache is dropped with it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use tokio::time::Instant;

use crate::config::DecisionCacheConfig;

/// A reclaim brings the total this fraction of the ceiling under it: one reclaim (a lock and a
/// look at every cache) makes room for the inserts of a 256th of the ceiling.
pub const SLACK_DIVISOR: usize = 256;

/// The least a cache gives back at a time when it ties with the next largest, in bytes.
const TIE_CHUNK: usize = 16 << 10;

/// What a cache gave back.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Freed {
    pub bytes: usize,
    pub entries: u64,
}

/// A cache as the budget sees it. Implemented by the caches' shared state; each keeps its own
/// count of the bytes it holds and gives them back to the budget itself.
pub(crate) trait Member: Send + Sync {
    /// Bytes the cache keeps now.
    fn held(&self) -> usize;
    /// Evicts entries, from its largest partitions, until at least `bytes` are given back or
    /// it keeps none.
    fn give_back(&self, bytes: usize) -> Freed;
    /// Empties the shards no request looked up for the cache's idle time, judged at `now`.
    fn sweep(&self, now: Instant) -> Freed;
}

/// Where the budget is counted.
#[derive(Debug, Clone)]
struct BudgetMetrics {
    bytes: prometheus::IntGauge,
    by_ceiling: prometheus::IntCounter,
    idle: prometheus::IntCounter,
}

/// The bytes every decision cache of an instance may keep together, and the caches that share
/// them (see the module's documentation).
pub struct CacheBudget {
    ceiling: usize,
    idle: Duration,
    /// Bytes kept or reserved by every cache; at most `ceiling`.
    total: AtomicUsize,
    members: Mutex<Vec<Weak<dyn Member>>>,
    /// One reclaim at a time: another that waited finds the room made.
    reclaiming: Mutex<()>,
    metrics: OnceLock<BudgetMetrics>,
}

impl std::fmt::Debug for CacheBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CacheBudget")
            .field("ceiling", &self.ceiling)
            .field("total", &self.total())
            .finish_non_exhaustive()
    }
}

/// How often idle caches are looked for: a quarter of the idle time, between 1 and 30 s.
pub fn sweep_interval(idle: Duration) -> Duration {
    (idle / 4).clamp(Duration::from_secs(1), Duration::from_secs(30))
}

impl CacheBudget {
    /// The budget of `config` (`total_bytes`, `idle_secs`).
    pub fn new(config: &DecisionCacheConfig) -> Arc<Self> {
        Arc::new(Self {
            ceiling: config.total_bytes,
            idle: Duration::from_secs(config.idle_secs),
            total: AtomicUsize::new(0),
            members: Mutex::new(Vec::new()),
            reclaiming: Mutex::new(()),
            metrics: OnceLock::new(),
        })
    }

    /// The ceiling, in bytes.
    pub fn ceiling(&self) -> usize {
        self.ceiling
    }

    /// How long a shard may go without a lookup before its entries are reclaimed (a cache
    /// whose module's maximum age is shorter uses that).
    pub fn idle(&self) -> Duration {
        self.idle
    }

    /// Bytes kept (or reserved for an insert under way) by every cache now.
    pub fn total(&self) -> usize {
        self.total.load(Ordering::Relaxed)
    }

    /// Counts the total and the reclaimed entries in `metrics` from now on (set once).
    pub fn count_in(self: &Arc<Self>, metrics: &crate::metrics::Metrics) {
        let set = self.metrics.set(BudgetMetrics {
            bytes: metrics.decision_cache_bytes.clone(),
            by_ceiling: metrics
                .decision_cache_reclaimed
                .with_label_values(&["ceiling"]),
            idle: metrics
                .decision_cache_reclaimed
                .with_label_values(&["idle"]),
        });
        if set.is_ok() {
            metrics
                .decision_cache_ceiling_bytes
                .set(self.ceiling as i64);
            let me: Weak<dyn crate::metrics::Publish> = Arc::downgrade(self) as _;
            metrics.publishers.add(me);
        }
    }

    /// Adds a cache (and forgets the caches that are gone).
    pub(crate) fn join(&self, member: Weak<dyn Member>) {
        if let Ok(mut members) = self.members.lock() {
            members.retain(|m| m.strong_count() > 0);
            members.push(member);
        }
    }

    fn live(&self) -> Vec<Arc<dyn Member>> {
        match self.members.lock() {
            Ok(mut members) => {
                members.retain(|m| m.strong_count() > 0);
                members.iter().filter_map(Weak::upgrade).collect()
            }
            Err(_) => Vec::new(),
        }
    }

    fn try_reserve(&self, bytes: usize) -> bool {
        self.total
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |total| {
                total
                    .checked_add(bytes)
                    .filter(|after| *after <= self.ceiling)
            })
            .is_ok()
    }

    /// Reserves `bytes` for an entry about to be inserted, making room under the ceiling when
    /// there is none (from the caches furthest over their share); false when no room could be
    /// made. Never called with a cache's shard locked: making room locks other caches' shards.
    pub(crate) fn reserve(&self, bytes: usize) -> bool {
        if self.try_reserve(bytes) {
            return true;
        }
        self.reclaim(bytes);
        self.try_reserve(bytes)
    }

    /// Gives back `bytes` reserved or kept by a cache.
    pub(crate) fn release(&self, bytes: usize) {
        if bytes > 0 {
            self.total.fetch_sub(bytes, Ordering::Relaxed);
        }
    }

    /// Brings the total, plus `need`, a 256th of the ceiling ([`SLACK_DIVISOR`]) under it,
    /// taking from the largest cache down to the next largest, then from both, and so on.
    fn reclaim(&self, need: usize) {
        let Ok(_one) = self.reclaiming.lock() else {
            return;
        };
        // A reclaim that ran while this one waited may have made the room.
        if self.total().saturating_add(need) <= self.ceiling {
            return;
        }
        let target = self.ceiling - self.ceiling / SLACK_DIVISOR;
        let mut caches: Vec<(Arc<dyn Member>, usize)> = self
            .live()
            .into_iter()
            .map(|m| {
                let held = m.held();
                (m, held)
            })
            .filter(|(_, held)| *held > 0)
            .collect();
        let mut entries = 0;
        loop {
            let over = self.total().saturating_add(need).saturating_sub(target);
            if over == 0 {
                break;
            }
            let Some((largest, _)) = caches.iter().enumerate().max_by_key(|(_, (_, h))| *h) else {
                break;
            };
            let held = caches[largest].1;
            let next = caches
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != largest)
                .map(|(_, (_, h))| *h)
                .max()
                .unwrap_or(0);
            let amount = over.min(held.saturating_sub(next).max(TIE_CHUNK));
            let cache = &caches[largest].0;
            let freed = cache.give_back(amount);
            entries += freed.entries;
            if freed.bytes == 0 {
                caches.swap_remove(largest);
                continue;
            }
            caches[largest].1 = cache.held();
        }
        if let Some(m) = self.metrics.get() {
            m.by_ceiling.inc_by(entries);
        }
    }

    /// Empties the shards of every cache that no request looked up for its idle time, judged
    /// at `now`; what was given back.
    pub fn sweep(&self, now: Instant) -> Freed {
        let mut freed = Freed::default();
        for cache in self.live() {
            let f = cache.sweep(now);
            freed.bytes += f.bytes;
            freed.entries += f.entries;
        }
        if let Some(m) = self.metrics.get() {
            m.idle.inc_by(freed.entries);
        }
        freed
    }

    /// Sweeps every [`sweep_interval`] while the budget exists (on the current Tokio runtime).
    pub fn spawn_sweeps(self: &Arc<Self>) {
        let budget = Arc::downgrade(self);
        let every = sweep_interval(self.idle);
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(every);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                let Some(budget) = budget.upgrade() else {
                    return;
                };
                budget.sweep(Instant::now());
            }
        });
    }
}

impl crate::metrics::Publish for CacheBudget {
    fn publish(&self) {
        if let Some(m) = self.metrics.get() {
            m.bytes.set(self.total() as i64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::runtime::decision_cache::{DecisionCache, KeyWriter};

    /// A budget of `ceiling` bytes, caches of up to 1 MiB with partitions of 256 KiB.
    fn setup(ceiling: usize) -> (DecisionCacheConfig, Arc<CacheBudget>) {
        let config = DecisionCacheConfig {
            entries: 100_000,
            bytes: 1 << 20,
            partition_entries: 100_000,
            partition_bytes: 256 << 10,
            total_bytes: ceiling,
            ..DecisionCacheConfig::default()
        };
        let budget = CacheBudget::new(&config);
        (config, budget)
    }

    fn cache(config: &DecisionCacheConfig, budget: &Arc<CacheBudget>) -> DecisionCache<u64> {
        DecisionCache::new(config, budget, vec!["origin"], Duration::from_secs(300)).expect("cache")
    }

    fn key(partition: &str, input: &str) -> KeyWriter {
        let mut k = KeyWriter::new(partition);
        k.str(input);
        k
    }

    /// Decisions of 1 KiB each.
    const SIZE: usize = 1024;

    #[test]
    fn the_total_never_exceeds_the_ceiling_and_follows_every_insert_and_eviction() {
        let (config, budget) = setup(256 << 10);
        let caches: Vec<_> = (0..4).map(|_| cache(&config, &budget)).collect();
        for n in 0..2_000u64 {
            let c = &caches[(n % 4) as usize];
            c.put(
                key(&format!("p{}", n % 7), &n.to_string()),
                n,
                SIZE,
                Instant::now(),
            );
            assert!(budget.total() <= budget.ceiling(), "after {n}: {budget:?}");
            let kept: usize = caches.iter().map(|c| c.report().bytes).sum();
            assert_eq!(kept, budget.total(), "after {n}: accounted exactly");
        }
        assert!(budget.total() > budget.ceiling() / 2, "{budget:?}");
    }

    #[test]
    fn the_total_stays_under_the_ceiling_with_caches_filled_at_once_from_threads() {
        let (config, budget) = setup(128 << 10);
        let caches: Vec<_> = (0..4).map(|_| Arc::new(cache(&config, &budget))).collect();
        let over = Arc::new(AtomicUsize::new(0));
        std::thread::scope(|s| {
            for (t, c) in caches.iter().enumerate() {
                let (budget, over) = (budget.clone(), over.clone());
                s.spawn(move || {
                    for n in 0..3_000u64 {
                        c.put(
                            key(&format!("t{t}"), &n.to_string()),
                            n,
                            SIZE,
                            Instant::now(),
                        );
                        if budget.total() > budget.ceiling() {
                            over.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        assert_eq!(over.load(Ordering::Relaxed), 0);
        let kept: usize = caches.iter().map(|c| c.report().bytes).sum();
        assert_eq!(kept, budget.total());
    }

    #[test]
    fn the_cache_furthest_over_its_share_is_evicted_first_and_a_quiet_one_keeps_its_entries() {
        let (config, budget) = setup(512 << 10);
        let quiet = cache(&config, &budget);
        let floods: Vec<_> = (0..3).map(|_| cache(&config, &budget)).collect();
        for n in 0..20u64 {
            quiet.put(key("quiet", &n.to_string()), n, SIZE, Instant::now());
        }
        let quiet_bytes = quiet.report().bytes;
        // Three floods of unique inputs, from many partitions, each wanting its whole 1 MiB.
        for n in 0..6_000u64 {
            let flood = &floods[(n % 3) as usize];
            let partition = format!("a{}", n % 50);
            flood.put(key(&partition, &n.to_string()), n, SIZE, Instant::now());
        }
        for n in 0..20u64 {
            assert_eq!(
                quiet.get(&key("quiet", &n.to_string()), Instant::now()),
                Some(n),
                "the quiet cache's entry {n} is kept"
            );
        }
        assert_eq!(quiet.report().bytes, quiet_bytes);
        assert!(budget.total() <= budget.ceiling());
        // The floods share the rest about evenly: none is left with much more than another.
        let sizes: Vec<usize> = floods.iter().map(|f| f.report().bytes).collect();
        let spread = sizes.iter().max().expect("three") - sizes.iter().min().expect("three");
        assert!(spread <= 64 << 10, "{sizes:?}");
        let evicted: u64 = floods.iter().map(|f| f.report().evicted).sum();
        assert!(evicted > 5_000, "{evicted}");
        // A quiet cache still keeps what it decides next, from the floods' room.
        quiet.put(key("quiet", "new"), 99, SIZE, Instant::now());
        assert_eq!(quiet.get(&key("quiet", "new"), Instant::now()), Some(99));
        assert_eq!(quiet.report().evicted, 0);
    }

    #[test]
    fn an_unloaded_modules_bytes_return_to_the_budget() {
        let (config, budget) = setup(1 << 20);
        let kept = cache(&config, &budget);
        let unloaded = cache(&config, &budget);
        for n in 0..100u64 {
            kept.put(key("p", &n.to_string()), n, SIZE, Instant::now());
            unloaded.put(key("p", &n.to_string()), n, SIZE, Instant::now());
        }
        let before = budget.total();
        assert_eq!(before, kept.report().bytes + unloaded.report().bytes);
        drop(unloaded);
        assert_eq!(budget.total(), kept.report().bytes);
        assert!(budget.total() < before);
        drop(kept);
        assert_eq!(budget.total(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn shards_no_request_looks_up_give_their_entries_back() {
        let (mut config, _) = setup(1 << 20);
        config.idle_secs = 60;
        let budget = CacheBudget::new(&config);
        let busy = cache(&config, &budget);
        let idle = cache(&config, &budget);
        let short = DecisionCache::new(&config, &budget, vec!["origin"], Duration::from_secs(5))
            .expect("cache");
        for n in 0..50u64 {
            for c in [&busy, &idle, &short] {
                c.put(key("p", &n.to_string()), n, SIZE, Instant::now());
            }
        }
        let each = busy.report().bytes;
        // The first sweep marks every shard; a lookup of `busy` marks its shard as used.
        assert_eq!(budget.sweep(Instant::now()), Freed::default());
        for step in 0..6 {
            tokio::time::advance(Duration::from_secs(15)).await;
            assert_eq!(busy.get(&key("p", "1"), Instant::now()), Some(1), "{step}");
            let freed = budget.sweep(Instant::now());
            if step == 0 {
                // 15 s: past the short cache's maximum age: all its entries have expired.
                assert_eq!(freed.bytes, each, "the short cache at {step}");
            }
        }
        assert_eq!(short.report().entries, 0);
        assert_eq!(idle.report().entries, 0, "idle for 60 s");
        assert_eq!(busy.report().entries, 50, "looked up: kept");
        assert_eq!(budget.total(), each);
    }
}
