//! HTTP/1.1 connections to the HTTP backends, pooled per origin and driven by the request that
//! uses one.
//!
//! A connection is not a task of its own. The request that checked it out writes the request
//! and reads the answer's head itself, and the answer's body reads from it while the body
//! streams to the client, through the gateway's own HTTP/1.1 codec ([`crate::http1::client`]). So an
//! exchange costs no hand-over to a connection task and back (two task wake-ups and a channel
//! each way), no HTTP library's state machine, and no pool lookup by a hashed authority: each
//! backend resolves its origin's pool once ([`Backend`]).
//!
//! - **Reuse.** When the answer's body has ended and the connection is ready for another
//!   exchange, it goes back to its origin's pool (the last returned is the first taken). A body
//!   dropped before its end (the client went away) closes the connection.
//! - **Idle connections** are kept at most `upstreams.pool_max_idle_per_host` per origin and
//!   [`IDLE_TIMEOUT`]. One the backend closed while it waited is noticed when it is taken (or by
//!   the sweep, every [`SWEEP_EVERY`]) and never used.
//! - **A request never written is sent again**, once, on a new connection: a reused connection
//!   that closed under it hands the request back before any byte of it left. A request that
//!   was written is never sent twice.
//! - **WebSocket upgrades** take a new connection, driven by hyper's client in a task of its
//!   own until the handshake hands the connection to the tunnel.

use std::collections::HashMap;
use std::future::poll_fn;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use axum::body::Body;
use bytes::Bytes;
use http::{HeaderValue, Request, Response, Uri, header};
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_rustls::{HttpsConnector, MaybeHttpsStream};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioIo;
use prometheus::{IntCounter, IntCounterVec};
use tokio::net::TcpStream;
use tower::ServiceExt;

use super::headers::HttpBackendHeaders;
use crate::error::GatewayError;
use crate::http1::client::{Connection, SendError, WireError};

/// What dials a backend: TCP (with the connect timeout), then TLS for `https://`.
pub type Connector = HttpsConnector<HttpConnector<crate::dns::ConnectResolver>>;
type Io = MaybeHttpsStream<TokioIo<TcpStream>>;

/// How long a connection may wait unused in a pool before it is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// How often idle connections past [`IDLE_TIMEOUT`], or closed by their backend, are dropped.
pub const SWEEP_EVERY: Duration = Duration::from_secs(30);

