//! HTTP/1.1 connections on the gateway's own codec: the request heads parsed by `httparse`
//! (`crate::http1::server`), the bodies framed by [`crate::http1::body`], and the connection driven in the
//! connection's task — no hyper dispatcher, no channel for a request without a body, one
//! write for an answer's head and its first bytes when they are at hand.
//!
//! What a connection holds while it waits for its next request is its socket, an empty write
//! buffer and a read buffer: after `server.idle_release_ms` without a request the read buffer
//! is given back too and a plain-text connection waits on its socket's readiness alone
//! (counted in `aura_connections_parked`). A parked connection is still closed
//! `server.header_read_timeout_ms` after its last answer.
//!
//! The header timeout is one timer per connection, moved only when it fires: a connection
//! whose next head is not complete `server.header_read_timeout_ms` after its last answer (or
//! after its first bytes, for a connection's first head and one woken from parked) is closed,
//! counted in `aura_connections_closed_total{reason="silent"}`. A head that is not HTTP/1.x,
//! is over twice `server.max_header_bytes` or frames its body ambiguously is answered with the
//! contract's JSON error and its connection closed (`reason="malformed"`).
//!
//! While a request is served, the connection reads on only to feed the request's body when the
//! handler asks for it, or — once the body is read — to see the client go away, which drops
//! the request (its upstream call, its breaker probe) at once. Bytes of a pipelined next
//! request are kept, up to the head limit. A request whose body was not read to its end is
//! answered with `Connection: close`. Each write of an answer may wait at most
//! `server.send_timeout_ms` for the client to read: a client that stops reading is closed
//! (`reason="send_timeout"`), and the backend exchange its answer streams from is dropped with
//! it. After a `101` to a request that asked for an upgrade,
//! the socket and the bytes read past the handshake go to the tunnel through the request's
//! [`ClientUpgrade`].

use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use axum::body::Body;
use axum::response::IntoResponse as _;
use bytes::{Bytes, BytesMut};
use http::{HeaderMap, Method, StatusCode, Version};
use http_body::Body as _;
use http_body_util::BodyExt as _;
use tokio::io::AsyncWriteExt as _;
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::time::{Instant, Sleep};

use super::body::{BodyError, Pipe, RequestBody};
use super::stop::{Stop, Stopped};
use super::{Closed, Listener, Prefixed, Requests};
use crate::http1::body::{Decoded, Decoder, Encoder, Framing, READ_CHUNK, has_token, poll_fill};
use crate::http1::server::{self as head, Framed, Refusal, RequestHead, Sending};
use crate::phases::stamps::{Stamped, Stamps};
use crate::proxy::tunnels::{ClientIo, ClientUpgrade};

/// A write buffer larger than this is not kept between requests.
const KEEP_WRITE_BUFFER: usize = 16 * 1024;
/// How long, at most, a connection closed with bytes still coming is read and dropped.
const LINGER: std::time::Duration = std::time::Duration::from_secs(2);
/// How many bytes, at most, a lingering close reads and drops.
const LINGER_BYTES: usize = 1 << 20;
/// The interim answer to `Expect: 100-continue`.
const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// A connection's byte stream, and the socket to wait on while it is parked.
pub(super) trait Socket:
    tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static
{
    /// The socket whose readiness means the client sent something; `None` when bytes may be
    /// waiting above it (a TLS session's buffered records), which rules parking out.
    fn parkable(&self) -> Option<&TcpStream>;
}

impl Socket for TcpStream {
    fn parkable(&self) -> Option<&TcpStream> {
        Some(self)
    }
}

impl Socket for tokio_rustls::server::TlsStream<TcpStream> {
    fn parkable(&self) -> Option<&TcpStream> {
        None
    }
}

/// One client connection: its stream, what was read and not used, what is to be written.
struct Conn<S> {
    io: S,
    buf: BytesMut,
    out: Vec<u8>,
    /// `server.send_timeout_ms`: the longest one write to the client may wait.
    send_timeout: std::time::Duration,
    /// A write waited `send_timeout`: the client reads nothing, the connection is dropped.
    stalled: bool,
}

