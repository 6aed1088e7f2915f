//! The decision cache of one module: what it decided for the inputs it declared, reused
//! without calling it while the declaration's `max-age-ms` lasts.
//!
//! A module's cache belongs to the loaded module: a swap, rollback, promotion or new
//! configuration loads another module, which starts empty. Entries are bounded in number and in
//! bytes for the module (`plugins.decision_cache.entries`, `.bytes`) and for each partition of
//! it (`.partition_entries`, `.partition_bytes`): a partition is the caller's project, or the
//! caller's address before authentication knows the project. Within a partition, the oldest
//! entry makes room first; when the module's whole cache is full, the largest partition gives
//! up its oldest entry. So a caller flooding a module with unique inputs evicts its own
//! entries, and another project's entries stay as long as the flood does not outnumber them.
//!
//! The key of an entry is every declared input, written by the stage ([`KeyWriter`]) with its
//! length before it, and the partition before them all: two different inputs never share an
//! entry, whatever bytes they hold.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::config::DecisionCacheConfig;

/// Shards of a module's cache: a lookup locks one.
const SHARDS: usize = 8;

/// What an entry costs beyond its key and decision (map and queue slots, times, counts).
const ENTRY_OVERHEAD: usize = 96;

/// Lookups in one window of the admission check.
const ADMISSION_WINDOW: u64 = 1024;
/// A window with fewer hits than this (under 1 %) marks the cache as thrashing: the requests'
/// declared inputs do not repeat, and keeping each miss's decision would only evict another.
const THRASHING_HITS: u64 = 10;
/// While thrashing, one request in this many looks its decision up (and keeps it when it
/// misses), so that inputs that start repeating are noticed (their hits end the thrashing at the
/// end of a window); the others are decided by the module without a lookup.
const THRASHING_SAMPLE: u64 = 16;

/// Writes the declared inputs of a request into a cache key.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct KeyWriter {
    bytes: Vec<u8>,
    partition_end: usize,
}

impl KeyWriter {
    /// A key of `partition` (the caller's project or address).
    pub fn new(partition: &str) -> Self {
        let mut key = Self::default();
        key.partition(partition);
        key
    }

    /// Starts the key with its partition (the caller's project or address).
    pub fn partition(&mut self, partition: &str) -> &mut Self {
        self.bytes.clear();
        self.bytes.reserve(128);
        self.tag(b'p').str(partition);
        self.partition_end = self.bytes.len();
        self
    }

    /// Starts the key with the partition of a client address (an IPv6 one by its /64; `None`
    /// when unknown), written as bytes: no text is formatted on the request's path.
    pub fn partition_address(&mut self, client: Option<std::net::IpAddr>) -> &mut Self {
        use std::net::IpAddr;
        self.bytes.clear();
        self.bytes.reserve(128);
        match client {
            None => self.tag(b'-'),
            Some(IpAddr::V4(v4)) => self.tag(b'4').bytes(&v4.octets()),
            Some(IpAddr::V6(v6)) => self.tag(b'6').bytes(&v6.octets()[..8]),
        };
        self.partition_end = self.bytes.len();
        self
    }

    /// Adds a string input.
    pub fn str(&mut self, value: &str) -> &mut Self {
        self.bytes(value.as_bytes())
    }

    /// Adds an input given as bytes.
    pub fn bytes(&mut self, value: &[u8]) -> &mut Self {
        self.bytes
            .extend_from_slice(&(value.len() as u32).to_le_bytes());
        self.bytes.extend_from_slice(value);
        self
    }

    /// Adds an optional string input (absent and empty differ).
    pub fn opt(&mut self, value: Option<&str>) -> &mut Self {
        match value {
            None => self.tag(0),
            Some(v) => self.tag(1).str(v),
        }
    }

    /// Adds a small number (an enum's index, a flag).
    pub fn tag(&mut self, value: u8) -> &mut Self {
        self.bytes.push(value);
        self
    }

    fn partition_bytes(&self) -> &[u8] {
        &self.bytes[..self.partition_end]
    }
}

