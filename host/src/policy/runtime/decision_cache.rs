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
//! Every cache of the instance also shares one ceiling of bytes
//! (`plugins.decision_cache.total_bytes`, [`CacheBudget`]): an entry's bytes are reserved in it
//! before the entry is inserted and given back when it goes, and when there is no room the
//! caches furthest over their fair share give back entries first; a cache's shards that no
//! request looks up for a while, and a module's whole cache when the module is unloaded, give
//! their bytes back.
//!
//! The key of an entry is every declared input, written by the stage ([`KeyWriter`]) with its
//! length before it, and the partition before them all: two different inputs never share an
//! entry, whatever bytes they hold.
//!
//! A lookup is on every request's path, so it touches few cache lines: [`DecisionCache`] is the
//! three fields a lookup reads (the rest is behind its pointer); the partitions are spread over
//! [`SHARDS`] shards, each under its own lock, in one line of 64 bytes that holds the admission
//! word, the lock, the table's header and the lookups of the admission window under way (the
//! bookkeeping of insertion and eviction, and the counts of the windows before, are behind a
//! pointer a hit does not follow); and a hit reads the table's control bytes and one slot of
//! 128 bytes that holds the key's bytes (up to [`INLINE_KEY`] of them), the decision and its
//! time. A cell and a slot are each aligned to 128 bytes, a pair of lines some cores fetch
//! together: neighbouring shards never share one. Hits and misses are plain numbers under the
//! shard's lock, added to their metric's counter when the metrics are rendered
//! ([`crate::metrics::Publish`]): besides the lock, the only shared counter a hit moves is the
//! decision's reference count (the ceiling's count of bytes is moved by inserts and evictions
//! only). Nor does a lookup read the clock: an entry's age is judged at the
//! arrival of the request that looks it up, a time the caller read once for all the request's
//! stages, and an entry is kept as old as the request it was decided for.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hashbrown::HashTable;
use tokio::time::Instant;

use super::cache_budget::{CacheBudget, Freed, Member};
use crate::config::DecisionCacheConfig;

/// Shards of a module's cache: a lookup locks one, chosen by the key's partition.
pub const SHARDS: usize = 8;

/// Key bytes kept in an entry's slot; a longer key is kept on the heap. Room for the default
/// plugins' keys of a request (an address and an API key of 50 characters; a project, a role
/// and a plan), in a slot of 128 bytes.
pub const INLINE_KEY: usize = 86;

/// What an entry costs beyond its heap bytes: its slot, the table's control byte and its place
/// in its partition's queue.
const ENTRY_OVERHEAD: usize = 128 + 1 + 16;

/// Lookups in one window of a shard's admission check.
const ADMISSION_WINDOW: u64 = 1024;
/// A window with fewer hits than this (under 1 %) marks the shard as thrashing: the requests'
/// declared inputs do not repeat, and keeping each miss's decision would only evict another.
const THRASHING_HITS: u64 = 10;
/// While a shard thrashes, one of its requests in this many looks its decision up (and keeps it
/// when it misses), so that inputs that start repeating are noticed (their hits end the
/// thrashing at the end of a window); the others are decided by the module without a lookup.
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
    /// Decisions too large for a partition, or that found no room under the instance's
    /// ceiling, not kept.
    pub skipped: u64,
    /// Requests decided by the module without a lookup while their shard was thrashing.
    pub declined: u64,
    /// Whether a shard of the cache thrashes: its last 1,024 lookups found fewer than 10
    /// decisions (its partitions' inputs do not repeat), and only one of its requests in 16
    /// looks its decision up (and keeps it) until they do.
    pub thrashing: bool,
    /// How many of the cache's shards thrash (of [`SHARDS`]; partitions are spread over them).
    pub thrashing_shards: usize,
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
    /// Where the cache is told to add its hits and misses to `hits` and `misses`.
    pub publishers: crate::metrics::Publishers,
}

/// Counters of a module's cache kept outside its shards (their paths take no lock).
#[derive(Debug, Default)]
struct Counts {
    skipped: AtomicU64,
    declined: AtomicU64,
}

/// A module's counts summed over its shards, for its report.
#[derive(Debug, Default, Clone, Copy)]
struct ShardCounts {
    hits: u64,
    misses: u64,
    expired: u64,
    evicted: u64,
}

/// Hits and misses of a shard.
#[derive(Debug, Default, Clone, Copy)]
struct Lookups {
    hits: u64,
    misses: u64,
}

/// The lookups of a shard's admission window under way, moved under its lock on every lookup;
/// added to the shard's [`Books::lookups`] when the window ends.
#[derive(Debug, Default, Clone, Copy)]
struct Window {
    lookups: u32,
    hits: u32,
}

/// A key's bytes: in the entry's slot when they fit, else on the heap.
enum KeyBytes {
    Inline { len: u8, bytes: [u8; INLINE_KEY] },
    Heap(Box<[u8]>),
}

