//! Tenant module calls run off the request workers, and every project gets its fair share of
//! the threads they run on.
//!
//! A module a project installed is untrusted code that may spin to its deadline on every call.
//! Run inline, such calls would take the async worker threads that serve every other project.
//! They run instead on a small pool of threads of their own (`plugins.tenant_threads`, at a
//! lower scheduling priority than the request workers).
//!
//! Which call a free thread takes next is decided per project, not in arrival order: each
//! project with calls waiting has a queue, and a free thread serves the project that has used
//! the least thread time so far (start-time fair queuing over the time each call took: a
//! project whose calls spin to their deadline pays for every millisecond, one whose calls take
//! microseconds barely moves). A project that starts calling again starts from the time of the
//! call being served, never from credit saved while it was idle. So a hundred projects
//! spinning at their deadline share the threads among themselves, and a project with one call
//! in a second waits at most for one thread to come free, never behind their queues.
//!
//! A project whose last call ran for a quarter of the call deadline or more is *heavy*, and its
//! calls run on threads of their own (as many), at the kernel's idle scheduling class: they get
//! only the CPU nothing else wants, the request workers and the other projects' calls take it
//! from them at once, and they never take a thread of the others. However many projects spin
//! at their deadline, a project whose calls are quick finds the threads it had before; a heavy
//! project whose call is quick again is light from its next call. Heavy calls together may
//! also use at most `plugins.tenant_heavy_cpu_share` of one core (their thread time is credited
//! at that rate; a heavy thread waits for credit before it starts a call), so that the CPU they
//! leave is free when a request worker wakes, not merely theirs to take back.
//!
//! Each project may also have at most `plugins.tenant_max_concurrent_calls` calls running at
//! once. A call that has not started within `plugins.tenant_queue_timeout_ms` is not run: its
//! request fails closed with `503 policy_busy`. Operator modules (trusted) keep running inline.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

/// Niceness of the pool's threads: the request workers win the CPU when both want it.
const POOL_NICE: i32 = 10;

/// The threads of light calls, and those of heavy calls.
const LIGHT: usize = 0;
const HEAVY: usize = 1;

/// Calls one project may have waiting, per call it may run at once: more could not start
/// within the queue timeout anyway, and each waiting call holds its input.
const QUEUED_PER_PLACE: usize = 16;

/// A call: runs on a tenant thread and gives back how to answer its caller, which the thread
/// does once the call's place and time are accounted (a caller never sees its place still
/// taken after its answer).
type Job = Box<dyn FnOnce() -> Answer + Send + 'static>;

/// Answers a call's caller.
type Answer = Box<dyn FnOnce() + Send + 'static>;

/// The call was not run: the project's places or the threads stayed taken for the queue
/// timeout, or its queue was full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the project's policy modules are busy; retry shortly")]
pub struct Busy;

/// A project's place in the tenant pool's schedule: calls under one gate share its places and
/// its thread time.
#[derive(Debug)]
pub struct ProjectGate {
    id: u64,
    /// The project's last call ran for the pool's `heavy_after` or longer.
    heavy: std::sync::atomic::AtomicBool,
}

impl ProjectGate {
    /// [`LIGHT`] or [`HEAVY`]: whose threads run the project's next call.
    fn class(&self) -> usize {
        if self.heavy.load(Ordering::Relaxed) {
            HEAVY
        } else {
            LIGHT
        }
    }
}

/// A project's gate, shared by its slots.
pub type Gate = Arc<ProjectGate>;

/// Where a waiting call is: the caller gives up only on a call that has not started.
const WAITING: u8 = 0;
const STARTED: u8 = 1;
const ABANDONED: u8 = 2;

struct Queued {
    job: Job,
    state: Arc<AtomicU8>,
    /// Told when the call starts (a waiting caller's queue timeout ends there).
    started: Option<oneshot::Sender<()>>,
    shadow: bool,
}

/// One project's calls.
#[derive(Default)]
struct Project {
    /// Thread time used, in nanoseconds of the schedule's virtual clock.
    used: u64,
    running: usize,
    queue: VecDeque<Queued>,
    /// The project's gate (none: the operator's shadows, always light).
    gate: Option<Gate>,
}

impl Project {
    fn class(&self) -> usize {
        self.gate.as_ref().map_or(LIGHT, |g| g.class())
    }
}

