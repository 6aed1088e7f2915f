//! The listeners, through the real binary: connections that never speak (in clear text, after a
//! TLS handshake, or with a part of the HTTP/2 preface), HTTP/2 connections that hold a slot
//! without a stream or stop answering PINGs, HTTP/2 connections multiplexing more long-lived
//! streams than the listener's budget, and an HTTP/2 stream whose client makes no room for its
//! answer; a part of the HTTP/2 preface held by a thousand connections at no CPU, and a preface
//! cut in two writes.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use rustls::pki_types::ServerName;
use tokio::io::AsyncWriteExt;

use crate::support::builder::{Gateway, Started};
use crate::support::call::Call;
use crate::support::gateway::Process;
use crate::support::h2raw;
use crate::support::metrics::metric;
use crate::support::pki::Pki;
use crate::support::poll::poll_every;
use crate::support::upstream::SseBackend;

/// A gateway binary with `toml`.
fn started(toml: impl AsRef<str>) -> Started {
    Gateway::builder().toml(toml).binary()
}

async fn closed_count(gw: &Process, plane: &str, reason: &str) -> f64 {
    let labels = [format!("plane=\"{plane}\""), format!("reason=\"{reason}\"")];
    let text = gw.metrics().await;
    metric(
        &text,
        "aura_connections_closed_total",
        &[&labels[0], &labels[1]],
    )
}

/// A TLS client of the management plane offering `alpn`, the handshake done.
async fn tls_connection(
    port: u16,
    pki: &Pki,
    alpn: &[&[u8]],
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await;
    let connector =
        tokio_rustls::TlsConnector::from(std::sync::Arc::new(pki.rustls_client(alpn, false)));
    let localhost = ServerName::try_from("localhost").expect("name");
    connector
        .connect(localhost, tcp.expect("connect"))
        .await
        .expect("handshake")
}

/// `GET path` (with `apikey` when given) on an HTTP/2 connection, once it has room for a stream:
/// the answer's head and body.
async fn h2_get(
    client: h2::client::SendRequest<bytes::Bytes>,
    port: u16,
    path: &str,
    apikey: Option<&str>,
) -> (
    h2::client::SendRequest<bytes::Bytes>,
    http::Response<h2::RecvStream>,
) {
    let mut client = client.ready().await.expect("ready");
    let mut request = http::Request::get(format!("http://127.0.0.1:{port}{path}"));
    if let Some(key) = apikey {
        request = request.header("apikey", key);
    }
    let request = request.body(()).expect("request");
    let (response, _) = client.send_request(request, true).expect("send");
    (client, response.await.expect("response"))
}

/// Every one of `connections` is closed by the gateway within 5 s.
async fn all_closed(connections: &mut [impl tokio::io::AsyncRead + Unpin], what: &str) {
    for (i, s) in connections.iter_mut().enumerate() {
        let closed = h2raw::closed_within(s, Duration::from_secs(5)).await;
        assert!(closed.is_some(), "{what} {i} is still open");
    }
}

/// Until `done` holds (polled every 20 ms); fails naming `what` after 5 s.
async fn within_five_seconds(what: &str, done: impl Fn() -> bool) {
    let every = Duration::from_millis(20);
    let held = poll_every(Duration::from_secs(5), every, async || done().then_some(()));
    assert!(held.await.is_some(), "{what}");
}

