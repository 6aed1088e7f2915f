//! The data plane's HTTP/1.1 codec through the binary, on raw sockets: request bodies reach the
//! backend whole whatever their framing (chunked in pieces, a length split across writes,
//! `Expect: 100-continue`), pipelined requests are answered in order, HTTP/1.0 and `HEAD` are
//! answered as they must be, and hostile heads get the contract's JSON error, are counted, and
//! leave the listener serving.

use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::routing::any;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::support::builder::{Gateway, Started};
use crate::support::metrics::metric;
use crate::support::upstream::serve_http;

/// A storage backend answering every request with its method and body: `POST 5 hello`.
async fn echo_backend() -> String {
    let app = Router::new().fallback(any(|method: http::Method, body: Bytes| async move {
        format!("{method} {} {}", body.len(), String::from_utf8_lossy(&body))
    }));
    format!("http://{}", serve_http(app).await)
}

/// The binary in front of an echo backend, with its anon key.
async fn gateway() -> (Started, String) {
    let backend = echo_backend().await;
    let started = Gateway::builder()
        .toml(format!(
            "[server]\nmax_header_bytes = 8192\n\n[upstreams]\nstorage_url = \"{backend}\"\n"
        ))
        .binary();
    let key = started.fx.anon_key.clone();
    (started, key)
}

/// One answer read off a connection.
#[derive(Debug)]
struct Answer {
    /// The status line.
    line: String,
    /// Lower-cased header lines.
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Answer {
    fn status(&self) -> u16 {
        self.line
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0)
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// A connection and what was read from it past the last answer.
struct Client {
    s: TcpStream,
    rest: Vec<u8>,
}

impl Client {
    async fn connect(port: u16) -> Self {
        let s = TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("connect");
        Self {
            s,
            rest: Vec::new(),
        }
    }

    async fn send(&mut self, bytes: &[u8]) {
        self.s.write_all(bytes).await.expect("write");
    }

    /// Reads more bytes; false when the connection closed.
    async fn fill(&mut self) -> bool {
        let mut buf = [0u8; 8192];
        match tokio::time::timeout(Duration::from_secs(10), self.s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => false,
            Ok(Ok(n)) => {
                self.rest.extend_from_slice(&buf[..n]);
                true
            }
            Err(_) => panic!("nothing read within 10 s; have {:?}", self.text()),
        }
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.rest).into_owned()
    }

    /// Takes `n` bytes, reading as needed.
    async fn take(&mut self, n: usize) -> Vec<u8> {
        while self.rest.len() < n {
            assert!(self.fill().await, "closed inside a body");
        }
        self.rest.drain(..n).collect()
    }

    /// Takes one line (without its CRLF).
    async fn line(&mut self) -> String {
        loop {
            if let Some(end) = self.rest.windows(2).position(|w| w == b"\r\n") {
                let line = self.take(end + 2).await;
                return String::from_utf8_lossy(&line[..end]).into_owned();
            }
            assert!(self.fill().await, "closed inside a line: {:?}", self.text());
        }
    }

    /// Reads one answer to a request of `method`: a length, chunked or to-the-close body.
    async fn answer(&mut self, method: &str) -> Answer {
        let line = self.line().await;
        let mut headers = Vec::new();
        loop {
            let h = self.line().await;
            if h.is_empty() {
                break;
            }
            let (n, v) = h.split_once(':').expect("a header line");
            headers.push((n.to_ascii_lowercase(), v.trim().to_owned()));
        }
        let mut answer = Answer {
            line,
            headers,
            body: Vec::new(),
        };
        let status = answer.status();
        if method == "HEAD" || status == 204 || status == 304 || status < 200 {
            return answer;
        }
        if let Some(n) = answer.header("content-length") {
            let n = n.parse().expect("length");
            answer.body = self.take(n).await;
        } else if answer.header("transfer-encoding") == Some("chunked") {
            loop {
                let size = usize::from_str_radix(&self.line().await, 16).expect("chunk size");
                if size == 0 {
                    assert_eq!(self.line().await, "", "no trailers");
                    break;
                }
                let data = self.take(size).await;
                answer.body.extend_from_slice(&data);
                assert_eq!(self.line().await, "");
            }
        } else {
            while self.fill().await {}
            answer.body = std::mem::take(&mut self.rest);
        }
        answer
    }

    /// Whether the gateway closes the connection within 5 s (discarding what it sends).
    async fn closed(&mut self) -> bool {
        let mut buf = [0u8; 1024];
        tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                match self.s.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        })
        .await
        .is_ok()
    }
}