/// Waits for `io`, one write or flush of the client's socket, at most `limit` once it has to
/// wait at all: most complete at once, and read no clock. Past `limit`, `stalled` is set and
/// the write fails (`TimedOut`). Each write is timed on its own, so a client that reads
/// slowly but steadily is not cut; one that stops reading is.
async fn within<T>(
    limit: std::time::Duration,
    stalled: &mut bool,
    io: impl std::future::Future<Output = io::Result<T>>,
) -> io::Result<T> {
    let mut io = std::pin::pin!(io);
    if let Poll::Ready(done) = poll_fn(|cx| Poll::Ready(io.as_mut().poll(cx))).await {
        return done;
    }
    match tokio::time::timeout(limit, io).await {
        Ok(done) => done,
        Err(_) => {
            *stalled = true;
            Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client read nothing within server.send_timeout_ms",
            ))
        }
    }
}

impl<S: Socket> Conn<S> {
    /// Reads into the buffer, with room for at least `room` bytes.
    fn poll_fill(&mut self, cx: &mut Context<'_>, room: usize) -> Poll<io::Result<usize>> {
        poll_fill(&mut self.io, &mut self.buf, cx, room)
    }

    /// Writes what the write buffer holds.
    async fn write_out(&mut self) -> io::Result<()> {
        let mut at = 0;
        while at < self.out.len() {
            let write = self.io.write(&self.out[at..]);
            match within(self.send_timeout, &mut self.stalled, write).await? {
                0 => return Err(io::ErrorKind::WriteZero.into()),
                n => at += n,
            }
        }
        self.out.clear();
        Ok(())
    }

    /// Writes `data`, without copying it into the write buffer.
    async fn write_bytes(&mut self, data: &mut Bytes) -> io::Result<()> {
        while !data.is_empty() {
            let write = self.io.write(data);
            match within(self.send_timeout, &mut self.stalled, write).await? {
                0 => return Err(io::ErrorKind::WriteZero.into()),
                n => bytes::Buf::advance(data, n),
            }
        }
        Ok(())
    }

    /// Flushes the stream (a TLS session's records).
    async fn flush(&mut self) -> io::Result<()> {
        within(self.send_timeout, &mut self.stalled, self.io.flush()).await
    }
}

/// How waiting for a head ended without one.
enum NoHead {
    /// A head refused: answered, then closed.
    Refused(Refusal),
    /// Shutdown: closed.
    Stop,
    /// The client closed, the socket failed, or the header timeout passed: dropped.
    Gone,
}

/// What follows an exchange.
enum Next {
    /// The next request.
    Again,
    /// Close the connection after the answer.
    Close,
    /// Close it, reading and dropping what the client still sends for a while: an unread
    /// body or the rest of a refused head (closing a socket with bytes unread resets the
    /// connection, and the client could lose the answer).
    Linger,
    /// The connection failed or the client went away: drop it.
    Gone,
    /// Hand the socket to the tunnel.
    Upgrade(oneshot::Sender<Box<dyn ClientIo>>),
}

/// Serves `io` as HTTP/1.1 until the client closes, stays idle past the header timeout, or
/// shutdown asks the connection to finish.
///
/// An `async` block rather than an `async fn`: the connection's task holds what it captured
/// once, not once more as the function's locals.
pub(super) fn serve<S: Socket>(
    settings: &Listener,
    io: Prefixed<S>,
    requests: Requests,
    stop: Stop,
) -> impl std::future::Future<Output = ()> + Send + '_ {
    let mut conn = Conn {
        buf: BytesMut::from(&io.prefix[..]),
        io: io.inner,
        out: Vec::new(),
        send_timeout: settings.send_timeout,
        stalled: false,
    };
    async move {
        // Registered once for the connection's life, not once per request.
        let stopping = stop.wait();
        tokio::pin!(stopping);
        let mut idle_since = Instant::now();
        let check = tokio::time::sleep_until(first_check(settings, idle_since));
        tokio::pin!(check);
        loop {
            let clock = (&mut idle_since, check.as_mut());
            // The head moves into the boxed exchange before anything else is awaited: the
            // connection's task keeps no room for it.
            let pending = match next_head(settings, &mut conn, clock, stopping.as_mut()).await {
                Ok(head) => exchange(settings, &mut conn, head, &requests, &stop),
                Err(NoHead::Refused(refusal)) => refuse(settings, &mut conn, refusal),
                Err(NoHead::Stop) => Box::pin(std::future::ready(Next::Close)),
                Err(NoHead::Gone) => Box::pin(std::future::ready(Next::Gone)),
            };
            match pending.await {
                Next::Again => {
                    idle_since = Instant::now();
                    // The check may have been set from an older start: never later than needed.
                    let due = first_check(settings, idle_since);
                    if check.deadline() > due {
                        check.as_mut().reset(due);
                    }
                    if conn.out.capacity() > KEEP_WRITE_BUFFER {
                        conn.out = Vec::new();
                    }
                }
                // Boxed, as the other rare steps: the connection's task is not as large as them.
                Next::Close => return Box::pin(close(settings, conn, false)).await,
                Next::Linger => return Box::pin(close(settings, conn, true)).await,
                Next::Gone => {
                    if conn.stalled {
                        settings.count(Closed::SendTimeout);
                        tracing::debug!(
                            plane = settings.plane.as_str(),
                            "the client read nothing of its answer within the send timeout; closed"
                        );
                    }
                    return;
                }
                Next::Upgrade(tunnel) => {
                    let rest = conn.buf.freeze();
                    let socket = Prefixed::new(conn.io, Bytes::new()).with_prefix(rest);
                    let _ = tunnel.send(Box::new(socket));
                    return;
                }
            }
        }
    }
}