impl KeyBytes {
    fn of(key: &[u8]) -> Self {
        if key.len() <= INLINE_KEY {
            let mut bytes = [0; INLINE_KEY];
            bytes[..key.len()].copy_from_slice(key);
            Self::Inline {
                len: key.len() as u8,
                bytes,
            }
        } else {
            Self::Heap(key.into())
        }
    }

    fn as_slice(&self) -> &[u8] {
        match self {
            Self::Inline { len, bytes } => &bytes[..usize::from(*len)],
            Self::Heap(bytes) => bytes,
        }
    }

    /// Bytes on the heap.
    fn heap(&self) -> usize {
        match self {
            Self::Inline { .. } => 0,
            Self::Heap(bytes) => bytes.len(),
        }
    }
}

/// One decision in a shard's table: 128 bytes, aligned to them.
#[repr(align(128))]
struct Slot<D> {
    key: KeyBytes,
    decision: D,
    stored: Instant,
    /// The entry's number in its shard: its partition's queue names it by its hash and this.
    seq: u64,
    /// What the entry is counted for against the bounds.
    bytes: usize,
}

/// A partition's entries, oldest first, by their key's hash and number.
#[derive(Default)]
struct Partition {
    order: VecDeque<(u64, u64)>,
    bytes: usize,
}

/// Whether a shard's requests look their decisions up: always, unless the shard's last window
/// of lookups found (almost) nothing — then a cache costs a key, a lookup, an insert and an
/// eviction per request for no hit, and only a sample of its requests uses it. Judged per
/// shard: a caller flooding a module with unique inputs makes its own shard step aside, and the
/// partitions of the other shards keep their lookups.
///
/// One word: the top bit says the shard thrashes, the others count its requests while it does
/// (a lookup of a shard that does not thrash reads the word and writes nothing).
#[derive(Debug, Default)]
struct Admission(AtomicU32);

impl Admission {
    const THRASHING: u32 = 1 << 31;

    fn samples(&self) -> bool {
        if self.0.load(Ordering::Relaxed) & Self::THRASHING == 0 {
            return true;
        }
        // The count wraps into the flag after 2^31 requests: the shard then looks up until
        // its window ends (at most 1,024 lookups later) and is judged again.
        let before = self.0.fetch_add(1, Ordering::Relaxed);
        u64::from(before & !Self::THRASHING).is_multiple_of(THRASHING_SAMPLE)
    }

    fn thrashing(&self) -> bool {
        self.0.load(Ordering::Relaxed) & Self::THRASHING != 0
    }

    /// Marks the shard as thrashing or not, at the end of a window. A request counted at the
    /// same time as the flag is cleared leaves a count without the flag: not thrashing.
    fn set(&self, thrashing: bool) {
        if thrashing != self.thrashing() {
            self.0.store(
                if thrashing { Self::THRASHING } else { 0 },
                Ordering::Relaxed,
            );
        }
    }
}

/// A shard's table and what its lookups count: what a hit touches, beside the lock (48 bytes,
/// in this order).
#[repr(C)]
struct Shard<D> {
    table: HashTable<Slot<D>>,
    window: Window,
    /// What insertion and eviction keep, behind a pointer a hit does not follow.
    books: Box<Books>,
}

/// A shard's bookkeeping of insertion and eviction, and its rarer counts.
#[derive(Default)]
struct Books {
    partitions: HashMap<Arc<[u8]>, Partition, foldhash::fast::RandomState>,
    /// Partitions by their number of entries, to find the largest.
    by_size: BTreeSet<(usize, Arc<[u8]>)>,
    bytes: usize,
    next_seq: u64,
    expired: u64,
    evicted: u64,
    /// The hits and misses of the admission windows that ended.
    lookups: Lookups,
    /// The hits and misses already added to the metric's counters.
    published: Lookups,
    /// The shard's lookups when a sweep last saw them change, and when: a shard whose lookups
    /// stay the same for the cache's idle time gives its entries back.
    quiet: Option<(u64, Instant)>,
}

impl<D> Shard<D> {
    fn new() -> Self {
        Self {
            table: HashTable::new(),
            window: Window::default(),
            books: Box::default(),
        }
    }

    /// Counts a lookup; at the end of a window, whether the shard thrashes.
    fn looked_up(&mut self, hit: bool) -> Option<bool> {
        self.window.lookups += 1;
        self.window.hits += u32::from(hit);
        if u64::from(self.window.lookups) < ADMISSION_WINDOW {
            return None;
        }
        let Window { lookups, hits } = std::mem::take(&mut self.window);
        let totals = &mut self.books.lookups;
        totals.hits += u64::from(hits);
        totals.misses += u64::from(lookups - hits);
        Some(u64::from(hits) < THRASHING_HITS)
    }

    /// Every hit and miss of the shard: the windows that ended and the one under way.
    fn lookups(&self) -> Lookups {
        let (totals, window) = (self.books.lookups, self.window);
        Lookups {
            hits: totals.hits + u64::from(window.hits),
            misses: totals.misses + u64::from(window.lookups - window.hits),
        }
    }

