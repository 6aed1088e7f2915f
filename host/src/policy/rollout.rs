//! Trying a module on live traffic before it decides for everyone.
//!
//! A project may put a *candidate* module next to the one in force for a stage:
//! - a **shadow** runs on live requests after the enforced decision is made, on the tenant
//!   threads and never waiting for a place (a run that finds none is skipped and counted), so it
//!   never changes or slows a response; its decision is compared with the enforced one and the
//!   disagreements are counted and sampled ([`Comparison`]);
//! - a **canary** decides for `percent` % of actors, chosen by a stable hash of the project,
//!   the stage and the actor ([`on_canary`]): the same actor is always on the same side, on
//!   every instance. A canary failing too often on its share (the automatic rollback's
//!   thresholds, `plugins.rollback_*`) is dropped by itself, with the reason in the history.
//!
//! `promote` makes the candidate the module in force, `abort` drops it.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use sha2::{Digest, Sha256};

pub use crate::stage::Trial;

use super::Stage;
use crate::metrics::Metrics;
use crate::plane::Plane;

/// Whether `subject` (an actor) is on the canary side of `project`'s `stage` at `percent` %:
/// a SHA-256 of the three into 10,000 buckets, so the choice is the same on every request and
/// every instance, and raising the percent only moves actors onto the canary.
pub fn on_canary(project: &str, stage: Stage, subject: &str, percent: u8) -> bool {
    let mut hash = Sha256::new();
    for part in [project, stage.key(), subject] {
        hash.update(part.as_bytes());
        hash.update([0]);
    }
    let digest = hash.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first) % 10_000 < u64::from(percent) * 100
}

/// Disagreements kept per candidate, newest last.
pub const SAMPLE_KEPT: usize = 20;
/// The longest text of a field of a sampled disagreement (a path, a decision).
const FIELD_MAX: usize = 256;

/// One request on which the shadow decided otherwise (or failed). No header, query string or
/// credential is kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disagreement {
    pub at: DateTime<Utc>,
    pub request_id: String,
    pub method: String,
    /// The request's path, without its query string.
    pub path: String,
    pub enforced: String,
    pub shadow: String,
}

/// What a shadow did so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShadowReport {
    pub compared: u64,
    pub disagreements: u64,
    /// Shadow calls that failed (counted in `disagreements` too).
    pub failures: u64,
    /// Runs skipped for want of a free place.
    pub skipped: u64,
    /// The latest disagreements, newest first.
    pub sample: Vec<Disagreement>,
}

/// The request a shadow decision is compared on.
#[derive(Debug, Clone)]
pub struct Compared {
    pub request_id: String,
    pub method: String,
    pub path: String,
}

impl Compared {
    /// The request's id, method and path, each bounded.
    pub fn new(request_id: Option<&str>, method: &str, path: &str) -> Self {
        Self {
            request_id: bounded(request_id.unwrap_or("-")),
            method: bounded(method),
            path: bounded(path),
        }
    }
}

fn bounded(text: &str) -> String {
    let mut end = text.len().min(FIELD_MAX);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end]
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

/// Counts and samples a shadow's disagreements with the enforced decisions.
#[derive(Debug)]
pub struct Comparison {
    compared: AtomicU64,
    disagreements: AtomicU64,
    failures: AtomicU64,
    skipped: AtomicU64,
    sample: Mutex<VecDeque<Disagreement>>,
    series: std::sync::OnceLock<ShadowSeries>,
}

impl Comparison {
    /// A comparison counted in `series` (none in checks and tests).
    pub fn new(series: Option<ShadowSeries>) -> Self {
        let comparison = Self {
            compared: AtomicU64::new(0),
            disagreements: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
            sample: Mutex::new(VecDeque::with_capacity(SAMPLE_KEPT)),
            series: std::sync::OnceLock::new(),
        };
        if let Some(series) = series {
            let _ = comparison.series.set(series);
        }
        comparison
    }

    /// Counts in the series `make` gives, unless it already counts in one (an operator's
    /// candidate is loaded before the metrics exist).
    pub fn count_in(&self, make: impl FnOnce() -> ShadowSeries) {
        self.series.get_or_init(make);
    }