fn post_head(key: &str, path: &str, framing: &str) -> String {
    format!("POST /v1/storage/object/{path} HTTP/1.1\r\nhost: gw\r\napikey: {key}\r\n{framing}\r\n")
}

#[tokio::test]
async fn request_bodies_reach_the_backend_whole_whatever_their_framing() {
    let (Started { gw, dir: _dir, .. }, key) = gateway().await;
    let mut c = Client::connect(gw.port).await;

    // Chunked, in pieces that cut the framing anywhere, with an extension and a trailer.
    let head = post_head(&key, "a", "transfer-encoding: chunked\r\n");
    c.send(head.as_bytes()).await;
    for piece in [
        "5;ext=",
        "1\r\nhel",
        "lo\r\n",
        "6\r\n wor",
        "ld\r\n0\r\nx-t: 1\r\n",
        "\r\n",
    ] {
        tokio::time::sleep(Duration::from_millis(20)).await;
        c.send(piece.as_bytes()).await;
    }
    let a = c.answer("POST").await;
    assert_eq!((a.status(), a.text()), (200, "POST 11 hello world".into()));

    // A length, its body split across writes after the head.
    let head = post_head(&key, "b", "content-length: 10\r\n");
    c.send(head.as_bytes()).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    c.send(b"01234").await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    c.send(b"56789").await;
    let a = c.answer("POST").await;
    assert_eq!((a.status(), a.text()), (200, "POST 10 0123456789".into()));

    // `Expect: 100-continue`: the `100` comes first, then the answer to the body sent after it.
    let head = post_head(&key, "c", "content-length: 4\r\nexpect: 100-continue\r\n");
    c.send(head.as_bytes()).await;
    let interim = c.answer("POST").await;
    assert_eq!(interim.status(), 100, "{interim:?}");
    c.send(b"body").await;
    let a = c.answer("POST").await;
    assert_eq!((a.status(), a.text()), (200, "POST 4 body".into()));
    assert!(a.header("date").is_some(), "answers carry a date");

    // Three requests in one write are answered in order on the same connection.
    let get = |path: &str| {
        format!("GET /v1/storage/object/{path} HTTP/1.1\r\nhost: gw\r\napikey: {key}\r\n\r\n")
    };
    let three = [
        get("1"),
        post_head(&key, "2", "content-length: 2\r\n") + "hi",
        get("3"),
    ]
    .concat();
    c.send(three.as_bytes()).await;
    assert_eq!(c.answer("GET").await.text(), "GET 0 ");
    assert_eq!(c.answer("POST").await.text(), "POST 2 hi");
    assert_eq!(c.answer("GET").await.text(), "GET 0 ");

    // `HEAD`: a head alone, and the connection goes on.
    c.send(b"HEAD /health HTTP/1.1\r\nhost: gw\r\n\r\nGET /health HTTP/1.1\r\nhost: gw\r\n\r\n")
        .await;
    let a = c.answer("HEAD").await;
    assert_eq!(a.status(), 200);
    let a = c.answer("GET").await;
    assert_eq!(
        a.status(),
        200,
        "the answer after a HEAD's is read as one: {a:?}"
    );
    assert!(c.rest.is_empty(), "stray bytes: {:?}", c.text());

    // HTTP/1.0: answered in HTTP/1.0 and closed, unless it asks to keep the connection.
    let mut old = Client::connect(gw.port).await;
    old.send(b"GET /health HTTP/1.0\r\nconnection: keep-alive\r\n\r\n")
        .await;
    let a = old.answer("GET").await;
    assert!(a.line.starts_with("HTTP/1.0 200"), "{a:?}");
    assert_eq!(a.header("connection"), Some("keep-alive"));
    old.send(b"GET /health HTTP/1.0\r\n\r\n").await;
    let a = old.answer("GET").await;
    assert_eq!(a.status(), 200);
    assert!(
        old.closed().await,
        "an HTTP/1.0 request without keep-alive closes"
    );
}

