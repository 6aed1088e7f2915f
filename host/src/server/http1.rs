//! HTTP/1.1 connections: hyper's connection while requests come, and only the socket while the
//! client is idle between them.
//!
//! hyper keeps, for every connection and from its first request to its close, an 8 KiB read
//! buffer (grown up to `2 × server.max_header_bytes` by large heads), an 8 KiB buffer for
//! answer heads and the room for one request in progress. An SDK edge holds many keep-alive
//! connections that mostly wait. With `server.idle_release_ms`, a plain-text connection with no
//! request in progress for that long gives its hyper connection back: hyper's graceful
//! shutdown closes an idle connection without touching the socket, `into_parts` hands back
//! the socket and any bytes read past the last request, and the connection waits for the
//! client's next bytes with its socket alone (counted in `aura_connections_parked`). Those
//! bytes start a new hyper connection on the same socket. A parked connection is still closed
//! `server.header_read_timeout_ms` after its last answer.
//!
//! The header timeout is kept here rather than by hyper, which makes, arms and drops a timer
//! for every request's head: one timer per connection, moved only when it fires, closes a
//! connection whose next head is not complete `server.header_read_timeout_ms` after its last
//! answer (or after its first bytes, for a connection's first head and one woken from parked),
//! counted in `aura_connections_closed_total{reason="silent"}`.
//!
//! The connection is driven with `poll_without_shutdown`, which leaves upgrades to its caller:
//! after a `101` to a request that asked for one, the socket and the bytes read past the
//! handshake go to the tunnel through the request's [`ClientUpgrade`].

use std::convert::Infallible;
use std::future::poll_fn;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::AsyncWriteExt as _;
use tokio::net::TcpStream;
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use super::{Closed, Listener, Prefixed, Requests, log_end, stopped};
use crate::proxy::Holding;
use crate::proxy::tunnels::{ClientIo, ClientUpgrade};

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

impl<S: Socket> Socket for Prefixed<S> {
    fn parkable(&self) -> Option<&TcpStream> {
        if self.has_prefix() {
            return None;
        }
        self.inner().parkable()
    }
}

/// What the requests of one connection tell its driver.
struct Activity {
    /// Requests in progress: from the call to the end (or drop) of the answer's body.
    in_flight: AtomicUsize,
    /// Requests started on the connection.
    started: AtomicU64,
    /// When the last answer's body ended (or the connection started, or woke from parked: when
    /// the next head started to be awaited), in milliseconds after `since`.
    ended_ms: AtomicU64,
    since: Instant,
    /// Set when a request that asked for an upgrade was answered `101`.
    switching: AtomicBool,
    /// The tunnel waiting for the socket of an upgrade in progress.
    upgrade: std::sync::Mutex<Option<oneshot::Sender<Box<dyn ClientIo>>>>,
}

impl Activity {
    fn new() -> Self {
        Self {
            in_flight: AtomicUsize::new(0),
            started: AtomicU64::new(0),
            ended_ms: AtomicU64::new(0),
            since: Instant::now(),
            switching: AtomicBool::new(false),
            upgrade: std::sync::Mutex::new(None),
        }
    }

    /// When the connection last went without a request in progress.
    fn idle_since(&self) -> Instant {
        self.since + Duration::from_millis(self.ended_ms.load(Ordering::Relaxed))
    }

