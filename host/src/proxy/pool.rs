//! HTTP/1.1 connections to the HTTP backends, pooled per origin and driven by the request that
//! uses one.
//!
//! A connection is not a task of its own. The request that checked it out polls it while it
//! waits for the answer's head, and the answer's body polls it while the body streams to the
//! client. So an exchange costs no hand-over to a connection task and back (two task wake-ups
//! and a channel each way), and no pool lookup by a hashed authority: each backend resolves its
//! origin's pool once ([`Backend`]).
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
//! - **WebSocket upgrades** take a new connection, driven by a task of its own until the
//!   handshake hands the connection to the tunnel.

use std::collections::HashMap;
use std::future::{Future, poll_fn};
use std::pin::{Pin, pin};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll, Waker, ready};
use std::time::{Duration, Instant};

use axum::body::Body;
use bytes::Bytes;
use http::{HeaderValue, Request, Response, Uri, header};
use http_body::{Body as _, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_rustls::{HttpsConnector, MaybeHttpsStream};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioIo;
use prometheus::{IntCounter, IntCounterVec};
use tokio::net::TcpStream;
use tower::ServiceExt;

use crate::error::GatewayError;

/// What dials a backend: TCP (with the connect timeout), then TLS for `https://`.
pub type Connector = HttpsConnector<HttpConnector>;
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
    Exchange(#[source] hyper::Error),
}

impl UpstreamError {
    /// Whether the backend could not be reached at all.
    pub fn is_connect(&self) -> bool {
        !matches!(self, Self::Exchange(_))
    }
}

/// One connection: the handle requests are sent on, and the state machine that does the I/O
/// (`None` once the connection has closed).
struct Conn {
    sender: http1::SendRequest<Body>,
    driver: Option<http1::Connection<Io, Body>>,
}

impl Conn {
    /// Drives the connection's I/O; `true` once it has closed, for good. A closed connection's
    /// state is dropped at once: that fails the exchange still queued on it (handing back a
    /// request it never wrote) instead of leaving it waiting for an answer that cannot come.
    fn poll_closed(&mut self, cx: &mut Context<'_>) -> bool {
        if let Some(driver) = &mut self.driver
            && let Poll::Ready(result) = Pin::new(driver).poll(cx)
        {
            if let Err(e) = result {
                tracing::debug!(error = %e, "backend connection closed with an error");
            }
            self.driver = None;
        }
        self.driver.is_none()
    }

    /// Whether the connection takes another request now.
    fn is_reusable(&self) -> bool {
        self.driver.is_some() && self.sender.is_ready()
    }
}

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

    /// Sends `request` (its URI in origin form: path and query) and answers with the head of
    /// the backend's answer. The body streams from the connection, which goes back to the
    /// pool after it.
    pub async fn send(
        self: &Arc<Self>,
        mut request: Request<Body>,
    ) -> Result<Response<PooledBody>, UpstreamError> {
        request
            .headers_mut()
            .insert(header::HOST, self.host.clone());
        let mut pooled = poll_fn(|cx| Poll::Ready(self.checkout(cx, Instant::now()))).await;
        loop {
            let reused = pooled.is_some();
            let mut conn = match pooled.take() {
                Some(conn) => conn,
                // Boxed: connecting is the rare case, and its state would otherwise make the
                // future of every request larger.
                None => Box::pin(self.connect()).await?,
            };
            // A pooled connection was ready when taken; a new one gets ready after its first
            // turns.
            if !conn.sender.is_ready() {
                let ready = poll_fn(|cx| {
                    if conn.poll_closed(cx) {
                        return Poll::Ready(false);
                    }
                    conn.sender.poll_ready(cx).map(|r| r.is_ok())
                })
                .await;
                if !ready {
                    if reused {
                        continue;
                    }
                    return Err(UpstreamError::ClosedBeforeSending);
                }
            }
            let mut exchange = pin!(conn.sender.try_send_request(request));
            // The connection is driven first (it writes the request, then reads the answer and
            // hands it over), then the exchange is asked for the answer.
            let result = poll_fn(|cx| {
                conn.poll_closed(cx);
                exchange.as_mut().poll(cx)
            })
            .await;
            match result {
                Ok(response) => {
                    let pool = self.clone();
                    return Ok(response.map(|body| PooledBody {
                        body,
                        conn: Some(conn),
                        pool,
                    }));
                }
                Err(mut failed) => match failed.take_message() {
                    // Handed back unwritten by a connection that closed under it.
                    Some(unsent) if reused => request = unsent,
                    _ => return Err(UpstreamError::Exchange(failed.into_error())),
                },
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
        let Conn { mut sender, driver } = *self.connect().await?;
        let Some(driver) = driver else {
            return Err(UpstreamError::ClosedBeforeSending);
        };
        tokio::spawn(async move {
            if let Err(e) = driver.with_upgrades().await {
                tracing::debug!(error = %e, "backend upgrade connection ended with an error");
            }
        });
        sender
            .send_request(request)
            .await
            .map_err(UpstreamError::Exchange)
    }

    /// The most recently returned idle connection still usable, if any. Others met on the way
    /// (past [`IDLE_TIMEOUT`], or closed by the backend while waiting) are dropped.
    fn checkout(&self, cx: &mut Context<'_>, now: Instant) -> Option<Box<Conn>> {
        loop {
            let mut entry = self.idle.lock().ok()?.pop()?;
            if now.duration_since(entry.since) > IDLE_TIMEOUT {
                continue;
            }
            // Driven once: a connection the backend closed reads its end now.
            if entry.conn.poll_closed(cx) || !entry.conn.is_reusable() {
                continue;
            }
            return Some(entry.conn);
        }
    }

    /// Returns a connection after its exchange; closed instead when the pool is full.
    fn put(&self, conn: Box<Conn>, now: Instant) {
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

    /// Opens a connection. Boxed: the connection's state (buffers, TLS session) is kilobytes,
    /// and every future holding it would grow by as much and move it on each poll.
    async fn connect(&self) -> Result<Box<Conn>, UpstreamError> {
        let io = self
            .connector
            .clone()
            .oneshot(self.origin.clone())
            .await
            .map_err(UpstreamError::Connect)?;
        let (sender, driver) = http1::Builder::new()
            .handshake(io)
            .await
            .map_err(|e| UpstreamError::Connect(e.into()))?;
        self.opened.inc();
        Ok(Box::new(Conn {
            sender,
            driver: Some(driver),
        }))
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
                if now.duration_since(entry.since) > IDLE_TIMEOUT || entry.conn.poll_closed(&mut cx)
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
/// the body has ended, and is closed if the body is dropped before.
pub struct PooledBody {
    body: Incoming,
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
    /// Gives the connection back if the exchange is over and it takes another request.
    fn release(&mut self, cx: &mut Context<'_>) {
        if let Some(mut conn) = self.conn.take()
            // Usually the connection asked for the next request as it delivered the body's
            // end; if not, one more turn lets it finish the exchange.
            && (conn.is_reusable() || (!conn.poll_closed(cx) && conn.is_reusable()))
        {
            self.pool.put(conn, Instant::now());
        }
    }
}

impl http_body::Body for PooledBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        // The body is read first: what the connection already delivered needs no turn of it.
        let frame = match Pin::new(&mut this.body).poll_frame(cx) {
            Poll::Ready(frame) => frame,
            Poll::Pending => {
                let Some(conn) = &mut this.conn else {
                    return Poll::Pending;
                };
                if conn.poll_closed(cx) {
                    this.conn = None;
                }
                ready!(Pin::new(&mut this.body).poll_frame(cx))
            }
        };
        match &frame {
            Some(Err(_)) => this.conn = None,
            None => this.release(cx),
            Some(Ok(_)) if this.body.is_end_stream() => this.release(cx),
            Some(Ok(_)) => {}
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl Drop for PooledBody {
    fn drop(&mut self) {
        // A body with nothing to read (no content, or all of it read) is not always polled to
        // its end: the exchange is over all the same.
        if self.conn.is_some() && self.body.is_end_stream() {
            self.release(&mut Context::from_waker(Waker::noop()));
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
        let mut target = String::with_capacity(
            self.prefix.len() + rest.len() + query.map_or(0, |q| q.len() + 1) + 1,
        );
        target.push_str(&self.prefix);
        if !rest.starts_with('/') {
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
            .wrap_connector(HttpConnector::new());
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
        let conn = b.pool.connect().await.expect("connected");
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
        let conn = b.pool.connect().await.expect("connected");
        until_open(&open, 1).await;
        b.pool.put(conn, t0);
        assert_eq!(b.pool.sweep(t0 + Duration::from_secs(1)), 0);
        assert_eq!(b.pool.idle_count(), 1);
        assert_eq!(b.pool.sweep(t0 + IDLE_TIMEOUT + Duration::from_secs(1)), 1);
        assert_eq!(b.pool.idle_count(), 0);
        until_open(&open, 0).await;
    }
}
