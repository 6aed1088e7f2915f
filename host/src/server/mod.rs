//! Listeners: two TCP listeners, one per plane, served concurrently over one state, with a
//! deadline on everything before a connection's first request (TLS handshake, protocol
//! detection, an HTTP/2 connection's first stream), a header-read timeout for each HTTP/1.1
//! head (slowloris guard), an idle timeout and a PING budget for HTTP/2, a connection cap,
//! load shedding, and a bounded graceful shutdown. HTTP/1.1 is served by the gateway's own
//! codec (`http1.rs`), HTTP/2 by hyper.

mod body;
mod h2_send;
mod http1;
mod stop;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::config::Config;
use crate::phases::stamps::Stamped;
use crate::plane::Plane;
use crate::planes::chain::PlaneService;
use crate::planes::{build_data_plane_router, build_management_plane_router};
use crate::state::AppState;
use crate::tls::ListenerTls;
use axum::body::Body;
use axum::response::IntoResponse;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use stop::Stop;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio_util::task::TaskTracker;

/// Binds both listeners. Fails with the address when a port is taken.
pub async fn bind(config: &Config) -> anyhow::Result<(TcpListener, TcpListener)> {
    let data_addr: SocketAddr = format!("{}:{}", config.host, config.port).parse()?;
    let mgmt_addr: SocketAddr = format!("{}:{}", config.host, config.management_port).parse()?;
    let data = TcpListener::bind(data_addr)
        .await
        .map_err(|e| anyhow::anyhow!("data plane: cannot listen on {data_addr}: {e}"))?;
    let mgmt = TcpListener::bind(mgmt_addr)
        .await
        .map_err(|e| anyhow::anyhow!("management plane: cannot listen on {mgmt_addr}: {e}"))?;
    Ok((data, mgmt))
}

/// Serves both planes until `shutdown` resolves, then lets in-flight requests finish for at
/// most `server.shutdown_grace_secs`.
pub async fn serve(
    state: AppState,
    data: TcpListener,
    management: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let stop = Stop::new();
    let stopped_at = Arc::new(std::sync::OnceLock::new());
    {
        let stopped_at = stopped_at.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            shutdown.await;
            let _ = stopped_at.set(tokio::time::Instant::now());
            stop.set();
        });
    }
    let data_app = build_data_plane_router(state.clone());
    let mgmt_app = build_management_plane_router(state.clone());
    let base = state.config_path.get().and_then(|p| p.parent());
    let http2 = state.config.server.http2;
    let load = |plane, tls: &Option<crate::config::ListenerTlsConfig>| {
        tls.as_ref()
            .map(|t| ListenerTls::load(plane, t, base, http2))
            .transpose()
    };
    let data_tls = load(Plane::Data, &state.config.data_plane.tls)?;
    let mgmt_tls = load(Plane::Management, &state.config.management_plane.tls)?;
    crate::tls::spawn_reloader(
        data_tls.iter().chain(mgmt_tls.iter()).cloned().collect(),
        Duration::from_millis(state.config.server.tls_watch_interval_ms),
        state.metrics.clone(),
    );
    let (a, b) = tokio::join!(
        serve_plane(Plane::Data, data, data_tls, data_app, &state, stop.clone()),
        serve_plane(
            Plane::Management,
            management,
            mgmt_tls,
            mgmt_app,
            &state,
            stop
        ),
    );
    // Tunnels get what is left of the same grace.
    let grace = Duration::from_secs(state.config.server.shutdown_grace_secs);
    let left = stopped_at
        .get()
        .map_or(grace, |at| grace.saturating_sub(at.elapsed()));
    state.http.tunnels.shut_down(left).await;
    a.and(b)
}

/// The client preface that opens every HTTP/2 connection (RFC 9113 §3.4).
const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The protocol a connection speaks, told by its first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Protocol {
    Http1,
    Http2,
}

