//! The signals that end the listeners and their connections: shutdown (stop accepting, finish
//! what is in flight) and the end of the grace (drop what is left).
//!
//! Every connection waits for both for as long as it lives, and its task is woken by every read
//! and every answer of its requests. A wait on a `watch` channel or a `CancellationToken`
//! registers with the sender's list (a lock shared by every connection) each time it is created
//! and each time it is polled; a [`Stopped`] registers once, then reads one flag until it is
//! set.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Waker};

use tokio::sync::Notify;
use tokio::sync::futures::Notified;

/// A signal set once, waited for by many.
#[derive(Debug, Clone, Default)]
pub struct Stop(Arc<Inner>);

#[derive(Debug, Default)]
struct Inner {
    set: AtomicBool,
    notify: Notify,
}

impl Stop {
    /// A signal not set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the signal and wakes every [`Stopped`] waiting for it.
    pub fn set(&self) {
        self.0.set.store(true, Ordering::Release);
        self.0.notify.notify_waiters();
    }

    /// Whether the signal is set.
    pub fn is_set(&self) -> bool {
        self.0.set.load(Ordering::Acquire)
    }

    /// Resolves once the signal is set (at once if it already is).
    pub fn wait(&self) -> Stopped<'_> {
        Stopped {
            set: &self.0.set,
            notified: self.0.notify.notified(),
            registered: None,
        }
    }
}

pin_project_lite::pin_project! {
    /// The wait of [`Stop::wait`]: its first poll registers the task's waker with the signal;
    /// later polls from the same task only read the flag.
    pub struct Stopped<'a> {
        set: &'a AtomicBool,
        #[pin]
        notified: Notified<'a>,
        // The waker the registration holds.
        registered: Option<Waker>,
    }
}

impl Future for Stopped<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.project();
        if this.set.load(Ordering::Acquire) {
            return Poll::Ready(());
        }
        // `set` stores the flag before it wakes the registered waker: a poll after that wake
        // reads it set. A poll from another task than the registered one registers again.
        if this
            .registered
            .as_ref()
            .is_some_and(|w| w.will_wake(cx.waker()))
        {
            return Poll::Pending;
        }
        match this.notified.poll(cx) {
            Poll::Ready(()) => Poll::Ready(()),
            Poll::Pending => {
                *this.registered = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::task::Wake;

    /// A waker that counts its wakes.
    struct Counting(AtomicUsize);

    impl Wake for Counting {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn counting() -> (Arc<Counting>, Waker) {
        let counter = Arc::new(Counting(AtomicUsize::new(0)));
        (counter.clone(), Waker::from(counter))
    }

    #[test]
    fn a_wait_polled_many_times_is_woken_once_when_the_signal_is_set() {
        let stop = Stop::new();
        let (wakes, waker) = counting();
        let mut cx = Context::from_waker(&waker);
        let mut wait = Box::pin(stop.wait());
        for _ in 0..100 {
            assert!(wait.as_mut().poll(&mut cx).is_pending());
        }
        assert_eq!(wakes.0.load(Ordering::SeqCst), 0);
        stop.set();
        assert_eq!(
            wakes.0.load(Ordering::SeqCst),
            1,
            "the registered waker is woken"
        );
        assert!(wait.as_mut().poll(&mut cx).is_ready());
        assert!(stop.is_set());
    }

    #[test]
    fn a_wait_made_before_the_signal_and_polled_after_it_is_ready() {
        let stop = Stop::new();
        let (_, waker) = counting();
        let mut cx = Context::from_waker(&waker);
        let mut wait = Box::pin(stop.wait());
        stop.set();
        assert!(wait.as_mut().poll(&mut cx).is_ready());
        // And one made after it.
        assert!(Box::pin(stop.wait()).as_mut().poll(&mut cx).is_ready());
    }

    #[test]
    fn a_wait_moved_to_another_task_wakes_that_task() {
        let stop = Stop::new();
        let (first, first_waker) = counting();
        let (second, second_waker) = counting();
        let mut wait = Box::pin(stop.wait());
        assert!(
            wait.as_mut()
                .poll(&mut Context::from_waker(&first_waker))
                .is_pending()
        );
        assert!(
            wait.as_mut()
                .poll(&mut Context::from_waker(&second_waker))
                .is_pending()
        );
        stop.set();
        assert_eq!(first.0.load(Ordering::SeqCst), 0);
        assert_eq!(
            second.0.load(Ordering::SeqCst),
            1,
            "the last poller is woken"
        );
    }

    #[tokio::test]
    async fn many_connections_waiting_all_end_when_the_signal_is_set() {
        let stop = Stop::new();
        let tasks: Vec<_> = (0..50)
            .map(|_| {
                let stop = stop.clone();
                tokio::spawn(async move {
                    let wait = stop.wait();
                    tokio::pin!(wait);
                    // Polled again and again by the task's other wake-ups, as a connection's.
                    loop {
                        tokio::select! {
                            biased;
                            () = wait.as_mut() => return,
                            () = tokio::task::yield_now() => {}
                        }
                    }
                })
            })
            .collect();
        tokio::task::yield_now().await;
        stop.set();
        for task in tasks {
            tokio::time::timeout(std::time::Duration::from_secs(5), task)
                .await
                .expect("ended")
                .expect("joined");
        }
    }
}