    /// Removes the oldest entry of `partition`: the bytes it was counted for; `None` when the
    /// partition has none.
    fn evict_from(&mut self, partition: &[u8]) -> Option<usize> {
        let books = &mut *self.books;
        let (name, part) = books.partitions.get_key_value(partition)?;
        let name = name.clone();
        let before = part.order.len();
        books.by_size.remove(&(before, name.clone()));
        let part = books
            .partitions
            .get_mut(partition)
            .expect("looked up just before");
        let (hash, seq) = part.order.pop_front()?;
        let mut freed = 0;
        if let Ok(slot) = self.table.find_entry(hash, |s| s.seq == seq) {
            let (slot, _) = slot.remove();
            part.bytes -= slot.bytes;
            books.bytes -= slot.bytes;
            freed = slot.bytes;
        }
        if part.order.is_empty() {
            books.partitions.remove(partition);
        } else {
            books.by_size.insert((before - 1, name));
        }
        Some(freed)
    }

    /// Evicts the oldest entries of the shard's largest partitions until `bytes` are freed or
    /// the shard is empty.
    fn evict_largest(&mut self, bytes: usize) -> Freed {
        let mut freed = Freed::default();
        while freed.bytes < bytes {
            let Some((_, largest)) = self.books.by_size.last() else {
                break;
            };
            let largest = largest.clone();
            let Some(b) = self.evict_from(&largest) else {
                break;
            };
            freed.bytes += b;
            freed.entries += 1;
        }
        self.books.evicted += freed.entries;
        freed
    }

    /// Drops every entry, and the memory of the table and its books.
    fn clear(&mut self) -> Freed {
        let freed = Freed {
            bytes: self.books.bytes,
            entries: self.table.len() as u64,
        };
        self.table = HashTable::new();
        let books = &mut *self.books;
        books.partitions = HashMap::default();
        books.by_size = BTreeSet::new();
        books.bytes = 0;
        freed
    }

    /// Returns the table's and the books' memory when evictions left them mostly empty.
    fn shrink(&mut self, hasher: &foldhash::fast::RandomState) {
        let len = self.table.len();
        if self.table.capacity() > 4 * len.max(16) {
            self.table
                .shrink_to(2 * len, |s| hasher.hash_one(s.key.as_slice()));
        }
        let parts = &mut self.books.partitions;
        if parts.capacity() > 4 * parts.len().max(16) {
            parts.shrink_to(2 * parts.len());
        }
    }

    /// The partition that gives up an entry when the shard is full and `inserting` adds one:
    /// the largest, and `inserting` itself when none is larger (a tie never costs a quieter
    /// caller its entries).
    fn victim(&self, inserting: &[u8]) -> Option<Arc<[u8]>> {
        let own = self
            .books
            .partitions
            .get_key_value(inserting)
            .map(|(name, p)| (p.order.len(), name.clone()));
        match (self.books.by_size.last(), own) {
            (Some((largest, name)), Some((own, _))) if *largest > own => Some(name.clone()),
            (_, Some((own, name))) if own > 0 => Some(name),
            (largest, _) => largest.map(|(_, name)| name.clone()),
        }
    }
}

/// A shard and what its requests check before taking its lock: 64 bytes, the only line of the
/// shard a lookup touches, at the start of 128 bytes of its own (the workers locking
/// neighbouring shards share no line, nor a pair of lines).
#[repr(C, align(128))]
struct ShardCell<D> {
    admission: Admission,
    shard: Mutex<Shard<D>>,
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
///
/// The three fields a lookup reads (32 bytes, in this order): a module keeps them on the line
/// it reads for every request; what only a miss or a report reads is behind `shared`.
#[repr(C)]
pub struct DecisionCache<D> {
    shared: Arc<Shared<D>>,
    hasher: foldhash::fast::RandomState,
    max_age: Duration,
}

/// A cache's shards and counts, shared with the metrics, which add its hits and misses to their
/// counters when they are rendered.
struct Shared<D> {
    shards: [ShardCell<D>; SHARDS],
    counts: Counts,
    metrics: std::sync::OnceLock<Option<CacheMetrics>>,
    bounds: Bounds,
    inputs: Vec<&'static str>,
    /// The instance's ceiling, where the bytes in `held` are counted too.
    budget: Arc<CacheBudget>,
    /// Bytes the cache's entries are counted for, over its shards (what the budget weighs).
    held: AtomicUsize,
    /// How long a shard goes without a lookup before its entries are given back.
    idle: Duration,
    /// The lookups' hasher, to shrink a table.
    hasher: foldhash::fast::RandomState,
}

impl<D> Shared<D> {
    /// Counts an insert's `added` bytes (reserved in the budget before) and the `freed` bytes
    /// of the entries it evicted or replaced.
    fn settle(&self, added: usize, freed: usize) {
        if added >= freed {
            self.held.fetch_add(added - freed, Ordering::Relaxed);
        } else {
            self.held.fetch_sub(freed - added, Ordering::Relaxed);
        }
        self.budget.release(freed);
    }

