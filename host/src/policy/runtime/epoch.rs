//! The epoch ticker: the clock that stops a plugin call at its deadline.
//!
//! wasmtime checks a store's epoch deadline in the guest's loops and calls; the host advances
//! the engine's epoch from a thread of its own every [`epoch_tick`]. The thread ticks only while
//! guest code may run: every entry into a guest (instantiation, `config-schema`, `configure`,
//! a stage call) holds a [`Running`] guard, and the ticker, once it has seen no guest running
//! for [`IDLE_BEFORE_SLEEP`], sleeps until the next guard wakes it. An idle gateway — or a busy
//! one whose decisions all come from the decision cache — then has no thread waking 200 times a
//! second on the request workers' cores; a gateway whose calls keep coming wakes it at most once
//! per idle period.
//!
//! Correctness does not depend on the ticker running when a call starts: a call's deadline is a
//! number of ticks from the epoch when it starts, and the guard that wakes the ticker is taken
//! before the guest is entered, so the call's first tick comes at most one tick (plus the
//! thread's wake-up) after it starts, as when the ticker never sleeps.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use wasmtime::Engine;

/// How long the ticker goes on ticking after the last guest call ended, before it sleeps.
pub const IDLE_BEFORE_SLEEP: Duration = Duration::from_secs(1);

/// The period of the epoch ticker for a call deadline: a quarter of the deadline, between 1 and
/// 10 ms. A call is stopped between its deadline and one tick later; the ticker wakes only as
/// often as that precision needs (each wake-up costs the request workers a context switch).
pub fn epoch_tick(call_deadline_ms: u64) -> Duration {
    Duration::from_millis((call_deadline_ms / 4).clamp(1, 10))
}

/// What the ticker thread and the guards share.
#[derive(Debug, Default)]
struct Shared {
    /// Guest entries in progress.
    running: AtomicUsize,
    /// Whether the ticker is asleep (or about to be) until a guard wakes it.
    asleep: AtomicBool,
    stop: AtomicBool,
    /// Times the ticker announced a sleep (a guard taken at that instant cancels it); for tests
    /// and the runtime's report.
    sleeps: AtomicUsize,
}

/// The ticker thread of one engine. Dropping it stops the thread.
#[derive(Debug)]
pub struct EpochTicker {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// Held while guest code may run: the ticker keeps ticking.
#[derive(Debug)]
#[must_use = "the ticker may sleep as soon as the guard is dropped"]
pub struct Running<'a>(&'a EpochTicker);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.shared.running.fetch_sub(1, Ordering::SeqCst);
    }
}

impl EpochTicker {
    /// Starts a thread advancing the epoch of each of `engines` every `tick` while guests run,
    /// sleeping after `idle` without one.
    pub fn start(engines: Vec<Engine>, tick: Duration, idle: Duration) -> std::io::Result<Self> {
        let shared = Arc::new(Shared::default());
        let ticks_before_sleep = (idle.as_nanos() / tick.as_nanos().max(1)).max(1);
        let thread = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("aura-epoch".into())
                .spawn(move || {
                    let mut idle_ticks = 0u128;
                    while !shared.stop.load(Ordering::Relaxed) {
                        std::thread::sleep(tick);
                        for engine in &engines {
                            engine.increment_epoch();
                        }
                        if shared.running.load(Ordering::SeqCst) > 0 {
                            idle_ticks = 0;
                            continue;
                        }
                        idle_ticks += 1;
                        if idle_ticks < ticks_before_sleep {
                            continue;
                        }
                        idle_ticks = 0;
                        // Announce the sleep, then look again: a guard taken in between either
                        // is seen here or sees `asleep` and wakes the thread (both orders are
                        // sequentially consistent). A wake-up before `park` is not lost.
                        // The sleep is counted before it is announced, so whoever sees
                        // `asleep` also sees it counted.
                        shared.sleeps.fetch_add(1, Ordering::SeqCst);
                        shared.asleep.store(true, Ordering::SeqCst);
                        if shared.running.load(Ordering::SeqCst) == 0
                            && !shared.stop.load(Ordering::SeqCst)
                        {
                            std::thread::park();
                        }
                        shared.asleep.store(false, Ordering::SeqCst);
                    }
                })?
        };
        Ok(Self {
            shared,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Marks guest code as running until the guard is dropped, waking the ticker if it sleeps.
    /// Taken before every entry into a guest.
    pub fn running(&self) -> Running<'_> {
        self.shared.running.fetch_add(1, Ordering::SeqCst);
        if self.shared.asleep.load(Ordering::SeqCst) {
            self.wake();
        }
        Running(self)
    }

    /// Whether the ticker is asleep now.
    pub fn asleep(&self) -> bool {
        self.shared.asleep.load(Ordering::SeqCst)
    }

    /// How many times the ticker has gone to sleep.
    pub fn sleeps(&self) -> usize {
        self.shared.sleeps.load(Ordering::SeqCst)
    }

    fn wake(&self) {
        if let Ok(thread) = self.thread.lock()
            && let Some(handle) = thread.as_ref()
        {
            handle.thread().unpark();
        }
    }
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(handle) = self.thread.lock().ok().and_then(|mut t| t.take()) {
            handle.thread().unpark();
            let _ = handle.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    fn engine() -> Engine {
        let mut config = wasmtime::Config::new();
        config.epoch_interruption(true);
        Engine::new(&config).expect("engine")
    }

    fn wait_for(what: &str, mut ready: impl FnMut() -> bool) {
        let started = Instant::now();
        while !ready() {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "{what} within 10 s"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    #[test]
    fn the_ticker_sleeps_when_no_guest_runs_and_a_guard_wakes_it() {
        let engine = engine();
        let ticker = EpochTicker::start(
            vec![engine.clone()],
            Duration::from_millis(1),
            Duration::from_millis(20),
        )
        .expect("ticker");
        wait_for("the ticker sleeps", || ticker.asleep());
        let sleeps = ticker.sleeps();
        {
            let _running = ticker.running();
            wait_for("a guard wakes the ticker", || !ticker.asleep());
            // While a guest runs, the ticker never sleeps, however long the call.
            std::thread::sleep(Duration::from_millis(60));
            assert!(!ticker.asleep());
            assert_eq!(ticker.sleeps(), sleeps);
        }
        wait_for("the ticker sleeps again", || ticker.asleep());
        assert_eq!(ticker.sleeps(), sleeps + 1);
    }
}
