//! Idle HTTP/1.1 keep-alive connections through the real binary: released while idle
//! (`server.idle_release_ms`), their next request served afresh on the same socket — whole,
//! pipelined, split across the release, or a WebSocket upgrade — and still bounded by the
//! header timeout: a parked connection closes at it, and a head started after a release
//! cannot outlive it.

use std::time::{Duration, Instant};

use futures::{SinkExt as _, StreamExt as _};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;

use crate::support::builder::{Gateway, Started};
use crate::support::gateway::Process;
use crate::support::metrics::metric;

const GET_HEALTH: &[u8] = b"GET /health HTTP/1.1\r\nhost: gw\r\n\r\n";

async fn parked(gw: &Process) -> f64 {
    metric(
        &gw.metrics().await,
        "aura_connections_parked",
        &["plane=\"data\""],
    )
}

/// Until `aura_connections_parked{plane="data"}` reads `want`; fails after 5 s with the last
/// reading.
async fn parked_reaches(gw: &Process, want: f64) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let now = parked(gw).await;
        if now == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "parked connections: {now}, want {want}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Reads one answer (head and `content-length` body) from `s`, keeping bytes past it in `rest`;
/// its status, or 0 when the connection closed first.
async fn answer(s: &mut TcpStream, rest: &mut Vec<u8>) -> u16 {
    let mut buf = [0u8; 4096];
    loop {
        if let Some(end) = rest.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&rest[..end]).to_ascii_lowercase();
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map_or(0, |v| v.trim().parse().expect("length"));
            let whole = end + 4 + length;
            while rest.len() < whole {
                let n = s.read(&mut buf).await.expect("body");
                assert!(n > 0, "closed inside a body");
                rest.extend_from_slice(&buf[..n]);
            }
            let status = head.split(' ').nth(1).and_then(|c| c.parse().ok());
            rest.drain(..whole);
            return status.unwrap_or(0);
        }
        match tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return 0,
            Ok(Ok(n)) => rest.extend_from_slice(&buf[..n]),
            Err(_) => panic!("no answer within 10 s"),
        }
    }
}

/// A new keep-alive connection to `port` with one `/health` answered.
async fn answered_once(port: u16) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    s.write_all(GET_HEALTH).await.expect("write");
    assert_eq!(answer(&mut s, &mut Vec::new()).await, 200);
    s
}

/// How long until the gateway closes `s` (reading and discarding), at most `within`.
async fn closes_within(s: &mut TcpStream, within: Duration) -> Option<Duration> {
    let started = Instant::now();
    let mut buf = [0u8; 1024];
    let closed = tokio::time::timeout(within, async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    });
    closed.await.ok().map(|()| started.elapsed())
}

/// Fifty idle connections are parked and each serves its next request — whole, two pipelined
/// in one write, or split across the release (the first part read before it, kept through it)
/// — and parks again; parked connections close at the header timeout.
#[tokio::test]
async fn idle_connections_are_parked_and_serve_their_next_request_on_the_same_socket() {
    let Started { gw, dir: _dir, .. } = Gateway::builder()
        .toml("[server]\nidle_release_ms = 200\nheader_read_timeout_ms = 4000\n")
        .binary();
    let mut connections = Vec::new();
    for _ in 0..50 {
        connections.push(answered_once(gw.port).await);
    }
    parked_reaches(&gw, 50.0).await;

    for (i, s) in connections.iter_mut().enumerate() {
        let mut rest = Vec::new();
        match i % 3 {
            0 => {
                s.write_all(GET_HEALTH).await.expect("write");
                assert_eq!(answer(s, &mut rest).await, 200, "connection {i}");
            }
            1 => {
                s.write_all(&[GET_HEALTH, GET_HEALTH].concat())
                    .await
                    .expect("write");
                assert_eq!(answer(s, &mut rest).await, 200, "connection {i}");
                assert_eq!(answer(s, &mut rest).await, 200, "connection {i}, pipelined");
            }
            _ => {
                s.write_all(&GET_HEALTH[..9]).await.expect("write");
                tokio::time::sleep(Duration::from_millis(30)).await;
                s.write_all(&GET_HEALTH[9..]).await.expect("write");
                assert_eq!(answer(s, &mut rest).await, 200, "connection {i}");
            }
        }
        assert!(rest.is_empty(), "connection {i}: stray bytes");
    }
    parked_reaches(&gw, 50.0).await;

    // The next request's first part comes with this one and the rest after the release: the
    // part read is kept through it.
    let s = &mut connections[0];
    let partial = &GET_HEALTH[..12];
    s.write_all(&[GET_HEALTH, partial].concat())
        .await
        .expect("write");
    let mut rest = Vec::new();
    assert_eq!(answer(s, &mut rest).await, 200);
    tokio::time::sleep(Duration::from_millis(600)).await;
    s.write_all(&GET_HEALTH[12..]).await.expect("write");
    assert_eq!(
        answer(s, &mut rest).await,
        200,
        "the head split across the release"
    );

    // A parked connection is closed at the header timeout after its last answer, like an idle
    // one that kept its state.
    parked_reaches(&gw, 50.0).await;
    for (i, s) in connections.iter_mut().enumerate() {
        let closed = closes_within(s, Duration::from_secs(6)).await;
        assert!(
            closed.is_some(),
            "parked connection {i} still open past the header timeout"
        );
    }
    parked_reaches(&gw, 0.0).await;
    // And the listener serves on.
    let mut fresh = answered_once(gw.port).await;
    fresh.write_all(GET_HEALTH).await.expect("write");
    assert_eq!(answer(&mut fresh, &mut Vec::new()).await, 200);
}