/// Closes the connection after its last answer; `lingering`, reads and drops what the client
/// still sends for a while.
async fn close<S: Socket>(settings: &Listener, mut conn: Conn<S>, lingering: bool) {
    let _ = tokio::time::timeout(settings.header_timeout, conn.io.shutdown()).await;
    if lingering {
        let _ = tokio::time::timeout(LINGER, linger(&mut conn)).await;
    }
}

/// Reads and drops what the client sends until it closes or [`LINGER_BYTES`] were read.
async fn linger<S: Socket>(conn: &mut Conn<S>) {
    let mut read = 0;
    while read < LINGER_BYTES {
        conn.buf.clear();
        match poll_fn(|cx| conn.poll_fill(cx, READ_CHUNK)).await {
            Ok(0) | Err(_) => return,
            Ok(n) => read += n,
        }
    }
}

/// When an idle connection is first looked at again: its header deadline or its release time.
fn first_check(settings: &Listener, idle_since: Instant) -> Instant {
    let after = settings
        .idle_release
        .map_or(settings.header_timeout, |r| r.min(settings.header_timeout));
    idle_since + after
}

/// Reads until a whole request head is buffered, parking the connection when it has been idle
/// for the release time, and closing it at the header deadline.
async fn next_head<S: Socket>(
    settings: &Listener,
    conn: &mut Conn<S>,
    (idle_since, mut check): (&mut Instant, Pin<&mut Sleep>),
    mut stopping: Pin<&mut Stopped<'_>>,
) -> Result<RequestHead, NoHead> {
    // How much of the buffer was searched for the head's end: a head is parsed when it first
    // arrives, then — when it was not whole — only once new bytes may end it, so that a head
    // that trickles in is searched once, not parsed again on every read.
    let mut scanned = 0;
    loop {
        let whole = if scanned == 0 {
            !conn.buf.is_empty()
        } else {
            head::may_end(&conn.buf, &mut scanned) || conn.buf.len() >= settings.max_head
        };
        if whole {
            match head::parse(&mut conn.buf, settings.max_head).map_err(NoHead::Refused)? {
                Some(head) => return Ok(head),
                None => scanned = conn.buf.len(),
            }
        }
        enum Event {
            Read(io::Result<usize>),
            Check,
            Stop,
        }
        let event = tokio::select! {
            biased;
            read = poll_fn(|cx| conn.poll_fill(cx, READ_CHUNK)) => Event::Read(read),
            () = check.as_mut() => Event::Check,
            () = stopping.as_mut() => Event::Stop,
        };
        match event {
            Event::Read(Ok(0) | Err(_)) => return Err(NoHead::Gone),
            Event::Read(Ok(_)) => {}
            Event::Stop => return Err(NoHead::Stop),
            Event::Check => {
                let now = Instant::now();
                let head_due = *idle_since + settings.header_timeout;
                if now >= head_due {
                    // No head complete within the header timeout: silent, idle or slow.
                    settings.count(Closed::Silent);
                    tracing::debug!("no request head within the header timeout; closed");
                    return Err(NoHead::Gone);
                }
                let mut next = head_due;
                // Parked only with nothing of a next head read: a head carried over keeps its
                // deadline and is served, not parked.
                let release = settings.idle_release.filter(|_| conn.buf.is_empty());
                if let Some(after) = release
                    && conn.io.parkable().is_some()
                {
                    let release_at = *idle_since + after;
                    if now >= release_at {
                        check.as_mut().reset(head_due);
                        if !Box::pin(park(settings, conn, check.as_mut(), stopping.as_mut())).await
                        {
                            return Err(NoHead::Gone);
                        }
                        // The next head's time starts with its first bytes, as on a new
                        // connection.
                        scanned = 0;
                        *idle_since = Instant::now();
                        check.as_mut().reset(first_check(settings, *idle_since));
                        continue;
                    }
                    next = next.min(release_at);
                }
                check.as_mut().reset(next);
            }
        }
    }
}