    /// Counts `freed` bytes given back by evictions outside an insert.
    fn gave_back(&self, freed: Freed) {
        if freed.bytes > 0 {
            self.held.fetch_sub(freed.bytes, Ordering::Relaxed);
            self.budget.release(freed.bytes);
        }
        if freed.entries > 0
            && let Some(Some(m)) = self.metrics.get()
        {
            m.evicted.inc_by(freed.entries);
        }
    }

    /// Adds the hits and misses counted since the last time to the metric's counters.
    fn publish_lookups(&self) {
        let Some(Some(m)) = self.metrics.get() else {
            return;
        };
        for cell in &self.shards {
            let Ok(mut shard) = cell.shard.lock() else {
                continue;
            };
            let (now, before) = (shard.lookups(), shard.books.published);
            shard.books.published = now;
            drop(shard);
            m.hits.inc_by(now.hits - before.hits);
            m.misses.inc_by(now.misses - before.misses);
        }
    }
}

impl<D: Send + 'static> crate::metrics::Publish for Shared<D> {
    fn publish(&self) {
        self.publish_lookups();
    }
}

impl<D: Send> Member for Shared<D> {
    fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    fn give_back(&self, bytes: usize) -> Freed {
        // Each shard gives in proportion to what it keeps, from its largest partitions.
        let sizes: Vec<usize> = self
            .shards
            .iter()
            .map(|cell| cell.shard.lock().map_or(0, |s| s.books.bytes))
            .collect();
        let kept: usize = sizes.iter().sum();
        let mut freed = Freed::default();
        if kept == 0 {
            return freed;
        }
        for (cell, size) in self.shards.iter().zip(sizes) {
            if size == 0 {
                continue;
            }
            let share = (bytes as u128 * size as u128).div_ceil(kept as u128) as usize;
            let Ok(mut shard) = cell.shard.lock() else {
                continue;
            };
            let f = shard.evict_largest(share);
            shard.shrink(&self.hasher);
            drop(shard);
            freed.bytes += f.bytes;
            freed.entries += f.entries;
        }
        self.gave_back(freed);
        freed
    }

    fn sweep(&self, now: Instant) -> Freed {
        let mut freed = Freed::default();
        for cell in &self.shards {
            let Ok(mut shard) = cell.shard.lock() else {
                continue;
            };
            let seen = shard.lookups();
            let lookups = seen.hits + seen.misses;
            match shard.books.quiet {
                Some((before, since)) if before == lookups => {
                    if !shard.table.is_empty() && now.saturating_duration_since(since) >= self.idle
                    {
                        let f = shard.clear();
                        freed.bytes += f.bytes;
                        freed.entries += f.entries;
                    }
                }
                _ => shard.books.quiet = Some((lookups, now)),
            }
        }
        if freed.bytes > 0 {
            self.held.fetch_sub(freed.bytes, Ordering::Relaxed);
            self.budget.release(freed.bytes);
        }
        freed
    }
}

impl<D> Drop for Shared<D> {
    fn drop(&mut self) {
        // A cache goes with its module (or the last holder of its shared state): its bytes go
        // back to the instance's ceiling.
        self.budget.release(*self.held.get_mut());
    }
}

impl<D> Drop for DecisionCache<D> {
    fn drop(&mut self) {
        // A cache goes with its module: what it counted since the last rendering is added now.
        self.shared.publish_lookups();
    }
}

impl<D> std::fmt::Debug for DecisionCache<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DecisionCache")
            .field("inputs", &self.shared.inputs)
            .field("max_age", &self.max_age)
            .finish_non_exhaustive()
    }
}

impl<D: Clone> DecisionCache<D> {
    /// A cache for decisions that hold `max_age` (the module's; lowered to the host's ceiling)
    /// and depend on `inputs`, whose bytes count against `budget` (the instance's); `None` when
    /// the configuration or the module keeps nothing.
    pub fn new(
        config: &DecisionCacheConfig,
        budget: &Arc<CacheBudget>,
        inputs: Vec<&'static str>,
        max_age: Duration,
    ) -> Option<Self>
    where
        D: Send + 'static,
    {
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
        let hasher = foldhash::fast::RandomState::default();
        let shared = Arc::new(Shared {
            shards: std::array::from_fn(|_| ShardCell {
                admission: Admission::default(),
                shard: Mutex::new(Shard::new()),
            }),
            counts: Counts::default(),
            metrics: std::sync::OnceLock::new(),
            bounds,
            inputs,
            budget: budget.clone(),
            held: AtomicUsize::new(0),
            idle: budget.idle().min(max_age),
            hasher: hasher.clone(),
        });
        let member: std::sync::Weak<dyn Member> = Arc::downgrade(&shared) as _;
        budget.join(member);
        Some(Self {
            shared,
            hasher,
            max_age,
        })
    }

    /// Where hits, misses and evictions are counted from now on (set once): evictions and
    /// declined lookups as they happen, hits and misses when the metrics are rendered.
    pub fn count_in(&self, metrics: impl FnOnce() -> Option<CacheMetrics>)
    where
        D: Send + Sync + 'static,
    {
        self.shared.metrics.get_or_init(|| {
            let metrics = metrics();
            if let Some(m) = &metrics {
                let shared: std::sync::Weak<dyn crate::metrics::Publish> =
                    Arc::downgrade(&self.shared) as _;
                m.publishers.add(shared);
            }
            metrics
        });
    }