/// Slowloris against the release: a client whose head trickles in after its connection was
/// parked (a byte every 250 ms, longer than the release time) is closed at the header timeout
/// from its first byte, not carried from release to release; one that sends a part of a head
/// and stops is closed at it too; neither is answered, and both closings are counted.
#[tokio::test]
async fn a_head_started_after_a_release_is_bounded_by_the_header_timeout() {
    let Started { gw, dir: _dir, .. } = Gateway::builder()
        .toml("[server]\nidle_release_ms = 100\nheader_read_timeout_ms = 2000\n")
        .binary();
    let mut trickle = answered_once(gw.port).await;
    let mut stalled = answered_once(gw.port).await;
    parked_reaches(&gw, 2.0).await;

    stalled.write_all(b"GET /hea").await.expect("write");
    let stalled_since = Instant::now();
    let (mut reader, mut writer) = trickle.split();
    let started = Instant::now();
    let endless = async {
        let head = b"GET /health HTTP/1.1\r\nx-slow: "
            .iter()
            .chain(std::iter::repeat(&b'a'));
        for byte in head {
            if writer.write_all(&[*byte]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    };
    let closed = async {
        let mut buf = [0u8; 1024];
        let mut got = Vec::new();
        loop {
            match reader.read(&mut buf).await {
                Ok(0) | Err(_) => return got,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    };
    let got = tokio::time::timeout(Duration::from_secs(8), async {
        tokio::select! {
            got = closed => got,
            () = endless => Vec::new(),
        }
    })
    .await
    .expect("the trickling head was cut");
    let took = started.elapsed();
    eprintln!("a trickling head after a release was cut after {took:?}");
    assert!(took < Duration::from_millis(4500), "cut after {took:?}");
    let got = String::from_utf8_lossy(&got);
    assert!(
        !got.contains(" 200 "),
        "the trickled request was answered: {got}"
    );

    let closed = closes_within(&mut stalled, Duration::from_secs(6)).await;
    let took = closed.map(|_| stalled_since.elapsed());
    eprintln!("a stalled head after a release was closed after {took:?}");
    assert!(
        took.is_some_and(|t| t < Duration::from_millis(4500)),
        "{took:?}"
    );
    parked_reaches(&gw, 0.0).await;
    let silent = metric(
        &gw.metrics().await,
        "aura_connections_closed_total",
        &["plane=\"data\"", "reason=\"silent\""],
    );
    assert!(silent >= 2.0, "closings counted: {silent}");
}

/// A part of the next head sent behind an answered request and left there keeps the header
/// deadline of the last answer through the release that follows: closed at it, not at the
/// release time plus a new header timeout (here 1 s + 2.5 s); a connection parked in between
/// (answered 0.8 s later, so its own deadline comes 0.8 s after the first one's) still serves.
#[tokio::test]
async fn a_head_carried_over_a_release_keeps_its_deadline() {
    let Started { gw, dir: _dir, .. } = Gateway::builder()
        .toml("[server]\nidle_release_ms = 1000\nheader_read_timeout_ms = 2500\n")
        .binary();
    let mut carried = TcpStream::connect(("127.0.0.1", gw.port))
        .await
        .expect("connect");
    carried
        .write_all(&[GET_HEALTH, b"GET /he".as_slice()].concat())
        .await
        .expect("write");
    assert_eq!(answer(&mut carried, &mut Vec::new()).await, 200);
    let answered = Instant::now();
    tokio::time::sleep(Duration::from_millis(800)).await;
    let mut idle = answered_once(gw.port).await;
    let closed = closes_within(&mut carried, Duration::from_secs(6)).await;
    let took = closed.map(|_| answered.elapsed());
    eprintln!("a head carried over a release was closed {took:?} after the last answer");
    assert!(
        took.is_some_and(|t| t >= Duration::from_millis(2400) && t < Duration::from_millis(3300)),
        "{took:?}"
    );
    // The other connection, parked since 1.8 s and due at 3.3 s, serves its next request.
    parked_reaches(&gw, 1.0).await;
    idle.write_all(GET_HEALTH).await.expect("write");
    assert_eq!(answer(&mut idle, &mut Vec::new()).await, 200);
}

/// A WebSocket upgrade on a connection that was parked: the socket, taken back from the
/// release, goes to the tunnel with the frame the client sent right behind the handshake.
#[tokio::test]
async fn a_websocket_upgrade_on_a_parked_connection_reaches_the_tunnel() {
    let realtime = crate::support::upstream::websocket_echo().await;
    let Started { gw, fx, dir: _dir } = Gateway::builder()
        .toml(format!(
            "[server]\nidle_release_ms = 100\n\n[upstreams]\nrealtime_url = \"{realtime}\"\n"
        ))
        .binary();
    let s = answered_once(gw.port).await;
    parked_reaches(&gw, 1.0).await;
    let url = format!(
        "ws://127.0.0.1:{}/v1/realtime/websocket?apikey={}",
        gw.port, fx.anon_key
    );
    let (mut ws, response) = tokio_tungstenite::client_async(&url, s)
        .await
        .expect("handshake on the parked connection");
    assert_eq!(response.status(), 101);
    for text in ["one", "two", "three"] {
        ws.send(Message::text(text)).await.expect("send");
        let echoed = ws.next().await.expect("frame").expect("ok");
        assert_eq!(echoed, Message::text(text));
    }
    // The tunnel outlives the release time: it is not the keep-alive connection any more.
    tokio::time::sleep(Duration::from_millis(400)).await;
    ws.send(Message::text("later")).await.expect("send");
    assert_eq!(
        ws.next().await.expect("frame").expect("ok"),
        Message::text("later")
    );
    assert_eq!(parked(&gw).await, 0.0);
}