/// Four connections at `max_connections = 4` that never start a request — two silent, two
/// that send only `P` (the first byte of the HTTP/2 preface, and of `POST`) — used to hold the
/// listener for good: protocol detection read without a deadline. They are closed at the
/// header timeout and the listener serves again; the same after a completed TLS handshake with
/// ALPN `h2` and with nothing sent.
#[tokio::test]
async fn connections_that_never_start_a_request_are_closed_at_the_header_timeout() {
    let pki_dir = tempfile::tempdir().expect("tempdir");
    let pki = Pki::new(pki_dir.path(), "listener");
    let (cert, key) = (pki.server_cert.display(), pki.server_key.display());
    let Started { gw, dir: _dir, .. } = started(format!(
        "[server]\nmax_connections = 4\nheader_read_timeout_ms = 1000\n\n\
         [management_plane.tls]\ncert_file = \"{cert}\"\nkey_file = \"{key}\"\n",
    ));
    let data = ("127.0.0.1", gw.port);

    let mut held = Vec::new();
    for i in 0..4 {
        let mut s = tokio::net::TcpStream::connect(data).await.expect("connect");
        if i % 2 == 1 {
            s.write_all(b"P").await.expect("P");
        }
        held.push(s);
    }
    // The listener's four slots are taken: a real request waits in the backlog until the
    // header timeout frees them, and is then served.
    let started = Instant::now();
    let health = Call::get(gw.data_url("/health")).try_send();
    let answer = tokio::time::timeout(Duration::from_secs(10), health).await;
    let answer = answer.expect("served within the header timeout, not held");
    assert_eq!(answer.expect("answer").status(), StatusCode::OK);
    let waited = started.elapsed();
    eprintln!("a request behind four silent connections was served after {waited:?}");
    all_closed(&mut held, "silent connection").await;
    assert!(closed_count(&gw, "data", "silent").await >= 4.0);

    // After TLS: the handshake is done, ALPN says h2, and nothing more comes.
    let mut tls = Vec::new();
    for _ in 0..4 {
        tls.push(tls_connection(gw.management_port, &pki, &[b"h2"]).await);
    }
    let started = Instant::now();
    let mut health = tls_connection(gw.management_port, &pki, &[b"http/1.1"]).await;
    let answer = tokio::time::timeout(Duration::from_secs(10), async {
        use tokio::io::AsyncReadExt;
        let get = b"GET /health HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n";
        health.write_all(get).await.expect("write");
        let mut out = Vec::new();
        let _ = health.read_to_end(&mut out).await;
        String::from_utf8_lossy(&out).into_owned()
    });
    let answer = answer.await.expect("served within the header timeout");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let waited = started.elapsed();
    eprintln!("a TLS request behind four silent TLS connections was served after {waited:?}");
    all_closed(&mut tls, "silent TLS connection").await;
    assert!(closed_count(&gw, "management", "silent").await >= 4.0);
}

/// The CPU time `pid` has used so far (user and system), in seconds: fields 14 and 15 of
/// `/proc/PID/stat`, in the kernel's fixed 100 ticks a second.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("process stat");
    // The command name (field 2) may hold spaces; the fields after it are counted from its `)`.
    let after = &stat[stat.rfind(')').expect("stat") + 2..];
    let fields: Vec<&str> = after.split(' ').collect();
    let ticks = |i: usize| fields[i - 3].parse::<u64>().expect("ticks");
    (ticks(14) + ticks(15)) as f64 / 100.0
}

