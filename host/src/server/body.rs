//! A request's body, read from the client's connection as the request's handler asks for it.
//!
//! The connection's driver owns the socket; the body the handler holds is the other end of a
//! one-slot [`Pipe`]. The driver reads and decodes only when the handler has asked for more
//! (at most one piece ahead), so a handler that never reads a body never makes the client
//! send it: an `Expect: 100-continue` is answered `100` on the first ask, not before. A body
//! whose bytes all came with the head is handed over whole, with no pipe.

use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use http_body::{Frame, SizeHint};

/// Why a request's body could not be read to its end.
#[derive(Debug, Clone, thiserror::Error)]
#[error("the request body: {0}")]
pub struct BodyError(pub &'static str);

/// The slot between the driver (the writer) and the handler's body (the reader).
#[derive(Debug, Default)]
pub(super) struct Pipe(Mutex<Slot>);

#[derive(Debug, Default)]
struct Slot {
    /// A piece read and not yet taken.
    data: Option<Bytes>,
    /// The body's end: clean, or why it failed.
    end: Option<Result<(), BodyError>>,
    /// The reader waits for a piece.
    wanted: bool,
    /// The reader was dropped.
    dropped: bool,
    reader: Option<Waker>,
    writer: Option<Waker>,
}

impl Pipe {
    fn slot(&self) -> MutexGuard<'_, Slot> {
        // The slot is left consistent at every step: a panic elsewhere does not poison it.
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether the reader asks for a piece (and has none waiting); `Err` once it is dropped.
    /// Registers `cx` to be woken when that changes.
    pub fn poll_wanted(&self, cx: &mut Context<'_>) -> Poll<Result<(), ()>> {
        let mut slot = self.slot();
        if slot.dropped {
            return Poll::Ready(Err(()));
        }
        if slot.wanted && slot.data.is_none() {
            return Poll::Ready(Ok(()));
        }
        register(&mut slot.writer, cx);
        Poll::Pending
    }

    /// Hands a piece to the reader.
    pub fn put(&self, data: Bytes) {
        let mut slot = self.slot();
        slot.data = Some(data);
        slot.wanted = false;
        if let Some(w) = slot.reader.take() {
            w.wake();
        }
    }

    /// Ends the body, cleanly or with why it failed (the first end stays).
    pub fn end(&self, end: Result<(), BodyError>) {
        let mut slot = self.slot();
        slot.end.get_or_insert(end);
        if let Some(w) = slot.reader.take() {
            w.wake();
        }
    }
}

fn register(slot: &mut Option<Waker>, cx: &Context<'_>) {
    match slot {
        Some(w) if w.will_wake(cx.waker()) => {}
        _ => *slot = Some(cx.waker().clone()),
    }
}

/// A request's body as its handler sees it.
#[derive(Debug)]
pub(super) enum RequestBody {
    /// All of it came with the head.
    Whole(Option<Bytes>),
    /// Read from the connection as asked for; the bytes left when the length is known.
    Piped {
        pipe: Arc<Pipe>,
        left: Option<u64>,
        ended: bool,
    },
}

impl RequestBody {
    /// A body read through a new pipe: the body and the driver's end.
    pub fn piped(left: Option<u64>) -> (Self, Arc<Pipe>) {
        let pipe = Arc::new(Pipe::default());
        (
            Self::Piped {
                pipe: pipe.clone(),
                left,
                ended: false,
            },
            pipe,
        )
    }
}

impl http_body::Body for RequestBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        match self.get_mut() {
            Self::Whole(data) => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            Self::Piped { pipe, left, ended } => {
                if *ended {
                    return Poll::Ready(None);
                }
                let mut slot = pipe.slot();
                if let Some(data) = slot.data.take() {
                    if let Some(n) = left {
                        *n = n.saturating_sub(data.len() as u64);
                    }
                    // The writer goes on as soon as it is asked again: no wake-up for it yet.
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                if let Some(end) = slot.end.take() {
                    *ended = true;
                    return Poll::Ready(end.err().map(Err));
                }
                slot.wanted = true;
                register(&mut slot.reader, cx);
                if let Some(w) = slot.writer.take() {
                    w.wake();
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::Whole(data) => data.is_none(),
            Self::Piped { ended, left, .. } => *ended || *left == Some(0),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Self::Whole(data) => SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64)),
            Self::Piped { left: Some(n), .. } => SizeHint::with_exact(*n),
            Self::Piped { .. } => SizeHint::default(),
        }
    }
}

impl Drop for RequestBody {
    fn drop(&mut self) {
        if let Self::Piped { pipe, .. } = self {
            let mut slot = pipe.slot();
            slot.dropped = true;
            if let Some(w) = slot.writer.take() {
                w.wake();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body::Body as _;
    use http_body_util::BodyExt as _;

    #[tokio::test]
    async fn pieces_are_read_only_when_asked_for_and_the_end_is_seen() {
        let (mut body, pipe) = RequestBody::piped(Some(6));
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        assert!(pipe.poll_wanted(&mut cx).is_pending(), "nothing asked yet");
        assert_eq!(body.size_hint().exact(), Some(6));
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            while let Some(frame) = body.frame().await {
                got.extend_from_slice(&frame.expect("frame").into_data().expect("data"));
            }
            got
        });
        for piece in ["abc", "def"] {
            std::future::poll_fn(|cx| pipe.poll_wanted(cx))
                .await
                .expect("asked");
            pipe.put(Bytes::from(piece));
        }
        std::future::poll_fn(|cx| pipe.poll_wanted(cx))
            .await
            .expect("asked");
        pipe.end(Ok(()));
        assert_eq!(reader.await.expect("reader"), b"abcdef");
    }

    #[tokio::test]
    async fn a_failed_body_errs_once_and_a_dropped_reader_is_seen() {
        let (mut body, pipe) = RequestBody::piped(None);
        pipe.end(Err(BodyError("cut")));
        let err = body.frame().await.expect("a frame").expect_err("failed");
        assert_eq!(err.0, "cut");
        assert!(body.frame().await.is_none());
        assert!(body.is_end_stream());
        drop(body);
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        assert_eq!(pipe.poll_wanted(&mut cx), Poll::Ready(Err(())));
        let mut whole = RequestBody::Whole(Some(Bytes::from_static(b"all")));
        assert_eq!(whole.size_hint().exact(), Some(3));
        let data = whole
            .frame()
            .await
            .expect("frame")
            .expect("ok")
            .into_data()
            .expect("data");
        assert_eq!(&data[..], b"all");
        assert!(whole.is_end_stream());
    }
}
