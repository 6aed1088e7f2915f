//! Tenant module calls run off the request workers.
//!
//! A module a project installed is untrusted code that may spin to its deadline on every call.
//! Run inline, such calls would take the async worker threads that serve every other project.
//! They run instead on a small pool of threads of their own (`plugins.tenant_threads`, at a
//! lower scheduling priority than the request workers), and each project may have at most
//! `plugins.tenant_max_concurrent_calls` of them in progress at once. A call that cannot get a
//! place within `plugins.tenant_queue_timeout_ms` is not run: its request fails closed with
//! `503 policy_busy`. One project's slow module then costs that project its own throughput,
//! never the workers of the others. Operator modules (trusted) keep running inline.

use std::panic::AssertUnwindSafe;
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};

/// Niceness of the pool's threads: the request workers win the CPU when both want it.
const POOL_NICE: i32 = 10;

type Job = Box<dyn FnOnce() + Send + 'static>;

/// The call was not run: the project's cap or the pool stayed full for the queue timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the project's policy modules are busy; retry shortly")]
pub struct Busy;

/// The tenant call pool.
#[derive(Debug)]
pub struct TenantPool {
    jobs: SyncSender<Job>,
    slots: Arc<Semaphore>,
    /// Places for shadow runs: half the threads, so that shadows never take them all.
    shadows: Arc<Semaphore>,
    per_project: usize,
    queue_timeout: Duration,
}

impl TenantPool {
    /// Starts `threads` threads.
    pub fn new(threads: usize, per_project: usize, queue_timeout: Duration) -> Self {
        let threads = threads.max(1);
        let (jobs, receiver) = sync_channel::<Job>(threads);
        let receiver = Arc::new(Mutex::new(receiver));
        for i in 0..threads {
            let receiver = receiver.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("aura-tenant-{i}"))
                .spawn(move || worker(&receiver));
            if let Err(e) = spawned {
                tracing::error!(error = %e, "cannot start a tenant module thread");
            }
        }
        Self {
            jobs,
            slots: Arc::new(Semaphore::new(threads)),
            shadows: Arc::new(Semaphore::new((threads / 2).max(1))),
            per_project: per_project.max(1),
            queue_timeout,
        }
    }

    /// A concurrency gate for one project.
    pub fn project_gate(&self) -> Arc<Semaphore> {
        Arc::new(Semaphore::new(self.per_project))
    }

    /// Runs `call` on the pool under `gate` (the project's), or answers [`Busy`].
    pub async fn run<T: Send + 'static>(
        &self,
        gate: &Arc<Semaphore>,
        call: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, Busy> {
        let deadline = tokio::time::Instant::now() + self.queue_timeout;
        let acquire = |s: &Arc<Semaphore>| {
            let s = s.clone();
            async move {
                tokio::time::timeout_at(deadline, s.acquire_owned())
                    .await
                    .ok()
                    .and_then(Result::ok)
            }
        };
        let project: OwnedSemaphorePermit = acquire(gate).await.ok_or(Busy)?;
        let slot: OwnedSemaphorePermit = acquire(&self.slots).await.ok_or(Busy)?;
        let (tx, rx) = oneshot::channel();
        let job: Job = Box::new(move || {
            let result = call();
            // The places are given back when the call ends, not when its caller stops waiting.
            drop((project, slot));
            let _ = tx.send(result);
        });
        match self.jobs.try_send(job) {
            Ok(()) => {}
            // Cannot happen while every job holds a slot; fail closed if it ever does.
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => return Err(Busy),
        }
        rx.await.map_err(|_| Busy)
    }
}

impl TenantPool {
    /// Runs `call` on the pool when a place of `gate` (the project's, for a project's shadow),
    /// a shadow place and a thread are free at once, without waiting for any ([`Busy`]
    /// otherwise): a shadow run must never hold up a request, and a project's shadows count
    /// against its own share like its calls. The caller does not wait for it.
    pub fn try_spawn(
        &self,
        gate: Option<&Arc<Semaphore>>,
        call: impl FnOnce() + Send + 'static,
    ) -> Result<(), Busy> {
        let project = gate
            .map(|g| g.clone().try_acquire_owned())
            .transpose()
            .map_err(|_| Busy)?;
        let shadow = self.shadows.clone().try_acquire_owned().map_err(|_| Busy)?;
        let slot = self.slots.clone().try_acquire_owned().map_err(|_| Busy)?;
        let job: Job = Box::new(move || {
            call();
            drop((project, shadow, slot));
        });
        self.jobs.try_send(job).map_err(|_| Busy)
    }
}