    /// The shard of `key`'s partition (written first, so that it is known before the rest).
    fn cell(&self, key: &KeyWriter) -> &ShardCell<D> {
        let hash = self.hasher.hash_one(key.partition_bytes());
        &self.shared.shards[hash as usize % SHARDS]
    }

    fn metric(&self, f: impl FnOnce(&CacheMetrics)) {
        if let Some(Some(m)) = self.shared.metrics.get() {
            f(m);
        }
    }

    /// Whether this request, whose key holds its partition so far, looks its decision up and
    /// keeps the module's answer on a miss (see [`CacheReport::thrashing`]); counted when it
    /// does not.
    pub fn looks_up(&self, key: &KeyWriter) -> bool {
        if self.cell(key).admission.samples() {
            return true;
        }
        self.shared.counts.declined.fetch_add(1, Ordering::Relaxed);
        self.metric(|m| m.declined.inc());
        false
    }

    /// The decision kept for `key`, if it was younger than the maximum age at `at`: the time
    /// the request arrived, read once for all its stages (a decision kept after it is as young
    /// as can be). A request is thus decided as of its arrival: a decision that comes of age
    /// while the request waits for its stage (an API key looked up, a per-actor limit, or the
    /// backend's answer, for the CORS decision of the response: at most the route group's
    /// budget) still serves it. That is never a wrong decision: a stage's decision depends on
    /// its inputs and its module's configuration only, and the request pinned its modules when
    /// it arrived; the maximum age bounds how long an entry is kept, not whether it holds.
    pub fn get(&self, key: &KeyWriter, at: Instant) -> Option<D> {
        let cell = self.cell(key);
        let wanted = key.bytes.as_slice();
        let hash = self.hasher.hash_one(wanted);
        let (found, thrashing) = {
            let mut shard = cell.shard.lock().ok()?;
            let found = match shard.table.find(hash, |s| s.key.as_slice() == wanted) {
                Some(slot) if at.saturating_duration_since(slot.stored) < self.max_age => {
                    Some(slot.decision.clone())
                }
                Some(_) => {
                    shard.books.expired += 1;
                    None
                }
                None => None,
            };
            let thrashing = shard.looked_up(found.is_some());
            (found, thrashing)
        };
        if let Some(thrashing) = thrashing {
            cell.admission.set(thrashing);
        }
        found
    }