/// Counters of a module's cache.
#[derive(Debug, Default)]
struct Counts {
    hits: AtomicU64,
    misses: AtomicU64,
    expired: AtomicU64,
    evicted: AtomicU64,
    skipped: AtomicU64,
    declined: AtomicU64,
}

/// Whether a request looks its decision up: always, unless the last window of lookups found
/// (almost) nothing — then a cache costs a key, a lookup, an insert and an eviction per request
/// for no hit, and only a sample of requests uses it.
#[derive(Debug, Default)]
struct Admission {
    lookups: AtomicU64,
    window_hits: AtomicU64,
    thrashing: std::sync::atomic::AtomicBool,
    requests: AtomicU64,
}

impl Admission {
    fn looked_up(&self, hit: bool) {
        if hit {
            self.window_hits.fetch_add(1, Ordering::Relaxed);
        }
        let n = self.lookups.fetch_add(1, Ordering::Relaxed) + 1;
        if n.is_multiple_of(ADMISSION_WINDOW) {
            let hits = self.window_hits.swap(0, Ordering::Relaxed);
            self.thrashing
                .store(hits < THRASHING_HITS, Ordering::Relaxed);
        }
    }

    fn samples(&self) -> bool {
        !self.thrashing.load(Ordering::Relaxed)
            || self
                .requests
                .fetch_add(1, Ordering::Relaxed)
                .is_multiple_of(THRASHING_SAMPLE)
    }
}

/// What the management API shows of a module's cache.
#[derive(Debug, Clone, serde::Serialize, PartialEq, Eq)]
pub struct CacheReport {
    /// The inputs the module declared.
    pub inputs: Vec<&'static str>,
    /// How long a decision is kept (the module's, within the host's ceiling).
    pub max_age_ms: u64,
    pub hits: u64,
    pub misses: u64,
    /// Lookups that found an entry older than the maximum age (counted in `misses` too).
    pub expired: u64,
    pub evicted: u64,
    /// Decisions too large for a partition, not kept.
    pub skipped: u64,
    /// Requests decided by the module without a lookup while the cache was thrashing.
    pub declined: u64,
    /// Whether the last 1,024 lookups found fewer than 10 decisions: the inputs do not repeat,
    /// and only one request in 16 looks its decision up (and keeps it) until they do.
    pub thrashing: bool,
    pub entries: usize,
    pub bytes: usize,
}

/// Where the cache's outcomes are counted (`aura_decision_cache_total`).
#[derive(Debug, Clone)]
pub struct CacheMetrics {
    pub hits: prometheus::IntCounter,
    pub misses: prometheus::IntCounter,
    pub evicted: prometheus::IntCounter,
    pub declined: prometheus::IntCounter,
}

struct Entry<D> {
    decision: D,
    stored: Instant,
    bytes: usize,
}

#[derive(Default)]
struct Partition {
    order: VecDeque<Arc<[u8]>>,
    bytes: usize,
}

struct Shard<D> {
    entries: HashMap<Arc<[u8]>, Entry<D>, foldhash::fast::RandomState>,
    partitions: HashMap<Arc<[u8]>, Partition, foldhash::fast::RandomState>,
    /// Partitions by their number of entries, to find the largest.
    by_size: BTreeSet<(usize, Arc<[u8]>)>,
    bytes: usize,
}

impl<D> Shard<D> {
    fn new() -> Self {
        Self {
            entries: HashMap::default(),
            partitions: HashMap::default(),
            by_size: BTreeSet::new(),
            bytes: 0,
        }
    }

    /// Removes the oldest entry of `partition`; false when it has none.
    fn evict_from(&mut self, partition: &[u8]) -> bool {
        let Some((name, part)) = self.partitions.get_key_value(partition) else {
            return false;
        };
        let name = name.clone();
        let before = part.order.len();
        self.by_size.remove(&(before, name.clone()));
        let part = self
            .partitions
            .get_mut(partition)
            .expect("looked up just before");
        let Some(key) = part.order.pop_front() else {
            return false;
        };
        if let Some(entry) = self.entries.remove(&key) {
            part.bytes -= entry.bytes;
            self.bytes -= entry.bytes;
        }
        if part.order.is_empty() {
            self.partitions.remove(partition);
        } else {
            self.by_size.insert((before - 1, name));
        }
        true
    }

