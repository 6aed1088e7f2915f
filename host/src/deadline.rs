//! Request deadlines on timers that are armed once and moved, not made per request.
//!
//! A route's budget and its backend call each race the request against a deadline. With
//! `tokio::time::timeout_at`, every request makes a timer, registers it in the runtime's timer
//! wheel (under the wheel's lock) when the request first waits, and takes it out again (the
//! lock once more) when the answer comes first — as it almost always does. [`Timers`] keeps the
//! timers of finished requests and hands them to the next ones instead: a timer still in the
//! wheel whose deadline moves later is moved by one atomic exchange (tokio re-files it when its
//! old slot comes round), and waiting on it stores the request's waker, with no lock taken.
//! Only a deadline earlier than the timer's last one, or a timer that has fired since, goes
//! through the wheel's lock again.
//!
//! A kept timer still holds the waker of the last request that waited on it: when it fires
//! before it is handed out again, it wakes that request's connection once, for nothing, and
//! until then keeps that task's memory. Both are bounded by the number kept ([`KEPT`]) and by
//! the longest budget.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Mutex, PoisonError};
use std::task::{Context, Poll};

use pin_project_lite::pin_project;
use tokio::task::coop;
use tokio::time::{Instant, Sleep};

/// Timers kept for reuse per [`Timers`]: enough for this many requests waiting at once; past
/// it, timers are made and dropped as `tokio::time::timeout_at` makes them.
pub const KEPT: usize = 1024;

/// The deadline passed before the work finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expired;

/// Timers kept for reuse by one user (a plane's route budgets, a transport's calls). Timers
/// belong to the runtime they were made on: a `Timers` is used on one runtime.
#[derive(Debug, Default)]
pub struct Timers {
    kept: Mutex<Vec<Pin<Box<Sleep>>>>,
}

impl Timers {
    /// Runs `work` until `deadline`: its output, or [`Expired`] if the deadline came first
    /// (checked only when `work` has to wait, as `tokio::time::timeout_at` does).
    pub fn run_until<F: Future>(&self, deadline: Instant, work: F) -> RunUntil<'_, F> {
        RunUntil {
            work,
            timer: self.take(deadline),
        }
    }

    /// A timer due at `deadline`, kept or new.
    fn take(&self, deadline: Instant) -> Taken<'_> {
        let kept = self
            .kept
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        let sleep = match kept {
            Some(mut sleep) => {
                sleep.as_mut().reset(deadline);
                sleep
            }
            // Not in the wheel until first waited on.
            None => Box::pin(tokio::time::sleep_until(deadline)),
        };
        Taken {
            timers: self,
            sleep: Some(sleep),
        }
    }

    /// Timers kept now.
    pub fn kept(&self) -> usize {
        self.kept
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

pin_project! {
    /// `work` raced against a kept timer ([`Timers::run_until`]). The work is moved in once,
    /// when this is made, as `tokio::time::Timeout` moves it; a request's work can be several
    /// kilobytes.
    #[must_use = "futures do nothing unless awaited"]
    pub struct RunUntil<'a, F> {
        #[pin]
        work: F,
        timer: Taken<'a>,
    }
}

impl<F: Future> Future for RunUntil<'_, F> {
    type Output = Result<F::Output, Expired>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let had_budget = coop::has_budget_remaining();
        if let Poll::Ready(out) = this.work.poll(cx) {
            return Poll::Ready(Ok(out));
        }
        let timer = this.timer.sleep();
        let expired = if had_budget && !coop::has_budget_remaining() {
            // The work used up the task's budget: the deadline is still looked at (tokio's
            // documented way), or a busy request would never expire.
            std::pin::pin!(coop::unconstrained(timer)).poll(cx)
        } else {
            timer.poll(cx)
        };
        expired.map(|()| Err(Expired))
    }
}

/// A timer lent to one request; back to its [`Timers`] when dropped.
struct Taken<'a> {
    timers: &'a Timers,
    sleep: Option<Pin<Box<Sleep>>>,
}

impl Taken<'_> {
    fn sleep(&mut self) -> Pin<&mut Sleep> {
        match self.sleep.as_mut() {
            Some(sleep) => sleep.as_mut(),
            None => unreachable!("a taken timer is held until it is dropped"),
        }
    }
}