    /// Keeps `decision` for `key` (`size`: the decision's heap bytes), as old as the request
    /// it was decided for, which arrived at `at`.
    pub fn put(&self, key: KeyWriter, decision: D, size: usize, at: Instant) {
        let wanted = key.bytes.as_slice();
        let stored_key = KeyBytes::of(wanted);
        let bytes = stored_key.heap() + size + ENTRY_OVERHEAD;
        let bounds = self.shared.bounds;
        // Room under the instance's ceiling is made before the shard is locked: making it may
        // lock another cache's shards, or this cache's.
        if bytes > bounds.partition_bytes
            || bytes > bounds.bytes
            || !self.shared.budget.reserve(bytes)
        {
            self.shared.counts.skipped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let hash = self.hasher.hash_one(wanted);
        let Ok(mut shard) = self.cell(&key).shard.lock() else {
            self.shared.budget.release(bytes);
            return;
        };
        let partition = key.partition_bytes();
        if let Some(slot) = shard.table.find_mut(hash, |s| s.key.as_slice() == wanted) {
            // Expired (or decided twice at once): replaced where it stands, in its place in
            // its partition's queue.
            let old = std::mem::replace(&mut slot.bytes, bytes);
            slot.decision = decision;
            slot.stored = at;
            shard.books.bytes = shard.books.bytes + bytes - old;
            if let Some(part) = shard.books.partitions.get_mut(partition) {
                part.bytes = part.bytes + bytes - old;
            }
            drop(shard);
            self.shared.settle(bytes, old);
            return;
        }
        let (mut evicted, mut freed) = (0u64, 0usize);
        // The partition makes room from its own entries first.
        while let Some(part) = shard.books.partitions.get(partition)
            && (part.order.len() >= bounds.partition_entries
                || part.bytes + bytes > bounds.partition_bytes)
        {
            let Some(b) = shard.evict_from(partition) else {
                break;
            };
            freed += b;
            evicted += 1;
        }
        // Then the module's cache, from its largest partition.
        while shard.table.len() >= bounds.entries || shard.books.bytes + bytes > bounds.bytes {
            let Some(victim) = shard.victim(partition) else {
                break;
            };
            let Some(b) = shard.evict_from(&victim) else {
                break;
            };
            freed += b;
            evicted += 1;
        }
        let books = &mut *shard.books;
        let seq = books.next_seq;
        books.next_seq += 1;
        let name: Arc<[u8]> = match books.partitions.get_key_value(partition) {
            Some((name, _)) => name.clone(),
            None => Arc::from(partition),
        };
        let part = books.partitions.entry(name.clone()).or_default();
        let before = part.order.len();
        part.order.push_back((hash, seq));
        part.bytes += bytes;
        books.by_size.remove(&(before, name.clone()));
        books.by_size.insert((before + 1, name));
        books.bytes += bytes;
        books.evicted += evicted;
        let hasher = &self.hasher;
        shard.table.insert_unique(
            hash,
            Slot {
                key: stored_key,
                decision,
                stored: at,
                seq,
                bytes,
            },
            |s| hasher.hash_one(s.key.as_slice()),
        );
        drop(shard);
        self.shared.settle(bytes, freed);
        if evicted > 0 {
            self.metric(|m| m.evicted.inc_by(evicted));
        }
    }

    /// Counts and sizes, for the module's report.
    pub fn report(&self) -> CacheReport {
        let (mut entries, mut bytes, mut thrashing) = (0, 0, 0);
        let mut counts = ShardCounts::default();
        for cell in self.shared.shards.iter() {
            thrashing += usize::from(cell.admission.thrashing());
            if let Ok(shard) = cell.shard.lock() {
                let lookups = shard.lookups();
                entries += shard.table.len();
                bytes += shard.books.bytes;
                counts.hits += lookups.hits;
                counts.misses += lookups.misses;
                counts.expired += shard.books.expired;
                counts.evicted += shard.books.evicted;
            }
        }
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        CacheReport {
            inputs: self.shared.inputs.clone(),
            max_age_ms: self.max_age.as_millis() as u64,
            hits: counts.hits,
            misses: counts.misses,
            expired: counts.expired,
            evicted: counts.evicted,
            skipped: load(&self.shared.counts.skipped),
            declined: load(&self.shared.counts.declined),
            thrashing: thrashing > 0,
            thrashing_shards: thrashing,
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

    /// The default ceiling, far above what these tests keep.
    fn budget() -> Arc<CacheBudget> {
        CacheBudget::new(&DecisionCacheConfig::default())
    }

    fn key(partition: &str, input: &str) -> KeyWriter {
        let mut k = KeyWriter::new(partition);
        k.str(input);
        k
    }

    #[tokio::test(start_paused = true)]
    async fn a_decision_is_kept_for_its_maximum_age_and_no_longer() {
        let cache = DecisionCache::new(
            &config(100, 10),
            &budget(),
            vec!["path"],
            Duration::from_secs(5),
        )
        .expect("cache");
        assert_eq!(cache.get(&key("p", "/a"), Instant::now()), None);
        cache.put(key("p", "/a"), 7u32, 0, Instant::now());
        assert_eq!(cache.get(&key("p", "/a"), Instant::now()), Some(7));
        assert_eq!(
            cache.get(&key("p", "/b"), Instant::now()),
            None,
            "another input"
        );
        assert_eq!(
            cache.get(&key("q", "/a"), Instant::now()),
            None,
            "another partition"
        );
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(cache.get(&key("p", "/a"), Instant::now()), None, "expired");
        cache.put(key("p", "/a"), 8, 0, Instant::now());
        assert_eq!(
            cache.get(&key("p", "/a"), Instant::now()),
            Some(8),
            "replaced in place"
        );
        let r = cache.report();
        assert_eq!((r.hits, r.misses, r.expired, r.entries), (2, 4, 1, 1));
    }

    #[test]
    fn a_decision_is_judged_young_or_old_at_the_arrival_of_the_request_that_looks_it_up() {
        let max_age = Duration::from_secs(5);
        let cache =
            DecisionCache::new(&config(100, 10), &budget(), vec!["path"], max_age).expect("cache");
        let kept = Instant::now();
        let later = |ms: u64| kept + Duration::from_millis(ms);
        cache.put(key("p", "/a"), 1u8, 0, kept);
        // The clock is not read: only the requests' arrival times count.
        assert_eq!(
            cache.get(&key("p", "/a"), later(4_999)),
            Some(1),
            "younger than 5 s"
        );
        assert_eq!(cache.get(&key("p", "/a"), later(5_000)), None, "5 s old");
        // A request that arrived before the decision was kept (decided for another request
        // meanwhile) finds it young.
        let early = kept
            .checked_sub(Duration::from_secs(60))
            .expect("a minute earlier");
        assert_eq!(
            cache.get(&key("p", "/a"), early),
            Some(1),
            "kept after the arrival"
        );
        // A decision is as old as the request it was decided for: one that arrived a second
        // before the decision was put holds 4 s from the put.
        cache.put(key("p", "/b"), 2u8, 0, later(9_000));
        assert_eq!(cache.get(&key("p", "/b"), later(13_999)), Some(2));
        assert_eq!(cache.get(&key("p", "/b"), later(14_000)), None);
        assert_eq!(cache.report().expired, 2);
    }

    #[test]
    fn a_cache_whose_inputs_never_repeat_keeps_a_sample_until_they_do() {
        let cache = DecisionCache::new(
            &config(100_000, 100_000),
            &budget(),
            vec!["path"],
            Duration::MAX,
        )
        .expect("cache");
        let miss_and_keep = |n: u64| {
            let k = key("p", &n.to_string());
            if !cache.looks_up(&k) {
                return;
            }
            if cache.get(&k, Instant::now()).is_none() {
                cache.put(k, n, 0, Instant::now());
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
        let cache = DecisionCache::new(
            &config(8 * 6, 4),
            &budget(),
            vec!["path"],
            Duration::from_secs(60),
        )
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
            cache.put(key("quiet", path), 1u8, 0, Instant::now());
        }
        for n in 0..10_000 {
            cache.put(key(&flood, &n.to_string()), 2u8, 0, Instant::now());
        }
        for path in ["/1", "/2", "/3"] {
            assert_eq!(
                cache.get(&key("quiet", path), Instant::now()),
                Some(1),
                "{path} kept"
            );
        }
        let r = cache.report();
        assert!(r.entries <= 6, "{r:?}");
        assert!(r.evicted >= 10_000 - 3, "{r:?}");
        // A crowd of partitions in the same shard: the largest gives, the shard stays bounded.
        let crowd: Vec<String> = neighbours.take(20).collect();
        for p in &crowd {
            for n in 0..4 {
                cache.put(key(p, &n.to_string()), 3u8, 0, Instant::now());
            }
        }
        let shard = cache.shared.shards[target].shard.lock().expect("lock");
        assert!(shard.table.len() <= 6, "bounded: {}", shard.table.len());
    }

    #[test]
    fn a_flooding_partition_makes_only_its_own_shard_step_aside() {
        let cache = DecisionCache::new(
            &config(100_000, 100_000),
            &budget(),
            vec!["path"],
            Duration::MAX,
        )
        .expect("cache");
        let shard_of =
            |p: &str| cache.hasher.hash_one(KeyWriter::new(p).partition_bytes()) as usize % SHARDS;
        let flood = "flood";
        let (neighbour, quiet) = {
            let mut others = (0..1_000).map(|n| format!("p{n}"));
            let neighbour = others
                .clone()
                .find(|p| shard_of(p) == shard_of(flood))
                .expect("a neighbour");
            let quiet = others
                .find(|p| shard_of(p) != shard_of(flood))
                .expect("another shard");
            (neighbour, quiet)
        };
        // Each request of `partition` with `input`: looked up (and kept on a miss) when its
        // shard lets it, and whether it did.
        let request = |partition: &str, input: &str| {
            let k = key(partition, input);
            let looked = cache.looks_up(&k);
            if looked && cache.get(&k, Instant::now()).is_none() {
                cache.put(k, 1u8, 0, Instant::now());
            }
            looked
        };
        for n in 0..2 * ADMISSION_WINDOW {
            request(flood, &n.to_string());
            assert!(request(&quiet, "/same"), "the quiet partition looks up");
        }
        let r = cache.report();
        assert_eq!((r.thrashing, r.thrashing_shards), (true, 1), "{r:?}");
        // The quiet partition kept its lookups, and hit every time after its first.
        let looked_up: u64 = (0..64).map(|_| u64::from(request(&quiet, "/same"))).sum();
        assert_eq!(looked_up, 64);
        // The flood's shard samples one request in 16, whoever makes it.
        let sampled: u64 = (0..64)
            .map(|n| u64::from(request(&neighbour, &format!("/n{n}"))))
            .sum();
        assert_eq!(sampled, 64 / THRASHING_SAMPLE, "{sampled}");
        let r = cache.report();
        assert_eq!(r.hits, 2 * ADMISSION_WINDOW - 1 + 64, "{r:?}");
    }

    #[test]
    fn keys_longer_than_a_slot_are_kept_on_the_heap_and_told_apart() {
        let cache = DecisionCache::new(
            &config(100, 100),
            &budget(),
            vec!["path"],
            Duration::from_secs(60),
        )
        .expect("cache");
        let partition_len = KeyWriter::new("p").bytes.len();
        // Inputs that make keys of exactly the slot's room, one byte more, and much more, and
        // keys that differ in their last byte only.
        let fits = INLINE_KEY - partition_len - 4;
        let mut kept = 0;
        for len in [fits, fits + 1, 4 * INLINE_KEY] {
            for last in [b'a', b'b'] {
                let mut input = "x".repeat(len - 1);
                input.push(char::from(last));
                let k = key("p", &input);
                assert_eq!(k.bytes.len(), partition_len + 4 + len);
                cache.put(k, (len, last), 0, Instant::now());
                kept += 1;
            }
        }
        for len in [fits, fits + 1, 4 * INLINE_KEY] {
            for last in [b'a', b'b'] {
                let mut input = "x".repeat(len - 1);
                input.push(char::from(last));
                assert_eq!(
                    cache.get(&key("p", &input), Instant::now()),
                    Some((len, last)),
                    "{len}"
                );
            }
        }
        let r = cache.report();
        assert_eq!(r.entries, kept);
        // The slots' room and the longer keys' heap bytes, each counted once.
        let heap = 2 * (partition_len + 4 + fits + 1) + 2 * (partition_len + 4 + 4 * INLINE_KEY);
        assert_eq!(r.bytes, kept * ENTRY_OVERHEAD + heap);
    }

    #[test]
    fn a_hit_touches_one_line_of_the_shard_and_one_pair_of_the_slot() {
        let slot = std::mem::size_of::<Slot<Arc<u64>>>();
        assert_eq!(slot, 128, "{slot} bytes");
        assert_eq!(std::mem::align_of::<Slot<Arc<u64>>>(), 128);
        assert!(ENTRY_OVERHEAD >= slot, "the bounds count the slot");
        // The admission word, the shard's lock, its table's header and its window in the first
        // line of the cell's 128 bytes.
        assert_eq!(std::mem::size_of::<ShardCell<Arc<u64>>>(), 128);
        assert_eq!(std::mem::align_of::<ShardCell<Arc<u64>>>(), 128);
        let used = std::mem::offset_of!(ShardCell<Arc<u64>>, shard)
            + std::mem::size_of::<Mutex<Shard<Arc<u64>>>>();
        assert!(used <= 64, "{used} bytes");
        // What a lookup reads of the module's cache, and nothing else.
        let head = std::mem::size_of::<DecisionCache<Arc<u64>>>();
        assert!(head <= 32, "{head} bytes");
    }

    #[test]
    fn the_admission_word_samples_one_request_in_sixteen_while_its_shard_thrashes() {
        let admission = Admission::default();
        assert!((0..100).all(|_| admission.samples()), "not thrashing");
        admission.set(true);
        assert!(admission.thrashing());
        let sampled = (0..160).filter(|_| admission.samples()).count();
        assert_eq!(sampled, 10);
        admission.set(false);
        assert!(!admission.thrashing());
        assert!((0..100).all(|_| admission.samples()));
        // The count wrapping into the flag ends the thrashing until the window's end.
        admission.set(true);
        admission.0.store(u32::MAX, Ordering::Relaxed);
        assert!(
            !admission.samples(),
            "the count's last value, not a multiple of 16"
        );
        assert!(!admission.thrashing(), "wrapped");
        assert!(admission.samples());
    }

    fn counters() -> CacheMetrics {
        let counter = |name: &str| prometheus::IntCounter::new(name, name).expect("counter");
        CacheMetrics {
            hits: counter("hits"),
            misses: counter("misses"),
            evicted: counter("evicted"),
            declined: counter("declined"),
            publishers: crate::metrics::Publishers::default(),
        }
    }

    #[test]
    fn hits_and_misses_reach_their_counters_when_published_and_when_the_cache_goes() {
        let m = counters();
        let cache = DecisionCache::new(
            &config(100, 10),
            &budget(),
            vec!["path"],
            Duration::from_secs(60),
        )
        .expect("cache");
        cache.count_in(|| Some(m.clone()));
        let counted = || (m.hits.get(), m.misses.get());
        assert_eq!(cache.get(&key("p", "/a"), Instant::now()), None);
        cache.put(key("p", "/a"), Arc::new(1u8), 0, Instant::now());
        for _ in 0..2 {
            assert!(cache.get(&key("p", "/a"), Instant::now()).is_some());
        }
        assert_eq!(counted(), (0, 0), "not moved by a lookup");
        m.publishers.publish();
        assert_eq!(counted(), (2, 1));
        m.publishers.publish();
        assert_eq!(counted(), (2, 1), "each lookup once");
        assert!(cache.get(&key("p", "/a"), Instant::now()).is_some());
        assert_eq!(cache.get(&key("q", "/a"), Instant::now()), None);
        drop(cache);
        assert_eq!(counted(), (3, 2), "the last ones when dropped");
        m.publishers.publish();
        assert_eq!(counted(), (3, 2));
    }

    #[test]
    fn bytes_are_bounded_and_oversized_decisions_skipped() {
        let cfg = DecisionCacheConfig {
            partition_bytes: 1024,
            ..DecisionCacheConfig::default()
        };
        let cache = DecisionCache::new(&cfg, &budget(), vec!["path"], Duration::from_secs(60))
            .expect("cache");
        cache.put(key("p", "/big"), 1u8, 4096, Instant::now());
        assert_eq!(cache.report().skipped, 1);
        for n in 0..100 {
            cache.put(key("p", &n.to_string()), 1u8, 200, Instant::now());
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
        assert!(
            DecisionCache::<u8>::new(&off, &budget(), vec![], Duration::from_secs(1)).is_none()
        );
        let on = DecisionCacheConfig::default();
        assert!(DecisionCache::<u8>::new(&on, &budget(), vec![], Duration::ZERO).is_none());
        let capped = DecisionCache::<u8>::new(&on, &budget(), vec![], Duration::from_secs(86_400))
            .expect("cache");
        assert_eq!(
            capped.report().max_age_ms,
            on.max_age_ms,
            "lowered to the ceiling"
        );
    }
}
