//! Whether this instance should be sent traffic (`GET /ready` on the management plane).
//!
//! Ready means: the control store answered once (afterwards an outage of the store is reported
//! but does not take the instance out: keys and projects are served from the caches, and a
//! fleet-wide store outage must not pull every instance at once), NATS is connected, the
//! operator's modules are loaded (they are, before the listeners open) and every project's
//! modules were loaded by a first complete refresh, and the instance is not draining. From the
//! moment SIGTERM arrives the instance answers `503 draining` for `server.drain_delay_secs`
//! while it still serves, so that load balancers stop sending before the listeners close.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How long the dependency checks of `/ready` (a store ping, a Redis ping) are answered from
/// their last result: `/ready` is unauthenticated, and a flood of it must not become a flood of
/// store and Redis round trips.
pub const PROBE_TTL: Duration = Duration::from_secs(1);

/// What `/ready` is decided from (the checks made on each call are added by the handler).
#[derive(Debug, Default)]
pub struct Readiness {
    store_answered: AtomicBool,
    tenant_modules_listed: AtomicBool,
    draining: AtomicBool,
    /// The last checks of the dependencies, and when they were made.
    probes: tokio::sync::Mutex<Option<(Instant, Probes)>>,
}

/// The dependency checks of one `/ready`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Probes {
    /// The control store answered its ping.
    pub store_up: bool,
    /// Redis answered its ping (`None`: not configured).
    pub redis_up: Option<bool>,
}

/// One answer of `/ready`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Report {
    /// The control store answered at least once since the start.
    pub store_answered_once: bool,
    /// The control store answers now.
    pub store_up: bool,
    /// The NATS connection is up.
    pub nats_up: bool,
    /// Every project's stored modules were listed once (a project's are loaded on its first
    /// request, which waits for them).
    pub tenant_modules_listed: bool,
    /// SIGTERM arrived.
    pub draining: bool,
}

impl Report {
    /// Whether the instance should get traffic.
    pub fn ready(&self) -> bool {
        self.store_answered_once && self.nats_up && self.tenant_modules_listed && !self.draining
    }

    /// Why not, for the error message; `None` when ready.
    pub fn reason(&self) -> Option<&'static str> {
        if self.draining {
            Some("the instance is draining before it stops")
        } else if !self.store_answered_once {
            Some("the control store has not answered yet")
        } else if !self.nats_up {
            Some("NATS is not connected")
        } else if !self.tenant_modules_listed {
            Some("the projects' policy modules are not listed yet")
        } else {
            None
        }
    }
}

impl Readiness {
    /// The control store answered.
    pub fn store_answered(&self) {
        self.store_answered.store(true, Ordering::Release);
    }

    /// A refresh listed the projects' modules.
    pub fn tenant_modules_listed(&self) {
        self.tenant_modules_listed.store(true, Ordering::Release);
    }

    /// SIGTERM arrived: `/ready` answers `503` from now on.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::Release);
    }

    /// Whether the instance is draining.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// The dependency checks as of `now`: the last ones when made less than [`PROBE_TTL`] ago,
    /// else made by `probe` (once, however many requests wait for them).
    pub async fn probes<F: Future<Output = Probes>>(
        &self,
        now: Instant,
        probe: impl FnOnce() -> F,
    ) -> Probes {
        let mut last = self.probes.lock().await;
        if let Some((at, probes)) = *last
            && now.saturating_duration_since(at) < PROBE_TTL
        {
            return probes;
        }
        let probes = probe().await;
        *last = Some((now, probes));
        probes
    }

    /// The report, given what the handler checked now.
    pub fn report(&self, store_up: bool, nats_up: bool) -> Report {
        if store_up {
            self.store_answered();
        }
        Report {
            store_answered_once: self.store_answered.load(Ordering::Acquire),
            store_up,
            nats_up,
            tenant_modules_listed: self.tenant_modules_listed.load(Ordering::Acquire),
            draining: self.is_draining(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn dependency_checks_are_made_at_most_once_a_second() {
        let r = Readiness::default();
        let made = std::sync::atomic::AtomicUsize::new(0);
        let probe = || async {
            made.fetch_add(1, Ordering::SeqCst);
            Probes {
                store_up: true,
                redis_up: None,
            }
        };
        let t0 = Instant::now();
        for ms in [0, 10, 500, 999] {
            r.probes(t0 + Duration::from_millis(ms), probe).await;
        }
        assert_eq!(
            made.load(Ordering::SeqCst),
            1,
            "answered from the last checks"
        );
        r.probes(t0 + PROBE_TTL, probe).await;
        assert_eq!(
            made.load(Ordering::SeqCst),
            2,
            "checked again after a second"
        );
    }

    #[test]
    fn ready_only_once_everything_loaded_and_not_while_draining() {
        let r = Readiness::default();
        assert_eq!(
            r.report(false, true).reason(),
            Some("the control store has not answered yet")
        );
        assert!(!r.report(true, true).ready(), "modules not loaded yet");
        r.tenant_modules_listed();
        assert!(r.report(true, true).ready());
        assert!(!r.report(true, false).ready(), "NATS down");
        // Once the store answered, its outage is reported but does not take the instance out.
        let later = r.report(false, true);
        assert!(later.ready() && !later.store_up);
        r.start_draining();
        assert_eq!(
            r.report(true, true).reason(),
            Some("the instance is draining before it stops")
        );
    }
}