/// Why an exchange with a backend failed.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// No connection could be opened (refused, unreachable, TLS, the connect timeout): nothing
    /// was sent.
    #[error("connecting: {0}")]
    Connect(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// A new connection closed before it took the request: nothing was sent.
    #[error("the connection closed before the request was sent")]
    ClosedBeforeSending,
    /// The exchange broke: the request may have reached the backend.
    #[error("exchange: {0}")]
    Exchange(#[source] WireError),
    /// A WebSocket handshake broke: the request may have reached the backend.
    #[error("upgrade exchange: {0}")]
    Upgrade(#[source] hyper::Error),
    /// The client's request body failed ([`WireError::is_client`]): the client's fault, never
    /// the backend's; the request is not sent again.
    #[error("{0}")]
    Client(#[source] WireError),
}

impl UpstreamError {
    /// Whether the backend could not be reached at all.
    pub fn is_connect(&self) -> bool {
        matches!(self, Self::Connect(_) | Self::ClosedBeforeSending)
    }

    /// Whether the client's side failed, not the backend: such an exchange never counts
    /// against the backend's breaker.
    pub fn is_client(&self) -> bool {
        matches!(self, Self::Client(_))
    }
}

/// One connection, read and written by the request that holds it.
type Conn = Connection<TokioIo<Io>>;

struct Idle {
    conn: Box<Conn>,
    since: Instant,
}

/// The connections to one origin (`scheme://host:port`).
pub struct OriginPool {
    /// `scheme://authority`: what the connector dials.
    origin: Uri,
    /// The `Host` every request to this origin carries.
    host: HeaderValue,
    connector: Connector,
    idle: Mutex<Vec<Idle>>,
    max_idle: usize,
    opened: IntCounter,
}

impl std::fmt::Debug for OriginPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OriginPool")
            .field("origin", &self.origin)
            .field("idle", &self.idle_count())
            .finish()
    }
}

impl OriginPool {
    /// Connections waiting in the pool.
    pub fn idle_count(&self) -> usize {
        self.idle.lock().map(|i| i.len()).unwrap_or_default()
    }

    /// Sends `request` (its URI in origin form: path and query) with the backend's `host`,
    /// and, for a client's request, its headers as `backend` says (see
    /// [`HttpBackendHeaders`]); answers with the head of the backend's answer. The body streams
    /// from the connection, which goes back to the pool after it.
    pub async fn send(
        self: &Arc<Self>,
        mut request: Request<Body>,
        backend: Option<&HttpBackendHeaders<'_>>,
    ) -> Result<Response<PooledBody>, UpstreamError> {
        let added = crate::http1::client::Added {
            host: Some(&self.host),
            backend: backend.map(|b| b as &dyn crate::http1::head::HeadEdits),
        };
        let mut pooled = poll_fn(|cx| Poll::Ready(self.checkout(cx, Instant::now()))).await;
        loop {
            let reused = pooled.is_some();
            let mut conn = match pooled.take() {
                Some(conn) => conn,
                // Boxed: connecting is the rare case, and its state would otherwise make the
                // future of every request larger.
                None => Box::pin(self.open()).await?,
            };
            match conn.send_with(request, added).await {
                Ok(head) => {
                    let pool = self.clone();
                    let body = PooledBody {
                        conn: Some(conn),
                        pool,
                    };
                    return Ok(head.map(|()| body));
                }
                // The client's request is refused before a byte of it was written: the
                // connection is as good as it was, and the request is not sent again.
                Err(SendError::Unsent(unsent)) if unsent.error.is_client() => {
                    if conn.is_reusable() {
                        self.put(conn, Instant::now());
                    }
                    return Err(UpstreamError::Client(unsent.error));
                }
                // Nothing of it written: a reused connection that closed under it hands it
                // back, for a new connection.
                Err(SendError::Unsent(unsent)) if reused => {
                    tracing::debug!(error = %unsent.error, "reused backend connection closed; sending again");
                    request = unsent.request;
                }
                Err(SendError::Unsent(_)) => return Err(UpstreamError::ClosedBeforeSending),
                // The client's body broke while it was sent: the connection is closed (the
                // backend holds half a request), the fault is the client's.
                Err(SendError::Sent(e)) if e.is_client() => return Err(UpstreamError::Client(e)),
                Err(SendError::Sent(e)) => return Err(UpstreamError::Exchange(e)),
            }
        }
    }

    /// Sends a WebSocket handshake on a new connection, driven by a task of its own so that
    /// `hyper::upgrade::on` can take the connection over once the backend switches protocols.
    pub async fn send_upgrade(
        &self,
        mut request: Request<Body>,
    ) -> Result<Response<Incoming>, UpstreamError> {
        request
            .headers_mut()
            .insert(header::HOST, self.host.clone());
        let io = self.dial().await?;
        let (mut sender, driver) = http1::Builder::new()
            .handshake(io)
            .await
            .map_err(|e| UpstreamError::Connect(e.into()))?;
        self.opened.inc();
        tokio::spawn(async move {
            if let Err(e) = driver.with_upgrades().await {
                tracing::debug!(error = %e, "backend upgrade connection ended with an error");
            }
        });
        sender
            .send_request(request)
            .await
            .map_err(UpstreamError::Upgrade)
    }

    /// The most recently returned idle connection still usable, if any. Others met on the way
    /// (past [`IDLE_TIMEOUT`], or closed by the backend while waiting) are dropped.
    fn checkout(&self, cx: &mut Context<'_>, now: Instant) -> Option<Box<Conn>> {
        loop {
            let mut entry = self.idle.lock().ok()?.pop()?;
            if now.duration_since(entry.since) > IDLE_TIMEOUT {
                continue;
            }
            // Read once: a connection the backend closed reads its end now.
            if entry.conn.poll_idle_closed(cx) {
                continue;
            }
            return Some(entry.conn);
        }
    }

    /// Returns a connection after its exchange; closed instead when the pool is full.
    fn put(&self, mut conn: Box<Conn>, now: Instant) {
        conn.shrink_idle();
        let Ok(mut idle) = self.idle.lock() else {
            return;
        };
        if idle.len() < self.max_idle {
            idle.push(Idle { conn, since: now });
        } else {
            drop(idle);
            drop(conn);
        }
    }

    /// Dials the origin (TCP, then TLS for `https://`).
    async fn dial(&self) -> Result<Io, UpstreamError> {
        self.connector
            .clone()
            .oneshot(self.origin.clone())
            .await
            .map_err(UpstreamError::Connect)
    }

    /// Opens a connection. Boxed: the connection's state (buffers, TLS session) is kilobytes,
    /// and every future holding it would grow by as much and move it on each poll.
    async fn open(&self) -> Result<Box<Conn>, UpstreamError> {
        let io = self.dial().await?;
        self.opened.inc();
        Ok(Box::new(Connection::new(TokioIo::new(io))))
    }

    /// Drops idle connections past [`IDLE_TIMEOUT`] or closed by the backend; answers how many.
    fn sweep(&self, now: Instant) -> usize {
        let mut cx = Context::from_waker(Waker::noop());
        let dropped: Vec<Idle> = {
            let Ok(mut idle) = self.idle.lock() else {
                return 0;
            };
            let mut kept = Vec::with_capacity(idle.len());
            let mut dropped = Vec::new();
            for mut entry in idle.drain(..) {
                if now.duration_since(entry.since) > IDLE_TIMEOUT
                    || entry.conn.poll_idle_closed(&mut cx)
                {
                    dropped.push(entry);
                } else {
                    kept.push(entry);
                }
            }
            *idle = kept;
            dropped
        };
        dropped.len()
    }
}

/// An answer's body, streamed from its connection. The connection goes back to its pool once
/// the body has ended, and is closed if the body is dropped before (or fails).
pub struct PooledBody {
    /// `None` once the body has ended or failed.
    conn: Option<Box<Conn>>,
    pool: Arc<OriginPool>,
}

impl std::fmt::Debug for PooledBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PooledBody")
            .field("pool", &self.pool)
            .finish_non_exhaustive()
    }
}

