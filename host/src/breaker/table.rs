//! Breakers per dedicated PostgREST target, keyed by resolved target, created on first use.
//!
//! A sweep (every 60 s by default) removes entries not used since the previous sweep, except
//! open ones and ones holding a probe, so that every dedicated project that ever sent a request
//! does not stay in memory forever. The table is also bounded: when full, idle entries are
//! evicted first; if none can go, the call gets a breaker of its own that is not kept.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use super::{BreakerSettings, BreakerState, CircuitBreaker};

#[derive(Debug)]
struct Entry {
    breaker: Arc<CircuitBreaker>,
    used: AtomicBool,
}

/// The table.
#[derive(Debug)]
pub struct BreakerTable {
    settings: BreakerSettings,
    max_entries: usize,
    entries: Mutex<HashMap<String, Entry>>,
}

impl BreakerTable {
    /// An empty table holding at most `max_entries` breakers.
    pub fn new(settings: BreakerSettings, max_entries: usize) -> Arc<Self> {
        Arc::new(Self {
            settings,
            max_entries: max_entries.max(1),
            entries: Mutex::new(HashMap::new()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn removable(entry: &Entry) -> bool {
        entry.breaker.state() == BreakerState::Closed && !entry.breaker.has_probe_in_flight()
    }

    /// The breaker of `target`, created when missing.
    pub fn get(&self, target: &str) -> Arc<CircuitBreaker> {
        let mut entries = self.lock();
        if let Some(entry) = entries.get(target) {
            entry.used.store(true, Ordering::Relaxed);
            return entry.breaker.clone();
        }
        if entries.len() >= self.max_entries {
            // Make room: closed, probe-free entries go, least recently marked first.
            let victims: Vec<String> = entries
                .iter()
                .filter(|(_, e)| !e.used.load(Ordering::Relaxed) && Self::removable(e))
                .chain(entries.iter().filter(|(_, e)| Self::removable(e)))
                .map(|(k, _)| k.clone())
                .take(1 + self.max_entries / 64)
                .collect();
            for key in victims {
                entries.remove(&key);
            }
            if entries.len() >= self.max_entries {
                tracing::warn!(target, "breaker table full; using an untracked breaker");
                return CircuitBreaker::new(target, self.settings);
            }
        }
        let breaker = CircuitBreaker::new(target, self.settings);
        entries.insert(
            target.to_owned(),
            Entry {
                breaker: breaker.clone(),
                used: AtomicBool::new(true),
            },
        );
        breaker
    }

    /// Removes entries unused since the previous sweep (never an open one, never one holding a
    /// probe) and starts a new period. Returns how many were removed.
    pub fn sweep(&self) -> usize {
        let mut entries = self.lock();
        let before = entries.len();
        entries.retain(|_, e| e.used.swap(false, Ordering::Relaxed) || !Self::removable(e));
        before - entries.len()
    }

    /// Targets whose breaker is not closed, with their state.
    pub fn not_closed(&self) -> Vec<(String, BreakerState)> {
        self.lock()
            .iter()
            .map(|(k, e)| (k.clone(), e.breaker.state()))
            .filter(|(_, s)| *s != BreakerState::Closed)
            .collect()
    }

    /// Every breaker held, as it is now.
    pub fn snapshots(&self) -> Vec<super::BreakerSnapshot> {
        self.lock().values().map(|e| e.breaker.snapshot()).collect()
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Runs [`BreakerTable::sweep`] every `every` while the table is alive.
    pub fn spawn_sweeper(self: &Arc<Self>, every: Duration) {
        let weak: Weak<Self> = Arc::downgrade(self);
        let first = tokio::time::Instant::now() + every;
        tokio::spawn(async move {
            let mut tick = tokio::time::interval_at(first, every);
            loop {
                tick.tick().await;
                let Some(table) = weak.upgrade() else { break };
                let removed = table.sweep();
                if removed > 0 {
                    tracing::debug!(removed, left = table.len(), "breaker table swept");
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> BreakerSettings {
        BreakerSettings {
            failure_threshold: 1,
            open_for: Duration::from_secs(30),
            half_open_probes: 1,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_sweep_removes_idle_entries_but_never_open_or_probing_ones() {
        let table = BreakerTable::new(settings(), 1_000);
        table.spawn_sweeper(Duration::from_secs(60));
        table.get("http://idle:3000");
        let open = table.get("http://open:3000");
        open.try_acquire_probe().expect("closed").record_failure();
        let probing = table.get("http://probing:3000");
        probing
            .try_acquire_probe()
            .expect("closed")
            .record_failure();
        tokio::time::advance(Duration::from_secs(30)).await;
        let probe = probing.try_acquire_probe().expect("half-open probe");
        let busy = table.get("http://busy:3000");

        // First sweep: everything was used in this period, nothing goes.
        tokio::time::advance(Duration::from_secs(30)).await;
        tokio::task::yield_now().await;
        assert_eq!(table.len(), 4);
        // Second period: only `busy` is used again.
        table.get("http://busy:3000");
        drop(busy);
        tokio::time::advance(Duration::from_secs(60)).await;
        tokio::task::yield_now().await;
        assert_eq!(table.len(), 3, "idle went; open, probing and busy stay");
        let kept = table.get("http://open:3000");
        assert!(Arc::ptr_eq(&kept, &open), "the open entry kept its state");
        assert!(table.get("http://probing:3000").has_probe_in_flight());
        drop(probe);
    }

    #[tokio::test(start_paused = true)]
    async fn the_table_stays_bounded_and_keeps_open_entries() {
        let table = BreakerTable::new(settings(), 100);
        let open = table.get("open");
        open.try_acquire_probe().expect("closed").record_failure();
        for i in 0..100_000 {
            table.get(&format!("http://t{i}:3000"));
            assert!(table.len() <= 100);
        }
        let again = table.get("open");
        assert!(
            Arc::ptr_eq(&again, &open),
            "the open entry was never evicted"
        );
        assert_eq!(again.state(), BreakerState::Open);
    }
}
