//! The listeners under attack, through the real binary: connections that never speak (in clear
//! text, after a TLS handshake, or with a part of the HTTP/2 preface), HTTP/2 connections that
//! hold a slot without a stream or stop answering PINGs, and HTTP/2 connections multiplexing
//! more long-lived streams than the listener's budget.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use rustls::pki_types::ServerName;
use tokio::io::AsyncWriteExt;

use crate::support::gateway::{Process, Started, metric, start_binary};
use crate::support::h2raw;
use crate::support::pki::Pki;
use crate::support::upstream::SseBackend;

async fn closed_count(gw: &Process, plane: &str, reason: &str) -> f64 {
    metric(
        &gw.metrics().await,
        "aura_connections_closed_total",
        &[
            &format!("plane=\"{plane}\""),
            &format!("reason=\"{reason}\""),
        ],
    )
}

/// A TLS client of the management plane offering `alpn`, the handshake done.
async fn tls_connection(
    port: u16,
    pki: &Pki,
    alpn: &[&[u8]],
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    tokio_rustls::TlsConnector::from(std::sync::Arc::new(pki.rustls_client(alpn, false)))
        .connect(ServerName::try_from("localhost").expect("name"), tcp)
        .await
        .expect("handshake")
}

/// Reads a TLS connection until the gateway closes it, at most `limit`.
async fn tls_closed_within(
    tls: &mut tokio_rustls::client::TlsStream<tokio::net::TcpStream>,
    limit: Duration,
) -> Option<Duration> {
    use tokio::io::AsyncReadExt;
    let started = Instant::now();
    let mut buf = [0u8; 1024];
    loop {
        let left = limit.checked_sub(started.elapsed())?;
        match tokio::time::timeout(left, tls.read(&mut buf)).await {
            Ok(Ok(0) | Err(_)) => return Some(started.elapsed()),
            Ok(Ok(_)) => {}
            Err(_) => return None,
        }
    }
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
    let (response, _) = client
        .send_request(request.body(()).expect("request"), true)
        .expect("send");
    (client, response.await.expect("response"))
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
    let Started { gw, dir: _dir, .. } = start_binary(&format!(
        "[server]\nmax_connections = 4\nheader_read_timeout_ms = 1000\n\n\
             [management_plane.tls]\ncert_file = \"{}\"\nkey_file = \"{}\"\n",
        pki.server_cert.display(),
        pki.server_key.display()
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
    let answer = tokio::time::timeout(
        Duration::from_secs(10),
        reqwest::Client::new().get(gw.data_url("/health")).send(),
    )
    .await
    .expect("served within the header timeout, not held")
    .expect("answer");
    assert_eq!(answer.status(), StatusCode::OK);
    let waited = started.elapsed();
    eprintln!("a request behind four silent connections was served after {waited:?}");
    for (i, s) in held.iter_mut().enumerate() {
        let closed = h2raw::closed_within(s, Duration::from_secs(5)).await;
        assert!(closed.is_some(), "silent connection {i} is still open");
    }
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
        health
            .write_all(b"GET /health HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n")
            .await
            .expect("write");
        let mut out = Vec::new();
        let _ = health.read_to_end(&mut out).await;
        String::from_utf8_lossy(&out).into_owned()
    })
    .await
    .expect("served within the header timeout");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    eprintln!(
        "a TLS request behind four silent TLS connections was served after {:?}",
        started.elapsed()
    );
    for (i, s) in tls.iter_mut().enumerate() {
        let closed = tls_closed_within(s, Duration::from_secs(5)).await;
        assert!(closed.is_some(), "silent TLS connection {i} is still open");
    }
    assert!(closed_count(&gw, "management", "silent").await >= 4.0);
}

