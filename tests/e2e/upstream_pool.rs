//! The HTTP backends' connection pools, through the binary: connections are reused, and a
//! connection the backend closed, or whose answer was abandoned or cut short, is never used
//! again.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt;
use reqwest::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::builder::{Gateway, Started};
use crate::support::call::Call;
use crate::support::gateway::Process;
use crate::support::metrics::metric;
use crate::support::poll::poll_every;

/// A raw HTTP/1.1 backend, so that it can misbehave in ways a framework would not allow. By
/// path: `/keep` answers `keep` and keeps the connection; `/close-after` answers the same and
/// then closes it, without saying so; `/big` answers 8 MiB slowly; `/short` promises 100 bytes,
/// sends 10 and closes; `/switch` switches protocols unasked; `/chunked` answers `keep` in
/// chunked coding, with a chunk extension and a trailer; `/chunked-then-empty` the same with
/// an empty `Transfer-Encoding` field after `chunked`; `/http10-chunked` the same in an
/// HTTP/1.0 answer that asks to be kept alive; `/smuggle` sends both a
/// `Content-Length` and a `Transfer-Encoding`; `/huge-head` sends a 200 KiB header;
/// `/echo-head` answers the request head it received as its body; `/cased` answers headers
/// in mixed case that the gateway replaces or passes.
struct RawBackend {
    url: String,
    accepted: Arc<AtomicUsize>,
    open: Arc<AtomicUsize>,
}