impl Drop for Taken<'_> {
    fn drop(&mut self) {
        let Some(sleep) = self.sleep.take() else {
            return;
        };
        let mut kept = self
            .timers
            .kept
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if kept.len() < KEPT {
            kept.push(sleep);
        }
        // Past the bound the timer is dropped here (out of the wheel under its lock), after
        // this one is released.
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// Whether `work` under `deadline` is still waiting after `after` of paused time.
    async fn still_waiting(timers: &Timers, deadline: Instant, after: Duration) -> bool {
        let run = timers.run_until(deadline, std::future::pending::<()>());
        tokio::pin!(run);
        tokio::select! {
            biased;
            out = &mut run => {
                assert_eq!(out, Err(Expired));
                false
            }
            () = tokio::time::sleep(after) => true,
        }
    }

    /// Waits on nothing until `deadline` and checks it expired then, not before or after.
    async fn expires_at(timers: &Timers, deadline: Instant) {
        let out = timers
            .run_until(deadline, std::future::pending::<()>())
            .await;
        assert_eq!(out, Err(Expired));
        assert_eq!(Instant::now(), deadline);
    }

    /// Leaves a timer set `after` from now in `timers`, as a request that waited once and
    /// finished leaves it.
    async fn arm(timers: &Timers, after: Duration) {
        let out = timers
            .run_until(Instant::now() + after, tokio::task::yield_now())
            .await;
        assert_eq!(out, Ok(()));
    }

    #[tokio::test(start_paused = true)]
    async fn work_that_finishes_first_gives_its_output_and_its_timer_back() {
        let timers = Timers::default();
        let out = timers
            .run_until(Instant::now() + 10 * MS, async {
                tokio::task::yield_now().await;
                7
            })
            .await;
        assert_eq!(out, Ok(7));
        assert_eq!(timers.kept(), 1);
        let out = timers
            .run_until(Instant::now() + 10 * MS, async { 8 })
            .await;
        assert_eq!(out, Ok(8));
        assert_eq!(
            timers.kept(),
            1,
            "the kept timer was reused, not a second one made"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_deadline_fires_at_its_time_not_before() {
        let timers = Timers::default();
        let start = Instant::now();
        let deadline = start + 30 * MS;
        assert!(still_waiting(&timers, deadline, 29 * MS).await);
        expires_at(&timers, deadline).await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_reused_timer_fires_at_the_new_deadline_later_or_earlier() {
        let timers = Timers::default();
        // Armed at +30 ms by a request that finished at once.
        arm(&timers, 30 * MS).await;
        assert_eq!(timers.kept(), 1);
        // Moved later: the old slot (+30 ms) passes without firing.
        let later = Instant::now() + 50 * MS;
        assert!(still_waiting(&timers, later, 40 * MS).await);
        expires_at(&timers, later).await;
        // Moved earlier than it was: fires at the earlier one.
        arm(&timers, 100 * MS).await;
        let earlier = Instant::now() + 5 * MS;
        expires_at(&timers, earlier).await;
        assert_eq!(timers.kept(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_kept_timer_that_fired_while_kept_is_armed_again() {
        let timers = Timers::default();
        arm(&timers, 10 * MS).await;
        // Its deadline passes while nobody holds it.
        tokio::time::sleep(20 * MS).await;
        let deadline = Instant::now() + 10 * MS;
        assert!(
            still_waiting(&timers, deadline, 9 * MS).await,
            "not expired at once"
        );
        expires_at(&timers, deadline).await;
    }

    #[tokio::test]
    async fn work_that_uses_up_its_budget_on_every_poll_still_expires() {
        let timers = Timers::default();
        let busy = async {
            loop {
                tokio::task::consume_budget().await;
            }
        };
        let run = timers.run_until(Instant::now() + 20 * MS, busy);
        let out = tokio::time::timeout(Duration::from_secs(10), run).await;
        assert_eq!(out.ok(), Some(Err(Expired)), "expired by its own deadline");
    }

    #[tokio::test(start_paused = true)]
    async fn no_more_than_the_bound_are_kept() {
        let timers = Timers::default();
        let deadline = Instant::now() + 10 * MS;
        let waiting: Vec<_> = (0..KEPT + 10)
            .map(|_| Box::pin(timers.run_until(deadline, std::future::pending::<()>())))
            .collect();
        for out in futures::future::join_all(waiting).await {
            assert_eq!(out, Err(Expired));
        }
        assert_eq!(timers.kept(), KEPT);
    }
}