    /// The partition that gives up an entry when the shard is full and `inserting` adds one:
    /// the largest, and `inserting` itself when none is larger (a tie never costs a quieter
    /// caller its entries).
    fn victim(&self, inserting: &[u8]) -> Option<Arc<[u8]>> {
        let own = self
            .partitions
            .get_key_value(inserting)
            .map(|(name, p)| (p.order.len(), name.clone()));
        match (self.by_size.last(), own) {
            (Some((largest, name)), Some((own, _))) if *largest > own => Some(name.clone()),
            (_, Some((own, name))) if own > 0 => Some(name),
            (largest, _) => largest.map(|(_, name)| name.clone()),
        }
    }
}

/// The bounds of one shard.
#[derive(Debug, Clone, Copy)]
struct Bounds {
    entries: usize,
    bytes: usize,
    partition_entries: usize,
    partition_bytes: usize,
}

/// A module's decisions by their declared inputs.
pub struct DecisionCache<D> {
    shards: Box<[Mutex<Shard<D>>]>,
    hasher: foldhash::fast::RandomState,
    bounds: Bounds,
    max_age: Duration,
    inputs: Vec<&'static str>,
    counts: Counts,
    admission: Admission,
    metrics: std::sync::OnceLock<Option<CacheMetrics>>,
}

impl<D> std::fmt::Debug for DecisionCache<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DecisionCache")
            .field("inputs", &self.inputs)
            .field("max_age", &self.max_age)
            .finish_non_exhaustive()
    }
}

