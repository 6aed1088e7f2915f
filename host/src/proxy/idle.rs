//! Idle limits for streams: bodies and upgraded connections are not bounded by the route's
//! budget once established, but are closed after a period with no traffic.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::{Instant, Sleep};

/// The error of a stream closed for inactivity.
#[derive(Debug, thiserror::Error)]
#[error("stream idle for {0:?}; closed")]
pub struct IdleTimeout(pub Duration);

/// A body that fails once no frame arrived for `idle`. The timer is armed only when the body
/// first has to wait: a body that is ready at once (most small answers) never makes one.
#[derive(Debug)]
pub struct IdleBody<B> {
    inner: B,
    idle: Duration,
    timer: Option<Pin<Box<Sleep>>>,
    /// Whether the timer's deadline counts from the current wait.
    armed: bool,
    /// The exchange's place in its listener's stream budget, given back with the body.
    _place: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl<B> IdleBody<B> {
    /// Wraps `inner`.
    pub fn new(inner: B, idle: Duration) -> Self {
        Self {
            inner,
            idle,
            timer: None,
            armed: false,
            _place: None,
        }
    }

    /// The body holding `place` (a stream budget's) until it is dropped.
    pub fn holding(mut self, place: Option<tokio::sync::OwnedSemaphorePermit>) -> Self {
        self._place = place;
        self
    }
}

impl<B> Body for IdleBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                // Traffic: the idle time starts again when the body next has to wait.
                this.armed = false;
                Poll::Ready(frame.map(|f| f.map_err(Into::into)))
            }
            Poll::Pending => {
                let idle = this.idle;
                let timer = this
                    .timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(idle)));
                if !this.armed {
                    timer.as_mut().reset(Instant::now() + idle);
                    this.armed = true;
                }
                match timer.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(IdleTimeout(idle))))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

use std::future::Future as _;

/// Copies bytes both ways between `a` and `b` until either side closes, or until neither side
/// sent anything for `idle`. Frames are not parsed: WebSocket text, binary, ping/pong and close
/// frames pass unchanged.
pub async fn pump<A, B>(a: A, b: B, idle: Duration)
where
    A: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    B: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let started = Instant::now();
    let last = Arc::new(AtomicU64::new(0));
    let (a_read, a_write) = tokio::io::split(a);
    let (b_read, b_write) = tokio::io::split(b);
    let forward = one_way(a_read, b_write, last.clone(), started, idle);
    let backward = one_way(b_read, a_write, last, started, idle);
    // When one direction ends, the other is ended too.
    tokio::select! {
        _ = forward => {}
        _ = backward => {}
    }
}

async fn one_way<R, W>(
    mut from: R,
    mut to: W,
    last: Arc<AtomicU64>,
    started: Instant,
    idle: Duration,
) where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let since = Duration::from_millis(last.load(Ordering::Relaxed));
        let deadline = started + since + idle;
        let read = tokio::select! {
            r = from.read(&mut buf) => r,
            _ = tokio::time::sleep_until(deadline) => {
                // Traffic the other way counts: look again before closing.
                if Duration::from_millis(last.load(Ordering::Relaxed)) > since {
                    continue;
                }
                break;
            }
        };
        match read {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                last.store(started.elapsed().as_millis() as u64, Ordering::Relaxed);
                if to.write_all(&buf[..n]).await.is_err() || to.flush().await.is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown().await;
}