/// What `first` (the first bytes of a connection) says it speaks: HTTP/2 once they are the whole
/// client preface, HTTP/1 as soon as they differ from it, `None` while they are a strict part
/// of it (wait for more: `P` is `POST` as well as `PRI`).
fn protocol_of(first: &[u8]) -> Option<Protocol> {
    let n = first.len().min(H2_PREFACE.len());
    if n == 0 {
        None
    } else if first[..n] != H2_PREFACE[..n] {
        Some(Protocol::Http1)
    } else if n == H2_PREFACE.len() {
        Some(Protocol::Http2)
    } else {
        None
    }
}

/// The settings every connection of a listener is served with.
struct Listener {
    plane: Plane,
    /// The longest HTTP/1.1 request head read: twice `server.max_header_bytes` (heads over
    /// the limit and within this reach the request-limits phase and its JSON `431`).
    max_head: usize,
    http2: hyper::server::conn::http2::Builder<TokioExecutor>,
    /// `server.http2`: a connection opening with the preface is closed when off.
    http2_enabled: bool,
    /// `server.header_read_timeout_ms`: the TLS handshake, the protocol's detection and an
    /// HTTP/2 connection's first stream must all be done within it of the accept.
    header_timeout: Duration,
    /// `server.http2_idle_timeout_ms`.
    http2_idle: Duration,
    /// `server.idle_release_ms` (`None`: 0, never).
    idle_release: Option<Duration>,
    /// `server.send_timeout_ms`: the longest one write of an answer to an HTTP/1.1 client
    /// may wait, and the longest an HTTP/2 stream's answer may wait for its client to make
    /// room for its next frame.
    send_timeout: Duration,
    /// `aura_http2_streams_reset_total{reason="send_timeout"}` of the plane.
    http2_send_timeouts: prometheus::IntCounter,
    /// `aura_connections_parked` of the plane.
    parked: prometheus::IntGauge,
    closed: [prometheus::IntCounter; 5],
    handshake_failures: prometheus::IntCounter,
}

/// Why the listener closed a connection (`aura_connections_closed_total{reason}`).
#[derive(Debug, Clone, Copy)]
enum Closed {
    /// Nothing that starts a request within the header timeout.
    Silent = 0,
    /// An HTTP/2 preface with `server.http2` off.
    Http2Refused = 1,
    /// An HTTP/2 connection with no stream for the idle timeout.
    Idle = 2,
    /// An HTTP/1.1 request head refused (answered with its error, then closed).
    Malformed = 3,
    /// An HTTP/1.1 client that read nothing of its answer for `server.send_timeout_ms`.
    SendTimeout = 4,
}

impl Listener {
    fn new(plane: Plane, config: &Config, metrics: &crate::metrics::Metrics) -> Self {
        let s = &config.server;
        let header_timeout = Duration::from_millis(s.header_read_timeout_ms);
        let mut http2 = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
        http2
            .timer(TokioTimer::new())
            .max_concurrent_streams(s.http2_max_concurrent_streams)
            .max_header_list_size(2 * s.max_header_bytes);
        if s.http2_keep_alive_interval_ms > 0 {
            // A peer that does not answer a PING within the timeout is gone: its connection
            // and streams are closed rather than held.
            http2
                .keep_alive_interval(Duration::from_millis(s.http2_keep_alive_interval_ms))
                .keep_alive_timeout(Duration::from_millis(s.http2_keep_alive_timeout_ms));
        }
        let closed = |reason| {
            metrics
                .connections_closed
                .with_label_values(&[plane.as_str(), reason])
        };
        Self {
            plane,
            max_head: (2 * s.max_header_bytes as usize).max(8192),
            http2,
            http2_enabled: s.http2,
            header_timeout,
            http2_idle: Duration::from_millis(s.http2_idle_timeout_ms),
            idle_release: (s.idle_release_ms > 0).then(|| Duration::from_millis(s.idle_release_ms)),
            send_timeout: Duration::from_millis(s.send_timeout_ms),
            http2_send_timeouts: metrics
                .http2_streams_reset
                .with_label_values(&[plane.as_str(), "send_timeout"]),
            parked: metrics
                .connections_parked
                .with_label_values(&[plane.as_str()]),
            closed: [
                closed("silent"),
                closed("http2_refused"),
                closed("idle"),
                closed("malformed"),
                closed("send_timeout"),
            ],
            handshake_failures: metrics
                .tls_handshake_failures
                .with_label_values(&[plane.as_str()]),
        }
    }