/// Waits for the client's next bytes with the socket alone; `false` when the connection is to
/// be dropped instead (the header deadline in `check`, shutdown, a failed socket).
async fn park<S: Socket>(
    settings: &Listener,
    conn: &mut Conn<S>,
    check: Pin<&mut Sleep>,
    stopping: Pin<&mut impl std::future::Future<Output = ()>>,
) -> bool {
    conn.buf = BytesMut::new();
    conn.out = Vec::new();
    let Some(socket) = conn.io.parkable() else {
        return true;
    };
    settings.parked.inc();
    let woke = tokio::select! {
        ready = socket.readable() => ready.is_ok(),
        () = check => {
            settings.count(Closed::Silent);
            false
        }
        () = stopping => false,
    };
    settings.parked.dec();
    woke
}

/// What the connection reads while a request is served.
enum Reading {
    /// The request's body, as its handler asks for it.
    Body(Pump),
    /// Nothing but the client's going away (or a pipelined next request, kept).
    Watch,
    /// Nothing.
    Idle,
}

/// What reading while a request is served came to.
enum Read {
    /// The body was read to its end.
    BodyDone,
    /// The body's reader was dropped, or the body was refused: not read to its end.
    BodyStopped,
    /// The head limit's worth of a next request is buffered.
    Full,
    /// The client closed or the socket failed.
    Gone,
}

/// Feeds a request's body from the connection, as the body's reader asks.
struct Pump {
    pipe: Arc<Pipe>,
    decoder: Decoder,
    /// Bytes of the `100 Continue` still to write, then whether to flush it.
    to_continue: usize,
    flush_continue: bool,
}

impl Pump {
    fn poll<S: Socket>(&mut self, cx: &mut Context<'_>, conn: &mut Conn<S>) -> Poll<Read> {
        loop {
            match self.pipe.poll_wanted(cx) {
                Poll::Pending => return Poll::Pending,
                // Dropped: read to its end if the last piece was its last byte.
                Poll::Ready(Err(())) if self.decoder.is_done() => {
                    return Poll::Ready(Read::BodyDone);
                }
                Poll::Ready(Err(())) => return Poll::Ready(Read::BodyStopped),
                Poll::Ready(Ok(())) => {}
            }
            // The client waits for a `100` before it sends: sent when the body is first asked.
            while self.to_continue > 0 {
                let from = CONTINUE.len() - self.to_continue;
                match ready!(Pin::new(&mut conn.io).poll_write(cx, &CONTINUE[from..])) {
                    Ok(0) | Err(_) => return Poll::Ready(self.cut("the client connection failed")),
                    Ok(n) => self.to_continue -= n,
                }
                self.flush_continue = true;
            }
            if self.flush_continue {
                if ready!(Pin::new(&mut conn.io).poll_flush(cx)).is_err() {
                    return Poll::Ready(self.cut("the client connection failed"));
                }
                self.flush_continue = false;
            }
            match self.decoder.decode(&mut conn.buf) {
                Decoded::Data(data) => self.pipe.put(data),
                Decoded::End => {
                    self.pipe.end(Ok(()));
                    return Poll::Ready(Read::BodyDone);
                }
                Decoded::Refused(why) => {
                    self.pipe.end(Err(BodyError(why)));
                    return Poll::Ready(Read::BodyStopped);
                }
                Decoded::More(room) => match ready!(conn.poll_fill(cx, room)) {
                    Ok(0) | Err(_) => {
                        return Poll::Ready(
                            self.cut("the client closed the connection before the body's end"),
                        );
                    }
                    Ok(_) => {}
                },
            }
        }
    }

    fn cut(&self, why: &'static str) -> Read {
        self.pipe.end(Err(BodyError(why)));
        Read::Gone
    }
}