impl RawBackend {
    async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let accepted = Arc::new(AtomicUsize::new(0));
        let open = Arc::new(AtomicUsize::new(0));
        let (count, live) = (accepted.clone(), open.clone());
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                live.fetch_add(1, Ordering::SeqCst);
                let live = live.clone();
                tokio::spawn(async move {
                    serve_connection(stream).await;
                    live.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        Self {
            url,
            accepted,
            open,
        }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    fn open(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }
}

/// Serves requests (heads only: these tests send no bodies) until the client closes, or the
/// path says to stop.
async fn serve_connection(mut stream: tokio::net::TcpStream) {
    let mut buf = Vec::new();
    loop {
        let head_end = loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break end + 4;
            }
            let mut chunk = [0u8; 4096];
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
        buf.drain(..head_end);
        let mut line = head.lines().next().unwrap_or_default().split(' ');
        let method = line.next().unwrap_or_default().to_owned();
        let path = line.next().unwrap_or_default().to_owned();
        let keep = b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nkeep";
        let written = match path.as_str() {
            "/object/keep" if method == "HEAD" => {
                stream
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\n")
                    .await
            }
            "/object/keep" => stream.write_all(keep).await,
            "/object/close-after" => {
                let _ = stream.write_all(keep).await;
                return;
            }
            "/object/big" => {
                let size = 8 << 20;
                let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {size}\r\n\r\n");
                if stream.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                let chunk = vec![b'B'; 64 * 1024];
                for _ in 0..size / chunk.len() {
                    if stream.write_all(&chunk).await.is_err() {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Ok(())
            }
            "/object/switch" => {
                // Switches protocols on a request that asked for no upgrade.
                let _ = stream
                    .write_all(
                        b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: upgrade\r\n\r\n",
                    )
                    .await;
                tokio::time::sleep(Duration::from_millis(200)).await;
                return;
            }
            "/object/chunked" => {
                stream
                    .write_all(
                        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2;ext=1\r\nke\r\n2\r\nep\r\n0\r\nx-trailer: t\r\n\r\n",
                    )
                    .await
            }
            "/object/chunked-then-empty" => {
                // The codings are one list: `chunked` is still the last of them.
                stream
                    .write_all(
                        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ntransfer-encoding: \r\n\r\n4\r\nkeep\r\n0\r\n\r\n",
                    )
                    .await
            }
            "/object/http10-chunked" => {
                // HTTP/1.0 has no transfer codings: the framing is faulty, whatever it asks.
                stream
                    .write_all(
                        b"HTTP/1.0 200 OK\r\ntransfer-encoding: chunked\r\nconnection: keep-alive\r\n\r\n4\r\nkeep\r\n0\r\n\r\n",
                    )
                    .await
            }
            "/object/smuggle" => {
                // Framed twice: a proxy that picked the length would read the chunk framing as
                // the next answer.
                stream
                    .write_all(
                        b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\ntransfer-encoding: chunked\r\n\r\n4\r\nkeep\r\n0\r\n\r\n",
                    )
                    .await
            }
            "/object/huge-head" => {
                let head = format!(
                    "HTTP/1.1 200 OK\r\nx-big: {}\r\ncontent-length: 4\r\n\r\nkeep",
                    "a".repeat(200 * 1024)
                );
                stream.write_all(head.as_bytes()).await
            }
            "/object/echo-head" => {
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{head}",
                    head.len()
                );
                stream.write_all(answer.as_bytes()).await
            }
            "/object/cased" => {
                stream
                    .write_all(
                        b"HTTP/1.1 200 OK\r\nX-Request-Id: backend-id\r\nX-FRAME-OPTIONS: ALLOWALL\r\n\
                          Preference-Applied: return=minimal\r\nRateLimit-Limit: 1\r\n\
                          Content-Security-Policy: default-src *\r\nx-content-type-OPTIONS: sniff\r\n\
                          Referrer-Policy: unsafe-url\r\nStrict-Transport-Security: max-age=0\r\n\
                          RATELIMIT-REMAINING: 0\r\nratelimit-reset: 999\r\ncontent-length: 4\r\n\r\nkeep",
                    )
                    .await
            }
            "/object/short" => {
                let _ = stream
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n0123456789")
                    .await;
                return;
            }
            _ => {
                stream
                    .write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
                    .await
            }
        };
        if written.is_err() {
            return;
        }
    }
}

/// The gateway binary in front of `backend`, and an API key it knows.
fn start_gateway(backend: &RawBackend, pool_max_idle: usize) -> (Started, String) {
    let upstreams = format!(
        "[upstreams]\nstorage_url = \"{}\"\npool_max_idle_per_host = {pool_max_idle}\n",
        backend.url
    );
    let started = Gateway::builder().toml(upstreams).binary();
    let key = started.fx.anon_key.clone();
    (started, key)
}

async fn get(gw: &Process, key: &str, path: &str) -> (StatusCode, String) {
    let r = Call::get(gw.data_url(path)).key(key).send().await;
    let status = r.status();
    (status, r.text().await.unwrap_or_default())
}

/// `GET /v1/storage/object/keep`, answered `keep` by the backend.
async fn keep(gw: &Process, key: &str) -> (StatusCode, String) {
    get(gw, key, "/v1/storage/object/keep").await
}

fn kept() -> (StatusCode, String) {
    (StatusCode::OK, "keep".to_owned())
}

#[tokio::test]
async fn backend_connections_are_reused_and_never_after_a_close_an_abandoned_or_a_cut_answer() {
    let backend = RawBackend::start().await;
    let (Started { gw, .. }, key) = start_gateway(&backend, 8);

    // One client at a time: one backend connection, whatever the client does with its own.
    for _ in 0..20 {
        assert_eq!(keep(&gw, &key).await, kept());
    }
    assert_eq!(backend.accepted(), 1, "the connection was reused");
    let metrics = gw.metrics().await;
    let labels = ["backend=\"storage\""];
    let opened = metric(&metrics, "aura_upstream_connections_opened_total", &labels);
    assert_eq!(opened, 1.0, "{metrics}");
    // A `HEAD` answered with a length: the head declares a body the answer has not, so its
    // connection is not used again (a body written late would answer the next request).
    let head = Call::new(
        reqwest::Method::HEAD,
        gw.data_url("/v1/storage/object/keep"),
    );
    assert_eq!(head.key(&key).status().await, StatusCode::OK);
    assert_eq!(keep(&gw, &key).await, kept());
    assert_eq!(backend.accepted(), 2, "a new connection after the HEAD");

    // The backend closes the connection after answering (its keep-alive ran out), without a
    // `Connection: close`: the next request sees the close and takes a new connection.
    for _ in 0..5 {
        let closing = get(&gw, &key, "/v1/storage/object/close-after").await;
        assert_eq!(closing, kept());
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(keep(&gw, &key).await, kept());
    }
    assert_eq!(backend.accepted(), 7);

    // A client abandons an 8 MiB answer after its first bytes: that connection still holds the
    // rest, and is closed rather than reused.
    let accepted = backend.accepted();
    let big = Call::get(gw.data_url("/v1/storage/object/big"))
        .key(&key)
        .send()
        .await;
    assert_eq!(big.status(), StatusCode::OK);
    let mut stream = big.bytes_stream();
    let first = stream.next().await.expect("a chunk").expect("bytes");
    assert_eq!(first[0], b'B');
    drop(stream);
    for _ in 0..5 {
        let clean = keep(&gw, &key).await;
        assert_eq!(
            clean,
            kept(),
            "no byte of the abandoned answer reached another request"
        );
    }
    assert_eq!(backend.accepted(), accepted + 1);

    // An answer cut short: the client's exchange fails (at its head or its body, depending on
    // what was flushed), and the next request is served cleanly.
    let short = Call::get(gw.data_url("/v1/storage/object/short"))
        .key(&key)
        .try_send()
        .await;
    let complete = match short {
        Ok(r) => r.bytes().await.is_ok(),
        Err(_) => false,
    };
    assert!(!complete, "a body cut short is not passed off as complete");
    for _ in 0..3 {
        assert_eq!(keep(&gw, &key).await, kept());
    }

    // A backend switching protocols on a plain request: the contract's JSON 502, that
    // connection never reused, and the next request served cleanly.
    let accepted = backend.accepted();
    let (status, body) = get(&gw, &key, "/v1/storage/object/switch").await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    let body: serde_json::Value = serde_json::from_str(&body).expect("json error");
    assert_eq!(body["error"]["code"], "upstream_error", "{body}");
    assert_eq!(keep(&gw, &key).await, kept());
    assert_eq!(backend.accepted(), accepted + 1);
    let health = get(&gw, &key, "/health").await.0;
    assert_eq!(health, StatusCode::OK, "still serving");
}

#[tokio::test]
async fn a_burst_opens_connections_as_needed_and_keeps_at_most_the_idle_limit() {
    let backend = RawBackend::start().await;
    let (Started { gw, .. }, key) = start_gateway(&backend, 4);
    // Concurrent answers that take a while: each needs a connection of its own.
    let calls = (0..24).map(|_| get(&gw, &key, "/v1/storage/object/big"));
    let answers = futures::future::join_all(calls).await;
    for (status, body) in &answers {
        assert_eq!(*status, StatusCode::OK);
        assert_eq!(body.len(), 8 << 20);
    }
    let accepted = backend.accepted();
    assert!(
        accepted > 4,
        "{accepted} connections for 24 concurrent answers"
    );
    // Back to idle: the pool keeps four; the others were closed.
    let every = Duration::from_millis(20);
    let _ = poll_every(Duration::from_secs(5), every, async || {
        (backend.open() <= 4).then_some(())
    })
    .await;
    assert_eq!(backend.open(), 4, "idle connections kept past the limit");
    // And they serve the next requests.
    let accepted = backend.accepted();
    for _ in 0..8 {
        assert_eq!(keep(&gw, &key).await, kept());
    }
    let reused = backend.accepted() == accepted;
    assert!(reused, "the idle connections were used");
}

#[tokio::test]
async fn hostile_backend_answers_are_refused_with_a_502_and_their_connections_never_reused() {
    let backend = RawBackend::start().await;
    let (Started { gw, .. }, key) = start_gateway(&backend, 8);
    assert_eq!(keep(&gw, &key).await, kept());

    // Chunked coding, an extension and a trailer: decoded, and the connection reused.
    let chunked = get(&gw, &key, "/v1/storage/object/chunked").await;
    assert_eq!(chunked, kept());
    assert_eq!(keep(&gw, &key).await, kept());
    assert_eq!(
        backend.accepted(),
        1,
        "the connection was reused after a chunked answer"
    );

    // Framed twice, or a head past the gateway's bound: the contract's JSON 502, and the
    // connection closed rather than read from again.
    for path in ["/v1/storage/object/smuggle", "/v1/storage/object/huge-head"] {
        let accepted = backend.accepted();
        let (status, body) = get(&gw, &key, path).await;
        assert_eq!(status, StatusCode::BAD_GATEWAY, "{path}: {body}");
        let body: serde_json::Value = serde_json::from_str(&body).expect("json error");
        assert_eq!(body["error"]["code"], "upstream_error", "{path}: {body}");
        for _ in 0..3 {
            assert_eq!(
                keep(&gw, &key).await,
                kept(),
                "{path}: the next requests served cleanly"
            );
        }
        assert_eq!(
            backend.accepted(),
            accepted + 1,
            "{path}: its connection was not reused"
        );
    }
    let metrics = gw.metrics().await;
    let failed = metric(
        &metrics,
        "aura_http_requests_total",
        &["group=\"storage\"", "status=\"502\""],
    );
    assert!(failed >= 2.0, "the refusals are counted: {metrics}");
}

#[tokio::test]
async fn the_last_transfer_coding_of_all_fields_frames_an_answer_and_http_1_0_ones_are_not_reused()
{
    let backend = RawBackend::start().await;
    let (Started { gw, .. }, key) = start_gateway(&backend, 8);
    assert_eq!(keep(&gw, &key).await, kept());
    // `chunked`, then a field with no coding: chunked is the last coding (RFC 9110 §5.3), so
    // the body ends at its last chunk rather than at a close that never comes.
    let within = Duration::from_secs(5);
    let path = "/v1/storage/object/chunked-then-empty";
    let answer = tokio::time::timeout(within, get(&gw, &key, path)).await;
    assert_eq!(answer.ok(), Some(kept()), "decoded as chunked within 5 s");
    assert_eq!(keep(&gw, &key).await, kept());
    assert_eq!(backend.accepted(), 1, "the connection was reused after it");
    // An HTTP/1.0 answer with a transfer coding has faulty framing (RFC 9112 §6.1): read, and
    // its connection closed however it asks to be kept.
    let answer = tokio::time::timeout(within, get(&gw, &key, "/v1/storage/object/http10-chunked"));
    assert_eq!(answer.await.ok(), Some(kept()));
    assert_eq!(keep(&gw, &key).await, kept());
    assert_eq!(
        backend.accepted(),
        2,
        "the HTTP/1.0 answer's connection was not reused"
    );
}

/// The values of header `name` (any case) in a raw answer or head.
fn header_values(raw: &str, name: &str) -> Vec<String> {
    let head = raw.split("\r\n\r\n").next().unwrap_or_default();
    head.lines()
        .skip(1)
        .filter_map(|line| line.split_once(':'))
        .filter(|(n, _)| n.trim().eq_ignore_ascii_case(name))
        .map(|(_, v)| v.trim().to_owned())
        .collect()
}

/// The gateway's security headers, request id and quota numbers, once each, in place of the
/// backend's (`/cased` sends all nine names).
fn assert_replaced_once(answer: &str) {
    let ids = header_values(answer, "x-request-id");
    assert!(
        ids.len() == 1 && ids[0].len() == 32 && ids[0] != "backend-id",
        "{answer}"
    );
    for (name, value) in [
        ("x-frame-options", "DENY"),
        ("x-content-type-options", "nosniff"),
        ("referrer-policy", "no-referrer"),
        (
            "strict-transport-security",
            "max-age=63072000; includeSubDomains",
        ),
        (
            "content-security-policy",
            "default-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
        ),
        ("ratelimit-limit", "1000"),
    ] {
        assert_eq!(header_values(answer, name), [value], "{name}: {answer}");
    }
    // The gateway's own quota numbers, once each, not the backend's.
    for (name, backends) in [("ratelimit-remaining", "0"), ("ratelimit-reset", "999")] {
        let values = header_values(answer, name);
        assert!(
            values.len() == 1 && values[0] != backends && values[0].parse::<u64>().is_ok(),
            "{name}: {answer}"
        );
    }
}

/// The head of an HTTP/2 (prior knowledge) `GET path` with `key`, written as an HTTP/1 head
/// (`status`, then `name: value` lines) for [`header_values`].
async fn h2c_head(port: u16, path: &str, key: &str) -> String {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let (send, connection) = h2::client::handshake(tcp).await.expect("h2c handshake");
    tokio::spawn(connection);
    let mut send = send.ready().await.expect("h2 ready");
    let request = http::Request::get(format!("http://127.0.0.1:{port}{path}"))
        .header("apikey", key)
        .body(())
        .expect("request");
    let (response, _) = send.send_request(request, true).expect("sent");
    let response = response.await.expect("answered");
    let mut head = format!("HTTP/2 {}\r\n", response.status().as_u16());
    for (name, value) in response.headers() {
        head.push_str(&format!(
            "{}: {}\r\n",
            name,
            String::from_utf8_lossy(value.as_bytes())
        ));
    }
    head.push_str("\r\n");
    head
}

#[tokio::test]
async fn header_names_in_any_case_are_one_name_both_ways_through_the_binary() {
    let backend = RawBackend::start().await;
    let (started, key) = start_gateway(&backend, 4);
    let gw = &started.gw;
    // A client writing its headers in capitals: the key still authenticates, and every
    // credential and identity header is removed before the backend, whatever its case.
    let request = crate::support::raw::get(
        "/v1/storage/object/echo-head",
        &[
            ("APIKEY", &key),
            ("X-Api-Key", &key),
            ("X-AURA-ROLE", "service_role"),
            ("x-Aura-Project", "other"),
            ("X-Request-ID", "client-id"),
            ("X-Client-Info", "sdk/1"),
            ("PREFER", "count=exact"),
        ],
    );
    let answer = crate::support::raw::exchange(gw.port, request).await;
    assert_eq!(crate::support::raw::status_of(&answer), 200, "{answer}");
    let seen = answer.split("\r\n\r\n").nth(1).unwrap_or_default();
    for credential in ["apikey", "x-api-key"] {
        assert!(
            header_values(seen, credential).is_empty(),
            "{credential} reached the backend: {seen}"
        );
    }
    assert!(
        !seen.contains(&key),
        "the key reached the backend in some header: {seen}"
    );
    assert_eq!(header_values(seen, "x-aura-role"), ["anon"], "{seen}");
    assert_ne!(header_values(seen, "x-aura-project"), ["other"], "{seen}");
    let ids = header_values(seen, "x-request-id");
    assert!(ids.len() == 1 && ids[0] != "client-id", "{seen}");
    assert_eq!(header_values(seen, "x-client-info"), ["sdk/1"]);
    assert_eq!(header_values(seen, "prefer"), ["count=exact"]);
    // A backend writing its headers in mixed case: the gateway's replace them, once each; the
    // rest pass.
    let answer = crate::support::raw::exchange(
        gw.port,
        crate::support::raw::get("/v1/storage/object/cased", &[("apikey", &key)]),
    )
    .await;
    assert_eq!(crate::support::raw::status_of(&answer), 200, "{answer}");
    assert_replaced_once(&answer);
    // The same answer over HTTP/2, whose writer gets the gateway's headers in the answer's map.
    let h2 = h2c_head(gw.port, "/v1/storage/object/cased", &key).await;
    assert!(h2.starts_with("HTTP/2 200\r\n"), "{h2}");
    assert_replaced_once(&h2);
    assert_eq!(header_values(&h2, "preference-applied"), ["return=minimal"]);
    assert_eq!(
        header_values(&answer, "preference-applied"),
        ["return=minimal"],
        "{answer}"
    );
    assert!(answer.ends_with("keep"), "{answer}");
}