impl PooledBody {
    /// Gives the connection back if it takes another request.
    fn release(&mut self) {
        if let Some(conn) = self.conn.take()
            && conn.is_reusable()
        {
            self.pool.put(conn, Instant::now());
        }
    }
}

impl http_body::Body for PooledBody {
    type Data = Bytes;
    type Error = WireError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, WireError>>> {
        let this = &mut *self;
        let Some(conn) = &mut this.conn else {
            return Poll::Ready(None);
        };
        let frame = std::task::ready!(conn.poll_body(cx));
        match &frame {
            Some(Err(_)) => this.conn = None,
            None => this.release(),
            // The last bytes: the connection goes back now, not at the next poll.
            Some(Ok(_)) if conn.body_ended() => this.release(),
            Some(Ok(_)) => {}
        }
        Poll::Ready(frame.map(|r| r.map(Frame::data)))
    }

    fn is_end_stream(&self) -> bool {
        self.conn.as_ref().is_none_or(|c| c.body_ended())
    }

    fn size_hint(&self) -> SizeHint {
        match self.conn.as_ref().map_or(Some(0), |c| c.body_left()) {
            Some(n) => SizeHint::with_exact(n),
            None => SizeHint::default(),
        }
    }
}

impl Drop for PooledBody {
    fn drop(&mut self) {
        // A body with nothing to read (no content, or all of it read) is not always polled to
        // its end: the exchange is over all the same.
        if self.conn.as_ref().is_some_and(|c| c.body_ended()) {
            self.release();
        }
    }
}

/// An HTTP backend: the pool of its origin and the path its base URL starts with.
#[derive(Debug, Clone)]
pub struct Backend {
    pub pool: Arc<OriginPool>,
    /// The base URL's path, without its trailing `/` (often empty).
    prefix: Box<str>,
}

impl Backend {
    /// The origin-form target of a request: the base's path + `rest` + the query without its
    /// `apikey` parameters.
    pub fn uri(&self, rest: &str, query: Option<&str>) -> Result<Uri, GatewayError> {
        let query = crate::headers::query_without_apikey(query);
        let query = query.as_deref();
        let slash = !rest.starts_with('/');
        // Exactly the target's length: `Uri` takes the string's buffer as it is, where a
        // buffer with room to spare would be handed over with an allocation of its own.
        let mut target = String::with_capacity(
            self.prefix.len() + usize::from(slash) + rest.len() + query.map_or(0, |q| q.len() + 1),
        );
        target.push_str(&self.prefix);
        if slash {
            target.push('/');
        }
        target.push_str(rest);
        if let Some(q) = query {
            target.push('?');
            target.push_str(q);
        }
        Uri::try_from(target).map_err(|_| {
            GatewayError::bad_request("invalid_path", "the request path cannot be forwarded")
        })
    }
}

/// The pools of every origin, and what dials them.
pub struct Pools {
    connector: Connector,
    max_idle: usize,
    opened: IntCounterVec,
    /// Origins named by a request (dedicated PostgREST targets), by `scheme://authority`.
    dynamic: Mutex<HashMap<String, Arc<OriginPool>>>,
    /// Origins named in the configuration (storage, realtime).
    fixed: Mutex<Vec<Weak<OriginPool>>>,
}

