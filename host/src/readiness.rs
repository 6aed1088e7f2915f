//! Whether this instance should be sent traffic (`GET /ready` on the management plane).
//!
//! Ready means: the control store answered once (afterwards an outage of the store is reported
//! but does not take the instance out: keys and projects are served from the caches, and a
//! fleet-wide store outage must not pull every instance at once), NATS is connected, the
//! operator's modules are loaded (they are, before the listeners open) and every project's
//! modules were loaded by a first complete refresh, and the instance is not draining. From the
//! moment SIGTERM arrives the instance answers `503 draining` for `server.drain_delay_secs`
//! while it still serves, so that load balancers stop sending before the listeners close.

use std::sync::atomic::{AtomicBool, Ordering};

/// What `/ready` is decided from (the checks made on each call are added by the handler).
#[derive(Debug, Default)]
pub struct Readiness {
    store_answered: AtomicBool,
    tenant_modules_loaded: AtomicBool,
    draining: AtomicBool,
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
    /// Every project's modules were loaded once.
    pub tenant_modules_loaded: bool,
    /// SIGTERM arrived.
    pub draining: bool,
}

impl Report {
    /// Whether the instance should get traffic.
    pub fn ready(&self) -> bool {
        self.store_answered_once && self.nats_up && self.tenant_modules_loaded && !self.draining
    }

    /// Why not, for the error message; `None` when ready.
    pub fn reason(&self) -> Option<&'static str> {
        if self.draining {
            Some("the instance is draining before it stops")
        } else if !self.store_answered_once {
            Some("the control store has not answered yet")
        } else if !self.nats_up {
            Some("NATS is not connected")
        } else if !self.tenant_modules_loaded {
            Some("the projects' policy modules are not loaded yet")
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

    /// A refresh of the projects' modules completed.
    pub fn tenant_modules_loaded(&self) {
        self.tenant_modules_loaded.store(true, Ordering::Release);
    }

    /// SIGTERM arrived: `/ready` answers `503` from now on.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::Release);
    }

    /// Whether the instance is draining.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
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
            tenant_modules_loaded: self.tenant_modules_loaded.load(Ordering::Acquire),
            draining: self.is_draining(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_once_everything_loaded_and_not_while_draining() {
        let r = Readiness::default();
        assert_eq!(
            r.report(false, true).reason(),
            Some("the control store has not answered yet")
        );
        assert!(!r.report(true, true).ready(), "modules not loaded yet");
        r.tenant_modules_loaded();
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