impl<D: Clone> DecisionCache<D> {
    /// A cache for decisions that hold `max_age` (the module's; lowered to the host's ceiling)
    /// and depend on `inputs`; `None` when the configuration or the module keeps nothing.
    pub fn new(
        config: &DecisionCacheConfig,
        inputs: Vec<&'static str>,
        max_age: Duration,
    ) -> Option<Self> {
        let max_age = max_age.min(Duration::from_millis(config.max_age_ms));
        if !config.enabled || max_age.is_zero() || config.entries == 0 {
            return None;
        }
        let per_shard = |total: usize| total.div_ceil(SHARDS).max(1);
        let bounds = Bounds {
            entries: per_shard(config.entries),
            bytes: per_shard(config.bytes),
            partition_entries: config.partition_entries.max(1),
            partition_bytes: config.partition_bytes.max(1),
        };
        Some(Self {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::new())).collect(),
            hasher: foldhash::fast::RandomState::default(),
            bounds,
            max_age,
            inputs,
            counts: Counts::default(),
            admission: Admission::default(),
            metrics: std::sync::OnceLock::new(),
        })
    }

    /// Where hits, misses and evictions are counted from now on (set once).
    pub fn count_in(&self, metrics: impl FnOnce() -> Option<CacheMetrics>) {
        self.metrics.get_or_init(metrics);
    }

    fn shard(&self, key: &KeyWriter) -> &Mutex<Shard<D>> {
        let hash = self.hasher.hash_one(key.partition_bytes());
        &self.shards[hash as usize % SHARDS]
    }

    fn metric(&self, f: impl FnOnce(&CacheMetrics)) {
        if let Some(Some(m)) = self.metrics.get() {
            f(m);
        }
    }

    /// The decision kept for `key`, if it is younger than the maximum age.
    pub fn get(&self, key: &KeyWriter) -> Option<D> {
        let found = {
            let shard = self.shard(key).lock().ok()?;
            match shard.entries.get(key.bytes.as_slice()) {
                Some(entry) if entry.stored.elapsed() < self.max_age => {
                    Some(entry.decision.clone())
                }
                Some(_) => {
                    self.counts.expired.fetch_add(1, Ordering::Relaxed);
                    None
                }
                None => None,
            }
        };
        self.admission.looked_up(found.is_some());
        match &found {
            Some(_) => {
                self.counts.hits.fetch_add(1, Ordering::Relaxed);
                self.metric(|m| m.hits.inc());
            }
            None => {
                self.counts.misses.fetch_add(1, Ordering::Relaxed);
                self.metric(|m| m.misses.inc());
            }
        }
        found
    }

    /// Whether this request looks its decision up, and keeps the module's answer on a miss
    /// (see [`CacheReport::thrashing`]); counted when it does not.
    pub fn looks_up(&self) -> bool {
        if self.admission.samples() {
            return true;
        }
        self.counts.declined.fetch_add(1, Ordering::Relaxed);
        self.metric(|m| m.declined.inc());
        false
    }

    /// Keeps `decision` for `key` (`size`: the decision's heap bytes).
    pub fn put(&self, key: KeyWriter, decision: D, size: usize) {
        let bytes = key.bytes.len() * 2 + size + ENTRY_OVERHEAD;
        if bytes > self.bounds.partition_bytes || bytes > self.bounds.bytes {
            self.counts.skipped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let Ok(mut shard) = self.shard(&key).lock() else {
            return;
        };
        let now = Instant::now();
        let partition_len = key.partition_end;
        let partition = &key.bytes[..partition_len];
        if let Some(entry) = shard.entries.get_mut(key.bytes.as_slice()) {
            // Expired (or decided twice at once): replaced where it stands.
            let old = std::mem::replace(
                entry,
                Entry {
                    decision,
                    stored: now,
                    bytes,
                },
            );
            shard.bytes = shard.bytes + bytes - old.bytes;
            if let Some(part) = shard.partitions.get_mut(partition) {
                part.bytes = part.bytes + bytes - old.bytes;
            }
            return;
        }
        let mut evicted = 0u64;
        // The partition makes room from its own entries first.
        while let Some(part) = shard.partitions.get(partition)
            && (part.order.len() >= self.bounds.partition_entries
                || part.bytes + bytes > self.bounds.partition_bytes)
        {
            if !shard.evict_from(partition) {
                break;
            }
            evicted += 1;
        }
        // Then the module's cache, from its largest partition.
        while shard.entries.len() >= self.bounds.entries || shard.bytes + bytes > self.bounds.bytes
        {
            let Some(victim) = shard.victim(partition) else {
                break;
            };
            if !shard.evict_from(&victim) {
                break;
            }
            evicted += 1;
        }
        let key: Arc<[u8]> = Arc::from(key.bytes.into_boxed_slice());
        let name: Arc<[u8]> = match shard.partitions.get_key_value(&key[..partition_len]) {
            Some((name, _)) => name.clone(),
            None => Arc::from(&key[..partition_len]),
        };
        let part = shard.partitions.entry(name.clone()).or_default();
        let before = part.order.len();
        part.order.push_back(key.clone());
        part.bytes += bytes;
        shard.by_size.remove(&(before, name.clone()));
        shard.by_size.insert((before + 1, name));
        shard.bytes += bytes;
        shard.entries.insert(
            key,
            Entry {
                decision,
                stored: now,
                bytes,
            },
        );
        drop(shard);
        if evicted > 0 {
            self.counts.evicted.fetch_add(evicted, Ordering::Relaxed);
            self.metric(|m| m.evicted.inc_by(evicted));
        }
    }

    /// Counts and sizes, for the module's report.
    pub fn report(&self) -> CacheReport {
        let (mut entries, mut bytes) = (0, 0);
        for shard in self.shards.iter() {
            if let Ok(shard) = shard.lock() {
                entries += shard.entries.len();
                bytes += shard.bytes;
            }
        }
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        CacheReport {
            inputs: self.inputs.clone(),
            max_age_ms: self.max_age.as_millis() as u64,
            hits: load(&self.counts.hits),
            misses: load(&self.counts.misses),
            expired: load(&self.counts.expired),
            evicted: load(&self.counts.evicted),
            skipped: load(&self.counts.skipped),
            declined: load(&self.counts.declined),
            thrashing: self.admission.thrashing.load(Ordering::Relaxed),
            entries,
            bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(entries: usize, partition_entries: usize) -> DecisionCacheConfig {
        DecisionCacheConfig {
            entries,
            partition_entries,
            ..DecisionCacheConfig::default()
        }
    }

    fn key(partition: &str, input: &str) -> KeyWriter {
        let mut k = KeyWriter::new(partition);
        k.str(input);
        k
    }

    #[tokio::test(start_paused = true)]
    async fn a_decision_is_kept_for_its_maximum_age_and_no_longer() {
        let cache = DecisionCache::new(&config(100, 10), vec!["path"], Duration::from_secs(5))
            .expect("cache");
        assert_eq!(cache.get(&key("p", "/a")), None);
        cache.put(key("p", "/a"), 7u32, 0);
        assert_eq!(cache.get(&key("p", "/a")), Some(7));
        assert_eq!(cache.get(&key("p", "/b")), None, "another input");
        assert_eq!(cache.get(&key("q", "/a")), None, "another partition");
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(cache.get(&key("p", "/a")), None, "expired");
        cache.put(key("p", "/a"), 8, 0);
        assert_eq!(cache.get(&key("p", "/a")), Some(8), "replaced in place");
        let r = cache.report();
        assert_eq!((r.hits, r.misses, r.expired, r.entries), (2, 4, 1, 1));
    }

    #[test]
    fn a_cache_whose_inputs_never_repeat_keeps_a_sample_until_they_do() {
        let cache = DecisionCache::new(&config(100_000, 100_000), vec!["path"], Duration::MAX)
            .expect("cache");
        let miss_and_keep = |n: u64| {
            if !cache.looks_up() {
                return;
            }
            let k = key("p", &n.to_string());
            if cache.get(&k).is_none() {
                cache.put(k, n, 0);
            }
        };
        // A window of unique inputs: every miss kept, then the cache is thrashing.
        for n in 0..ADMISSION_WINDOW {
            miss_and_keep(n);
        }
        let r = cache.report();
        assert!(r.thrashing);
        assert_eq!((r.entries, r.declined), (ADMISSION_WINDOW as usize, 0));
        // More unique inputs: one request in 16 looks up (and keeps its miss).
        for n in ADMISSION_WINDOW..2 * ADMISSION_WINDOW {
            miss_and_keep(n);
        }
        let r = cache.report();
        let sampled = (ADMISSION_WINDOW / THRASHING_SAMPLE) as usize;
        assert_eq!(r.entries, ADMISSION_WINDOW as usize + sampled);
        assert_eq!(r.declined, ADMISSION_WINDOW - sampled as u64);
        assert_eq!(r.misses, ADMISSION_WINDOW + sampled as u64);
        assert!(r.thrashing);
        // Inputs that repeat: the sampled lookups hit, and the window's end ends the thrashing.
        for n in 0..THRASHING_SAMPLE * ADMISSION_WINDOW {
            miss_and_keep(n % 16);
        }
        let r = cache.report();
        assert!(!r.thrashing, "{r:?}");
        let declined = r.declined;
        miss_and_keep(1_000_000);
        assert_eq!(cache.report().declined, declined, "every miss kept again");
    }

    #[test]
    fn addresses_partition_by_host_and_ipv6_by_its_64() {
        let of = |ip: &str| {
            let mut k = KeyWriter::default();
            k.partition_address(Some(ip.parse().expect("ip")));
            k.partition_bytes().to_vec()
        };
        assert_eq!(of("2001:db8:1:2::1"), of("2001:db8:1:2:ffff::9"), "one /64");
        assert_ne!(of("2001:db8:1:2::1"), of("2001:db8:1:3::1"));
        assert_ne!(of("192.0.2.1"), of("192.0.2.2"));
        let mut unknown = KeyWriter::default();
        unknown.partition_address(None);
        assert_ne!(unknown.partition_bytes(), of("192.0.2.1").as_slice());
        // A project's partition never meets an address's, whatever its name holds.
        let mut project = KeyWriter::default();
        project.partition("-");
        assert_ne!(project.partition_bytes(), unknown.partition_bytes());
    }

    #[test]
    fn keys_are_written_with_lengths_so_inputs_never_run_together() {
        let mut a = KeyWriter::new("p");
        a.str("ab").str("c");
        let mut b = KeyWriter::new("p");
        b.str("a").str("bc");
        assert_ne!(a.bytes, b.bytes);
        let mut c = KeyWriter::new("pa");
        c.str("b");
        let mut d = KeyWriter::new("p");
        d.str("ab");
        assert_ne!(c.bytes, d.bytes);
        let (mut none, mut empty) = (KeyWriter::new("p"), KeyWriter::new("p"));
        none.opt(None);
        empty.opt(Some(""));
        assert_ne!(none.bytes, empty.bytes);
    }

    #[tokio::test(start_paused = true)]
    async fn a_flooding_partition_evicts_its_own_entries_first() {
        // 8 shards of 6 entries, 4 per partition.
        let cache = DecisionCache::new(&config(8 * 6, 4), vec!["path"], Duration::from_secs(60))
            .expect("cache");
        let shard_of =
            |p: &str| cache.hasher.hash_one(KeyWriter::new(p).partition_bytes()) as usize % SHARDS;
        let target = shard_of("quiet");
        // Partitions that share the quiet one's shard, so that its module-wide bound is reached.
        let mut neighbours = (0..100_000)
            .map(|n| format!("p{n}"))
            .filter(|p| shard_of(p) == target);
        let flood = neighbours.next().expect("a neighbour");
        for path in ["/1", "/2", "/3"] {
            cache.put(key("quiet", path), 1u8, 0);
        }
        for n in 0..10_000 {
            cache.put(key(&flood, &n.to_string()), 2u8, 0);
        }
        for path in ["/1", "/2", "/3"] {
            assert_eq!(cache.get(&key("quiet", path)), Some(1), "{path} kept");
        }
        let r = cache.report();
        assert!(r.entries <= 6, "{r:?}");
        assert!(r.evicted >= 10_000 - 3, "{r:?}");
        // A crowd of partitions in the same shard: the largest gives, the shard stays bounded.
        let crowd: Vec<String> = neighbours.take(20).collect();
        for p in &crowd {
            for n in 0..4 {
                cache.put(key(p, &n.to_string()), 3u8, 0);
            }
        }
        let shard = cache.shards[target].lock().expect("lock");
        assert!(shard.entries.len() <= 6, "bounded: {}", shard.entries.len());
    }

    #[test]
    fn bytes_are_bounded_and_oversized_decisions_skipped() {
        let cfg = DecisionCacheConfig {
            partition_bytes: 1024,
            ..DecisionCacheConfig::default()
        };
        let cache = DecisionCache::new(&cfg, vec!["path"], Duration::from_secs(60)).expect("cache");
        cache.put(key("p", "/big"), 1u8, 4096);
        assert_eq!(cache.report().skipped, 1);
        for n in 0..100 {
            cache.put(key("p", &n.to_string()), 1u8, 200);
        }
        let r = cache.report();
        assert!(r.bytes <= 1024, "{r:?}");
        assert!(r.entries >= 1 && r.entries <= 4, "{r:?}");
    }

    #[test]
    fn no_cache_when_disabled_or_the_module_keeps_nothing() {
        let off = DecisionCacheConfig {
            enabled: false,
            ..DecisionCacheConfig::default()
        };
        assert!(DecisionCache::<u8>::new(&off, vec![], Duration::from_secs(1)).is_none());
        let on = DecisionCacheConfig::default();
        assert!(DecisionCache::<u8>::new(&on, vec![], Duration::ZERO).is_none());
        let capped =
            DecisionCache::<u8>::new(&on, vec![], Duration::from_secs(86_400)).expect("cache");
        assert_eq!(
            capped.report().max_age_ms,
            on.max_age_ms,
            "lowered to the ceiling"
        );
    }
}