    fn count(&self, closed: Closed) {
        self.closed[closed as usize].inc();
    }
}

async fn serve_plane(
    plane: Plane,
    listener: TcpListener,
    tls: Option<Arc<ListenerTls>>,
    service: PlaneService,
    state: &AppState,
    stop: Stop,
) -> anyhow::Result<()> {
    let config: &Config = &state.config;
    let addr = listener.local_addr()?;
    tracing::info!(
        plane = plane.as_str(),
        %addr,
        tls = tls.is_some(),
        client_certificates = tls.as_ref().is_some_and(|t| t.requires_client_certificate()),
        "listening"
    );
    let settings = Arc::new(Listener::new(plane, config, &state.metrics));
    let permits = Arc::new(Semaphore::new(config.server.max_connections));
    let in_flight = Arc::new(Semaphore::new(config.server.max_in_flight));
    let shed = state
        .metrics
        .requests_shed
        .with_label_values(&[plane.as_str()]);
    let connections = TaskTracker::new();
    // Cancelled once the grace is over: the connections still open are dropped.
    let force_close = Stop::new();
    loop {
        // Past the cap, stop accepting: new connections wait in the kernel backlog.
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => p?,
            () = stop.wait() => break,
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(plane = plane.as_str(), error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
            () = stop.wait() => break,
        };
        let _ = stream.set_nodelay(true);
        // Held by the connection and by a tunnel it may open (released when both are done).
        let slot = crate::proxy::tunnels::ConnectionSlot(Arc::new(permit));
        let requests = Requests {
            plane: service.clone(),
            in_flight: in_flight.clone(),
            shed: shed.clone(),
            slot: slot.clone(),
            peer,
        };
        let settings = settings.clone();
        let acceptor = tls.as_ref().map(|t| t.acceptor());
        let stop = stop.clone();
        let force_close = force_close.clone();
        connections.spawn(async move {
            let serve = serve_connection(&settings, stream, peer, acceptor, requests, stop);
            // The connection first: the end of the grace is a flag read on its wake-ups.
            tokio::select! {
                biased;
                () = serve => {}
                () = force_close.wait() => {}
            }
            drop(slot);
        });
    }
    drop(listener);
    let grace = Duration::from_secs(config.server.shutdown_grace_secs);
    tracing::info!(
        plane = plane.as_str(),
        grace_secs = grace.as_secs(),
        "shutting down"
    );
    connections.close();
    if tokio::time::timeout(grace, connections.wait())
        .await
        .is_err()
    {
        tracing::warn!(
            plane = plane.as_str(),
            "grace period over; closing remaining connections"
        );
        force_close.set();
        connections.wait().await;
    }
    Ok(())
}

/// What each request of a connection is served with.
#[derive(Clone)]
struct Requests {
    plane: PlaneService,
    in_flight: Arc<Semaphore>,
    shed: prometheus::IntCounter,
    slot: crate::proxy::tunnels::ConnectionSlot,
    peer: SocketAddr,
}

impl Requests {
    /// Serves one request: shed past `server.max_in_flight`, else through the plane's chain.
    async fn serve(&self, request: http::Request<Body>) -> axum::response::Response {
        self.stamped(request).await.into_response()
    }