impl Reading {
    fn poll<S: Socket>(
        &mut self,
        cx: &mut Context<'_>,
        conn: &mut Conn<S>,
        limit: usize,
    ) -> Poll<Read> {
        match self {
            Self::Idle => Poll::Pending,
            Self::Body(pump) => pump.poll(cx, conn),
            Self::Watch => loop {
                if conn.buf.len() >= limit {
                    return Poll::Ready(Read::Full);
                }
                match ready!(conn.poll_fill(cx, READ_CHUNK)) {
                    Ok(0) | Err(_) => return Poll::Ready(Read::Gone),
                    Ok(_) => {}
                }
            },
        }
    }
}

/// Serves one request: its body fed as asked, the handler called, the answer written.
fn exchange<'a, S: Socket>(
    settings: &'a Listener,
    conn: &'a mut Conn<S>,
    head: RequestHead,
    requests: &'a Requests,
    stop: &'a Stop,
) -> Pending<'a> {
    Box::pin(exchange_inner(settings, conn, head, requests, stop))
}

/// A step of a connection, boxed.
type Pending<'a> = Pin<Box<dyn std::future::Future<Output = Next> + Send + 'a>>;

async fn exchange_inner<S: Socket>(
    settings: &Listener,
    conn: &mut Conn<S>,
    head: RequestHead,
    requests: &Requests,
    stop: &Stop,
) -> Next {
    let RequestHead {
        request,
        body: framing,
        keep_alive,
        expect_continue,
        upgrade,
    } = head;
    let version = request.version();
    let head_request = request.method() == Method::HEAD;
    let mut reading = Reading::Watch;
    let body = match framing {
        Framing::Done => Body::empty(),
        // All of it came with the head: handed over whole.
        Framing::Length(n) if conn.buf.len() as u64 >= n => {
            let whole = conn.buf.split_to(n as usize).freeze();
            Body::new(RequestBody::Whole(Some(whole)))
        }
        framing => {
            let decoder = Decoder::new(framing);
            let (body, pipe) = RequestBody::piped(decoder.left());
            reading = Reading::Body(Pump {
                pipe,
                decoder,
                to_continue: if expect_continue { CONTINUE.len() } else { 0 },
                flush_continue: false,
            });
            Body::new(body)
        }
    };
    let mut request = request.map(|()| body);
    let mut tunnel = None;
    if upgrade {
        let (handle, tx) = ClientUpgrade::new();
        request.extensions_mut().insert(handle);
        tunnel = Some(tx);
    }
    let mut unfinished = matches!(reading, Reading::Body(_));
    let service = requests.stamped(request);
    tokio::pin!(service);
    let Stamped { response, stamps } = loop {
        tokio::select! {
            biased;
            answer = service.as_mut() => break answer,
            read = poll_fn(|cx| reading.poll(cx, conn, settings.max_head)) => match read {
                Read::BodyDone => {
                    unfinished = false;
                    reading = Reading::Watch;
                }
                Read::BodyStopped | Read::Full => reading = Reading::Idle,
                // The client is gone: so is its request (dropped here, with its upstream call).
                Read::Gone => return Next::Gone,
            },
        }
    };
    if let Reading::Body(pump) = &reading {
        // A reader that outlives the answer (in its body) does not wait for bytes that will
        // not be read.
        pump.pipe.end(Err(BodyError(
            "the request was answered before its body was read",
        )));
    }
    drop(reading);
    let (parts, body) = response.into_parts();
    let status = parts.status;
    if status == StatusCode::SWITCHING_PROTOCOLS {
        let Some(tunnel) = tunnel.filter(|_| !unfinished) else {
            tracing::warn!("a 101 to a request that did not ask for an upgrade; closed");
            return Next::Gone;
        };
        conn.out.clear();
        let framed = Framed {
            version,
            sending: Sending::Bodiless,
            close: false,
        };
        head::encode(&mut conn.out, status, &parts.headers, &stamps, framed);
        if conn.write_out().await.is_err() || conn.flush().await.is_err() {
            return Next::Gone;
        }
        return Next::Upgrade(tunnel);
    }
    drop(tunnel);
    // Shutdown asked for while it was served: the connection ends with this answer.
    let mut close =
        !keep_alive || unfinished || stop.is_set() || has_token(&parts.headers, "close");
    let bodiless = head_request
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED;
    let sending = if bodiless {
        Sending::Bodiless
    } else if let Some(n) = head::stated_length(&parts.headers).or(body.size_hint().exact()) {
        Sending::Length(n)
    } else if version == Version::HTTP_11 {
        Sending::Chunked
    } else {
        close = true;
        Sending::UntilClose
    };
    let framed = Framed {
        version,
        sending,
        close,
    };
    match answer(conn, status, parts.headers, &stamps, body, framed).await {
        Ok(true) if !close => Next::Again,
        Ok(true) if unfinished => Next::Linger,
        Ok(true) => Next::Close,
        Ok(false) | Err(_) => Next::Gone,
    }
}