    /// The next head is awaited from now.
    fn awaiting_head(&self) {
        let ms = u64::try_from(self.since.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.ended_ms.store(ms, Ordering::Relaxed);
    }

    fn take_upgrade(&self) -> Option<oneshot::Sender<Box<dyn ClientIo>>> {
        self.upgrade.lock().ok().and_then(|mut u| u.take())
    }
}

/// One request in progress; ended when dropped (with the answer's body).
struct Busy(Arc<Activity>);

impl Busy {
    fn begin(activity: &Arc<Activity>) -> Self {
        activity.in_flight.fetch_add(1, Ordering::Relaxed);
        activity.started.fetch_add(1, Ordering::Relaxed);
        Self(activity.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.awaiting_head();
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// How one hyper connection on the socket ended.
enum Phase<S> {
    /// The connection is over (closed, failed, shut down, or its socket went to a tunnel).
    Done,
    /// Released while idle: the socket, with any bytes read past the last request in front.
    Released(Prefixed<S>),
}

/// Serves `io` as HTTP/1.1 until the client closes, stays idle past the header timeout, or
/// shutdown asks the connection to finish.
pub(super) async fn serve<S: Socket>(
    settings: &Listener,
    io: Prefixed<S>,
    requests: Requests,
    mut stop: watch::Receiver<bool>,
) {
    let activity = Arc::new(Activity::new());
    let mut io = io;
    loop {
        // Boxed: while parked, the connection's task holds the socket, not hyper's state.
        let phase = Box::pin(active(settings, io, &requests, &activity, &mut stop)).await;
        let Phase::Released(rest) = phase else {
            return;
        };
        if rest.has_prefix() {
            // A part of the next request came with the last one: serve it at once, its head
            // still due by the header timeout after the last answer.
            io = rest;
            continue;
        }
        let Some(socket) = rest.parkable() else {
            return;
        };
        let closes_at = activity.idle_since() + settings.header_timeout;
        let parked = settings.parked.clone();
        parked.inc();
        let woke = tokio::select! {
            ready = socket.readable() => ready.is_ok(),
            () = tokio::time::sleep_until(closes_at) => {
                settings.count(Closed::Silent);
                false
            }
            _ = stopped(&mut stop) => false,
        };
        parked.dec();
        if !woke {
            // The idle keep-alive connection is over: the socket is dropped (closed).
            return;
        }
        // The next head's time starts with its first bytes, as on a new connection.
        activity.awaiting_head();
        io = rest;
    }
}

/// One hyper connection on the socket, until it ends or is released while idle.
async fn active<S: Socket>(
    settings: &Listener,
    io: Prefixed<S>,
    requests: &Requests,
    activity: &Arc<Activity>,
    stop: &mut watch::Receiver<bool>,
) -> Phase<S> {
    let release_after = settings
        .idle_release
        .filter(|_| io.parkable().is_some() || io.has_prefix());
    let service = {
        let requests = requests.clone();
        let activity = activity.clone();
        hyper::service::service_fn(move |request: http::Request<Incoming>| {
            let requests = requests.clone();
            let activity = activity.clone();
            Box::pin(async move {
                let busy = Busy::begin(&activity);
                let mut request = request;
                let upgrade = request.headers().contains_key(http::header::UPGRADE);
                if upgrade {
                    let (handle, tx) = ClientUpgrade::new();
                    if let Ok(mut slot) = activity.upgrade.lock() {
                        *slot = Some(tx);
                    }
                    request.extensions_mut().insert(handle);
                }
                let response = requests.serve(request).await;
                if upgrade {
                    if response.status() == http::StatusCode::SWITCHING_PROTOCOLS {
                        activity.switching.store(true, Ordering::Relaxed);
                    } else {
                        drop(activity.take_upgrade());
                    }
                }
                Ok::<_, Infallible>(response.map(|body| Holding::new(body, busy)))
            })
        })
    };
    let started = activity.started.load(Ordering::Relaxed);
    let mut connection = settings.http1.serve_connection(TokioIo::new(io), service);
    let header_timeout = settings.header_timeout;
    // Checked at the header deadline or the release time, whichever comes first; while a
    // request is in progress, at least as often as either could come due.
    let busy_check = header_timeout.min(release_after.unwrap_or(Duration::MAX));
    let check = tokio::time::sleep_until(activity.idle_since() + busy_check);
    tokio::pin!(check);
    let mut stopping = false;
    let mut releasing = false;
    loop {
        enum Event {
            Ended(Result<(), hyper::Error>),
            Stop,
            Check,
        }
        let event = tokio::select! {
            result = poll_fn(|cx| connection.poll_without_shutdown(cx)) => Event::Ended(result),
            _ = stopped(stop), if !stopping => Event::Stop,
            () = check.as_mut() => Event::Check,
        };
        match event {
            Event::Ended(Err(e)) => {
                log_end(Err(e));
                return Phase::Done;
            }
            Event::Ended(Ok(())) => {
                let parts = connection.into_parts();
                let io = parts.io.into_inner();
                if activity.switching.swap(false, Ordering::Relaxed) {
                    if let Some(tunnel) = activity.take_upgrade() {
                        let socket = io.with_prefix(parts.read_buf);
                        let _ = tunnel.send(Box::new(socket));
                    }
                    return Phase::Done;
                }
                if releasing && !stopping {
                    return Phase::Released(io.with_prefix(parts.read_buf));
                }
                // The client closed, or keep-alive ended (`Connection: close`, shutdown).
                let mut io = io;
                let _ = tokio::time::timeout(settings.header_timeout, io.shutdown()).await;
                return Phase::Done;
            }
            Event::Stop => {
                stopping = true;
                Pin::new(&mut connection).graceful_shutdown();
            }
            Event::Check => {
                let now = Instant::now();
                if activity.in_flight.load(Ordering::Relaxed) > 0 {
                    check.as_mut().reset(now + busy_check);
                    continue;
                }
                let idle_since = activity.idle_since();
                let head_due = idle_since + header_timeout;
                if now >= head_due {
                    // No head complete within the header timeout: silent, idle or slow.
                    settings.count(Closed::Silent);
                    tracing::debug!("no request head within the header timeout; closed");
                    return Phase::Done;
                }
                let mut next = head_due;
                // Released only after a request of this phase: a head carried over from the
                // last phase keeps its deadline and is served, not parked.
                let quiet = activity.started.load(Ordering::Relaxed) > started;
                if let Some(after) = release_after.filter(|_| !releasing && !stopping) {
                    if !quiet {
                        // Looked at again once the head awaited may have become a request.
                        next = next.min(now + after);
                    } else if now >= idle_since + after {
                        // hyper closes an idle connection at once, leaving the socket to
                        // `into_parts`; one in the middle of a request finishes it, then closes.
                        releasing = true;
                        Pin::new(&mut connection).graceful_shutdown();
                    } else {
                        next = next.min(idle_since + after);
                    }
                }
                check.as_mut().reset(next);
            }
        }
    }
}