    /// [`Self::serve`], with the headers the phases set on the way out kept beside the answer
    /// (written by the HTTP/1 writer itself).
    async fn stamped(&self, mut request: http::Request<Body>) -> Stamped {
        // Only an upgrade can outlive its exchange (a WebSocket tunnel): it keeps the slot.
        if request.headers().contains_key(http::header::UPGRADE) {
            request.extensions_mut().insert(self.slot.clone());
        }
        // Load shedding: past `server.max_in_flight` requests in progress, answer at once
        // rather than queue (a queue would only add latency to every request behind it).
        let Ok(_permit) = self.in_flight.clone().try_acquire_owned() else {
            self.shed.inc();
            let mut response = crate::error::GatewayError::overloaded().into_response();
            // Answered before the chain: the headers every answer carries, set here.
            crate::phases::security_headers::stamp(response.headers_mut());
            crate::phases::request_id::stamp_if_missing(response.headers_mut());
            return Stamped::whole(response);
        };
        self.plane.stamped(request, self.peer).await
    }
}

/// Serves one accepted connection: the TLS handshake, the protocol's detection, then HTTP/1.1
/// or HTTP/2 until it ends, the client goes idle, or shutdown asks it to finish.
///
/// Everything before the first request is bounded by `server.header_read_timeout_ms` from the
/// accept: a connection that completes TLS and sends nothing, or sends a part of the HTTP/2
/// preface and stops (`P`), is closed at that deadline instead of holding its slot under
/// `server.max_connections`.
async fn serve_connection(
    settings: &Listener,
    mut stream: tokio::net::TcpStream,
    peer: SocketAddr,
    acceptor: Option<tokio_rustls::TlsAcceptor>,
    requests: Requests,
    stop: Stop,
) {
    let deadline = tokio::time::Instant::now() + settings.header_timeout;
    let Some(acceptor) = acceptor else {
        let Some((protocol, read)) = peek_protocol(&mut stream, deadline).await else {
            settings.count(Closed::Silent);
            tracing::debug!(%peer, "connection started no request within the header timeout; closed");
            return;
        };
        return serve_http(
            settings,
            Prefixed::new(stream, read),
            protocol,
            deadline,
            requests,
            stop,
        )
        .await;
    };
    // Boxed: a plain-text connection's task (parked while idle) does not carry the room for
    // a TLS session.
    Box::pin(serve_tls(
        settings, stream, peer, acceptor, deadline, requests, stop,
    ))
    .await;
}

/// Serves a TLS connection: the handshake and the protocol's detection by `deadline`, then
/// HTTP/1.1 or HTTP/2.
async fn serve_tls(
    settings: &Listener,
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    acceptor: tokio_rustls::TlsAcceptor,
    deadline: tokio::time::Instant,
    requests: Requests,
    stop: Stop,
) {
    let mut stream = match tokio::time::timeout_at(deadline, acceptor.accept(stream)).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) => {
            settings.handshake_failures.inc();
            tracing::debug!(%peer, error = %e, "TLS handshake failed");
            return;
        }
        Err(_) => {
            settings.handshake_failures.inc();
            tracing::debug!(%peer, "TLS handshake not done within the header timeout");
            return;
        }
    };
    // ALPN offered `h2` only with `server.http2` on; the bytes tell what the client speaks.
    let mut first = Vec::with_capacity(H2_PREFACE.len());
    let protocol = tokio::time::timeout_at(deadline, async {
        let mut buf = [0u8; 24];
        loop {
            let want = H2_PREFACE.len() - first.len();
            match stream.read(&mut buf[..want]).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => first.extend_from_slice(&buf[..n]),
            }
            if let Some(protocol) = protocol_of(&first) {
                return Some(protocol);
            }
        }
    })
    .await;
    let Ok(Some(protocol)) = protocol else {
        settings.count(Closed::Silent);
        tracing::debug!(%peer, "TLS connection started no request within the header timeout; closed");
        return;
    };
    let io = Prefixed::new(stream, bytes::Bytes::from(first));
    serve_http(settings, io, protocol, deadline, requests, stop).await;
}

