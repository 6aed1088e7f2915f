//! SIGTERM, through the real binary: requests in flight finish, idle connections (HTTP/1.1
//! keep-alive and HTTP/2) are closed at once, and a request that outlives the shutdown grace is
//! cut.

use std::time::Duration;

use reqwest::StatusCode;

use crate::support::call::{Answer, IntoCall, client};
use crate::support::config::write_config;
use crate::support::gateway::Process;
use crate::support::poll::poll_tries;
use crate::support::records::e2e_control_file;
use crate::support::responder::{Bus, Responder, reply};

/// The gateway binary on the shared bus with `server` (lines of its `[server]` table) and the
/// e2e control file, `functions` answered `answer` after `delay`; returned once the gateway's
/// own NATS connection is up.
async fn with_slow_functions(
    server: &str,
    delay: Duration,
    answer: &'static [u8],
) -> (Process, Responder, tempfile::TempDir) {
    let bus = Bus::shared();
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("control.toml"), e2e_control_file()).expect("control file");
    let (nats, prefix) = (&bus.url, &bus.prefix);
    let toml = format!(
        "[server]\n{server}\n[nats]\nurl = {nats:?}\nsubject_prefix = {prefix:?}\n\
         [control]\nfile = \"control.toml\"\n"
    );
    let gw = Process::serve(&write_config(dir.path(), &toml), dir.path());
    let responder = bus
        .respond_after("functions", delay, move |_| reply(200, &[], answer))
        .await;
    let client = client();
    let _ = poll_tries(100, Duration::from_millis(50), async || {
        let r = client.get(gw.data_url("/v1/auth/x")).call().read().await;
        let up = r.status != StatusCode::SERVICE_UNAVAILABLE || r.text().contains("no_responders");
        up.then_some(())
    })
    .await;
    (gw, responder, dir)
}

#[tokio::test]
async fn sigterm_lets_in_flight_requests_finish() {
    let (gw, _responder, _dir) =
        with_slow_functions("", Duration::from_millis(1_000), b"finished").await;
    let in_flight = tokio::spawn(
        crate::support::call::client()
            .get(gw.data_url("/v1/functions/slow"))
            .send(),
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    gw.signal("-TERM");
    let response = in_flight
        .await
        .expect("task")
        .expect("in-flight request completes");
    let response = Answer::of(response).await;
    assert_eq!(response.status, StatusCode::OK);
    assert_eq!(response.text(), "finished");
    let status = gw.exit().await;
    assert!(status.success(), "clean exit after SIGTERM: {status:?}");
}

/// Reads from `conn` until it ends (EOF or reset); every byte read.
async fn read_to_end(conn: &mut tokio::net::TcpStream) -> Vec<u8> {
    use tokio::io::AsyncReadExt as _;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match conn.read(&mut buf).await {
            Ok(0) | Err(_) => return got,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
}

#[tokio::test]
async fn sigterm_closes_idle_connections_at_once_and_cuts_what_outlives_the_grace() {
    use tokio::io::AsyncWriteExt as _;
    let grace = Duration::from_secs(3);
    // The backend answers long after the grace.
    let (gw, _responder, _dir) = with_slow_functions(
        &format!("shutdown_grace_secs = {}", grace.as_secs()),
        Duration::from_secs(60),
        b"too late",
    )
    .await;
    let addr = ("127.0.0.1", gw.port);
    // Keep-alive connections that were answered once and then sent nothing: many, as an edge
    // holds them.
    let mut idle = Vec::new();
    for _ in 0..20 {
        let mut conn = tokio::net::TcpStream::connect(addr).await.expect("connect");
        conn.write_all(b"GET /health HTTP/1.1\r\nhost: gateway\r\n\r\n")
            .await
            .expect("write");
        let mut buf = [0u8; 1024];
        use tokio::io::AsyncReadExt as _;
        let n = conn.read(&mut buf).await.expect("answer");
        assert!(
            buf[..n].starts_with(b"HTTP/1.1 200"),
            "{}",
            String::from_utf8_lossy(&buf[..n])
        );
        idle.push(conn);
    }
    // An HTTP/2 connection (prior knowledge) answered once, then idle: its connection task
    // ends when the gateway closes it.
    let h2_idle = {
        let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let (send, connection) = h2::client::handshake(tcp).await.expect("h2c");
        let ended = tokio::spawn(async move {
            let _ = connection.await;
            std::time::Instant::now()
        });
        let mut send = send.ready().await.expect("ready");
        let health = format!("http://127.0.0.1:{}/health", gw.port);
        let request = http::Request::get(health).body(()).expect("request");
        let (response, _) = send.send_request(request, true).expect("sent");
        assert_eq!(response.await.expect("answer").status(), 200);
        (send, ended)
    };
    // A request whose backend answers after the grace.
    let mut slow = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let head = format!(
        "GET /v1/functions/slow HTTP/1.1\r\nhost: gateway\r\napikey: {}\r\n\r\n",
        crate::support::records::TEST_KEY
    );
    slow.write_all(head.as_bytes()).await.expect("write");
    tokio::time::sleep(Duration::from_millis(300)).await;

    let signalled = std::time::Instant::now();
    gw.signal("-TERM");
    let idle_closed = tokio::time::timeout(grace * 3, async {
        for conn in &mut idle {
            assert!(
                read_to_end(conn).await.is_empty(),
                "an idle connection got bytes"
            );
        }
        signalled.elapsed()
    })
    .await
    .expect("the idle connections were closed");
    let h2_closed = tokio::time::timeout(grace * 3, h2_idle.1)
        .await
        .expect("the HTTP/2 connection was closed")
        .expect("joined")
        .duration_since(signalled);
    let cut = tokio::time::timeout(grace * 3, async {
        let got = read_to_end(&mut slow).await;
        (got, signalled.elapsed())
    })
    .await
    .expect("the request in flight was cut");
    let status = gw.exit().await;
    println!(
        "idle connections closed after {idle_closed:?}, HTTP/2 after {h2_closed:?}, \
         the slow request cut after {:?}",
        cut.1
    );
    // Closed when shutdown began (HTTP/2 after its GOAWAY), not when the grace ran out.
    assert!(
        idle_closed < grace / 2,
        "idle connections closed after {idle_closed:?}"
    );
    assert!(h2_closed < grace / 2, "HTTP/2 closed after {h2_closed:?}");
    // The request in flight had its grace, then its connection was dropped without an answer.
    assert!(cut.1 >= grace - Duration::from_millis(200), "{:?}", cut.1);
    assert!(cut.0.is_empty(), "{}", String::from_utf8_lossy(&cut.0));
    assert!(status.success(), "clean exit after SIGTERM: {status:?}");
}