/// What the threads share.
struct Schedule {
    /// Projects with calls waiting or running.
    projects: HashMap<u64, Project>,
    /// Projects with a call waiting and a place free, least thread time first: the light ones
    /// and the heavy ones.
    ready: [BTreeSet<(u64, u64)>; 2],
    /// The thread time of the project served last: where a project that starts calling again
    /// starts.
    clock: u64,
    /// Threads not running a call, light and heavy.
    idle_threads: [usize; 2],
    /// Shadow runs waiting or running.
    shadows: usize,
    /// The pool was dropped: the threads end.
    stop: bool,
    /// The thread time heavy calls may still use.
    heavy_budget: HeavyBudget,
}

/// Thread time for heavy calls, credited at `rate` (thread nanoseconds per nanosecond) up to
/// [`HEAVY_BURST`] of it ahead; a call's time is charged when it ends (so credit may go below
/// zero by one call).
struct HeavyBudget {
    credit_ns: f64,
    at: Instant,
    rate: f64,
}

/// How far ahead heavy calls' credit may build up, in wall time at its rate.
const HEAVY_BURST: Duration = Duration::from_millis(100);

impl HeavyBudget {
    fn refill(&mut self, now: Instant) {
        if !self.rate.is_finite() {
            self.credit_ns = f64::INFINITY;
            return;
        }
        let elapsed = now.saturating_duration_since(self.at).as_nanos() as f64;
        self.at = now;
        let most = HEAVY_BURST.as_nanos() as f64 * self.rate;
        self.credit_ns = (self.credit_ns + elapsed * self.rate).min(most);
    }

    /// How long until there is credit again (none: there is now).
    fn wait(&self) -> Option<Duration> {
        if self.credit_ns > 0.0 {
            return None;
        }
        let nanos = (1.0 - self.credit_ns) / self.rate.max(f64::MIN_POSITIVE);
        Some(Duration::from_nanos(nanos.min(1e12) as u64))
    }
}

impl Schedule {
    /// Puts `id` in the ready set when it has a call waiting and a place free.
    fn offer(&mut self, id: u64, per_project: usize) {
        if let Some(p) = self.projects.get(&id)
            && !p.queue.is_empty()
            && p.running < per_project
        {
            self.ready[p.class()].insert((p.used, id));
        }
    }

    /// Takes `id` (whose thread time was `used`) out of the ready sets.
    fn unready(&mut self, used: u64, id: u64) {
        for ready in &mut self.ready {
            ready.remove(&(used, id));
        }
    }

    /// Whether a thread of `class` is free beyond one for each project of that class whose
    /// calls wait. For heavy calls, credit must be left too (as last counted): a call that would wait for
    /// credit is not placed, so its queue timeout bounds the wait.
    fn free_thread(&self, class: usize) -> bool {
        self.idle_threads[class] > self.ready[class].len()
            && (class == LIGHT || self.heavy_budget.credit_ns > 0.0)
    }

    /// The next call for a thread of `class`: the waiting call of the ready project of that
    /// class with the least thread time.
    fn next(&mut self, class: usize, per_project: usize) -> Option<(u64, Queued)> {
        loop {
            let (_, id) = self.ready[class].pop_first()?;
            let project = self.projects.get_mut(&id)?;
            let Some(queued) = project.queue.pop_front() else {
                continue;
            };
            self.clock = self.clock.max(project.used);
            // An abandoned call is dropped here: its caller answered busy already.
            if queued
                .state
                .compare_exchange(WAITING, STARTED, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                self.offer(id, per_project);
                self.forget_if_idle(id);
                continue;
            }
            project.running += 1;
            self.offer(id, per_project);
            let mut queued = queued;
            if let Some(started) = queued.started.take() {
                let _ = started.send(());
            }
            return Some((id, queued));
        }
    }

    /// Drops `id`'s record once it has nothing waiting or running: its thread time is not kept
    /// (it starts from the clock when it calls again).
    fn forget_if_idle(&mut self, id: u64) {
        if self
            .projects
            .get(&id)
            .is_some_and(|p| p.running == 0 && p.queue.is_empty())
        {
            self.projects.remove(&id);
        }
    }
}