/// The protocol of a plain-text connection by `deadline`, and the bytes read from it to tell
/// (to be served first); `None` when it closed or stayed silent.
///
/// The first bytes are peeked: the common case (a request's first segment, the whole preface
/// or anything that is not a part of it) is told without a read or a copy. A strict part of the
/// preface (`P`) is taken out of the socket instead: peeking again would find the same bytes at
/// once, and waiting on readability with them still queued would never wait, so the rest is
/// read as it arrives, and a client that stops there costs no CPU until the deadline.
async fn peek_protocol(
    stream: &mut tokio::net::TcpStream,
    deadline: tokio::time::Instant,
) -> Option<(Protocol, bytes::Bytes)> {
    let mut first = [0u8; 24];
    tokio::time::timeout_at(deadline, async {
        match stream.peek(&mut first).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => {
                if let Some(protocol) = protocol_of(&first[..n]) {
                    return Some((protocol, bytes::Bytes::new()));
                }
            }
        }
        // At most the preface's length is read: what follows it is the protocol's own.
        let mut read = 0;
        loop {
            match stream.read(&mut first[read..]).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => read += n,
            }
            if let Some(protocol) = protocol_of(&first[..read]) {
                return Some((protocol, bytes::Bytes::copy_from_slice(&first[..read])));
            }
        }
    })
    .await
    .ok()
    .flatten()
}

/// Serves `io` as `protocol` until the connection ends; an HTTP/2 connection is closed
/// (GOAWAY, then dropped if it lingers) when it has had no stream open for
/// `server.http2_idle_timeout_ms`, or none at all by `first_stream_by`.
async fn serve_http<S: http1::Socket>(
    settings: &Listener,
    io: Prefixed<S>,
    protocol: Protocol,
    first_stream_by: tokio::time::Instant,
    requests: Requests,
    stop: Stop,
) {
    match protocol {
        Protocol::Http1 => http1::serve(settings, io, requests, stop).await,
        Protocol::Http2 if !settings.http2_enabled => {
            settings.count(Closed::Http2Refused);
            tracing::debug!(
                plane = settings.plane.as_str(),
                "HTTP/2 connection refused (server.http2 is off)"
            );
        }
        // Boxed: an HTTP/1.1 connection's task (parked while idle) is not as large as
        // HTTP/2's connection state.
        Protocol::Http2 => {
            Box::pin(serve_http2(settings, io, first_stream_by, requests, stop)).await;
        }
    }
}

/// Serves `io` as HTTP/2 until it ends, goes idle, or shutdown asks it to finish.
async fn serve_http2<S: http1::Socket>(
    settings: &Listener,
    io: Prefixed<S>,
    first_stream_by: tokio::time::Instant,
    requests: Requests,
    stop: Stop,
) {
    let streams = Streams::default();
    let counted = streams.clone();
    let sending =
        h2_send::SendWatch::new(settings.send_timeout, settings.http2_send_timeouts.clone());
    let watched = sending.clone();
    let service = hyper::service::service_fn(move |request: http::Request<Incoming>| {
        let requests = requests.clone();
        let open = counted.open();
        let watched = watched.clone();
        async move {
            let response = requests.serve(request.map(Body::new)).await;
            // The stream stays open until its answer's body is done; the body is dropped when
            // the client makes no room for it within the send timeout.
            Ok::<_, Infallible>(response.map(|body| Body::new(watched.watch(body, open))))
        }
    });
    let connection = settings.http2.serve_connection(TokioIo::new(io), service);
    tokio::pin!(connection);
    let idle = streams.idle(first_stream_by, settings.http2_idle);
    tokio::pin!(idle);
    let send_watch = sending.run(streams.0.subscribe());
    tokio::pin!(send_watch);
    let lingering = settings.header_timeout;
    tokio::select! {
        result = connection.as_mut() => return log_end(result),
        // The watch runs as long as the connection; were it to end, serving goes on.
        () = send_watch.as_mut() => {}
        () = stop.wait() => connection.as_mut().graceful_shutdown(),
        () = idle.as_mut() => {
            settings.count(Closed::Idle);
            connection.as_mut().graceful_shutdown();
            // A client that does not close after the GOAWAY (a half-sent stream) is
            // dropped after the header timeout.
            if let Ok(result) = tokio::time::timeout(lingering, connection.as_mut()).await {
                log_end(result);
            }
            return;
        }
    }
    log_end(connection.await);
}

