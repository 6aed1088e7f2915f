//! Listeners: two TCP listeners, one per plane, served concurrently over one state, with a
//! header-read timeout (slowloris guard), a connection cap, and a bounded graceful shutdown.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::config::Config;
use crate::plane::Plane;
use crate::planes::chain::PlaneService;
use crate::planes::{build_data_plane_router, build_management_plane_router};
use crate::state::AppState;
use crate::tls::ListenerTls;
use axum::body::Body;
use axum::response::IntoResponse;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};

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
    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped_at = Arc::new(std::sync::OnceLock::new());
    {
        let stopped_at = stopped_at.clone();
        tokio::spawn(async move {
            shutdown.await;
            let _ = stopped_at.set(tokio::time::Instant::now());
            let _ = stop_tx.send(true);
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
        serve_plane(
            Plane::Data,
            data,
            data_tls,
            data_app,
            &state,
            stop_rx.clone()
        ),
        serve_plane(
            Plane::Management,
            management,
            mgmt_tls,
            mgmt_app,
            &state,
            stop_rx
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

async fn serve_plane(
    plane: Plane,
    listener: TcpListener,
    tls: Option<Arc<ListenerTls>>,
    service: PlaneService,
    state: &AppState,
    mut stop: watch::Receiver<bool>,
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
    let handshake_failures = state
        .metrics
        .tls_handshake_failures
        .with_label_values(&[plane.as_str()]);
    let mut builder = Builder::new(TokioExecutor::new());
    let header_timeout = Duration::from_millis(config.server.header_read_timeout_ms);
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout)
        // Heads up to twice the limit reach the request-limits phase, which answers them with
        // the contract's JSON `431`; larger ones are cut here (at least 8192, hyper's least).
        .max_buf_size(2 * config.server.max_header_bytes as usize);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(config.server.http2_max_concurrent_streams)
        .max_header_list_size(2 * config.server.max_header_bytes);
    let builder = Arc::new(builder);
    // With `server.http2` off, a connection opening with the HTTP/2 preface is closed (the
    // builder's own HTTP/1-only switch does not apply to connections served with upgrades).
    let http2 = config.server.http2;
    let permits = Arc::new(Semaphore::new(config.server.max_connections));
    let in_flight = Arc::new(Semaphore::new(config.server.max_in_flight));
    let shed = state
        .metrics
        .requests_shed
        .with_label_values(&[plane.as_str()]);
    let graceful = GracefulShutdown::new();
    loop {
        // Past the cap, stop accepting: new connections wait in the kernel backlog.
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => p?,
            _ = stopped(&mut stop) => break,
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
            _ = stopped(&mut stop) => break,
        };
        let _ = stream.set_nodelay(true);
        // Held by the connection and by a tunnel it may open (released when both are done).
        let slot = crate::proxy::tunnels::ConnectionSlot(Arc::new(permit));
        let plane_service = service.clone();
        let in_flight = in_flight.clone();
        let shed = shed.clone();
        let connection_slot = slot.clone();
        let service = hyper::service::service_fn(move |mut request: http::Request<Incoming>| {
            // Only an upgrade can outlive its exchange (a WebSocket tunnel): it keeps the slot.
            if request.headers().contains_key(http::header::UPGRADE) {
                request.extensions_mut().insert(connection_slot.clone());
            }
            let plane_service = plane_service.clone();
            // Load shedding: past `server.max_in_flight` requests in progress, answer at once
            // rather than queue (a queue would only add latency to every request behind it).
            let permit = in_flight.clone().try_acquire_owned();
            let shed = shed.clone();
            async move {
                let Ok(_permit) = permit else {
                    shed.inc();
                    let mut response = crate::error::GatewayError::overloaded().into_response();
                    // Answered before the chain: the headers every answer carries, set here.
                    crate::phases::security_headers::stamp(response.headers_mut());
                    crate::phases::request_id::stamp_if_missing(response.headers_mut());
                    return Ok(response);
                };
                Ok::<_, Infallible>(plane_service.handle(request.map(Body::new), peer).await)
            }
        });
        let builder = builder.clone();
        let watcher = graceful.watcher();
        let acceptor = tls.as_ref().map(|t| t.acceptor());
        let handshake_failures = handshake_failures.clone();
        tokio::spawn(async move {
            // Serves the connection under the graceful shutdown, then gives its slot back.
            macro_rules! serve_watched {
                ($io:expr) => {{
                    let connection = builder
                        .serve_connection_with_upgrades(TokioIo::new($io), service)
                        .into_owned();
                    if let Err(e) = watcher.watch(connection).await {
                        tracing::debug!(error = %e, "connection ended with an error");
                    }
                    drop(slot);
                }};
            }
            // The protocol detection reads the first bytes before hyper's header-read timeout
            // runs: a connection that sends nothing at all would hold its slot under
            // `server.max_connections` forever. It gets the same time to start as to finish
            // (a TLS handshake included).
            let deadline = tokio::time::Instant::now() + header_timeout;
            if let Some(acceptor) = acceptor {
                let mut stream = match tokio::time::timeout_at(deadline, acceptor.accept(stream))
                    .await
                {
                    Ok(Ok(stream)) => stream,
                    Ok(Err(e)) => {
                        handshake_failures.inc();
                        tracing::debug!(%peer, error = %e, "TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        handshake_failures.inc();
                        tracing::debug!(%peer, "TLS handshake not done within the header timeout");
                        return;
                    }
                };
                // ALPN offered `h2` only with `server.http2` on; the preface tells the rest.
                // Without HTTP/2, a client sending its preface anyway is not served: the
                // first three bytes are read and handed back to the connection.
                let stream = if http2 {
                    Prefixed::new(stream, Vec::new())
                } else {
                    let mut first = [0u8; 3];
                    match tokio::time::timeout_at(deadline, stream.read_exact(&mut first)).await {
                        Ok(Ok(_)) if &first != b"PRI" => Prefixed::new(stream, first.to_vec()),
                        _ => {
                            tracing::debug!(%peer, "TLS connection closed: no HTTP/1.1 request");
                            return;
                        }
                    }
                };
                serve_watched!(stream);
                return;
            }
            // Without HTTP/2, the first three bytes tell its preface (`PRI`) from a request.
            let wanted = if http2 { 1 } else { 3 };
            let mut first = [0u8; 3];
            let peeked = loop {
                match tokio::time::timeout_at(deadline, stream.peek(&mut first)).await {
                    Ok(Ok(n)) if n >= wanted => break n,
                    // Fewer bytes so far: wait for the rest (rare: a first segment of 1–2 bytes).
                    Ok(Ok(1..)) => tokio::time::sleep(Duration::from_millis(5)).await,
                    _ => break 0,
                }
            };
            if peeked == 0 {
                tracing::debug!(%peer, "connection sent nothing within the header timeout; closed");
                drop(slot);
                return;
            }
            if !http2 && &first == b"PRI" {
                tracing::debug!(%peer, "HTTP/2 connection refused (server.http2 is off)");
                drop(slot);
                return;
            }
            serve_watched!(stream);
        });
    }
    drop(listener);
    let grace = Duration::from_secs(config.server.shutdown_grace_secs);
    tracing::info!(
        plane = plane.as_str(),
        grace_secs = grace.as_secs(),
        "shutting down"
    );
    if tokio::time::timeout(grace, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            plane = plane.as_str(),
            "grace period over; closing remaining connections"
        );
    }
    Ok(())
}

/// A stream with bytes already read from it put back in front.
struct Prefixed<S> {
    prefix: Vec<u8>,
    at: usize,
    inner: S,
}

impl<S> Prefixed<S> {
    fn new(inner: S, prefix: Vec<u8>) -> Self {
        Self {
            prefix,
            at: 0,
            inner,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        if self.at < self.prefix.len() {
            let n = (self.prefix.len() - self.at).min(buf.remaining());
            let at = self.at;
            buf.put_slice(&self.prefix[at..at + n]);
            self.at += n;
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

/// Resolves once shutdown was asked for.
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await.map(|_| ());
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
