//! The send timeout of HTTP/2 answers: a stream whose client takes none of its answer for
//! `server.send_timeout_ms` loses its backend exchange.
//!
//! hyper's HTTP/2 server asks an answer's body for its next frame only when the stream's
//! flow-control window has room: a client that stops reading one stream (it never sends a
//! `WINDOW_UPDATE` for it) leaves the body unasked, and with it the backend connection the body
//! streams from and the stream's place in `server.max_streams`. The keep-alive PINGs do not see
//! this (the client's HTTP/2 stack answers them), nor does `server.http2_idle_timeout_ms` (the
//! stream is open).
//!
//! Each answer's body is wrapped in a [`Sent`] that notes when it handed hyper a data frame and
//! was not asked for the next one since: the client has not made room for it. A watch of the
//! connection ([`SendWatch::run`], part of the connection's task, a timer only while streams are
//! open) looks at the streams every quarter of the timeout; one that has waited longer has its
//! body dropped — the backend exchange ends, its place is released — and is counted in
//! `aura_http2_streams_reset_total{reason="send_timeout"}`. When the client asks again, the
//! stream ends with an error (hyper resets it). Only that stream: the connection and its other
//! streams go on, as a browser pausing one download expects. Each frame is timed on its own, so
//! a client reading slowly but steadily is never cut.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use http_body::{Frame, SizeHint};

/// The streams of one connection whose answers are being sent (`G`: what each holds while it
/// is, such as its place among the connection's open streams).
#[derive(Debug)]
pub(super) struct SendWatch<G> {
    /// Times are kept as milliseconds since this instant, plus one (0: not waiting).
    origin: Instant,
    timeout: Duration,
    streams: Mutex<Vec<Weak<Answer<G>>>>,
    reset: prometheus::IntCounter,
}

/// One stream's answer, shared by its body (which hyper holds) and the connection's watch.
#[derive(Debug)]
struct Answer<G> {
    /// When the body handed a data frame over and was not asked again since (see
    /// [`SendWatch::origin`]), or 0.
    waiting_since: AtomicU64,
    /// The backend's body and what the stream holds; `None` once dropped by the watch.
    body: Mutex<Option<(Body, G)>>,
}

impl<G> Answer<G> {
    fn body(&self) -> MutexGuard<'_, Option<(Body, G)>> {
        // The body is only polled or dropped under the lock: a panic cannot leave it half-done.
        self.body.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// An answer's body as hyper sees it: the backend's body, timed between frames.
#[derive(Debug)]
pub(super) struct Sent<G> {
    answer: Arc<Answer<G>>,
    watch: Arc<SendWatch<G>>,
}

/// Why an answer ended early: the watch dropped its body.
#[derive(Debug, thiserror::Error)]
#[error("the client read nothing of this answer within server.send_timeout_ms")]
struct SendTimeout;

impl<G> SendWatch<G> {
    pub(super) fn new(timeout: Duration, reset: prometheus::IntCounter) -> Arc<Self> {
        Arc::new(Self {
            origin: Instant::now(),
            timeout,
            streams: Mutex::new(Vec::new()),
            reset,
        })
    }

    fn now(&self) -> u64 {
        self.origin.elapsed().as_millis() as u64 + 1
    }

