//! Calls, failures and call times of one loaded module, for `/v1/admin/policies`: a few atomic
//! additions per call, percentiles read from a log-linear histogram (four buckets per power of
//! two: a percentile is exact to within a fifth of its value).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use crate::policy::FailureKind;

const BUCKETS: usize = 256;

/// The counters of one module.
#[derive(Debug)]
pub struct CallStats {
    loaded_at: SystemTime,
    calls: AtomicU64,
    failures: AtomicU64,
    /// Failures by kind: trap, deadline, memory.
    failures_by_kind: [AtomicU64; 3],
    /// Calls per call-time bucket (nanoseconds, log-linear).
    times: Box<[AtomicU64; BUCKETS]>,
}

/// What a module did since it was loaded.
#[derive(Debug, Clone, PartialEq)]
pub struct ModuleReport {
    /// `builtin`, a path, `sha256:…`, or `tenant:<project>`.
    pub name: String,
    /// SHA-256 of the module, hex.
    pub digest: String,
    pub loaded_at: SystemTime,
    pub calls: u64,
    pub failures: u64,
    /// Failures that were traps, deadline overruns, memory excesses.
    pub traps: u64,
    pub deadlines: u64,
    pub memory: u64,
    /// Median call time, in microseconds (`None` before the first call).
    pub p50_us: Option<f64>,
    /// 99th percentile call time, in microseconds.
    pub p99_us: Option<f64>,
    /// The decision cache, when the module declared its inputs.
    pub cache: Option<super::decision_cache::CacheReport>,
}

fn bucket(nanos: u64) -> usize {
    let v = nanos.max(1);
    let e = 63 - v.leading_zeros() as usize;
    if e < 2 {
        v as usize
    } else {
        (e * 4 + ((v >> (e - 2)) & 3) as usize).min(BUCKETS - 1)
    }
}

/// The smallest and largest call time (ns) of a bucket.
fn bounds(index: usize) -> (u64, u64) {
    if index < 4 {
        return (index as u64, index as u64);
    }
    let e = index / 4;
    let m = (index % 4) as u64;
    let low = (4 + m) << (e - 2);
    let width = 1u64 << (e - 2);
    (low, low.saturating_add(width - 1))
}

impl Default for CallStats {
    fn default() -> Self {
        Self {
            loaded_at: SystemTime::now(),
            calls: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            failures_by_kind: std::array::from_fn(|_| AtomicU64::new(0)),
            times: Box::new(std::array::from_fn(|_| AtomicU64::new(0))),
        }
    }
}

impl CallStats {
    /// Counts one call that took `took` and failed as `failed` (or succeeded).
    pub fn record(&self, took: Duration, failed: Option<FailureKind>) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        if let Some(kind) = failed {
            self.failures.fetch_add(1, Ordering::Relaxed);
            let slot = match kind {
                FailureKind::Trap | FailureKind::Refused => 0,
                FailureKind::Deadline => 1,
                FailureKind::Memory => 2,
            };
            self.failures_by_kind[slot].fetch_add(1, Ordering::Relaxed);
        }
        let nanos = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        self.times[bucket(nanos)].fetch_add(1, Ordering::Relaxed);
    }

    fn percentile(&self, counts: &[u64], total: u64, p: f64) -> Option<f64> {
        if total == 0 {
            return None;
        }
        let rank = ((total as f64) * p).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, count) in counts.iter().enumerate() {
            seen += count;
            if seen >= rank {
                let (low, high) = bounds(i);
                return Some((low as f64 + high as f64) / 2.0 / 1_000.0);
            }
        }
        None
    }

    /// The report of the module named `name` with `digest`.
    pub fn report(&self, name: &str, digest: &str) -> ModuleReport {
        let counts: Vec<u64> = self
            .times
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect();
        let total = counts.iter().sum();
        ModuleReport {
            name: name.to_owned(),
            digest: digest.to_owned(),
            loaded_at: self.loaded_at,
            calls: self.calls.load(Ordering::Relaxed),
            failures: self.failures.load(Ordering::Relaxed),
            traps: self.failures_by_kind[0].load(Ordering::Relaxed),
            deadlines: self.failures_by_kind[1].load(Ordering::Relaxed),
            memory: self.failures_by_kind[2].load(Ordering::Relaxed),
            p50_us: self.percentile(&counts, total, 0.50),
            p99_us: self.percentile(&counts, total, 0.99),
            cache: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_every_time_in_order_and_within_a_fifth() {
        let mut previous = 0;
        for nanos in (1..2_000_000u64).step_by(7).chain([u64::MAX / 2, u64::MAX]) {
            let i = bucket(nanos);
            assert!(i >= previous, "buckets grow with the time");
            previous = i;
            let (low, high) = bounds(i);
            assert!(low <= nanos && nanos <= high, "{nanos} in [{low}, {high}]");
            assert!((high - low) as f64 <= nanos as f64 / 4.0 + 1.0);
        }
    }

    #[test]
    fn percentiles_follow_the_calls() {
        let stats = CallStats::default();
        assert_eq!(stats.report("m", "d").p50_us, None);
        for _ in 0..98 {
            stats.record(Duration::from_micros(2), None);
        }
        stats.record(Duration::from_micros(500), Some(FailureKind::Deadline));
        stats.record(Duration::from_micros(900), None);
        let r = stats.report("m", "d");
        assert_eq!((r.calls, r.failures), (100, 1));
        assert_eq!((r.traps, r.deadlines, r.memory), (0, 1, 0));
        let p50 = r.p50_us.expect("p50");
        let p99 = r.p99_us.expect("p99");
        assert!((1.6..=2.5).contains(&p50), "p50 {p50}");
        assert!((400.0..=600.0).contains(&p99), "p99 {p99}");
    }
}
