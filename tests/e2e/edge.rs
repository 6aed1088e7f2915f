//! The HTTP edge under hostile clients: slowloris, and clients that go away mid-request.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use aura_gateway::config::Config;

use reqwest::StatusCode;

use crate::support::builder::{Gateway, Started};
use crate::support::call::{Call, IntoCall, client};
use crate::support::gateway::InProcess;
use crate::support::metrics::own_rss_mib;
use crate::support::raw::raw_exchange;
use crate::support::records::TEST_KEY;
use crate::support::responder::{Envelopes, reply};

/// Clients get 500 ms to send their request heads.
fn short_header_timeout(c: &mut Config) {
    c.server.header_read_timeout_ms = 500;
}

#[tokio::test]
async fn slow_header_senders_are_cut_and_other_clients_are_served() {
    let gw = Gateway::start_with(short_header_timeout).await;
    let addr = gw.data;
    let slow: Vec<TcpStream> = (0..50)
        .map(|_| {
            let mut s = TcpStream::connect(addr).expect("connect");
            let head = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ";
            s.write_all(head).expect("write");
            s
        })
        .collect();
    let served = client().get(gw.data_url("/health")).call().status().await;
    assert_eq!(served, StatusCode::OK, "served meanwhile");
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    for mut s in slow {
        s.set_read_timeout(Some(Duration::from_secs(2)))
            .expect("timeout");
        let mut buf = [0u8; 512];
        // The server gave up on the headers: the connection is closed (possibly after a 408).
        let closed = match s.read(&mut buf) {
            Ok(0) | Err(_) => true,
            Ok(n) => {
                let text = String::from_utf8_lossy(&buf[..n]);
                text.starts_with("HTTP/1.1 408") || matches!(s.read(&mut buf), Ok(0) | Err(_))
            }
        };
        assert!(closed, "a slowloris connection was kept open");
    }
}

#[tokio::test]
async fn clients_that_go_away_give_their_breaker_probes_back() {
    let gw = Gateway::with(|c| (c.breaker.failure_threshold, c.breaker.half_open_probes) = (1, 1));
    let gw = gw.start().await;
    let slowly = Duration::from_millis(500);
    let _slow = gw
        .bus
        .respond_after("functions", slowly, |_| reply(200, &[], b"ok"))
        .await;
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(20))
        .default_headers({
            let mut h = reqwest::header::HeaderMap::new();
            h.insert("apikey", TEST_KEY.parse().expect("value"));
            h
        })
        .build()
        .expect("client");
    let mut gone = 0;
    for _ in 0..200 {
        let f = impatient.post(gw.data_url("/v1/functions/f")).call();
        gone += usize::from(f.try_send().await.is_err());
    }
    assert!(gone >= 190, "clients went away: {gone}");
    let functions = aura_gateway::proxy::service::Service::Functions;
    let state = gw.state.breakers.service(functions).state();
    let closed = state == aura_gateway::breaker::BreakerState::Closed;
    assert!(closed, "abandoned calls are no failures: {state:?}");
    let f = client()
        .post(gw.data_url("/v1/functions/f"))
        .call()
        .status()
        .await;
    assert_eq!(f, StatusCode::OK, "the probe slots all came back");
}

/// Sends `raw` on a new connection and returns everything the gateway wrote back.
fn exchange(addr: std::net::SocketAddr, raw: &[u8]) -> String {
    raw_exchange(addr, raw)
}

/// A gateway and a functions responder recording every envelope it receives.
async fn recording_gateway() -> (InProcess, Envelopes) {
    let gw = Gateway::start().await;
    let envelopes = gw
        .bus
        .record(&["functions"], |_| reply(200, &[], b"ok"))
        .await;
    (gw, envelopes)
}

fn status_of(response: &str) -> Option<u16> {
    response
        .strip_prefix("HTTP/1.1 ")
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse().ok())
}