    fn streams(&self) -> MutexGuard<'_, Vec<Weak<Answer<G>>>> {
        self.streams.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `body`, watched; `held` (the stream's place) goes with it, and is dropped with it.
    pub(super) fn watch(self: &Arc<Self>, body: Body, held: G) -> Sent<G> {
        let answer = Arc::new(Answer {
            waiting_since: AtomicU64::new(0),
            body: Mutex::new(Some((body, held))),
        });
        let mut streams = self.streams();
        streams.retain(|s| s.strong_count() > 0);
        streams.push(Arc::downgrade(&answer));
        Sent {
            answer,
            watch: self.clone(),
        }
    }

    /// Drops the body of every answer that has waited for its client longer than the timeout;
    /// how many.
    fn sweep(&self) -> usize {
        self.sweep_at(self.now())
    }

    /// [`Self::sweep`] at `now` (milliseconds, as [`Self::now`]).
    fn sweep_at(&self, now: u64) -> usize {
        let limit = self.timeout.as_millis() as u64;
        let waited = |answer: &Answer<G>| {
            let since = answer.waiting_since.load(Ordering::Relaxed);
            since != 0 && now.saturating_sub(since) >= limit
        };
        let mut stalled = Vec::new();
        self.streams().retain(|s| match s.upgrade() {
            None => false,
            Some(answer) => {
                if waited(&answer) {
                    stalled.push(answer);
                    false
                } else {
                    true
                }
            }
        });
        let mut reset = 0;
        for answer in stalled {
            // Looked at again under the body's lock: hyper may have asked for the next frame
            // since (it notes that before taking the lock). Dropped outside the list's lock.
            let mut body = answer.body();
            if !waited(&answer) {
                drop(body);
                self.streams().push(Arc::downgrade(&answer));
                continue;
            }
            let dropped = body.take();
            drop(body);
            if dropped.is_some() {
                reset += 1;
                self.reset.inc();
            }
        }
        reset
    }

    /// Watches the connection's answers for as long as it lives (never returns): a sweep every
    /// quarter of the timeout while any answer is being sent, no timer otherwise.
    pub(super) async fn run(&self, mut open: tokio::sync::watch::Receiver<(usize, u64)>) {
        let every = (self.timeout / 4).max(Duration::from_millis(1));
        loop {
            if open.wait_for(|(open, _)| *open > 0).await.is_err() {
                return std::future::pending().await;
            }
            tokio::time::sleep(every).await;
            let reset = self.sweep();
            if reset > 0 {
                tracing::debug!(
                    streams = reset,
                    "HTTP/2 answers not read within server.send_timeout_ms: backend exchanges dropped"
                );
            }
        }
    }
}

impl<G: Send + Unpin + 'static> http_body::Body for Sent<G> {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        // Asked: the client has made room for what came before.
        this.answer.waiting_since.store(0, Ordering::Relaxed);
        let mut body = this.answer.body();
        let Some((inner, _)) = body.as_mut() else {
            return Poll::Ready(Some(Err(axum::Error::new(SendTimeout))));
        };
        let polled = Pin::new(inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled
            && frame.data_ref().is_some_and(|d| !d.is_empty())
        {
            this.answer
                .waiting_since
                .store(this.watch.now(), Ordering::Relaxed);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        // A dropped body still has its error to give.
        self.answer
            .body()
            .as_ref()
            .is_some_and(|(b, _)| b.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        self.answer
            .body()
            .as_ref()
            .map_or_else(SizeHint::default, |(b, _)| b.size_hint())
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt as _;

    use super::*;

    fn counter() -> prometheus::IntCounter {
        prometheus::IntCounter::new("reset", "reset").expect("counter")
    }

    fn since<G>(body: &Sent<G>) -> u64 {
        body.answer.waiting_since.load(Ordering::Relaxed)
    }

    #[tokio::test]
    async fn an_answer_not_asked_for_within_the_timeout_loses_its_body_and_no_other() {
        let watch = SendWatch::new(Duration::from_millis(50), counter());
        let chunks = || {
            let chunks = (0..3).map(|_| Ok::<_, std::io::Error>(bytes::Bytes::from_static(b"x")));
            Body::from_stream(futures::stream::iter(chunks))
        };
        // What each stream holds (its place among the open streams): dropped with its body.
        let held = [(); 3].map(|()| Arc::new(()));
        let mut stalled = watch.watch(chunks(), held[0].clone());
        let mut steady = watch.watch(chunks(), held[1].clone());
        let mut done = watch.watch(chunks(), held[2].clone());
        // A data frame handed over: each waits for its client to ask for the next.
        for body in [&mut stalled, &mut steady, &mut done] {
            assert_eq!(since(body), 0);
            let frame = body.frame().await.expect("a frame").expect("data");
            assert_eq!(frame.into_data().ok().as_deref(), Some(&b"x"[..]));
            assert_ne!(since(body), 0);
        }
        // Read to its end, nothing of `done` waits.
        while let Some(frame) = done.frame().await {
            frame.expect("data");
        }
        assert_eq!(since(&done), 0);
        // Times injected: `stalled` waits since 1000, `steady` was asked again at 1040.
        stalled.answer.waiting_since.store(1000, Ordering::Relaxed);
        steady.answer.waiting_since.store(1040, Ordering::Relaxed);
        assert_eq!(watch.sweep_at(1049), 0, "nothing has waited 50 ms yet");
        assert_eq!(watch.sweep_at(1050), 1, "the stream not asked for 50 ms");
        assert_eq!(watch.reset.get(), 1);
        assert_eq!(
            Arc::strong_count(&held[0]),
            1,
            "the stalled stream's place is free"
        );
        assert_eq!(
            Arc::strong_count(&held[1]),
            2,
            "the steady stream keeps its place"
        );
        let err = stalled
            .frame()
            .await
            .expect("an end")
            .expect_err("an error");
        assert!(err.to_string().contains("send_timeout_ms"), "{err}");
        steady
            .frame()
            .await
            .expect("a frame")
            .expect("the steady stream goes on");
        // Within the timeout of its last frame the steady stream stays; the dropped one is
        // not counted again.
        assert_eq!(watch.sweep_at(since(&steady) + 49), 0);
        assert_eq!(watch.reset.get(), 1, "counted once");
        drop((stalled, steady, done));
        assert_eq!(watch.sweep(), 0);
        assert!(watch.streams().is_empty(), "ended answers are forgotten");
    }

    /// An answer waiting on its backend (an SSE stream between events, a slow function) is not
    /// waiting for its client: however long, it is never cut.
    #[tokio::test]
    async fn an_answer_waiting_on_its_backend_is_never_cut() {
        let watch = SendWatch::new(Duration::from_millis(50), counter());
        let first =
            futures::stream::iter([Ok::<_, std::io::Error>(bytes::Bytes::from_static(b"x"))]);
        let body = Body::from_stream(futures::StreamExt::chain(first, futures::stream::pending()));
        let mut answer = watch.watch(body, ());
        answer.frame().await.expect("a frame").expect("data");
        assert_ne!(since(&answer), 0, "handed over, waiting for the client");
        // The client asks again; the backend has nothing yet.
        let next = tokio::time::timeout(Duration::from_millis(20), answer.frame()).await;
        assert!(next.is_err(), "the backend has nothing more");
        assert_eq!(since(&answer), 0);
        assert_eq!(
            watch.sweep_at(u64::MAX / 2),
            0,
            "not cut, however long it waits"
        );
        assert_eq!(watch.reset.get(), 0);
    }
}