#[tokio::test]
async fn requests_pipelined_past_the_head_limit_while_one_is_served_are_answered_in_order() {
    // While a request is served its connection is watched and what the client pipelines is
    // kept, up to the head limit (twice `server.max_header_bytes`: 16 KiB here); past it
    // nothing more is read until the answer is written, then the kept requests are served and
    // the connection read on. 200 requests of about 240 bytes (47 KB) behind a slow one.
    let app = Router::new().fallback(any(|uri: http::Uri| async move {
        if uri.path().ends_with("/slow") {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        uri.path().to_owned()
    }));
    let backend = format!("http://{}", serve_http(app).await);
    let gw = Gateway::builder()
        .toml(format!(
            "[server]\nmax_header_bytes = 8192\n\n[upstreams]\nstorage_url = \"{backend}\"\n"
        ))
        .binary();
    let key = &gw.fx.anon_key;
    let get = |path: &str| {
        format!(
            "GET /v1/storage/object/{path} HTTP/1.1\r\nhost: gw\r\napikey: {key}\r\nx-pad: {}\r\n\r\n",
            "p".repeat(128)
        )
    };
    let mut bytes = get("slow");
    for i in 0..200 {
        bytes.push_str(&get(&format!("p{i}")));
    }
    assert!(bytes.len() > 2 * 16 * 1024, "{} bytes", bytes.len());
    let mut c = Client::connect(gw.gw.port).await;
    c.send(bytes.as_bytes()).await;
    let first = c.answer("GET").await;
    assert_eq!((first.status(), first.text()), (200, "/object/slow".into()));
    for i in 0..200 {
        let a = c.answer("GET").await;
        assert_eq!(
            (a.status(), a.text()),
            (200, format!("/object/p{i}")),
            "{a:?}"
        );
    }
    assert!(c.rest.is_empty(), "stray bytes: {:?}", c.text());
    // And the connection goes on.
    c.send(get("after").as_bytes()).await;
    assert_eq!(c.answer("GET").await.text(), "/object/after");
}

#[tokio::test]
async fn a_client_that_stops_reading_its_answer_is_closed_after_the_send_timeout() {
    // A backend answering 64 MiB; the client asks and reads nothing. Once the sockets between
    // them are full, the gateway's next write waits `server.send_timeout_ms` (1 s here), then
    // the connection is closed and counted — and the backend's exchange dropped with it —
    // while a client that reads the same answer slowly but steadily gets all of it.
    const SIZE: usize = 64 << 20;
    let app = Router::new().fallback(any(|| async { vec![b'x'; SIZE] }));
    let backend = format!("http://{}", serve_http(app).await);
    let gw = Gateway::builder()
        .toml(format!(
            "[server]\nsend_timeout_ms = 1000\n\n[upstreams]\nstorage_url = \"{backend}\"\n"
        ))
        .binary();
    let head = format!(
        "GET /v1/storage/object/big HTTP/1.1\r\nhost: gw\r\napikey: {}\r\n\r\n",
        gw.fx.anon_key
    );
    let stalled = || async {
        metric(
            &gw.gw.metrics().await,
            "aura_connections_closed_total",
            &["plane=\"data\"", "reason=\"send_timeout\""],
        )
    };

    // Steady: 64 MiB read in pieces with four pauses of 400 ms between them, each well under
    // the timeout (room for a loaded machine's scheduling), 1.6 s in all: a timeout on the
    // whole answer rather than on each write would cut this client.
    let mut steady = Client::connect(gw.gw.port).await;
    steady.send(head.as_bytes()).await;
    let mut got = 0usize;
    let mut buf = vec![0u8; 1 << 20];
    let mut pauses = 0;
    while got < SIZE {
        let n = tokio::time::timeout(Duration::from_secs(10), steady.s.read(&mut buf))
            .await
            .expect("the answer keeps coming")
            .expect("read");
        assert!(n > 0, "closed after {got} bytes");
        got += n;
        if pauses < 4 && got > (pauses + 1) * (SIZE / 5) {
            pauses += 1;
            tokio::time::sleep(Duration::from_millis(400)).await;
        }
    }
    assert_eq!(pauses, 4);
    assert_eq!(stalled().await, 0.0, "a steady reader is not cut");

    // Stopped: nothing read after the request.
    let mut stopped = Client::connect(gw.gw.port).await;
    stopped.send(head.as_bytes()).await;
    let mut counted = 0.0;
    for _ in 0..100 {
        counted = stalled().await;
        if counted > 0.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(counted, 1.0, "the stalled connection is closed and counted");
    // What the sockets held, then the end: the gateway holds nothing of it any more.
    let mut held = 0usize;
    loop {
        match tokio::time::timeout(Duration::from_secs(10), stopped.s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => held += n,
            Err(_) => panic!("the connection stays open after {held} bytes"),
        }
    }
    assert!(held < SIZE, "{held} bytes: the answer was not cut");
    // The listener serves on.
    let mut after = Client::connect(gw.gw.port).await;
    after
        .send(b"GET /health HTTP/1.1\r\nhost: gw\r\n\r\n")
        .await;
    assert_eq!(after.answer("GET").await.status(), 200);
}

#[tokio::test]
async fn a_body_the_gateway_does_not_read_is_never_asked_for_and_closes_the_connection() {
    let (Started { gw, dir: _dir, .. }, _key) = gateway().await;
    let mut c = Client::connect(gw.port).await;
    // No API key: refused before the body is wanted, so no `100` invites the client to send it.
    let head = "POST /v1/storage/object/x HTTP/1.1\r\nhost: gw\r\ncontent-length: 1000000\r\n\
                expect: 100-continue\r\n\r\n";
    c.send(head.as_bytes()).await;
    let a = c.answer("POST").await;
    assert_eq!(a.status(), 401, "{a:?}");
    assert_eq!(a.header("connection"), Some("close"), "{a:?}");
    assert!(
        c.closed().await,
        "the connection with a body left unread is closed"
    );
}

#[tokio::test]
async fn hostile_heads_get_the_contracts_error_are_counted_and_the_listener_serves_on() {
    let (Started { gw, dir: _dir, .. }, key) = gateway().await;
    let k = &key;
    let cases: Vec<(String, u16)> = vec![
        // Smuggling shapes: both framings, lengths that differ, a coding before chunked.
        (
            format!(
                "POST /v1/storage/object/x HTTP/1.1\r\nhost: gw\r\napikey: {k}\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n"
            ),
            400,
        ),
        (
            format!(
                "POST /v1/storage/object/x HTTP/1.1\r\nhost: gw\r\napikey: {k}\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\nhello"
            ),
            400,
        ),
        (
            format!(
                "POST /v1/storage/object/x HTTP/1.1\r\nhost: gw\r\napikey: {k}\r\ntransfer-encoding: gzip, chunked\r\n\r\n0\r\n\r\n"
            ),
            400,
        ),
        (
            format!(
                "POST /v1/storage/object/x HTTP/1.0\r\napikey: {k}\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n"
            ),
            400,
        ),
        // No Host, two Hosts, a control byte in a value, not HTTP at all.
        (
            format!("GET /v1/storage/object/x HTTP/1.1\r\napikey: {k}\r\n\r\n"),
            400,
        ),
        (
            format!(
                "GET /v1/storage/object/x HTTP/1.1\r\nhost: a\r\nhost: b\r\napikey: {k}\r\n\r\n"
            ),
            400,
        ),
        (
            "GET / HTTP/1.1\r\nhost: gw\r\nx: a\x01b\r\n\r\n".to_owned(),
            400,
        ),
        (
            "\x16\x03\x01\x02\x00\x01\x00\x01\x7f\x03\x03 not http\r\n\r\n".to_owned(),
            400,
        ),
        // Over twice `max_header_bytes` (8 KiB here), and more than 100 headers.
        (
            format!(
                "GET / HTTP/1.1\r\nhost: gw\r\nx-big: {}\r\n\r\n",
                "a".repeat(20_000)
            ),
            431,
        ),
        (
            format!(
                "GET / HTTP/1.1\r\nhost: gw\r\n{}\r\n",
                "x: y\r\n".repeat(101)
            ),
            431,
        ),
    ];
    for (raw, want) in &cases {
        let mut c = Client::connect(gw.port).await;
        c.send(raw.as_bytes()).await;
        let a = c.answer("GET").await;
        let shown = raw.chars().take(80).collect::<String>();
        assert_eq!(a.status(), *want, "{shown:?}: {a:?}");
        let error: serde_json::Value = serde_json::from_slice(&a.body).expect("a JSON error");
        let code = if *want == 400 {
            "malformed_request"
        } else {
            "request_headers_too_large"
        };
        assert_eq!(error["error"]["code"], code, "{shown:?}");
        assert!(a.header("x-request-id").is_some(), "{shown:?}: {a:?}");
        assert_eq!(a.header("x-content-type-options"), Some("nosniff"));
        assert_eq!(a.header("connection"), Some("close"));
        assert!(
            c.closed().await,
            "{shown:?}: the connection is closed after the error"
        );
    }
    let counted = metric(
        &gw.metrics().await,
        "aura_connections_closed_total",
        &["plane=\"data\"", "reason=\"malformed\""],
    );
    assert_eq!(counted, cases.len() as f64);
    // A head over the limit but within twice it reaches the chain's own 431.
    let mut c = Client::connect(gw.port).await;
    let raw = format!(
        "GET /health HTTP/1.1\r\nhost: gw\r\nx-big: {}\r\n\r\n",
        "a".repeat(10_000)
    );
    c.send(raw.as_bytes()).await;
    let a = c.answer("GET").await;
    assert_eq!(a.status(), 431, "{a:?}");
    // And the listener serves on, on a new connection and on that one.
    c.send(b"GET /health HTTP/1.1\r\nhost: gw\r\n\r\n").await;
    assert_eq!(c.answer("GET").await.status(), 200);
}

#[tokio::test]
async fn a_trailer_line_a_lone_lf_or_cr_would_end_is_refused_and_hides_no_request() {
    let (Started { gw, dir: _dir, .. }, key) = gateway().await;
    // A front end that ends lines at a lone LF (RFC 9112 §2.2 lets it) sees the body end at
    // the empty line after `x-t: a\n` and the GET after it as a second request: read as one
    // more trailer line, that request would be swallowed and answered by nobody.
    let head = post_head(&key, "t", "transfer-encoding: chunked\r\n");
    let next = format!("GET /v1/storage/object/next HTTP/1.1\r\nhost: gw\r\napikey: {key}\r\n\r\n");
    let trailers = ["x-t: a\n", "\n", "x-t: a\rb", "x-t: a\0"];
    for trailer in trailers {
        let mut c = Client::connect(gw.port).await;
        c.send(format!("{head}5\r\nhello\r\n0\r\n{trailer}\r\n{next}").as_bytes())
            .await;
        let a = c.answer("POST").await;
        println!("trailer {trailer:?}: {} {}", a.status(), a.text());
        assert_eq!(a.status(), 400, "{trailer:?}: {a:?}");
        assert!(
            c.closed().await,
            "{trailer:?}: the connection is closed after the broken body"
        );
    }
    let refused = metric(
        &gw.metrics().await,
        "aura_errors_total",
        &["side=\"client\"", "code=\"invalid_body\""],
    );
    assert_eq!(refused, trailers.len() as f64, "counted as the client's");
    // A well-formed trailer is read and dropped, and the request after it answered.
    let mut c = Client::connect(gw.port).await;
    c.send(format!("{head}5\r\nhello\r\n0\r\nx-t: a\r\n\r\n{next}").as_bytes())
        .await;
    let a = c.answer("POST").await;
    assert_eq!((a.status(), a.text()), (200, "POST 5 hello".into()));
    let a = c.answer("GET").await;
    assert_eq!((a.status(), a.text()), (200, "GET 0 ".into()));
}