fn header_names(envelope: &serde_json::Value) -> Vec<String> {
    envelope["headers"]
        .as_array()
        .map(|hs| {
            hs.iter()
                .filter_map(|h| h[0].as_str().map(str::to_ascii_lowercase))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn length_and_chunked_together_never_smuggle_a_request() {
    let (gw, envelopes) = recording_gateway().await;
    let addr = gw.data;
    // CL.TE: a front end trusting Content-Length would forward `0\r\n\r\nG…` as one body and
    // leave a second request behind; one trusting Transfer-Encoding ends the body at `0`.
    let raw = format!(
        "POST /v1/functions/f HTTP/1.1\r\nHost: x\r\napikey: {TEST_KEY}\r\n\
         Content-Length: 49\r\nTransfer-Encoding: chunked\r\n\r\n\
         0\r\n\r\nGET /v1/functions/smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
    );
    let answer = tokio::task::spawn_blocking(move || exchange(addr, raw.as_bytes()))
        .await
        .expect("exchange");
    let status = status_of(&answer);
    assert!(
        matches!(status, Some(400) | Some(200)),
        "answered {answer:?}"
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    let seen = envelopes.seen();
    assert!(
        seen.iter()
            .all(|e| e["path"].as_str() != Some("/v1/functions/smuggled")
                && !e["url"].as_str().unwrap_or("").contains("smuggled")),
        "a smuggled request reached the backend: {seen:?}"
    );
    // Normalised (answered by the chunked framing) means exactly one delivery; refused, none.
    let expected = usize::from(status == Some(200));
    assert_eq!(seen.len(), expected, "deliveries for an answer {status:?}");
    for envelope in &seen {
        let names = header_names(envelope);
        assert!(
            !names
                .iter()
                .any(|n| n == "transfer-encoding" || n == "content-length"),
            "framing headers passed upstream: {names:?}"
        );
        assert!(
            envelope["body"].is_null() || envelope["body"].as_str() == Some(""),
            "the body was read by Content-Length, not by the chunked framing: {envelope}"
        );
    }
    assert!(
        answer.matches("HTTP/1.1 ").count() <= 1,
        "the gateway answered a second, smuggled request: {answer:?}"
    );
    drop(envelopes);
}

#[tokio::test]
async fn conflicting_lengths_and_bad_header_names_are_refused_before_any_backend() {
    let (gw, envelopes) = recording_gateway().await;
    let addr = gw.data;
    let cases = [
        format!(
            "POST /v1/functions/f HTTP/1.1\r\nHost: x\r\napikey: {TEST_KEY}\r\n\
             Content-Length: 2\r\nContent-Length: 4\r\n\r\nabcd"
        ),
        format!(
            "POST /v1/functions/f HTTP/1.1\r\nHost: x\r\napikey: {TEST_KEY}\r\n\
             Content-Length: 2, 4\r\n\r\nabcd"
        ),
        format!(
            "POST /v1/functions/f HTTP/1.1\r\nHost: x\r\napikey: {TEST_KEY}\r\n\
             Content-Length: -1\r\n\r\nabcd"
        ),
        format!(
            "GET /v1/functions/f HTTP/1.1\r\nHost: x\r\napikey: {TEST_KEY}\r\nBad Name: v\r\n\r\n"
        ),
        format!(
            "GET /v1/functions/f HTTP/1.1\r\nHost: x\r\napikey: {TEST_KEY}\r\nX-Ctl\x01: v\r\n\r\n"
        ),
        format!("GET /v1/functions/f HTTP/1.1\r\nHost: x\r\napikey: {TEST_KEY}\r\n: empty\r\n\r\n"),
        format!(
            "POST /v1/functions/f HTTP/1.1\r\nHost: x\r\napikey: {TEST_KEY}\r\n\
             Transfer-Encoding: gzip\r\n\r\nabcd"
        ),
    ];
    for raw in cases {
        let shown = raw.clone();
        let answer = tokio::task::spawn_blocking(move || exchange(addr, raw.as_bytes()))
            .await
            .expect("exchange");
        assert_eq!(
            status_of(&answer),
            Some(400),
            "{shown:?} was answered {answer:?}, not 400"
        );
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let reached = !envelopes.seen().is_empty();
    assert!(!reached, "a malformed request reached the backend");
    // The listener is unharmed.
    let f = client().post(gw.data_url("/v1/functions/f")).call();
    f.expect(StatusCode::OK).await;
    drop(envelopes);
}

#[tokio::test]
async fn load_past_capacity_is_shed_fast_and_the_rest_keeps_its_latency() {
    let gw = Gateway::start_with(|c| c.server.max_in_flight = 16).await;
    let (backend, ok) = (Duration::from_millis(300), |_| reply(200, &[], b"ok"));
    let responder = gw.bus.respond_after("functions", backend, ok).await;
    let before = own_rss_mib();
    let http = client();
    // 25 times the capacity, all at once, three waves.
    let mut served = 0usize;
    let mut shed = 0usize;
    let mut slowest_shed = Duration::ZERO;
    let mut slowest_served = Duration::ZERO;
    for _ in 0..3 {
        let calls = (0..400).map(|_| {
            let http = http.clone();
            let url = gw.data_url("/v1/functions/f");
            tokio::spawn(async move {
                let started = std::time::Instant::now();
                let r = http.post(url).send().await.expect("answered");
                let status = r.status();
                let retry_after = (
                    r.headers().get("retry-after").cloned(),
                    r.headers().contains_key("x-request-id")
                        && r.headers().contains_key("x-content-type-options"),
                );
                let body: serde_json::Value = r.json().await.unwrap_or_default();
                (status, retry_after, body, started.elapsed())
            })
        });
        for call in futures::future::join_all(calls).await {
            let (status, retry_after, body, took) = call.expect("task");
            match status {
                StatusCode::OK => {
                    served += 1;
                    slowest_served = slowest_served.max(took);
                }
                StatusCode::SERVICE_UNAVAILABLE => {
                    assert_eq!(body["error"]["code"], "overloaded", "{body}");
                    let (retry_after, stamped) = retry_after;
                    assert!(retry_after.is_some(), "a shed request says when to retry");
                    assert!(
                        stamped,
                        "a shed answer has a request id and security headers"
                    );
                    shed += 1;
                    slowest_shed = slowest_shed.max(took);
                }
                other => panic!("unexpected {other}: {body}"),
            }
        }
    }
    let grown = own_rss_mib() - before;
    eprintln!(
        "overload: 1200 requests at 25x capacity: {served} served (slowest {slowest_served:?}), \
         {shed} shed (slowest {slowest_shed:?}), RSS +{grown:.1} MiB"
    );
    assert!(served >= 16, "the capacity was used: {served} served");
    assert!(shed >= 600, "the excess was shed: {shed} of 1200");
    // Queued instead of shed, the last of 400 would wait 400 / 16 backend calls (7.5 s); shed,
    // each answer takes no backend time at all. Twice the backend leaves room for 1,200
    // connections opened at once on a machine shared with other tests.
    assert!(
        slowest_shed < backend * 2,
        "shedding took {slowest_shed:?}, longer than two backend calls"
    );
    assert!(
        slowest_served < backend * 4,
        "accepted requests waited {slowest_served:?} for a {backend:?} backend"
    );
    assert!(grown < 64.0, "memory grew by {grown:.1} MiB under overload");
    // Load drops: every request is served again.
    for _ in 0..20 {
        let f = http
            .post(gw.data_url("/v1/functions/f"))
            .call()
            .status()
            .await;
        assert_eq!(f, StatusCode::OK, "recovered after the overload");
    }
    let shed_metric = gw.state.metrics.render();
    assert!(
        shed_metric.contains("aura_requests_shed_total"),
        "shed requests are counted"
    );
    drop(responder);
}

/// Whether a read shows the peer closed the connection (not a read timeout).
fn closed_by_peer(read: std::io::Result<usize>) -> bool {
    match read {
        Ok(0) => true,
        Err(e) => !matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
        Ok(_) => false,
    }
}

#[tokio::test]
async fn silent_connections_cannot_hold_the_connection_cap() {
    let gw = Gateway::with(|c| c.server.max_connections = 4);
    let gw = gw.with(short_header_timeout).start().await;
    let addr = gw.data;
    // Four connections that never send a byte take every slot.
    let silent: Vec<TcpStream> = (0..4)
        .map(|_| TcpStream::connect(addr).expect("connect"))
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = std::time::Instant::now();
    let fifth = client().get(gw.data_url("/health")).send();
    let r = tokio::time::timeout(Duration::from_secs(5), fifth).await;
    let r = r.expect("a fifth client is served once the silent ones are cut");
    assert_eq!(r.expect("answered").status(), StatusCode::OK);
    let waited = started.elapsed();
    eprintln!("connection cap: a fifth client served after {waited:?}");
    assert!(waited < Duration::from_secs(2), "waited {waited:?}");
    for mut s in silent {
        s.set_read_timeout(Some(Duration::from_secs(2)))
            .expect("timeout");
        let mut buf = [0u8; 64];
        assert!(
            closed_by_peer(s.read(&mut buf)),
            "a silent connection was kept"
        );
    }
}

#[tokio::test]
async fn idle_keep_alive_connections_are_closed_after_the_idle_limit() {
    let gw = Gateway::start_with(short_header_timeout).await;
    let addr = gw.data;
    let (answer, idle_for) = tokio::task::spawn_blocking(move || {
        let mut s = TcpStream::connect(addr).expect("connect");
        s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            .expect("write");
        // The answer, until the connection goes quiet.
        s.set_read_timeout(Some(Duration::from_millis(200)))
            .expect("timeout");
        let mut answer = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(n) = s.read(&mut buf) {
            if n == 0 {
                break;
            }
            answer.extend_from_slice(&buf[..n]);
        }
        // Then nothing is sent: how long until the gateway closes the connection?
        let quiet = std::time::Instant::now();
        s.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        assert!(
            closed_by_peer(s.read(&mut buf)),
            "an idle keep-alive connection was kept"
        );
        (
            String::from_utf8_lossy(&answer).into_owned(),
            quiet.elapsed(),
        )
    })
    .await
    .expect("client");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        idle_for < Duration::from_secs(2),
        "closed only after {idle_for:?} idle"
    );
}

/// One HTTP/2 request with prior knowledge (h2c) to `port`: the status, and the streams the
/// server allows at once (from its SETTINGS), or the error.
async fn h2c_get(
    port: u16,
    path: &str,
    header: Option<(&str, String)>,
) -> Result<(u16, usize), String> {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| e.to_string())?;
    let (send, connection) = h2::client::handshake(tcp)
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(connection);
    let mut send = send.ready().await.map_err(|e| e.to_string())?;
    let mut request = http::Request::get(format!("http://127.0.0.1:{port}{path}"));
    if let Some((name, value)) = header {
        request = request.header(name, value);
    }
    let (response, _) = send
        .send_request(request.body(()).expect("request"), true)
        .map_err(|e| e.to_string())?;
    let response = response.await.map_err(|e| e.to_string())?;
    Ok((response.status().as_u16(), send.current_max_send_streams()))
}

#[tokio::test]
async fn http2_prior_knowledge_is_served_on_both_planes_within_its_limits_and_can_be_turned_off() {
    let limits = "[server]\nhttp2_max_concurrent_streams = 8\nmax_header_bytes = 16384\n";
    let Started { gw, fx, .. } = Gateway::builder().toml(limits).binary();
    for port in [gw.port, gw.management_port] {
        let (status, streams) = h2c_get(port, "/health", None).await.expect("h2c");
        assert_eq!(status, 200);
        assert_eq!(streams, 8, "the stream limit is advertised");
    }
    // A head over `server.max_header_bytes` gets the contract's JSON 431, with the request id
    // and the security headers, on both protocols.
    let big = "a".repeat(20_000);
    let over_h2 = h2c_get(gw.port, "/health", Some(("x-big", big.clone()))).await;
    let refused = matches!(over_h2, Ok((431, _)));
    assert!(refused, "an oversized header list over HTTP/2: {over_h2:?}");
    let with_big = |value: &str| Call::get(gw.data_url("/health")).header("x-big", value);
    let r = with_big(&big)
        .expect(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE)
        .await;
    assert!(r.headers.contains_key("x-request-id"));
    for name in crate::support::SECURITY_HEADERS {
        assert!(r.headers.contains_key(*name), "{name}");
    }
    assert_eq!(r.code(), "request_headers_too_large");
    // Past twice the limit the listener cuts the head before it is parsed: never served.
    let huge = "a".repeat(40_000);
    let cut_h2 = h2c_get(gw.port, "/health", Some(("x-big", huge.clone()))).await;
    assert!(!matches!(cut_h2, Ok((200, _))), "{cut_h2:?}");
    let cut = with_big(&huge).status().await;
    assert_eq!(cut, StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
    // Just under the limit is served.
    assert_eq!(with_big(&"a".repeat(12_000)).status().await, StatusCode::OK);
    drop(gw);

    let off = Gateway::builder()
        .fixture(&fx)
        .toml("[server]\nhttp2 = false\n");
    let Started { gw, .. } = off.binary();
    let refused = h2c_get(gw.port, "/health", None).await;
    assert!(refused.is_err(), "HTTP/2 served while off: {refused:?}");
    let r = Call::get(gw.data_url("/health")).status().await;
    assert_eq!(r, StatusCode::OK, "HTTP/1.1");
}