/// A thousand clear-text connections that send only `P` (the first byte of the HTTP/2 preface,
/// and of `POST`) used to be polled every 5 ms until the header timeout: a quarter of a core in
/// a release build, for nothing. They wait on readability now: the gateway's CPU time while
/// they are held stays near zero, and they are closed at the header timeout.
#[tokio::test]
async fn connections_holding_a_part_of_the_http2_preface_cost_no_cpu() {
    const CONNECTIONS: usize = 1_000;
    let Started { gw, dir: _dir, .. } =
        started("[server]\nmax_connections = 2000\nheader_read_timeout_ms = 12000\n");
    let pid = gw.child.id();
    let window = Duration::from_secs(3);
    let idle_from = cpu_seconds(pid);
    tokio::time::sleep(window).await;
    let idle = cpu_seconds(pid) - idle_from;

    let opened = Instant::now();
    let mut held = Vec::with_capacity(CONNECTIONS);
    for _ in 0..CONNECTIONS {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", gw.port))
            .await
            .expect("connect");
        s.write_all(b"P").await.expect("P");
        held.push(s);
    }
    let all_open = opened.elapsed();
    // Accepted and waiting: the measure starts once the last one is in.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let from = cpu_seconds(pid);
    tokio::time::sleep(window).await;
    let used = cpu_seconds(pid) - from;
    let share = used / window.as_secs_f64();
    eprintln!(
        "{CONNECTIONS} connections holding `P` (opened in {all_open:?}): the gateway used \
         {used:.2} s of CPU in {window:?} ({:.1} % of a core; {idle:.2} s with none)",
        share * 100.0
    );
    // Still held while measured: nothing closed them early. The header timeout is long enough
    // for a slow machine to open all of them and measure before the first is due; the last one
    // opened is checked all the same, since it is the furthest from its timeout.
    let last = held.last_mut().expect("connections");
    let closed = h2raw::closed_within(last, Duration::from_millis(10)).await;
    assert!(closed.is_none(), "closed before the header timeout");
    assert!(share < 0.05, "{:.1} % of a core", share * 100.0);

    // The header timeout closes every one of them, counted as silent.
    for (i, s) in held.iter_mut().enumerate() {
        let closed = h2raw::closed_within(s, Duration::from_secs(16)).await;
        assert!(closed.is_some(), "connection {i} is still open");
    }
    let lived = opened.elapsed();
    eprintln!("all were closed {lived:?} after the first was opened");
    assert!(lived >= Duration::from_millis(11_500), "{lived:?}");
    assert!(closed_count(&gw, "data", "silent").await >= CONNECTIONS as f64);
}

/// A TCP stream whose first `skip` bytes written are dropped: the client has sent them itself.
struct Skipping {
    inner: tokio::net::TcpStream,
    skip: usize,
}