impl std::fmt::Debug for Pools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pools")
            .field("max_idle", &self.max_idle)
            .finish_non_exhaustive()
    }
}

impl Pools {
    /// Pools dialing with `connector`, keeping at most `max_idle` idle connections per origin,
    /// counting the connections they open in `opened` (by backend).
    pub fn new(connector: Connector, max_idle: usize, opened: IntCounterVec) -> Arc<Self> {
        Arc::new(Self {
            connector,
            max_idle,
            opened,
            dynamic: Mutex::default(),
            fixed: Mutex::default(),
        })
    }

    /// The backend of a configured base URL, with a pool of its own; `name` labels its count
    /// of opened connections.
    pub fn configured(&self, name: &str, base: &str) -> Option<Backend> {
        let (origin, prefix) = split_base(base)?;
        let pool = Arc::new(self.pool_for(name, origin)?);
        if let Ok(mut fixed) = self.fixed.lock() {
            fixed.push(Arc::downgrade(&pool));
        }
        Some(Backend { pool, prefix })
    }

    /// The backend of a base URL named by a request (a dedicated PostgREST target), its pool
    /// shared with every base of the same origin.
    pub fn named(&self, name: &str, base: &str) -> Result<Backend, GatewayError> {
        let invalid = || {
            GatewayError::unavailable(
                "db_target_not_allowed",
                "the project's dedicated database endpoint is not a valid URL",
            )
        };
        let (origin, prefix) = split_base(base).ok_or_else(invalid)?;
        let key = origin.to_string();
        let mut dynamic = self.dynamic.lock().map_err(|_| invalid())?;
        if let Some(pool) = dynamic.get(&key) {
            return Ok(Backend {
                pool: pool.clone(),
                prefix,
            });
        }
        let pool = Arc::new(self.pool_for(name, origin).ok_or_else(invalid)?);
        dynamic.insert(key, pool.clone());
        Ok(Backend { pool, prefix })
    }

    fn pool_for(&self, name: &str, origin: Uri) -> Option<OriginPool> {
        let host = host_value(&origin)?;
        Some(OriginPool {
            origin,
            host,
            connector: self.connector.clone(),
            idle: Mutex::default(),
            max_idle: self.max_idle,
            opened: self.opened.with_label_values(&[name]),
        })
    }

    /// Sweeps every pool; forgets request-named origins no request holds and with nothing idle.
    pub fn sweep(&self, now: Instant) -> usize {
        let mut swept = 0;
        if let Ok(fixed) = self.fixed.lock() {
            for pool in fixed.iter().filter_map(Weak::upgrade) {
                swept += pool.sweep(now);
            }
        }
        if let Ok(mut dynamic) = self.dynamic.lock() {
            dynamic.retain(|_, pool| {
                swept += pool.sweep(now);
                Arc::strong_count(pool) > 1 || pool.idle_count() > 0
            });
        }
        swept
    }

    /// Runs [`Pools::sweep`] every [`SWEEP_EVERY`] while the pools are alive.
    pub fn spawn_sweeper(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick =
                tokio::time::interval_at(tokio::time::Instant::now() + SWEEP_EVERY, SWEEP_EVERY);
            loop {
                tick.tick().await;
                let Some(pools) = weak.upgrade() else { break };
                let closed = pools.sweep(Instant::now());
                if closed > 0 {
                    tracing::debug!(closed, "idle backend connections closed");
                }
            }
        });
    }
}

/// A base URL's origin (`scheme://authority`) and path (without its trailing `/`). `None`
/// unless it is an `http://` or `https://` URL with a host.
fn split_base(base: &str) -> Option<(Uri, Box<str>)> {
    let uri: Uri = base.parse().ok()?;
    let scheme = uri
        .scheme()
        .filter(|s| matches!(s.as_str(), "http" | "https"))?;
    uri.host()?;
    let origin = Uri::builder()
        .scheme(scheme.clone())
        .authority(uri.authority()?.clone())
        .path_and_query("/")
        .build()
        .ok()?;
    let prefix = uri.path().trim_end_matches('/').into();
    Some((origin, prefix))
}

