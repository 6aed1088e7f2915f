//! Idle limits for streams: bodies and upgraded connections are not bounded by the route's
//! budget once established, but are closed after a period with no traffic.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
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

/// What a quiet direction of a tunnel reads into: most WebSocket frames of an idle or chatty
/// connection (pings, small messages) fit, and an idle tunnel holds no more than this.
const QUIET_READ: usize = 512;
/// What a busy direction reads into, once a read filled the quiet buffer.
const BUSY_READ: usize = 16 * 1024;

/// The buffer for the next read of a direction whose last read was `n` bytes into `buf`: a
/// larger one when it filled the buffer (more is coming), the quiet one again when it used
/// less than half of a busy one (the traffic is light again), else `buf` emptied. The buffers
/// are not zeroed: reads fill the capacity.
fn next_buffer(mut buf: BytesMut, n: usize) -> BytesMut {
    let capacity = buf.capacity();
    if n >= capacity && capacity < BUSY_READ {
        BytesMut::with_capacity(BUSY_READ)
    } else if capacity > QUIET_READ && n < capacity / 2 {
        BytesMut::with_capacity(QUIET_READ)
    } else {
        buf.clear();
        buf
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
    let mut buf = BytesMut::with_capacity(QUIET_READ);
    loop {
        let since = Duration::from_millis(last.load(Ordering::Relaxed));
        let deadline = started + since + idle;
        let read = tokio::select! {
            r = from.read_buf(&mut buf) => r,
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
                buf = next_buffer(buf, n);
            }
        }
    }
    let _ = to.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_direction_grows_its_buffer_when_a_read_fills_it_and_shrinks_it_when_traffic_is_light() {
        let quiet = BytesMut::with_capacity(QUIET_READ);
        let busy = next_buffer(quiet, QUIET_READ);
        assert!(
            busy.capacity() >= BUSY_READ,
            "a full quiet read moves to the busy buffer"
        );
        let still_busy = next_buffer(busy, BUSY_READ / 2 + 1);
        assert!(still_busy.capacity() >= BUSY_READ && still_busy.is_empty());
        let light = next_buffer(still_busy, 100);
        assert!(
            light.capacity() < BUSY_READ,
            "a short read gives the busy buffer back"
        );
        let quiet_again = next_buffer(light, 10);
        assert!(quiet_again.capacity() < BUSY_READ && quiet_again.is_empty());
    }

    /// Bulk bytes one way and small messages the other come through whole and in order while
    /// the buffers change size.
    #[tokio::test]
    async fn a_tunnel_carries_bulk_and_small_traffic_whole_in_both_directions() {
        let (client, client_far) = tokio::io::duplex(4096);
        let (upstream, upstream_far) = tokio::io::duplex(4096);
        let pumping = tokio::spawn(pump(client_far, upstream_far, Duration::from_secs(5)));
        let bulk: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
        let (mut client_read, mut client_write) = tokio::io::split(client);
        let (mut upstream_read, mut upstream_write) = tokio::io::split(upstream);
        let sent = bulk.clone();
        let up = tokio::spawn(async move {
            for chunk in sent.chunks(7_777) {
                client_write.write_all(chunk).await.expect("write");
            }
            client_write
        });
        let mut got = vec![0u8; bulk.len()];
        upstream_read.read_exact(&mut got).await.expect("bulk");
        assert!(got == bulk, "bulk bytes changed on the way");
        let mut client_write = up.await.expect("writer");
        for i in 0..200u32 {
            let message = format!("message {i};");
            upstream_write
                .write_all(message.as_bytes())
                .await
                .expect("write");
            let mut back = vec![0u8; message.len()];
            client_read.read_exact(&mut back).await.expect("small");
            assert_eq!(back, message.as_bytes());
            client_write.write_all(b"ok").await.expect("write");
            let mut ok = [0u8; 2];
            upstream_read.read_exact(&mut ok).await.expect("ok");
            assert_eq!(&ok, b"ok");
        }
        drop((client_write, client_read));
        tokio::time::timeout(Duration::from_secs(5), pumping)
            .await
            .expect("the tunnel ends with its client")
            .expect("pump");
    }
}