impl tokio::io::AsyncRead for Skipping {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for Skipping {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        if self.skip > 0 {
            let n = self.skip.min(buf.len());
            self.skip -= n;
            return std::task::Poll::Ready(Ok(n));
        }
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
}

/// A preface that arrives in two writes (`P`, then the rest with the client's first frames)
/// is still HTTP/2 — the bytes read while waiting for the rest are served first — and so is
/// one cut after `PRI * HTTP`; a `P` followed by `OST` is HTTP/1.1.
#[tokio::test]
async fn a_preface_cut_in_two_writes_is_still_http2() {
    let Started { gw, dir: _dir, .. } = started("[server]\nheader_read_timeout_ms = 5000\n");
    for cut in [1, 10, 23] {
        let mut tcp = tokio::net::TcpStream::connect(("127.0.0.1", gw.port))
            .await
            .expect("connect");
        tcp.write_all(&h2raw::PREFACE[..cut]).await.expect("part");
        tokio::time::sleep(Duration::from_millis(200)).await;
        let io = Skipping {
            inner: tcp,
            skip: cut,
        };
        let (client, connection) = h2::client::handshake(io).await.expect("h2 handshake");
        tokio::spawn(connection);
        let (_client, response) = h2_get(client, gw.port, "/health", None).await;
        eprintln!("a preface cut after {cut} bytes: {}", response.status());
        assert_eq!(response.status(), 200, "cut after {cut} bytes");
    }
    let mut tcp = tokio::net::TcpStream::connect(("127.0.0.1", gw.port))
        .await
        .expect("connect");
    tcp.write_all(b"P").await.expect("P");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let post = "OST /health HTTP/1.1\r\nhost: gw\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
    tcp.write_all(post.as_bytes()).await.expect("rest");
    let mut answer = Vec::new();
    let read = tokio::io::AsyncReadExt::read_to_end(&mut tcp, &mut answer);
    tokio::time::timeout(Duration::from_secs(5), read)
        .await
        .expect("answered")
        .expect("read");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 "), "{answer}");
}

/// An HTTP/2 connection that sends the preface and then only PINGs — no stream — is closed at
/// the header timeout; one whose streams are done is closed after the idle timeout.
#[tokio::test]
async fn an_http2_connection_without_streams_is_closed_and_pings_do_not_keep_it() {
    let Started { gw, dir: _dir, .. } =
        started("[server]\nheader_read_timeout_ms = 1000\nhttp2_idle_timeout_ms = 1500\n");
    let data = ("127.0.0.1", gw.port);

    let mut pinging = h2raw::connect(data).await;
    let pinger = {
        let started = Instant::now();
        async move {
            let mut closed = None;
            for i in 0u8..40 {
                if pinging.write_all(&h2raw::ping([i; 8])).await.is_err() {
                    closed = Some(started.elapsed());
                    break;
                }
                let quiet = Duration::from_millis(150);
                if let Some(after) = h2raw::closed_within(&mut pinging, quiet).await {
                    closed = Some(started.elapsed() - quiet + after);
                    break;
                }
            }
            closed
        }
    };
    let closed = pinger
        .await
        .expect("a connection that only pings is closed");
    eprintln!("an HTTP/2 connection that only pinged was closed after {closed:?}");
    assert!(closed < Duration::from_secs(5), "{closed:?}");

    // A real client: one request, then nothing; the idle timeout ends the connection.
    let tcp = tokio::net::TcpStream::connect(data).await.expect("connect");
    let (client, connection) = h2::client::handshake(tcp).await.expect("h2 handshake");
    let ended = tokio::spawn(async move {
        let started = Instant::now();
        let _ = connection.await;
        started.elapsed()
    });
    let (_client, response) = h2_get(client, gw.port, "/health", None).await;
    assert_eq!(response.status(), 200);
    drop(response);
    let lived = tokio::time::timeout(Duration::from_secs(10), ended).await;
    let lived = lived
        .expect("the idle connection was closed")
        .expect("task");
    eprintln!("an idle HTTP/2 connection lived {lived:?}");
    let early = lived < Duration::from_millis(1000);
    assert!(!early, "closed before its idle timeout: {lived:?}");
    assert!(closed_count(&gw, "data", "idle").await >= 2.0);
}

/// An HTTP/2 client that opened a long-lived stream and stops answering PINGs is gone: the
/// connection and its backend stream are closed after the keep-alive budget, however long the
/// stream was allowed to stay idle.
#[tokio::test]
async fn an_http2_client_that_stops_answering_pings_is_dropped_with_its_streams() {
    let sse = SseBackend::start().await;
    let Started { gw, fx, dir: _dir } = started(format!(
        "[server]\nhttp2_keep_alive_interval_ms = 300\nhttp2_keep_alive_timeout_ms = 300\n\n\
         [upstreams]\nrealtime_url = \"{}\"\n",
        sse.url
    ));
    let mut raw = h2raw::connect(("127.0.0.1", gw.port)).await;
    let headers = h2raw::get(1, "/v1/realtime/sse", &[("apikey", &fx.anon_key)]);
    raw.write_all(&headers).await.expect("headers");
    within_five_seconds("no stream opened", || sse.open() > 0).await;
    // Never a PING ACK: the client reads what comes, and answers nothing.
    let closed = h2raw::closed_within(&mut raw, Duration::from_secs(10)).await;
    let closed = closed.expect("the silent client was dropped");
    eprintln!("a client that answered no PING was dropped after {closed:?}");
    within_five_seconds("the backend stream outlived its client", || sse.open() == 0).await;
}

/// `max_connections = 2` used to let one HTTP/2 connection hold a hundred SSE streams, each a
/// backend connection. Long-lived exchanges count against the listener's budget
/// (`server.max_streams`, `max_connections` by default) whatever the protocol: the streams
/// past it are refused `503 too_many_streams` before any backend connection is made, and a
/// place is free again once a stream ends. A WebSocket tunnel counts the same.
#[tokio::test]
async fn long_lived_streams_count_against_the_listeners_budget_whatever_the_protocol() {
    let sse = SseBackend::start().await;
    let Started { gw, fx, dir: _dir } = started(format!(
        "[server]\nmax_connections = 2\n\n[upstreams]\nrealtime_url = \"{}\"\n",
        sse.url
    ));
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", gw.port)).await;
    let (client, connection) = h2::client::handshake(tcp.expect("connect"))
        .await
        .expect("h2 handshake");
    tokio::spawn(connection);
    let key = Some(fx.anon_key.as_str());
    let mut client = client;
    let mut open = Vec::new();
    let mut refused = 0;
    for _ in 0..100 {
        let (next, response) = h2_get(client, gw.port, "/v1/realtime/sse", key).await;
        client = next;
        match response.status().as_u16() {
            200 => open.push(response),
            503 => {
                let mut body = response.into_body();
                let mut text = Vec::new();
                while let Some(chunk) = body.data().await {
                    text.extend_from_slice(&chunk.expect("chunk"));
                }
                let text = String::from_utf8_lossy(&text);
                assert!(text.contains("too_many_streams"), "{text}");
                refused += 1;
            }
            other => panic!("unexpected {other}"),
        }
    }
    let (opened, most) = (open.len(), sse.most());
    eprintln!(
        "100 SSE streams on one HTTP/2 connection: {opened} open, {refused} refused; backend streams at most {most}"
    );
    assert_eq!(opened, 2, "the budget is max_connections");
    assert_eq!(refused, 98);
    assert!(most <= 2, "{most} backend streams");
    let text = gw.metrics().await;
    let streams_refused = metric(&text, "aura_streams_refused_total", &["plane=\"data\""]);
    assert_eq!(streams_refused, 98.0);

    // A WebSocket upgrade on another connection finds no place either, until a stream ends.
    let ws = format!(
        "ws://127.0.0.1:{}/v1/realtime/websocket?apikey={}",
        gw.port, fx.anon_key
    );
    match tokio_tungstenite::connect_async(&ws).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            assert_eq!(response.status(), 503);
        }
        other => panic!("a tunnel past the budget: {:?}", other.map(|_| ())),
    }
    drop(open.pop());
    within_five_seconds("the stream's place stayed taken", || sse.open() <= 1).await;
    let (_client, response) = h2_get(client, gw.port, "/v1/realtime/sse", key).await;
    assert_eq!(response.status(), 200, "a place is free again");
}