/// The `Host` of an origin: its host, and its port unless the scheme's default.
fn host_value(origin: &Uri) -> Option<HeaderValue> {
    let host = origin.host()?;
    let default_port = match origin.scheme_str() {
        Some("https") => 443,
        _ => 80,
    };
    let value = match origin.port_u16() {
        Some(port) if port != default_port => format!("{host}:{port}"),
        _ => host.to_owned(),
    };
    HeaderValue::from_str(&value).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_base_splits_into_its_origin_and_path() {
        let (origin, prefix) = split_base("http://s:5000/storage/v1/").expect("base");
        assert_eq!(origin, "http://s:5000/");
        assert_eq!(&*prefix, "/storage/v1");
        let (origin, prefix) = split_base("https://pg.example").expect("base");
        assert_eq!(origin, "https://pg.example/");
        assert_eq!(&*prefix, "");
        assert!(split_base("ftp://x/").is_none());
        assert!(split_base("/relative").is_none());
    }

    #[test]
    fn the_host_header_names_the_port_unless_it_is_the_default() {
        let host = |base: &str| host_value(&split_base(base).expect("base").0).expect("host");
        assert_eq!(host("http://s:5000"), "s:5000");
        assert_eq!(host("http://s:80/x"), "s");
        assert_eq!(host("https://s:443"), "s");
        assert_eq!(host("https://s:80"), "s:80");
        assert_eq!(host("http://user:pw@s:81"), "s:81");
        assert_eq!(host("http://[::1]:8080"), "[::1]:8080");
    }

    fn backend(base: &str) -> Backend {
        let (origin, prefix) = split_base(base).expect("base");
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(crate::tls::client_config("t", None, false).expect("tls"))
            .https_or_http()
            .enable_http1()
            .wrap_connector(HttpConnector::new_with_resolver(
                crate::dns::Resolver::system().for_backends(),
            ));
        let pools = Pools::new(
            connector,
            1,
            IntCounterVec::new(prometheus::Opts::new("t", "t"), &["backend"]).expect("metric"),
        );
        Backend {
            pool: Arc::new(pools.pool_for("t", origin).expect("pool")),
            prefix,
        }
    }

    #[test]
    fn targets_join_the_base_path_the_rest_and_the_query() {
        let b = backend("http://s:5000");
        assert_eq!(
            b.uri("/object/a.png", Some("x=1&apikey=k")).expect("uri"),
            "/object/a.png?x=1"
        );
        assert_eq!(b.uri("", None).expect("uri"), "/");
        let b = backend("http://s:5000/storage/v1/");
        assert_eq!(b.uri("/object", None).expect("uri"), "/storage/v1/object");
        assert_eq!(b.uri("object", None).expect("uri"), "/storage/v1/object");
        assert!(b.uri("/a b", None).is_err());
    }

    /// A backend that accepts connections and counts those still open.
    async fn holding_backend() -> (String, Arc<std::sync::atomic::AtomicUsize>) {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use tokio::io::AsyncReadExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let open = Arc::new(AtomicUsize::new(0));
        let count = open.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                let count = count.clone();
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    while matches!(stream.read(&mut buf).await, Ok(n) if n > 0) {}
                    count.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        (url, open)
    }

    async fn until_open(open: &std::sync::atomic::AtomicUsize, want: usize) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while open.load(std::sync::atomic::Ordering::SeqCst) != want && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(open.load(std::sync::atomic::Ordering::SeqCst), want);
    }

    #[tokio::test]
    async fn idle_connections_are_used_within_the_idle_timeout_and_closed_past_it() {
        let (url, open) = holding_backend().await;
        let b = backend(&url);
        let mut cx = Context::from_waker(Waker::noop());
        let t0 = Instant::now();
        let conn = b.pool.open().await.expect("connected");
        until_open(&open, 1).await;
        b.pool.put(conn, t0);
        assert_eq!(b.pool.idle_count(), 1);

        // Taken just before its idle time runs out: the same connection.
        let conn = b
            .pool
            .checkout(&mut cx, t0 + IDLE_TIMEOUT - Duration::from_secs(1))
            .expect("an idle connection within the timeout");
        b.pool.put(conn, t0);
        // Just after: closed rather than used.
        assert!(
            b.pool
                .checkout(&mut cx, t0 + IDLE_TIMEOUT + Duration::from_secs(1))
                .is_none()
        );
        assert_eq!(b.pool.idle_count(), 0);
        until_open(&open, 0).await;

        // The sweep keeps what is within the timeout and closes what is past it.
        let conn = b.pool.open().await.expect("connected");
        until_open(&open, 1).await;
        b.pool.put(conn, t0);
        assert_eq!(b.pool.sweep(t0 + Duration::from_secs(1)), 0);
        assert_eq!(b.pool.idle_count(), 1);
        assert_eq!(b.pool.sweep(t0 + IDLE_TIMEOUT + Duration::from_secs(1)), 1);
        assert_eq!(b.pool.idle_count(), 0);
        until_open(&open, 0).await;
    }
}