fn log_end(result: Result<(), hyper::Error>) {
    if let Err(e) = result {
        tracing::debug!(error = %e, "connection ended with an error");
    }
}

/// The streams open on one HTTP/2 connection, from the request's arrival to the end of its
/// answer's body: (open now, opened since the connection started).
#[derive(Debug, Clone, Default)]
struct Streams(Arc<watch::Sender<(usize, u64)>>);

/// One open stream; closed when dropped.
struct OpenStream(Arc<watch::Sender<(usize, u64)>>);

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.0.send_modify(|(open, _)| *open -= 1);
    }
}

impl Streams {
    fn open(&self) -> OpenStream {
        self.0.send_modify(|(open, opened)| {
            *open += 1;
            *opened += 1;
        });
        OpenStream(self.0.clone())
    }

    /// Resolves once no stream has been open for `idle`, or none was ever opened by `first`.
    /// Frames without a stream (PING, SETTINGS, WINDOW_UPDATE) do not count: a connection
    /// that only pings holds a slot for nothing.
    async fn idle(&self, first: tokio::time::Instant, idle: Duration) {
        let mut watched = self.0.subscribe();
        let mut seen = 0;
        let mut until = first;
        loop {
            let (open, opened) = *watched.borrow_and_update();
            if open > 0 {
                // Busy: the idle time starts when the last stream closes.
                if watched.wait_for(|(open, _)| *open == 0).await.is_err() {
                    return std::future::pending().await;
                }
                continue;
            }
            if opened != seen {
                seen = opened;
                until = tokio::time::Instant::now() + idle;
            }
            tokio::select! {
                () = tokio::time::sleep_until(until) => {
                    if *watched.borrow() == (0, seen) {
                        return;
                    }
                }
                changed = watched.changed() => if changed.is_err() {
                    return std::future::pending().await;
                },
            }
        }
    }
}

/// A stream with bytes already read from it put back in front.
struct Prefixed<S> {
    prefix: bytes::Bytes,
    inner: S,
}

impl<S> Prefixed<S> {
    fn new(inner: S, prefix: bytes::Bytes) -> Self {
        Self { prefix, inner }
    }

    /// The stream with `read` (bytes read from it and not used) put back in front of what is
    /// still to be read. `read` is copied out: behind it is a connection's whole read buffer
    /// (8 KiB or more), which would otherwise stay with the tunnel for as long as it lives.
    fn with_prefix(mut self, read: bytes::Bytes) -> Self {
        let read = if read.is_empty() {
            bytes::Bytes::new()
        } else {
            bytes::Bytes::copy_from_slice(&read)
        };
        self.prefix = if self.prefix.is_empty() {
            read
        } else if read.is_empty() {
            self.prefix
        } else {
            let mut both = bytes::BytesMut::with_capacity(read.len() + self.prefix.len());
            both.extend_from_slice(&read);
            both.extend_from_slice(&self.prefix);
            both.freeze()
        };
        self
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            buf.put_slice(&self.prefix.split_to(n));
            if self.prefix.is_empty() {
                // Read through: let go of the allocation behind it.
                self.prefix = bytes::Bytes::new();
            }
            return std::task::Poll::Ready(Ok(()));
        }
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// The signal that asked the gateway to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopSignal {
    /// SIGINT (Ctrl-C): stop accepting at once.
    Interrupt,
    /// SIGTERM (an orchestrator): drain first (`server.drain_delay_secs`).
    Terminate,
}