    /// Records one shadow run: the enforced decision's text and the shadow's (`Err`: the shadow
    /// call failed, with its failure kind).
    pub fn record(&self, request: Compared, enforced: String, shadow: Result<String, String>) {
        // Counted under the sample's lock, after the sample: a report never shows a
        // disagreement whose entry is not there yet.
        let mut sample = self.sample.lock().unwrap_or_else(|p| p.into_inner());
        let shadow = match shadow {
            Ok(text) if text == enforced => {
                self.count_compared();
                return;
            }
            Ok(text) => text,
            Err(kind) => {
                self.failures.fetch_add(1, Ordering::Relaxed);
                format!("failed ({kind})")
            }
        };
        if sample.len() == SAMPLE_KEPT {
            sample.pop_front();
        }
        sample.push_back(Disagreement {
            at: Utc::now(),
            request_id: request.request_id,
            method: request.method,
            path: request.path,
            enforced: bounded(&enforced),
            shadow: bounded(&shadow),
        });
        self.disagreements.fetch_add(1, Ordering::Relaxed);
        if let Some(series) = self.series.get() {
            series.disagreements.inc();
        }
        self.count_compared();
    }

    fn count_compared(&self) {
        self.compared.fetch_add(1, Ordering::Relaxed);
        if let Some(series) = self.series.get() {
            series.compared.inc();
        }
    }

    /// A run that found no free place.
    pub fn skipped(&self) {
        self.skipped.fetch_add(1, Ordering::Relaxed);
        if let Some(series) = self.series.get() {
            series.skipped.inc();
        }
    }

    /// The counts and the sample, newest first.
    pub fn report(&self) -> ShadowReport {
        // The counters read under the sample's lock: they agree with the sample.
        let sample = self.sample.lock().unwrap_or_else(|p| p.into_inner());
        ShadowReport {
            compared: self.compared.load(Ordering::Relaxed),
            disagreements: self.disagreements.load(Ordering::Relaxed),
            failures: self.failures.load(Ordering::Relaxed),
            skipped: self.skipped.load(Ordering::Relaxed),
            sample: sample.iter().rev().cloned().collect(),
        }
    }
}

/// The scope of the operator's canaries in [`on_canary`] (project refs are never `-`).
pub const OPERATOR_SCOPE: &str = "-";

/// A failed call's kind as a sample shows it.
pub fn failure_kind(error: &super::PluginError) -> String {
    error
        .kind()
        .map_or("error", super::FailureKind::as_str)
        .to_owned()
}

/// The metric handles of one shadow (plane, stage, project), released with the last
/// [`Comparison`] holding them.
#[derive(Debug)]
pub struct ShadowSeries {
    labels: (Plane, Stage, String),
    compared: prometheus::IntCounter,
    skipped: prometheus::IntCounter,
    disagreements: prometheus::IntCounter,
    owner: Arc<ShadowMetrics>,
}

impl Drop for ShadowSeries {
    fn drop(&mut self) {
        self.owner.release(&self.labels);
    }
}

/// The disagreement series in use, counted so that a project's series goes away with its last
/// shadow (the label set stays bounded by the shadows loaded).
#[derive(Debug)]
pub struct ShadowMetrics {
    metrics: Metrics,
    in_use: Mutex<HashMap<(Plane, Stage, String), usize>>,
}

impl ShadowMetrics {
    /// Series registered in `metrics`.
    pub fn new(metrics: Metrics) -> Arc<Self> {
        Arc::new(Self {
            metrics,
            in_use: Mutex::new(HashMap::new()),
        })
    }

    /// The handles of a shadow of `project` (`-`: the operator's) for `stage` of `plane`.
    pub fn series(self: &Arc<Self>, plane: Plane, stage: Stage, project: &str) -> ShadowSeries {
        let labels = (plane, stage, project.to_owned());
        if let Ok(mut in_use) = self.in_use.lock() {
            *in_use.entry(labels.clone()).or_insert(0) += 1;
        }
        let m = &self.metrics;
        ShadowSeries {
            compared: m
                .shadow_runs
                .with_label_values(&[plane.as_str(), stage.key(), "compared"]),
            skipped: m
                .shadow_runs
                .with_label_values(&[plane.as_str(), stage.key(), "skipped"]),
            disagreements: m.shadow_disagreements.with_label_values(&[
                plane.as_str(),
                stage.key(),
                project,
            ]),
            labels,
            owner: self.clone(),
        }
    }