/// What the pool and its threads share.
struct Shared {
    schedule: Mutex<Schedule>,
    /// Wakes a thread of each class ([`LIGHT`], [`HEAVY`]).
    wake: [Condvar; 2],
}

/// The tenant call pool.
pub struct TenantPool {
    /// The schedule, and the wake-ups of the light and the heavy threads.
    shared: Arc<Shared>,
    threads: usize,
    /// A call this long or longer makes its project heavy, in nanoseconds (shared with the
    /// threads).
    heavy_after: Arc<AtomicU64>,
    /// Shadow runs at once: half the threads, so that shadows never take them all.
    max_shadows: usize,
    per_project: usize,
    queue_timeout: Duration,
    gates: AtomicU64,
}

impl std::fmt::Debug for TenantPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantPool")
            .field("threads", &self.threads)
            .field("per_project", &self.per_project)
            .finish_non_exhaustive()
    }
}

impl TenantPool {
    /// Starts `threads` threads for light calls and as many for heavy ones.
    pub fn new(threads: usize, per_project: usize, queue_timeout: Duration) -> Self {
        let threads = threads.max(1);
        let per_project = per_project.max(1);
        let shared = Arc::new(Shared {
            schedule: Mutex::new(Schedule {
                projects: HashMap::new(),
                ready: [BTreeSet::new(), BTreeSet::new()],
                clock: 0,
                idle_threads: [0, 0],
                shadows: 0,
                stop: false,
                heavy_budget: HeavyBudget {
                    credit_ns: 0.0,
                    at: Instant::now(),
                    rate: f64::INFINITY,
                },
            }),
            wake: [Condvar::new(), Condvar::new()],
        });
        let heavy_after = Arc::new(AtomicU64::new(u64::MAX));
        let mut started = [0, 0];
        for (class, name) in [(LIGHT, "aura-tenant"), (HEAVY, "aura-tenant-heavy")] {
            for i in 0..threads {
                let (shared, heavy_after) = (shared.clone(), heavy_after.clone());
                let spawned = std::thread::Builder::new()
                    .name(format!("{name}-{i}"))
                    .spawn(move || worker(&shared, class, per_project, &heavy_after));
                match spawned {
                    Ok(_) => started[class] += 1,
                    Err(e) => tracing::error!(error = %e, "cannot start a tenant module thread"),
                }
            }
        }
        shared
            .schedule
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .idle_threads = started;
        Self {
            shared,
            threads,
            heavy_after,
            max_shadows: (threads / 2).max(1),
            per_project,
            queue_timeout,
            gates: AtomicU64::new(0),
        }
    }

    /// Makes a project heavy once one of its calls ran for `after` or longer (never, unless
    /// set).
    pub fn heavy_after(self, after: Duration) -> Self {
        let nanos = u64::try_from(after.as_nanos()).unwrap_or(u64::MAX);
        self.heavy_after.store(nanos, Ordering::Relaxed);
        self
    }

    /// Lets heavy calls together use at most `share` of one core's time (every core's, unless
    /// set).
    pub fn heavy_cpu_share(self, share: f64) -> Self {
        let mut schedule = self.lock();
        schedule.heavy_budget.rate = share.max(0.0);
        schedule.heavy_budget.credit_ns = HEAVY_BURST.as_nanos() as f64 * share.max(0.0);
        drop(schedule);
        self
    }

