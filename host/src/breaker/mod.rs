//! Circuit breakers, used by the proxy code around the actual network call (never as a layer):
//! [`CircuitBreaker::try_acquire_probe`] before the call, then [`Probe::record_success`] or
//! [`Probe::record_failure`] after it. A probe dropped without either (a timeout, a client that
//! went away) gives its half-open slot back and changes nothing else.
//!
//! States: **closed** counts consecutive failures and opens at the threshold; **open** refuses
//! every call (503 with `Retry-After`, no network) until its duration has passed; then
//! **half-open** admits at most `half_open_probes` calls at once: one success closes the breaker,
//! one failure opens it again. Time is `tokio::time`, so tests drive it with paused time.

pub mod table;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::config::BreakerConfig;

/// The settings of a breaker.
#[derive(Debug, Clone, Copy)]
pub struct BreakerSettings {
    /// Consecutive failures that open a closed breaker.
    pub failure_threshold: u32,
    /// How long an open breaker refuses calls.
    pub open_for: Duration,
    /// Calls admitted at once while half-open.
    pub half_open_probes: u32,
}

impl From<&BreakerConfig> for BreakerSettings {
    fn from(c: &BreakerConfig) -> Self {
        Self {
            failure_threshold: c.failure_threshold,
            open_for: Duration::from_millis(c.open_ms),
            half_open_probes: c.half_open_probes,
        }
    }
}

/// The observable state of a breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    Closed,
    Open,
    HalfOpen,
}

impl BreakerState {
    /// Metric value: 0 closed, 1 half-open, 2 open.
    pub fn as_gauge(self) -> i64 {
        match self {
            BreakerState::Closed => 0,
            BreakerState::HalfOpen => 1,
            BreakerState::Open => 2,
        }
    }
}

#[derive(Debug)]
enum State {
    Closed { failures: u32 },
    Open { until: Instant },
    HalfOpen { in_flight: u32 },
}

#[derive(Debug)]
struct Inner {
    state: State,
    /// Bumped on every transition: outcomes of calls admitted in an earlier state are ignored.
    generation: u64,
    /// When the state last changed (`None`: closed since it was created).
    changed_at: Option<std::time::SystemTime>,
}

/// What a breaker looks like now (`/v1/admin/breakers`).
#[derive(Debug, Clone)]
pub struct BreakerSnapshot {
    /// Service name, or `postgrest:<target>`.
    pub name: String,
    pub state: BreakerState,
    /// Consecutive failures counted while closed (0 otherwise).
    pub failures: u32,
    /// When the state last changed; `None` when closed since it was created.
    pub changed_at: Option<std::time::SystemTime>,
}

/// One breaker.
#[derive(Debug)]
pub struct CircuitBreaker {
    name: String,
    settings: BreakerSettings,
    inner: Mutex<Inner>,
}

/// A refused call: the breaker is open (or half-open with every probe slot taken).
#[derive(Debug, Clone, Copy)]
pub struct Rejected {
    /// When a call may be admitted again.
    pub retry_after: Duration,
}

/// Permission to make one call. Consume it with [`Probe::record_success`] or
/// [`Probe::record_failure`]; dropping it unconsumed returns its slot.
#[derive(Debug)]
#[must_use = "record the outcome, or drop the probe to give its slot back"]
pub struct Probe {
    breaker: Arc<CircuitBreaker>,
    generation: u64,
    half_open: bool,
    done: bool,
}

impl CircuitBreaker {
    /// A closed breaker.
    pub fn new(name: impl Into<String>, settings: BreakerSettings) -> Arc<Self> {
        Arc::new(Self {
            name: name.into(),
            settings,
            inner: Mutex::new(Inner {
                state: State::Closed { failures: 0 },
                generation: 0,
                changed_at: None,
            }),
        })
    }