/// Answers a refused head with the contract's JSON error (the connection closes after it).
fn refuse<'a, S: Socket>(
    settings: &'a Listener,
    conn: &'a mut Conn<S>,
    refusal: Refusal,
) -> Pending<'a> {
    Box::pin(async move {
        refuse_inner(settings, conn, refusal).await;
        Next::Linger
    })
}

async fn refuse_inner<S: Socket>(settings: &Listener, conn: &mut Conn<S>, refusal: Refusal) {
    settings.count(Closed::Malformed);
    tracing::debug!(
        plane = settings.plane.as_str(),
        status = refusal.status.as_u16(),
        why = refusal.message,
        "request head refused; closed"
    );
    let mut response = refusal.error().into_response();
    // Answered before the chain: the headers every answer carries, set here.
    crate::phases::security_headers::stamp(response.headers_mut());
    crate::phases::request_id::stamp_if_missing(response.headers_mut());
    let (parts, body) = response.into_parts();
    let sending = Sending::Length(body.size_hint().exact().unwrap_or(0));
    let framed = Framed {
        version: Version::HTTP_11,
        sending,
        close: true,
    };
    let _ = answer(
        conn,
        parts.status,
        parts.headers,
        &Stamps::none(),
        body,
        framed,
    )
    .await;
}

/// Writes an answer: its head, then its body framed by `sending`. `Ok(false)` when the body
/// failed or did not match its length (the connection cannot go on).
async fn answer<S: Socket>(
    conn: &mut Conn<S>,
    status: StatusCode,
    headers: HeaderMap,
    stamps: &Stamps,
    body: Body,
    framed: Framed,
) -> io::Result<bool> {
    let sending = framed.sending;
    conn.out.clear();
    head::encode(&mut conn.out, status, &headers, stamps, framed);
    // Not kept while the body streams: a backend's header values are slices of the read
    // buffer of its connection (`http1::client`), which can then be reused for the next answer.
    drop(headers);
    if sending == Sending::Bodiless {
        drop(body);
        conn.write_out().await?;
        conn.flush().await?;
        return Ok(true);
    }
    let complete = write_body(conn, body, sending).await?;
    conn.write_out().await?;
    conn.flush().await?;
    Ok(complete)
}

/// Writes an answer's body after the head in the write buffer: data that is at hand joins
/// what is buffered, and the buffer is written when the body has nothing more at hand.
async fn write_body<S: Socket>(
    conn: &mut Conn<S>,
    body: Body,
    sending: Sending,
) -> io::Result<bool> {
    let mut body = body;
    let mut encoder = match sending {
        Sending::Length(n) => Encoder::length(n),
        Sending::Chunked => Encoder::chunked(),
        Sending::Bodiless | Sending::UntilClose => Encoder::until_close(),
    };
    let mut trailers = None;
    loop {
        let at_hand = poll_fn(|cx| Poll::Ready(Pin::new(&mut body).poll_frame(cx))).await;
        let frame = match at_hand {
            Poll::Ready(frame) => frame,
            Poll::Pending => {
                conn.write_out().await?;
                conn.flush().await?;
                body.frame().await
            }
        };
        let Some(frame) = frame else {
            break;
        };
        let frame = match frame {
            Ok(frame) => frame,
            Err(e) => {
                tracing::debug!(error = %e, "the answer's body failed; the connection is closed");
                return Ok(false);
            }
        };
        let mut data = match frame.into_data() {
            Ok(data) => data,
            Err(frame) => {
                if let Ok(t) = frame.into_trailers() {
                    trailers = Some(t);
                }
                continue;
            }
        };
        let encoded = encoder.data(&mut conn.out, &mut data);
        if let Some(after) = encoded.apart {
            conn.write_out().await?;
            conn.write_bytes(&mut data).await?;
            conn.out.extend_from_slice(after);
        }
        if encoded.over {
            // More than its length says: what fits is sent, then the connection closed.
            return Ok(false);
        }
    }
    if encoder.end(&mut conn.out, trailers.as_ref()).is_err() {
        tracing::debug!("the answer's body ended before its length; the connection is closed");
        return Ok(false);
    }
    Ok(true)
}
