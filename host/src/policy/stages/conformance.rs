//! Conformance vectors: typical and edge inputs every module of a stage must answer — without a
//! trap, within its deadline and memory, and with a decision the host can enforce. Run before a
//! module is put in force (start, reload) and by `aura-gateway plugin check`.

use std::time::{Duration, Instant};

use super::AnyModule;
use crate::plane::Plane;
use crate::policy::{FailureKind, PluginError, Policies, Stage};

/// What the vectors measured for one stage module.
#[derive(Debug, Clone)]
pub struct StageReport {
    pub plane: Plane,
    pub stage: Stage,
    pub module: String,
    pub digest: String,
    pub calls: usize,
    pub median: Duration,
    pub max: Duration,
    pub peak_memory: usize,
}

impl std::fmt::Display for StageReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}_plane.plugins.{}: {} ({}…): {} calls, median {:.2} µs, max {:.2} µs, memory {} KiB",
            self.plane,
            self.stage,
            self.module,
            &self.digest[..12.min(self.digest.len())],
            self.calls,
            self.median.as_secs_f64() * 1e6,
            self.max.as_secs_f64() * 1e6,
            self.peak_memory / 1024
        )
    }
}

/// A failed vector.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{plane}_plane.plugins.{stage}: conformance vector {vector:?} failed: {reason}")]
pub struct ConformanceError {
    pub plane: Plane,
    pub stage: Stage,
    pub vector: String,
    pub reason: String,
}

/// How many times a vector is tried when its call overruns the deadline.
pub(crate) const DEADLINE_ATTEMPTS: u32 = 3;

/// One module's run of its stage's vectors: each call timed, a failure named by its vector.
pub(crate) struct Run {
    plane: Plane,
    stage: Stage,
    times: Vec<Duration>,
}

impl Run {
    pub(crate) fn new(plane: Plane, stage: Stage) -> Self {
        Self {
            plane,
            stage,
            times: Vec::new(),
        }
    }

    pub(crate) fn fail(&self, vector: &str, reason: impl Into<String>) -> ConformanceError {
        ConformanceError {
            plane: self.plane,
            stage: self.stage,
            vector: vector.to_owned(),
            reason: reason.into(),
        }
    }

    /// Runs one vector. A call deadline is wall-clock time, and a loaded machine (a start or a
    /// reload beside busy request workers) can deschedule a call past it: a vector stopped by
    /// its deadline is run again, up to [`DEADLINE_ATTEMPTS`] times in all, and fails only if
    /// every attempt overran. Any other failure fails the vector at once; a module that spins
    /// overruns every attempt and is refused on its first vector.
    pub(crate) fn call<T>(
        &mut self,
        vector: &str,
        mut f: impl FnMut() -> Result<T, PluginError>,
    ) -> Result<T, ConformanceError> {
        let mut attempt = 1;
        loop {
            let started = Instant::now();
            let out = f();
            self.times.push(started.elapsed());
            match out {
                Err(e)
                    if e.kind() == Some(FailureKind::Deadline) && attempt < DEADLINE_ATTEMPTS =>
                {
                    attempt += 1;
                }
                out => return out.map_err(|e| self.fail(vector, e.to_string())),
            }
        }
    }

    pub(crate) fn report(mut self, module: &dyn AnyModule) -> StageReport {
        self.times.sort();
        StageReport {
            plane: self.plane,
            stage: self.stage,
            module: module.module_name().to_owned(),
            digest: module.digest().to_owned(),
            calls: self.times.len(),
            median: self
                .times
                .get(self.times.len() / 2)
                .copied()
                .unwrap_or_default(),
            max: self.times.last().copied().unwrap_or_default(),
            peak_memory: module.peak_memory(),
        }
    }
}

/// Runs every stage's vectors on both planes: each module in force, then each candidate (a
/// candidate passes the same vectors before it is tried).
pub fn check(policies: &Policies) -> Result<Vec<StageReport>, ConformanceError> {
    let mut reports = Vec::new();
    for plane in [&policies.data, &policies.management] {
        let mut candidates = Vec::new();
        for slot in plane.slots() {
            let mut checked = slot.conformance()?.into_iter();
            reports.extend(checked.next());
            candidates.extend(checked);
        }
        reports.extend(candidates);
    }
    Ok(reports)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failed(kind: FailureKind) -> PluginError {
        PluginError::Call {
            stage: Stage::Quota,
            plane: Plane::Data,
            module: "m".into(),
            kind,
            reason: "stopped".into(),
        }
    }

    #[test]
    fn a_vector_overrun_by_its_deadline_is_tried_again_and_fails_only_when_every_attempt_overran() {
        let mut run = Run::new(Plane::Data, Stage::Quota);
        let mut calls = 0;
        let out = run.call("once late", || {
            calls += 1;
            if calls == 1 {
                Err(failed(FailureKind::Deadline))
            } else {
                Ok(7)
            }
        });
        assert_eq!(out.expect("the second attempt answers"), 7);
        assert_eq!(calls, 2);

        let mut calls = 0;
        let err = run
            .call("always late", || -> Result<(), _> {
                calls += 1;
                Err(failed(FailureKind::Deadline))
            })
            .expect_err("a module that always overruns is refused");
        assert_eq!(calls, DEADLINE_ATTEMPTS);
        assert_eq!(err.vector, "always late");

        let mut calls = 0;
        run.call("trap", || -> Result<(), _> {
            calls += 1;
            Err(failed(FailureKind::Trap))
        })
        .expect_err("a trap fails the vector");
        assert_eq!(calls, 1, "only a deadline overrun is tried again");
    }
}