    /// The breaker's name (service or target).
    pub fn name(&self) -> &str {
        &self.name
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave the state inconsistent (every update is
        // a single assignment), so a poisoned lock is still usable.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The current state (an open breaker whose time is up reads as half-open).
    pub fn state(&self) -> BreakerState {
        let inner = self.lock();
        match inner.state {
            State::Closed { .. } => BreakerState::Closed,
            State::Open { until } if Instant::now() >= until => BreakerState::HalfOpen,
            State::Open { .. } => BreakerState::Open,
            State::HalfOpen { .. } => BreakerState::HalfOpen,
        }
    }

    /// The breaker's name, state, failures and last change.
    pub fn snapshot(&self) -> BreakerSnapshot {
        let state = self.state();
        let inner = self.lock();
        BreakerSnapshot {
            name: self.name.clone(),
            state,
            failures: match inner.state {
                State::Closed { failures } => failures,
                _ => 0,
            },
            changed_at: inner.changed_at,
        }
    }

    /// Whether a half-open probe is out.
    pub fn has_probe_in_flight(&self) -> bool {
        matches!(self.lock().state, State::HalfOpen { in_flight } if in_flight > 0)
    }

    /// Asks to make one call.
    pub fn try_acquire_probe(self: &Arc<Self>) -> Result<Probe, Rejected> {
        let mut inner = self.lock();
        // The clock is read only when the breaker is open: a closed or half-open breaker's
        // answer does not depend on the time.
        if let State::Open { until } = inner.state {
            let now = Instant::now();
            if now < until {
                return Err(Rejected {
                    retry_after: until - now,
                });
            }
            inner.state = State::HalfOpen { in_flight: 0 };
            inner.generation += 1;
            inner.changed_at = Some(std::time::SystemTime::now());
        }
        let generation = inner.generation;
        match &mut inner.state {
            State::Closed { .. } => Ok(Probe {
                breaker: self.clone(),
                generation,
                half_open: false,
                done: false,
            }),
            State::HalfOpen { in_flight } => {
                if *in_flight >= self.settings.half_open_probes {
                    return Err(Rejected {
                        retry_after: self.settings.open_for.min(Duration::from_secs(1)),
                    });
                }
                *in_flight += 1;
                Ok(Probe {
                    breaker: self.clone(),
                    generation,
                    half_open: true,
                    done: false,
                })
            }
            State::Open { .. } => unreachable!("handled above"),
        }
    }

    fn finish(&self, probe: &Probe, outcome: Option<bool>) {
        let mut inner = self.lock();
        if inner.generation != probe.generation {
            return;
        }
        let threshold = self.settings.failure_threshold;
        let open_for = self.settings.open_for;
        let next = match (&mut inner.state, outcome) {
            (State::Closed { failures }, Some(true)) => {
                *failures = 0;
                None
            }
            (State::Closed { failures }, Some(false)) => {
                *failures += 1;
                (*failures >= threshold).then(|| State::Open {
                    until: Instant::now() + open_for,
                })
            }
            (State::Closed { .. }, None) => None,
            (State::HalfOpen { .. }, Some(true)) => Some(State::Closed { failures: 0 }),
            (State::HalfOpen { .. }, Some(false)) => Some(State::Open {
                until: Instant::now() + open_for,
            }),
            (State::HalfOpen { in_flight }, None) => {
                if probe.half_open {
                    *in_flight = in_flight.saturating_sub(1);
                }
                None
            }
            (State::Open { .. }, _) => None,
        };
        if let Some(next) = next {
            match next {
                State::Open { .. } => {
                    tracing::warn!(breaker = %self.name, "circuit breaker opened")
                }
                State::Closed { .. } => {
                    tracing::info!(breaker = %self.name, "circuit breaker closed")
                }
                State::HalfOpen { .. } => {}
            }
            inner.state = next;
            inner.generation += 1;
            inner.changed_at = Some(std::time::SystemTime::now());
        }
    }
}

impl Probe {
    /// The call succeeded.
    pub fn record_success(mut self) {
        self.done = true;
        self.breaker.finish(&self, Some(true));
    }

    /// The call failed in a way that counts against the backend.
    pub fn record_failure(mut self) {
        self.done = true;
        self.breaker.finish(&self, Some(false));
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        if !self.done {
            self.breaker.finish(self, None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn breaker(threshold: u32, probes: u32) -> Arc<CircuitBreaker> {
        CircuitBreaker::new(
            "t",
            BreakerSettings {
                failure_threshold: threshold,
                open_for: Duration::from_secs(5),
                half_open_probes: probes,
            },
        )
    }

    #[tokio::test(start_paused = true)]
    async fn opens_at_the_threshold_and_refuses_until_its_time_is_up() {
        let b = breaker(3, 1);
        for _ in 0..2 {
            b.try_acquire_probe().expect("closed").record_failure();
        }
        b.try_acquire_probe().expect("closed").record_success();
        for _ in 0..3 {
            b.try_acquire_probe().expect("closed").record_failure();
        }
        assert_eq!(b.state(), BreakerState::Open);
        let rejected = b.try_acquire_probe().expect_err("open");
        assert_eq!(rejected.retry_after, Duration::from_secs(5));
        tokio::time::advance(Duration::from_secs(4)).await;
        assert!(b.try_acquire_probe().is_err());
        tokio::time::advance(Duration::from_secs(1)).await;
        let probe = b.try_acquire_probe().expect("half-open probe");
        assert!(b.try_acquire_probe().is_err(), "one probe at a time");
        probe.record_success();
        assert_eq!(b.state(), BreakerState::Closed);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_probe_reopens_and_a_dropped_probe_gives_its_slot_back() {
        let b = breaker(1, 2);
        b.try_acquire_probe().expect("closed").record_failure();
        tokio::time::advance(Duration::from_secs(5)).await;
        let p1 = b.try_acquire_probe().expect("probe 1");
        let p2 = b.try_acquire_probe().expect("probe 2");
        assert!(b.try_acquire_probe().is_err(), "bounded probes");
        drop(p1);
        assert!(b.has_probe_in_flight());
        let p3 = b
            .try_acquire_probe()
            .expect("the dropped slot is free again");
        p2.record_failure();
        assert_eq!(b.state(), BreakerState::Open);
        // An outcome from before the transition changes nothing.
        p3.record_success();
        assert_eq!(b.state(), BreakerState::Open);
        assert!(!b.has_probe_in_flight());
    }

    #[tokio::test(start_paused = true)]
    async fn late_outcomes_of_calls_admitted_while_closed_are_ignored_once_open() {
        let b = breaker(2, 1);
        let slow = b.try_acquire_probe().expect("closed");
        b.try_acquire_probe().expect("closed").record_failure();
        b.try_acquire_probe().expect("closed").record_failure();
        assert_eq!(b.state(), BreakerState::Open);
        slow.record_success();
        assert_eq!(b.state(), BreakerState::Open);
    }

    #[tokio::test(start_paused = true)]
    async fn a_thousand_probes_cancelled_by_clients_going_away_all_come_back() {
        let b = breaker(1, 2);
        b.try_acquire_probe().expect("closed").record_failure();
        tokio::time::advance(Duration::from_secs(5)).await;
        let mut taken = 0;
        for _ in 0..1_000 {
            // A request takes a probe and its client goes away mid-call: the task is aborted.
            let b2 = b.clone();
            let call = tokio::spawn(async move {
                let _probe = b2.try_acquire_probe().ok()?;
                std::future::pending::<()>().await;
                Some(())
            });
            tokio::task::yield_now().await;
            if b.has_probe_in_flight() {
                taken += 1;
            }
            call.abort();
            let _ = call.await;
        }
        assert_eq!(taken, 1_000, "every cancelled call had taken a probe");
        assert_eq!(b.state(), BreakerState::HalfOpen);
        assert!(!b.has_probe_in_flight(), "no permit leaked");
        let p1 = b.try_acquire_probe().expect("slot 1 free");
        let p2 = b.try_acquire_probe().expect("slot 2 free");
        assert!(b.try_acquire_probe().is_err());
        p1.record_success();
        drop(p2);
        assert_eq!(b.state(), BreakerState::Closed);
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_at_the_half_open_moment_lets_through_only_the_configured_probes() {
        for probes in [1u32, 3] {
            let b = breaker(1, probes);
            b.try_acquire_probe().expect("closed").record_failure();
            tokio::time::advance(Duration::from_secs(5)).await;
            // 1,000 requests race for the moment the breaker half-opens, on a multi-thread
            // scheduler's worth of tasks polled together.
            let admitted = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
            let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(1_000));
            let calls: Vec<_> = (0..1_000)
                .map(|_| {
                    let (b, admitted, barrier) = (b.clone(), admitted.clone(), barrier.clone());
                    tokio::spawn(async move {
                        barrier.wait().await;
                        if let Ok(probe) = b.try_acquire_probe() {
                            admitted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                            tokio::time::sleep(Duration::from_millis(10)).await;
                            drop(probe);
                        }
                    })
                })
                .collect();
            for call in calls {
                call.await.expect("task");
            }
            assert_eq!(
                admitted.load(std::sync::atomic::Ordering::SeqCst),
                probes,
                "probes admitted out of a burst of 1000"
            );
        }
    }
}
