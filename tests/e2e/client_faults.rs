//! What a client sends wrong is the client's, through the real binary: a broken request body
//! never counts against a backend's breaker, a client's spelling of the gateway's own headers
//! never reaches a backend, a connection is upgraded only on the WebSocket route, and a
//! backend's answer that declares a body it does not have never answers another request.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::support::builder::{Gateway, Started};
use crate::support::call::Call;
use crate::support::fixture::Fixture;
use crate::support::gateway::Process;
use crate::support::metrics::metric;
use crate::support::raw::{exchange, get, status_of};
use crate::support::upstream::Recorder;

/// A gateway binary whose storage and realtime backends record what they receive.
async fn with_recorders() -> (Process, Fixture, Recorder, Recorder) {
    let fx = Fixture::new();
    let (storage, realtime) = (Recorder::start().await, Recorder::start().await);
    let toml = format!(
        "[upstreams]\nstorage_url = \"{}\"\nrealtime_url = \"{}\"\n\n[breaker]\nfailure_threshold = 5\nopen_ms = 30000\n",
        storage.url, realtime.url
    );
    let Started { gw, .. } = Gateway::builder().fixture(&fx).toml(toml).binary();
    (gw, fx, storage, realtime)
}

/// Everything the gateway writes back on `stream` until it closes it or is quiet for 2 s.
async fn read_all(stream: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout(Duration::from_secs(2), stream.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => out.extend_from_slice(&buf[..n]),
            _ => break,
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// An upload of `path` with `key` whose body breaks after its first piece (sent apart from the
/// head, so that the request is on its way to the backend when it breaks): `how` says how.
async fn broken_upload(port: u16, path: &str, key: &str, how: Broken) -> String {
    let mut stream = TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let framing = match how {
        Broken::ChunkSize | Broken::ChunkCut => "transfer-encoding: chunked",
        Broken::ShortLength => "content-length: 100000",
    };
    let head = format!(
        "PUT {path} HTTP/1.1\r\nhost: gw\r\napikey: {key}\r\ncontent-type: application/octet-stream\r\n{framing}\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.expect("head");
    let first: &[u8] = match how {
        Broken::ChunkSize | Broken::ChunkCut => b"5\r\nhello\r\n",
        Broken::ShortLength => b"hello",
    };
    stream.write_all(first).await.expect("first piece");
    tokio::time::sleep(Duration::from_millis(30)).await;
    match how {
        Broken::ChunkSize => stream
            .write_all(b"zz\r\nnot a chunk\r\n")
            .await
            .expect("bad"),
        // The body ends where the client stops sending: the rest never comes.
        Broken::ChunkCut => {
            stream.write_all(b"10\r\nshort").await.expect("cut");
            stream.shutdown().await.expect("shutdown");
        }
        Broken::ShortLength => stream.shutdown().await.expect("shutdown"),
    }
    read_all(&mut stream).await
}

#[derive(Debug, Clone, Copy)]
enum Broken {
    /// A chunk-size line that is not hexadecimal.
    ChunkSize,
    /// A chunk cut short by the client's end.
    ChunkCut,
    /// A body shorter than its `Content-Length`, the client gone.
    ShortLength,
}

#[tokio::test]
async fn fifty_broken_uploads_from_one_key_open_no_breaker_and_another_organization_is_served() {
    let (gw, fx, storage, realtime) = with_recorders().await;
    // Answered 400, closed without an answer, answered by the backend before the break.
    let mut answered = [0usize; 3];
    for i in 0..50 {
        let how = [Broken::ChunkSize, Broken::ChunkCut, Broken::ShortLength][i % 3];
        let path = if i % 5 == 4 {
            "/v1/realtime/api/broadcast"
        } else {
            "/v1/storage/object/notes/broken.bin"
        };
        let answer = broken_upload(gw.port, path, &fx.anon_key, how).await;
        match status_of(&answer) {
            // A broken body is the client's: never a 502 (the backend's failure).
            400 => {
                assert!(answer.contains("\"invalid_body\""), "{how:?}: {answer}");
                answered[0] += 1;
            }
            // A client gone (or its body cut) may read nothing back at all.
            0 => answered[1] += 1,
            // The backend answered before the body broke (it does not read bodies, and
            // closed): its answer is the exchange's.
            200 => answered[2] += 1,
            other => panic!("{how:?} on {path}: {other}: {answer}"),
        }
    }
    println!(
        "50 broken uploads: {} answered 400 invalid_body, {} closed without an answer, {} answered by the backend first",
        answered[0], answered[1], answered[2]
    );
    assert!(
        answered[0] >= 17,
        "the bad chunk sizes are answered: {answered:?}"
    );

    // Organization B's project: served by both backends at once, every time.
    let started = Instant::now();
    for i in 0..20 {
        let path = if i % 2 == 0 {
            "/v1/storage/object/notes/b.txt"
        } else {
            "/v1/realtime/api/channels"
        };
        let r = Call::get(gw.data_url(path))
            .key(&fx.other_project_key)
            .read()
            .await;
        assert_eq!(r.status, reqwest::StatusCode::OK, "{path}: {}", r.text());
    }
    println!(
        "another organization's 20 requests after them: all 200 in {:?}",
        started.elapsed()
    );
    let metrics = gw.metrics().await;
    for breaker in ["storage", "realtime"] {
        let state = metric(
            &metrics,
            "aura_breaker_state",
            &[&format!("breaker=\"{breaker}\"")],
        );
        assert_eq!(state, 0.0, "the {breaker} breaker stays closed");
    }
    let client_errors = metric(
        &metrics,
        "aura_errors_total",
        &["side=\"client\"", "code=\"invalid_body\""],
    );
    assert!(
        client_errors >= answered[0] as f64,
        "counted as the client's: {client_errors}"
    );
    let upstream_errors = metric(&metrics, "aura_errors_total", &["side=\"upstream\""]);
    assert_eq!(upstream_errors, 0.0, "none is the backends'");
    assert!(storage.seen().len() >= 10 && !realtime.seen().is_empty());
}

#[tokio::test]
async fn underscore_spellings_of_the_gateways_headers_never_reach_a_backend() {
    let (gw, fx, storage, _realtime) = with_recorders().await;
    let forged = [
        ("x_aura_user_id", "victim-user"),
        ("x_aura_role", "service_role"),
        ("x_aura_org_role", "owner"),
        ("x-aura_project", "victim"),
        ("x_forwarded_for", "10.9.8.7"),
        ("x-forwarded-host", "evil.example"),
        ("x_forwarded_proto", "https"),
        ("x_real_ip", "10.9.8.7"),
        ("x_request_id", "forged-id"),
        ("content_length", "7"),
    ];
    let mut headers = vec![("apikey", fx.anon_key.as_str())];
    headers.extend(forged.iter().copied());
    headers.push(("x_custom_header", "kept"));
    let answer = exchange(gw.port, get("/v1/storage/object/notes/a.txt", &headers)).await;
    assert_eq!(status_of(&answer), 200, "{answer}");
    let seen = storage.last().expect("forwarded");
    for (name, value) in forged {
        let folded = name.replace('_', "-");
        for spelling in [name, folded.as_str()] {
            assert!(
                !seen.all(spelling).iter().any(|v| v == value),
                "{spelling}: {value} reached the backend: {:?}",
                seen.headers
            );
        }
    }
    // The gateway's own, and what is not the gateway's, are there.
    assert_eq!(seen.one("x-aura-role").as_deref(), Some("anon"));
    assert_eq!(seen.one("x-forwarded-for").as_deref(), Some("127.0.0.1"));
    assert!(seen.one("x-request-id").is_some_and(|id| id != "forged-id"));
    assert_eq!(seen.one("x_custom_header").as_deref(), Some("kept"));
    assert!(seen.one("x-aura-user-id").is_none(), "{:?}", seen.headers);
}

#[tokio::test]
async fn an_upgrade_is_taken_on_the_websocket_route_only_and_never_with_a_body() {
    let (gw, fx, storage, realtime) = with_recorders().await;
    let upgrade = |path: &str, extra: &str| {
        format!(
            "GET {path} HTTP/1.1\r\nhost: gw\r\napikey: {}\r\nconnection: Upgrade\r\nupgrade: websocket\r\nsec-websocket-version: 13\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n{extra}\r\n",
            fx.anon_key
        )
    };
    for path in [
        "/v1/storage/object/notes/a.txt",
        "/v1/realtime/api/channels",
        "/v1/realtime/sse",
    ] {
        let answer = exchange(gw.port, upgrade(path, "")).await;
        assert_eq!(status_of(&answer), 400, "{path}: {answer}");
        assert!(answer.contains("\"upgrade_refused\""), "{path}: {answer}");
    }
    for extra in ["content-length: 5\r\n", "transfer-encoding: chunked\r\n"] {
        let body = if extra.starts_with("content") {
            "hello"
        } else {
            "5\r\nhello\r\n0\r\n\r\n"
        };
        let raw = format!("{}{body}", upgrade("/v1/realtime/websocket", extra));
        let answer = exchange(gw.port, raw).await;
        assert_eq!(status_of(&answer), 400, "{extra}: {answer}");
        assert!(answer.contains("\"upgrade_refused\""), "{extra}: {answer}");
    }
    assert!(storage.seen().is_empty(), "{:?}", storage.seen());
    assert!(realtime.seen().is_empty(), "{:?}", realtime.seen());
}

#[tokio::test]
async fn expect_is_answered_by_the_gateway_and_never_forwarded() {
    let (gw, fx, storage, _realtime) = with_recorders().await;
    let mut stream = TcpStream::connect(("127.0.0.1", gw.port))
        .await
        .expect("connect");
    let head = format!(
        "PUT /v1/storage/object/notes/e.txt HTTP/1.1\r\nhost: gw\r\napikey: {}\r\ncontent-length: 5\r\nexpect: 100-continue\r\nconnection: close\r\n\r\n",
        fx.anon_key
    );
    stream.write_all(head.as_bytes()).await.expect("head");
    let mut buf = [0u8; 256];
    let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf))
        .await
        .expect("a 100 in time")
        .expect("read");
    let first = String::from_utf8_lossy(&buf[..n]).into_owned();
    assert!(first.starts_with("HTTP/1.1 100"), "{first}");
    stream.write_all(b"hello").await.expect("body");
    let answer = read_all(&mut stream).await;
    assert_eq!(status_of(&answer), 200, "{answer}");
    let seen = storage.last().expect("forwarded");
    assert!(seen.one("expect").is_none(), "{:?}", seen.headers);
}

/// A backend that answers `HEAD` with a length and no body, and writes that body (shaped as
/// an answer of its own) when the next request arrives on the same connection, before that
/// request's real answer. Counts the connections it accepted.
async fn late_body_backend() -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let connections = Arc::new(AtomicUsize::new(0));
    let counted = connections.clone();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut owed: Option<&[u8]> = None;
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    let Ok(n) = conn.read(&mut chunk).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head: Vec<u8> = buf.drain(..end + 4).collect();
                        let mut out = Vec::new();
                        if let Some(late) = owed.take() {
                            out.extend_from_slice(late);
                        }
                        if head.starts_with(b"HEAD") {
                            let late: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 6\r\n\r\nPWNED!";
                            out.extend_from_slice(
                                format!(
                                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n",
                                    late.len()
                                )
                                .as_bytes(),
                            );
                            owed = Some(late);
                        } else {
                            out.extend_from_slice(
                                b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
                            );
                        }
                        if conn.write_all(&out).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    (url, connections)
}

#[tokio::test]
async fn a_body_written_late_after_a_head_answer_never_answers_the_next_request() {
    let (backend, connections) = late_body_backend().await;
    let fx = Fixture::new();
    let toml = format!("[upstreams]\nstorage_url = \"{backend}\"\n");
    let Started { gw, .. } = Gateway::builder().fixture(&fx).toml(toml).binary();
    for round in 0..3 {
        let head = Call::new(reqwest::Method::HEAD, gw.data_url("/v1/storage/object/a"))
            .key(&fx.anon_key)
            .read()
            .await;
        assert_eq!(head.status, reqwest::StatusCode::OK, "round {round}");
        // Another project's request next: it must read its own answer.
        let r = Call::get(gw.data_url("/v1/storage/object/b"))
            .key(&fx.other_project_key)
            .read()
            .await;
        assert_eq!(r.status, reqwest::StatusCode::OK, "round {round}");
        assert_eq!(r.text(), "ok", "round {round}: another request's late body");
    }
    let opened = connections.load(Ordering::SeqCst);
    println!("backend connections for 3 HEAD + 3 GET: {opened}");
    assert!(
        opened >= 4,
        "a connection after a HEAD is not reused: {opened}"
    );
}