    /// A gate for one project.
    pub fn project_gate(&self) -> Gate {
        Arc::new(ProjectGate {
            id: self.gates.fetch_add(1, Ordering::Relaxed),
            heavy: std::sync::atomic::AtomicBool::new(false),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Schedule> {
        self.shared
            .schedule
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `job` for `gate`'s project, unless its queue is full. Whether it found a place at
    /// once: its project had a place free and nothing waiting, and a thread was free beyond one
    /// for each project whose calls wait.
    fn enqueue(&self, gate: &Gate, queued: Queued) -> Result<bool, Busy> {
        let mut schedule = self.lock();
        let clock = schedule.clock;
        let class = gate.class();
        let free_thread = schedule.free_thread(class);
        let project = schedule.projects.entry(gate.id).or_default();
        project.gate.get_or_insert_with(|| gate.clone());
        if project.queue.len() >= self.per_project * QUEUED_PER_PLACE {
            return Err(Busy);
        }
        let placed = free_thread && project.queue.is_empty() && project.running < self.per_project;
        if project.queue.is_empty() && project.running == 0 {
            // Starting to call again: from the clock, never from credit saved while idle.
            project.used = project.used.max(clock);
        }
        project.queue.push_back(queued);
        schedule.offer(gate.id, self.per_project);
        drop(schedule);
        self.shared.wake[class].notify_one();
        Ok(placed)
    }

    /// Runs `call` on the pool in `gate`'s project's turn, or answers [`Busy`] when it has not
    /// started within the queue timeout.
    pub async fn run<T: Send + 'static>(
        &self,
        gate: &Gate,
        call: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, Busy> {
        let (tx, rx) = oneshot::channel();
        let state = Arc::new(AtomicU8::new(WAITING));
        let job: Job = Box::new(move || {
            let result = call();
            Box::new(move || {
                let _ = tx.send(result);
            })
        });
        let (started, mut starting) = oneshot::channel();
        let queued = Queued {
            job,
            state: state.clone(),
            started: Some(started),
            shadow: false,
        };
        // A call that found a place is answered when it ends (its deadline bounds it); one that
        // waits is given up if it has not started within the queue timeout.
        if !self.enqueue(gate, queued)?
            && tokio::time::timeout(self.queue_timeout, &mut starting)
                .await
                .is_err()
            && state
                .compare_exchange(WAITING, ABANDONED, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            return Err(Busy);
        }
        rx.await.map_err(|_| Busy)
    }

    /// Runs `call` on the pool now when a thread is free beyond the calls waiting, a shadow
    /// place is free and `gate`'s project (a project's shadow) has a place free, without waiting
    /// for any ([`Busy`] otherwise): a shadow run must never hold up a request, and a project's
    /// shadows count against its own places and time like its calls. The caller does not wait
    /// for it.
    pub fn try_spawn(
        &self,
        gate: Option<&Gate>,
        call: impl FnOnce() + Send + 'static,
    ) -> Result<(), Busy> {
        let mut schedule = self.lock();
        let class = gate.map_or(LIGHT, |g| g.class());
        // A thread free now beyond one for each project whose calls wait.
        if schedule.shadows >= self.max_shadows || !schedule.free_thread(class) {
            return Err(Busy);
        }
        // The operator's shadows have a project of their own in the schedule.
        let id = gate.map_or(u64::MAX, |g| g.id);
        let clock = schedule.clock;
        let project = schedule.projects.entry(id).or_default();
        if project.gate.is_none() {
            project.gate = gate.cloned();
        }
        if project.running >= self.per_project && gate.is_some() {
            schedule.forget_if_idle(id);
            return Err(Busy);
        }
        if project.queue.is_empty() && project.running == 0 {
            project.used = project.used.max(clock);
        }
        project.queue.push_back(Queued {
            job: Box::new(move || {
                call();
                Box::new(|| {})
            }),
            state: Arc::new(AtomicU8::new(WAITING)),
            started: None,
            shadow: true,
        });
        schedule.shadows += 1;
        // Ready at once, whatever its place count (the operator's shadows have no cap but the
        // shadow places).
        let used = schedule.projects[&id].used;
        schedule.ready[class].insert((used, id));
        drop(schedule);
        self.shared.wake[class].notify_one();
        Ok(())
    }
}

impl Drop for TenantPool {
    fn drop(&mut self) {
        // Each thread ends after its call in progress; calls still waiting are answered busy
        // when the schedule is dropped with the last thread.
        self.lock().stop = true;
        for wake in &self.shared.wake {
            wake.notify_all();
        }
    }
}

/// The least thread time a call is charged, in nanoseconds: no call is free.
const LEAST_CHARGE_NS: u64 = 1_000;

/// Puts the calling thread in the kernel's idle scheduling class (`SCHED_IDLE`): it runs only
/// on CPU no other thread wants, and any other thread waking up takes the CPU from it at once.
#[expect(
    unsafe_code,
    reason = "sched_setscheduler through libc; rustix has no wrapper for it"
)]
fn idle_class() -> std::io::Result<()> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `param` is a valid, initialised `sched_param` that outlives the call, and pid 0
    // names the calling thread; the call reads it and changes only this thread's policy.
    let done = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
    if done == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn worker(shared: &Shared, class: usize, per_project: usize, heavy_after: &AtomicU64) {
    let lowered = if class == HEAVY {
        idle_class()
    } else {
        rustix::process::setpriority_process(None, POOL_NICE).map_err(std::io::Error::from)
    };
    if let Err(e) = lowered {
        tracing::debug!(error = %e, class, "tenant module thread keeps the default priority");
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
    let wake = &shared.wake[class];
    let relock = || shared.schedule.lock().unwrap_or_else(|p| p.into_inner());
    let mut schedule = relock();
    loop {
        if schedule.stop {
            return;
        }
        if class == HEAVY && !schedule.ready[HEAVY].is_empty() {
            schedule.heavy_budget.refill(Instant::now());
            if let Some(wait) = schedule.heavy_budget.wait() {
                schedule = wake
                    .wait_timeout(schedule, wait)
                    .map_or_else(|p| p.into_inner().0, |(s, _)| s);
                continue;
            }
        }
        let Some((id, queued)) = schedule.next(class, per_project) else {
            schedule = wake.wait(schedule).unwrap_or_else(|p| p.into_inner());
            continue;
        };
        schedule.idle_threads[class] -= 1;
        drop(schedule);
        let started = Instant::now();
        // A call catches the host's panics itself (a failed call); one that escaped must not
        // take the thread with it.
        let answer = std::panic::catch_unwind(AssertUnwindSafe(queued.job));
        if answer.is_err() {
            tracing::error!("a tenant module job panicked in the host");
        }
        let took = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let heavy = took >= heavy_after.load(Ordering::Relaxed);
        schedule = relock();
        schedule.idle_threads[class] += 1;
        if class == HEAVY {
            schedule.heavy_budget.credit_ns -= took as f64;
        }
        if queued.shadow {
            schedule.shadows -= 1;
        }
        let before = schedule.projects.get_mut(&id).map(|project| {
            let before = project.used;
            project.running -= 1;
            project.used = before.saturating_add(took.max(LEAST_CHARGE_NS));
            let was = project.class();
            if let Some(gate) = &project.gate {
                gate.heavy.store(heavy, Ordering::Relaxed);
            }
            (before, was != project.class())
        });
        let moved = if let Some((before, moved)) = before {
            schedule.unready(before, id);
            schedule.offer(id, per_project);
            schedule.forget_if_idle(id);
            moved
        } else {
            false
        };
        drop(schedule);
        // The project's waiting calls now wait for the other class's threads.
        if moved {
            shared.wake[1 - class].notify_one();
        }
        if let Ok(answer) = answer {
            answer();
        }
        schedule = relock();
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

    /// Queues `calls` calls of `gate` that each take `each` and then note `name` in `order`.
    fn queue_calls(
        pool: &Arc<TenantPool>,
        gate: &Gate,
        calls: usize,
        each: Duration,
        name: char,
        order: &Arc<Mutex<Vec<char>>>,
    ) -> Vec<tokio::task::JoinHandle<Result<(), Busy>>> {
        (0..calls)
            .map(|_| {
                let (pool, gate, order) = (pool.clone(), gate.clone(), order.clone());
                tokio::spawn(async move {
                    pool.run(&gate, move || {
                        std::thread::sleep(each);
                        order.lock().expect("order").push(name);
                    })
                    .await
                })
            })
            .collect()
    }

    /// Holds the pool's only thread until the returned sender is used, so that calls queued
    /// meanwhile are all waiting when it comes free.
    async fn hold_the_thread(pool: &Arc<TenantPool>) -> std::sync::mpsc::Sender<()> {
        let (release, held) = std::sync::mpsc::channel::<()>();
        let (ran_tx, ran) = oneshot::channel();
        let pool2 = pool.clone();
        let gate = pool.project_gate();
        tokio::spawn(async move {
            pool2
                .run(&gate, move || {
                    let _ = ran_tx.send(());
                    let _ = held.recv();
                })
                .await
        });
        ran.await.expect("the holding call runs");
        release
    }

    #[tokio::test]
    async fn the_project_that_used_the_least_thread_time_is_served_first() {
        let pool = Arc::new(TenantPool::new(1, 1, Duration::from_secs(30)));
        let order = Arc::new(Mutex::new(Vec::new()));
        let release = hold_the_thread(&pool).await;
        // `s` spins 10 ms a call, `q` takes 1 ms: both keep a full queue.
        let (slow, quick) = (pool.project_gate(), pool.project_gate());
        let mut calls = queue_calls(&pool, &slow, 8, Duration::from_millis(10), 's', &order);
        calls.extend(queue_calls(
            &pool,
            &quick,
            8,
            Duration::from_millis(1),
            'q',
            &order,
        ));
        tokio::time::sleep(Duration::from_millis(100)).await;
        release.send(()).expect("release");
        for call in calls {
            call.await.expect("task").expect("ran");
        }
        let order: String = order.lock().expect("order").iter().collect();
        // Served by the time used, not by the calls made: every quick call is done before the
        // slow project has had a third call (in turns, it would have had seven).
        let last_quick = order.rfind('q').expect("quick calls");
        let slow_before = order[..last_quick].matches('s').count();
        assert!(slow_before <= 2, "{order}");
    }

    #[tokio::test]
    async fn a_project_calling_rarely_waits_for_one_thread_never_behind_the_spinning_queues() {
        let pool = Arc::new(TenantPool::new(2, 1, Duration::from_secs(30)));
        let order = Arc::new(Mutex::new(Vec::new()));
        // Four projects whose every call spins 20 ms, each with a full queue...
        let mut spinning = Vec::new();
        for name in ['a', 'b', 'c', 'd'] {
            let gate = pool.project_gate();
            let each = Duration::from_millis(20);
            spinning.extend(queue_calls(&pool, &gate, 16, each, name, &order));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        // ... and one call of a project that has not called for a while.
        let rare = pool.project_gate();
        let at = order.lock().expect("order").len();
        let seen = order.clone();
        let done_before = pool
            .run(&rare, move || seen.lock().expect("order").len())
            .await
            .expect("ran");
        // It waited for a thread to come free, not for the calls queued before it.
        assert!(
            done_before - at <= 2,
            "{} spinning calls ended between its arrival and its turn",
            done_before - at
        );
        for call in spinning {
            call.await.expect("task").expect("ran");
        }
    }

    #[tokio::test]
    async fn heavy_projects_run_on_threads_of_their_own_never_the_others() {
        // Two threads of each class; a call of 5 ms or more makes its project heavy.
        let pool = Arc::new(
            TenantPool::new(2, 2, Duration::from_secs(2)).heavy_after(Duration::from_millis(5)),
        );
        let held = Arc::new((Mutex::new(true), Condvar::new()));
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        // A spinning call: runs until the test lets every one go.
        let spin = || {
            let (held, running, most) = (held.clone(), running.clone(), most.clone());
            move || {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                let (lock, let_go) = &*held;
                let mut holding = lock.lock().expect("held");
                while *holding {
                    holding = let_go.wait(holding).expect("held");
                }
                running.fetch_sub(1, Ordering::SeqCst);
            }
        };
        // Eight projects whose one call of 10 ms makes them heavy...
        let spinners: Vec<Gate> = (0..8).map(|_| pool.project_gate()).collect();
        for gate in &spinners {
            let call = || std::thread::sleep(Duration::from_millis(10));
            pool.run(gate, call).await.expect("ran");
        }
        // ... then fill their places with calls that run until let go.
        let mut load = Vec::new();
        for gate in &spinners {
            for _ in 0..2 {
                let (pool, gate, call) = (pool.clone(), gate.clone(), spin());
                load.push(tokio::spawn(async move { pool.run(&gate, call).await }));
            }
        }
        while running.load(Ordering::SeqCst) < 2 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // Both heavy threads hold spinning calls; a quick project's calls run on the light
        // threads at once (on shared threads they would wait out the queue timeout, busy).
        let quick = pool.project_gate();
        for i in 0..20 {
            assert_eq!(pool.run(&quick, move || i).await, Ok(i));
        }
        let quick_thread = pool
            .run(&quick, || std::thread::current().name().map(str::to_owned))
            .await;
        assert_eq!(
            most.load(Ordering::SeqCst),
            2,
            "spinning calls on the two heavy threads"
        );
        assert!(
            quick_thread
                .as_ref()
                .is_ok_and(|n| n.as_deref().is_some_and(|n| !n.contains("heavy"))),
            "{quick_thread:?}"
        );
        // Let go: the heavy calls waiting run two at a time (the others waited out the queue
        // timeout: busy, as a spinning project's calls past its share are).
        *held.0.lock().expect("held") = false;
        held.1.notify_all();
        for call in load {
            let _ = call.await.expect("task");
        }
        assert_eq!(most.load(Ordering::SeqCst), 2);
        // A heavy project whose call was quick is light again.
        let gate = &spinners[0];
        pool.run(gate, || ()).await.expect("ran");
        let name = pool
            .run(gate, || std::thread::current().name().map(str::to_owned))
            .await;
        assert!(
            name.as_ref()
                .is_ok_and(|n| n.as_deref().is_some_and(|n| !n.contains("heavy"))),
            "{name:?}"
        );
    }

    #[tokio::test]
    async fn heavy_calls_together_use_at_most_their_share_of_a_core() {
        // Heavy calls may use a twentieth of a core: 50 ms of thread time a second (5 ms ahead
        // at most), and each takes 5 ms.
        let pool = Arc::new(
            TenantPool::new(2, 2, Duration::from_secs(5))
                .heavy_after(Duration::from_millis(1))
                .heavy_cpu_share(0.05),
        );
        let gates: Vec<Gate> = (0..2).map(|_| pool.project_gate()).collect();
        for gate in &gates {
            let call = || std::thread::sleep(Duration::from_millis(2));
            pool.run(gate, call).await.expect("ran");
        }
        let done = Arc::new(AtomicUsize::new(0));
        let started = std::time::Instant::now();
        let mut calls = Vec::new();
        for gate in gates.iter().chain(&gates).cycle().take(40) {
            let (pool, gate, done) = (pool.clone(), gate.clone(), done.clone());
            calls.push(tokio::spawn(async move {
                pool.run(&gate, move || {
                    std::thread::sleep(Duration::from_millis(5));
                    done.fetch_add(1, Ordering::SeqCst);
                })
                .await
            }));
        }
        // A light project meanwhile runs at once.
        let quick = pool.project_gate();
        assert_eq!(pool.run(&quick, || 1).await, Ok(1));
        tokio::time::sleep(Duration::from_secs(1).saturating_sub(started.elapsed())).await;
        let in_a_second = done.load(Ordering::SeqCst);
        // 55 ms of credit in the second: about 11 calls (and those in progress), never all 40.
        assert!(
            (2..=16).contains(&in_a_second),
            "{in_a_second} heavy calls of 5 ms ran in a second at a twentieth of a core"
        );
        for call in calls {
            let _ = call.await.expect("task");
        }
    }

    #[tokio::test]
    async fn a_heavy_call_waiting_for_credit_is_refused_at_the_queue_timeout() {
        // A hundredth of a core: a heavy call of 20 ms leaves the credit 19 ms short, about two
        // seconds to make up.
        let pool = TenantPool::new(1, 1, Duration::from_millis(100))
            .heavy_after(Duration::from_millis(1))
            .heavy_cpu_share(0.01);
        let gate = pool.project_gate();
        let call = || std::thread::sleep(Duration::from_millis(20));
        pool.run(&gate, call).await.expect("ran light");
        pool.run(&gate, call)
            .await
            .expect("ran heavy on the credit ahead");
        let started = std::time::Instant::now();
        assert_eq!(pool.run(&gate, || ()).await, Err(Busy));
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "waited {:?} for credit past the queue timeout",
            started.elapsed()
        );
    }

    #[tokio::test]
    async fn a_full_queue_is_refused_at_once() {
        let pool = Arc::new(TenantPool::new(1, 1, Duration::from_secs(30)));
        let order = Arc::new(Mutex::new(Vec::new()));
        let release = hold_the_thread(&pool).await;
        let gate = pool.project_gate();
        let queued = queue_calls(&pool, &gate, QUEUED_PER_PLACE, Duration::ZERO, 'x', &order);
        tokio::time::sleep(Duration::from_millis(100)).await;
        let started = std::time::Instant::now();
        assert_eq!(pool.run(&gate, || ()).await, Err(Busy));
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "refused without waiting"
        );
        // Another project still queues.
        let other = pool.project_gate();
        let other_call = queue_calls(&pool, &other, 1, Duration::ZERO, 'y', &order);
        release.send(()).expect("release");
        for call in queued.into_iter().chain(other_call) {
            call.await.expect("task").expect("ran");
        }
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