    fn release(&self, labels: &(Plane, Stage, String)) {
        let Ok(mut in_use) = self.in_use.lock() else {
            return;
        };
        let Some(count) = in_use.get_mut(labels) else {
            return;
        };
        *count -= 1;
        if *count == 0 {
            in_use.remove(labels);
            let (plane, stage, project) = labels;
            let _ = self.metrics.shadow_disagreements.remove_label_values(&[
                plane.as_str(),
                stage.key(),
                project,
            ]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_never_counts_a_disagreement_its_sample_does_not_hold_yet() {
        let comparison = Arc::new(Comparison::new(None));
        let writer = {
            let comparison = comparison.clone();
            std::thread::spawn(move || {
                for i in 0..20_000 {
                    comparison.record(
                        Compared::new(Some(&i.to_string()), "GET", "/"),
                        "allow".into(),
                        Ok("deny".into()),
                    );
                }
            })
        };
        while !writer.is_finished() {
            let report = comparison.report();
            assert_eq!(
                report.sample.len() as u64,
                report.disagreements.min(SAMPLE_KEPT as u64)
            );
            assert_eq!(report.compared, report.disagreements);
        }
        writer.join().expect("writer");
        assert_eq!(comparison.report().sample.len(), SAMPLE_KEPT);
    }

    #[test]
    fn the_canary_share_is_stable_and_near_its_percent() {
        let on = |subject: &str, percent| on_canary("alpha", Stage::Quota, subject, percent);
        let subjects: Vec<String> = (0..10_000).map(|i| format!("user-{i}")).collect();
        let share = |percent| subjects.iter().filter(|s| on(s, percent)).count();
        let ten = share(10);
        assert!((900..=1_100).contains(&ten), "{ten} of 10,000 at 10 %");
        assert_eq!(share(100), 10_000);
        assert_eq!(share(0), 0);
        // Stable, and a larger share keeps everyone already on the canary.
        for s in &subjects {
            assert_eq!(on(s, 10), on(s, 10));
            if on(s, 10) {
                assert!(on(s, 30), "{s} left the canary when the share grew");
            }
        }
        // Another project's split is independent.
        let both = subjects
            .iter()
            .filter(|s| on(s, 10) && on_canary("beta", Stage::Quota, s, 10))
            .count();
        assert!(both < 200, "{both} in both projects' 10 %");
    }

    #[test]
    fn the_sample_keeps_the_newest_disagreements_bounded_and_clean() {
        let c = Comparison::new(None);
        for i in 0..100 {
            let request = Compared::new(Some(&format!("r{i}")), "GET", "/p");
            let shadow = if i % 2 == 0 {
                Ok("allow".to_owned())
            } else {
                Ok("deny".to_owned())
            };
            c.record(request, "allow".to_owned(), shadow);
        }
        c.record(
            Compared::new(None, "GET", &format!("/x\n{}", "y".repeat(1_000))),
            "allow".to_owned(),
            Err("trap".to_owned()),
        );
        c.skipped();
        let r = c.report();
        assert_eq!(
            (r.compared, r.disagreements, r.failures, r.skipped),
            (101, 51, 1, 1)
        );
        assert_eq!(r.sample.len(), SAMPLE_KEPT);
        assert_eq!(r.sample[0].shadow, "failed (trap)");
        assert_eq!(r.sample[0].request_id, "-");
        assert!(r.sample[0].path.len() <= FIELD_MAX && !r.sample[0].path.contains('\n'));
        assert_eq!(r.sample[1].request_id, "r99");
        assert_eq!(r.sample[1].enforced, "allow");
        assert_eq!(r.sample[1].shadow, "deny");
    }
}