/// Resolves on SIGINT or SIGTERM, marks the instance as draining (`/ready` answers `503`), and
/// on SIGTERM keeps serving for `server.drain_delay_secs` before the listeners stop accepting.
pub async fn drain_on_signal(state: AppState) {
    let signal = shutdown_signal().await;
    state.readiness.start_draining();
    let delay = Duration::from_secs(state.config.server.drain_delay_secs);
    if signal == StopSignal::Terminate && !delay.is_zero() {
        tracing::info!(
            delay_secs = delay.as_secs(),
            "draining: /ready answers 503 while requests are still served"
        );
        tokio::time::sleep(delay).await;
    }
}

/// Resolves on SIGINT or SIGTERM, with which one arrived.
pub async fn shutdown_signal() -> StopSignal {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {
            tracing::info!("SIGINT received");
            StopSignal::Interrupt
        }
        _ = terminate => {
            tracing::info!("SIGTERM received");
            StopSignal::Terminate
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_bytes_tell_http2_only_once_they_are_the_whole_preface() {
        assert_eq!(protocol_of(b""), None);
        assert_eq!(
            protocol_of(b"P"),
            None,
            "PRI or POST, PUT, PATCH: not known yet"
        );
        assert_eq!(protocol_of(b"PO"), Some(Protocol::Http1));
        assert_eq!(protocol_of(b"GET / HTTP/1.1\r\n"), Some(Protocol::Http1));
        assert_eq!(protocol_of(&H2_PREFACE[..23]), None);
        assert_eq!(protocol_of(H2_PREFACE), Some(Protocol::Http2));
        let mut request = H2_PREFACE.to_vec();
        request.extend_from_slice(b"\0\0\0\x04");
        assert_eq!(protocol_of(&request), Some(Protocol::Http2));
        // `PRI * HTTP/2.0` with anything else after it is not the preface.
        assert_eq!(
            protocol_of(b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n"),
            Some(Protocol::Http1)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_http2_connection_is_idle_only_without_streams_and_from_the_last_one() {
        let streams = Streams::default();
        let first = tokio::time::Instant::now() + Duration::from_secs(10);
        let idle = Duration::from_secs(60);
        // No stream by the first deadline: idle then.
        let started = tokio::time::Instant::now();
        streams.idle(first, idle).await;
        assert_eq!(started.elapsed(), Duration::from_secs(10));
        // A stream open holds it for as long as it lasts; the idle time counts from its end.
        let open = streams.open();
        let watcher = {
            let streams = streams.clone();
            tokio::spawn(async move {
                let from = tokio::time::Instant::now();
                streams.idle(from, idle).await;
                from.elapsed()
            })
        };
        tokio::time::sleep(Duration::from_secs(300)).await;
        assert!(!watcher.is_finished(), "idle while a stream is open");
        drop(open);
        let lived = watcher.await.expect("watcher");
        assert_eq!(lived, Duration::from_secs(360));
    }

    #[tokio::test]
    async fn a_part_of_the_preface_is_read_out_of_the_socket_and_handed_on() {
        use tokio::io::AsyncWriteExt as _;
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let connect = || tokio::net::TcpStream::connect(addr);

        // A request's first bytes: told from a peek, nothing taken out of the socket.
        let mut client = connect().await.expect("connect");
        let (mut server, _) = listener.accept().await.expect("accept");
        client
            .write_all(b"GET / HTTP/1.1\r\n")
            .await
            .expect("write");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        let told = peek_protocol(&mut server, deadline).await;
        assert_eq!(told, Some((Protocol::Http1, bytes::Bytes::new())));
        let mut get = [0u8; 3];
        server.read_exact(&mut get).await.expect("read");
        assert_eq!(&get, b"GET");

        // A preface in two parts: the first is read out, the wait is for the rest, and what was
        // read is handed on; what follows the preface stays in the socket.
        let mut client = connect().await.expect("connect");
        let (mut server, _) = listener.accept().await.expect("accept");
        client.write_all(&H2_PREFACE[..8]).await.expect("write");
        let detect = tokio::spawn(async move {
            let told = peek_protocol(&mut server, deadline).await;
            (told, server)
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!detect.is_finished(), "told from a part of the preface");
        client.write_all(&H2_PREFACE[8..]).await.expect("write");
        client.write_all(b"\0\0\0\x04").await.expect("write");
        let (told, mut server) = detect.await.expect("detect");
        let preface = bytes::Bytes::from_static(H2_PREFACE);
        assert_eq!(told, Some((Protocol::Http2, preface)));
        let mut frame = [0u8; 4];
        server.read_exact(&mut frame).await.expect("read");
        assert_eq!(&frame, b"\0\0\0\x04");

        // `P` and nothing more: nothing by the deadline.
        let mut client = connect().await.expect("connect");
        let (mut server, _) = listener.accept().await.expect("accept");
        client.write_all(b"P").await.expect("write");
        let deadline = tokio::time::Instant::now() + Duration::from_millis(200);
        assert_eq!(peek_protocol(&mut server, deadline).await, None);
    }

    /// Whether `bytes` points into the `len` bytes from `start`.
    fn within(bytes: &bytes::Bytes, start: *const u8, len: usize) -> bool {
        let at = bytes.as_ptr() as usize;
        at >= start as usize && at <= start as usize + len
    }

    #[tokio::test]
    async fn bytes_put_back_keep_none_of_the_read_buffer_behind_them() {
        use tokio::io::AsyncReadExt as _;
        // hyper's read buffer as `into_parts` hands it back: read through, or with a few
        // bytes of the next request left, its 8 KiB allocation behind either.
        let mut buffer = bytes::BytesMut::with_capacity(8192);
        buffer.extend_from_slice(b"GET / HTTP/1.1\r\n\r\nGET /ne");
        let start = buffer.as_ptr();
        let mut read = buffer.freeze();
        let rest = read.split_off(read.len() - 7);
        let empty = rest.slice(7..);
        assert!(within(&empty, start, 8192) && within(&rest, start, 8192));

        let io = Prefixed::new(tokio::io::empty(), bytes::Bytes::new()).with_prefix(empty);
        assert!(io.prefix.is_empty());
        assert!(
            !within(&io.prefix, start, 8192),
            "an empty rest keeps the buffer"
        );

        let mut io = Prefixed::new(tokio::io::empty(), bytes::Bytes::new()).with_prefix(rest);
        assert!(!io.prefix.is_empty());
        assert!(
            !within(&io.prefix, start, 8192),
            "the rest keeps the buffer"
        );
        let copied = io.prefix.as_ptr();
        let mut got = Vec::new();
        io.read_to_end(&mut got).await.expect("read");
        assert_eq!(got, b"GET /ne");
        assert!(
            !within(&io.prefix, copied, 7),
            "read through, the copy is kept"
        );
        drop(read);
    }

    /// The size of what `f` answers, without calling it.
    fn output_size<F, A, B, C, D, E, G, R>(_: &F) -> usize
    where
        F: FnOnce(A, B, C, D, E, G) -> R,
    {
        std::mem::size_of::<R>()
    }

    #[test]
    fn a_plain_text_connection_task_is_small() {
        // Every connection's task holds this future for as long as it lives, idle or not: the
        // TLS session and HTTP/2's state are boxed away from it, a request in progress too.
        let size = output_size::<
            _,
            &'static Listener,
            tokio::net::TcpStream,
            SocketAddr,
            Option<tokio_rustls::TlsAcceptor>,
            Requests,
            Stop,
            _,
        >(&serve_connection);
        eprintln!("a connection's future: {size} bytes");
        assert!(size <= 1280, "a connection's future: {size} bytes");
    }
}