/// An HTTP/2 connection that sends the preface and then only PINGs — no stream — is closed at
/// the header timeout; one whose streams are done is closed after the idle timeout.
#[tokio::test]
async fn an_http2_connection_without_streams_is_closed_and_pings_do_not_keep_it() {
    let Started { gw, dir: _dir, .. } =
        start_binary("[server]\nheader_read_timeout_ms = 1000\nhttp2_idle_timeout_ms = 1500\n");
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
                if let Some(after) =
                    h2raw::closed_within(&mut pinging, Duration::from_millis(150)).await
                {
                    closed = Some(started.elapsed() - Duration::from_millis(150) + after);
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
    let lived = tokio::time::timeout(Duration::from_secs(10), ended)
        .await
        .expect("the idle connection was closed")
        .expect("task");
    eprintln!("an idle HTTP/2 connection lived {lived:?}");
    assert!(
        lived >= Duration::from_millis(1000),
        "closed before its idle timeout: {lived:?}"
    );
    assert!(closed_count(&gw, "data", "idle").await >= 2.0);
}

/// An HTTP/2 client that opened a long-lived stream and stops answering PINGs is gone: the
/// connection and its backend stream are closed after the keep-alive budget, however long the
/// stream was allowed to stay idle.
#[tokio::test]
async fn an_http2_client_that_stops_answering_pings_is_dropped_with_its_streams() {
    let sse = SseBackend::start().await;
    let Started { gw, fx, dir: _dir } = start_binary(&format!(
        "[server]\nhttp2_keep_alive_interval_ms = 300\nhttp2_keep_alive_timeout_ms = 300\n\n\
             [upstreams]\nrealtime_url = \"{}\"\n",
        sse.url
    ));
    let mut raw = h2raw::connect(("127.0.0.1", gw.port)).await;
    raw.write_all(&h2raw::get(
        1,
        "/v1/realtime/sse",
        &[("apikey", &fx.anon_key)],
    ))
    .await
    .expect("headers");
    let started = Instant::now();
    while sse.open() == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "no stream opened"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Never a PING ACK: the client reads what comes, and answers nothing.
    let closed = h2raw::closed_within(&mut raw, Duration::from_secs(10))
        .await
        .expect("the silent client was dropped");
    eprintln!("a client that answered no PING was dropped after {closed:?}");
    let started = Instant::now();
    while sse.open() > 0 {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the backend stream outlived its client"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `max_connections = 2` used to let one HTTP/2 connection hold a hundred SSE streams, each a
/// backend connection. Long-lived exchanges count against the listener's budget
/// (`server.max_streams`, `max_connections` by default) whatever the protocol: the streams
/// past it are refused `503 too_many_streams` before any backend connection is made, and a
/// place is free again once a stream ends. A WebSocket tunnel counts the same.
#[tokio::test]
async fn long_lived_streams_count_against_the_listeners_budget_whatever_the_protocol() {
    let sse = SseBackend::start().await;
    let Started { gw, fx, dir: _dir } = start_binary(&format!(
        "[server]\nmax_connections = 2\n\n[upstreams]\nrealtime_url = \"{}\"\n",
        sse.url
    ));
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", gw.port))
        .await
        .expect("connect");
    let (client, connection) = h2::client::handshake(tcp).await.expect("h2 handshake");
    tokio::spawn(connection);
    let mut client = client;
    let mut open = Vec::new();
    let mut refused = 0;
    for _ in 0..100 {
        let (next, response) =
            h2_get(client, gw.port, "/v1/realtime/sse", Some(&fx.anon_key)).await;
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
    eprintln!(
        "100 SSE streams on one HTTP/2 connection: {} open, {refused} refused; backend streams at most {}",
        open.len(),
        sse.most()
    );
    assert_eq!(open.len(), 2, "the budget is max_connections");
    assert_eq!(refused, 98);
    assert!(sse.most() <= 2, "{} backend streams", sse.most());
    let text = gw.metrics().await;
    assert_eq!(
        metric(&text, "aura_streams_refused_total", &["plane=\"data\""]),
        98.0
    );

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
    let started = Instant::now();
    while sse.open() > 1 {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the stream's place stayed taken"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (_client, response) = h2_get(client, gw.port, "/v1/realtime/sse", Some(&fx.anon_key)).await;
    assert_eq!(response.status(), 200, "a place is free again");
}