fn worker(receiver: &Mutex<Receiver<Job>>) {
    if let Err(e) = rustix::process::setpriority_process(None, POOL_NICE) {
        tracing::debug!(error = %e, "tenant module thread keeps the default priority");
    }
    // A runtime context of its own, never driven: a module's WASI call that would wait (a
    // clock's pollable, a sleep) registers its timer here, is found not ready at once, and
    // traps inside the call (counted as a failure) instead of finding no runtime and panicking.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build();
    let _context = match &runtime {
        Ok(runtime) => Some(runtime.enter()),
        Err(e) => {
            tracing::error!(error = %e, "a tenant module thread has no runtime context");
            None
        }
    };
    loop {
        let job = match receiver.lock() {
            Ok(r) => r.recv(),
            Err(_) => return,
        };
        let Ok(job) = job else { return };
        // A call catches the host's panics itself (a failed call); one that escaped must not
        // take the thread with it.
        if std::panic::catch_unwind(AssertUnwindSafe(job)).is_err() {
            tracing::error!("a tenant module job panicked in the host");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future as _;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn a_project_at_its_cap_waits_then_is_refused_while_others_run() {
        let pool = Arc::new(TenantPool::new(3, 1, Duration::from_millis(100)));
        let spinning = pool.project_gate();
        let other = pool.project_gate();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let held = {
            let gate = spinning.clone();
            let pool = pool.clone();
            tokio::spawn(async move {
                pool.run(&gate, move || {
                    let _ = release_rx.recv();
                })
                .await
            })
        };
        // The first call holds the project's only place.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(pool.run(&spinning, || 1).await, Err(Busy), "over the cap");
        assert_eq!(pool.run(&other, || 2).await, Ok(2), "another project runs");
        release_tx.send(()).expect("release");
        held.await.expect("task").expect("ran");
        assert_eq!(pool.run(&spinning, || 3).await, Ok(3), "place given back");
    }

    #[tokio::test]
    async fn a_shadow_run_never_waits_and_leaves_threads_to_the_calls() {
        let pool = Arc::new(TenantPool::new(2, 2, Duration::from_millis(100)));
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let (ran_tx, ran_rx) = std::sync::mpsc::channel::<()>();
        pool.try_spawn(None, move || {
            let _ = ran_tx.send(());
            let _ = release_rx.recv();
        })
        .expect("a free place");
        ran_rx.recv().expect("the shadow ran");
        // Half the threads are for shadows: the next shadow is skipped at once...
        let started = std::time::Instant::now();
        assert_eq!(pool.try_spawn(None, || {}), Err(Busy));
        assert!(started.elapsed() < Duration::from_millis(50));
        // ... while a call still finds a thread.
        let gate = pool.project_gate();
        assert_eq!(pool.run(&gate, || 7).await, Ok(7));
        release_tx.send(()).expect("release");
        for _ in 0..100 {
            if pool.try_spawn(None, || {}).is_ok() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the shadow place was not given back");
    }

    #[tokio::test]
    async fn a_projects_shadows_take_its_gate_and_are_skipped_when_it_is_full() {
        let pool = Arc::new(TenantPool::new(4, 1, Duration::from_millis(100)));
        let gate = pool.project_gate();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let (ran_tx, ran_rx) = std::sync::mpsc::channel::<()>();
        pool.try_spawn(Some(&gate), move || {
            let _ = ran_tx.send(());
            let _ = release_rx.recv();
        })
        .expect("a free place");
        ran_rx.recv().expect("the shadow ran");
        // The project's one place is held by its shadow: its next shadow is skipped, and a
        // call of the project waits for its place (and is refused at the queue timeout)…
        assert_eq!(pool.try_spawn(Some(&gate), || {}), Err(Busy));
        assert_eq!(pool.run(&gate, || 1).await, Err(Busy));
        // … while another project's shadow and calls still run.
        let other = pool.project_gate();
        assert_eq!(pool.run(&other, || 2).await, Ok(2));
        assert!(pool.try_spawn(Some(&other), || {}).is_ok());
        release_tx.send(()).expect("release");
        for _ in 0..100 {
            if pool.run(&gate, || 3).await == Ok(3) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the project's place was not given back");
    }

    #[test]
    fn a_tenant_thread_has_a_runtime_context_for_timers() {
        let pool = TenantPool::new(1, 1, Duration::from_secs(1));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        let gate = pool.project_gate();
        // A timer made on the thread does not panic (no reactor) and is not ready at once.
        let pending = rt.block_on(pool.run(&gate, || {
            let sleep = tokio::time::sleep(Duration::from_secs(60));
            let mut sleep = std::pin::pin!(sleep);
            let waker = std::task::Waker::noop();
            sleep
                .as_mut()
                .poll(&mut std::task::Context::from_waker(waker))
                .is_pending()
        }));
        assert_eq!(pending, Ok(true));
    }

    #[tokio::test]
    async fn calls_run_off_the_caller_thread_and_panics_keep_the_pool() {
        let pool = TenantPool::new(1, 4, Duration::from_secs(1));
        let gate = pool.project_gate();
        let here = std::thread::current().id();
        let there = pool.run(&gate, || std::thread::current().id()).await;
        assert_ne!(there, Ok(here));
        let count = Arc::new(AtomicUsize::new(0));
        let boom = pool.run(&gate, || -> u8 { panic!("boom") }).await;
        assert_eq!(boom, Err(Busy));
        let c = count.clone();
        pool.run(&gate, move || c.fetch_add(1, Ordering::SeqCst))
            .await
            .expect("the thread survived");
        assert_eq!(count.load(Ordering::SeqCst), 1);
    }
}