/// The exchanges a backend has open: one per answer being streamed, ended when its body is
/// dropped (sent to its end, or dropped by the gateway).
#[derive(Clone, Default)]
struct Exchanges(std::sync::Arc<std::sync::atomic::AtomicUsize>);

struct Exchange(Exchanges);

impl Drop for Exchange {
    fn drop(&mut self) {
        (self.0).0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Exchanges {
    fn open(&self) -> usize {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// A body of `size` bytes in 64 KiB pieces, counted open until dropped.
    fn body(&self, size: usize) -> axum::body::Body {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let state = (0usize, Exchange(self.clone()));
        let pieces = futures::stream::unfold(state, move |(sent, exchange)| async move {
            (sent < size).then(|| {
                let piece = bytes::Bytes::from(vec![b'x'; 64 << 10]);
                (
                    Ok::<_, std::io::Error>(piece),
                    (sent + (64 << 10), exchange),
                )
            })
        });
        axum::body::Body::from_stream(pieces)
    }
}

/// An HTTP/2 client that asks for a large answer on one stream and never makes room for it (no
/// `WINDOW_UPDATE`) used to hold the stream's backend exchange and its place in
/// `server.max_streams` for as long as the connection lived: the client's stack answers the
/// PINGs, and the stream is open. After `server.send_timeout_ms` without room for the next
/// frame the stream's backend exchange is dropped and counted; the same connection's other
/// streams go on — one read slowly but steadily is served whole — and the stalled stream ends
/// with an error once its client reads again.
#[tokio::test]
async fn an_http2_stream_whose_client_reads_nothing_loses_its_backend_after_the_send_timeout() {
    const SIZE: usize = 8 << 20;
    let exchanges = Exchanges::default();
    let backend = exchanges.clone();
    let app = axum::Router::new().fallback(axum::routing::any(move || {
        let body = backend.body(SIZE);
        async move { body }
    }));
    let backend = format!("http://{}", crate::support::upstream::serve_http(app).await);
    let Started { gw, fx, dir: _dir } = started(format!(
        "[server]\nsend_timeout_ms = 1000\n\n[upstreams]\nstorage_url = \"{backend}\"\n"
    ));
    let reset = async || {
        let text = gw.metrics().await;
        let labels = ["plane=\"data\"", "reason=\"send_timeout\""];
        metric(&text, "aura_http2_streams_reset_total", &labels)
    };
    // Each stream may receive 64 KiB before its client makes room; the connection as a whole
    // 16 MiB, so that one stream left unread does not starve the others.
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", gw.port)).await;
    let (client, connection) = h2::client::Builder::new()
        .initial_window_size(65_535)
        .initial_connection_window_size(16 << 20)
        .handshake::<_, bytes::Bytes>(tcp.expect("connect"))
        .await
        .expect("h2 handshake");
    tokio::spawn(connection);
    let key = Some(fx.anon_key.as_str());
    let path = "/v1/storage/object/big";

    // Stalled: the answer's head, then nothing read.
    let (client, stalled) = h2_get(client, gw.port, path, key).await;
    assert_eq!(stalled.status(), 200);
    within_five_seconds("the backend streams the answer", || exchanges.open() == 1).await;

    // Steady, on the same connection meanwhile: read in pieces with four pauses of 400 ms (well
    // under the timeout, 1.6 s in all: longer than it).
    let (client, steady) = h2_get(client, gw.port, path, key).await;
    assert_eq!(steady.status(), 200);
    let mut body = steady.into_body();
    let (mut got, mut pauses) = (0usize, 0usize);
    while let Some(piece) = tokio::time::timeout(Duration::from_secs(10), body.data())
        .await
        .expect("the steady answer keeps coming")
    {
        let piece = piece.expect("the steady stream is not reset");
        got += piece.len();
        let _ = body.flow_control().release_capacity(piece.len());
        if pauses < 4 && got > (pauses + 1) * (SIZE / 5) {
            pauses += 1;
            tokio::time::sleep(Duration::from_millis(400)).await;
        }
    }
    assert_eq!((got, pauses), (SIZE, 4), "the steady reader got all of it");

    // The stalled stream lost its backend exchange, and only it was counted.
    let counted = poll_every(
        Duration::from_secs(10),
        Duration::from_millis(50),
        async || {
            let n = reset().await;
            (n > 0.0).then_some(n)
        },
    );
    assert_eq!(
        counted.await,
        Some(1.0),
        "the stalled stream is counted once"
    );
    within_five_seconds("the stalled backend exchange was dropped", || {
        exchanges.open() == 0
    })
    .await;
    let text = gw.metrics().await;
    let streams = metric(&text, "aura_streams_open", &["plane=\"data\""]);
    assert_eq!(streams, 0.0, "its place in server.max_streams is free");

    // The connection goes on; the stalled stream, read again, ends with an error after what
    // was sent before the timeout.
    let (_client, health) = h2_get(client, gw.port, "/health", None).await;
    assert_eq!(health.status(), 200);
    let mut body = stalled.into_body();
    let mut held = 0usize;
    let ended = loop {
        match tokio::time::timeout(Duration::from_secs(10), body.data()).await {
            Ok(Some(Ok(piece))) => {
                held += piece.len();
                let _ = body.flow_control().release_capacity(piece.len());
            }
            Ok(Some(Err(e))) => break Some(e),
            Ok(None) => break None,
            Err(_) => panic!("the stalled stream neither ends nor goes on after {held} bytes"),
        }
    };
    assert!(
        ended.is_some(),
        "the stalled stream ended cleanly after {held} bytes"
    );
    assert!(held < SIZE, "{held} bytes: the answer was not cut");
    assert_eq!(reset().await, 1.0);
}
