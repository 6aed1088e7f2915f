//! The HTTP edge under hostile clients: slowloris, and clients that go away mid-request.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use reqwest::StatusCode;

use crate::support::gateway::{InProcess, TEST_KEY, client, test_config};
use crate::support::nats_server::shared;
use crate::support::responder::{Responder, reply};
use crate::support::unique_prefix;

#[tokio::test]
async fn slow_header_senders_are_cut_and_other_clients_are_served() {
    let mut config = test_config(&shared().url(), &unique_prefix());
    config.server.header_read_timeout_ms = 500;
    let gw = InProcess::start(config).await;
    let addr = gw.data;
    let slow: Vec<TcpStream> = (0..50)
        .map(|_| {
            let mut s = TcpStream::connect(addr).expect("connect");
            s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ")
                .expect("write");
            s
        })
        .collect();
    let r = client()
        .get(gw.data_url("/health"))
        .send()
        .await
        .expect("served meanwhile");
    assert_eq!(r.status(), StatusCode::OK);
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
    let nats = shared();
    let prefix = unique_prefix();
    let mut config = test_config(&nats.url(), &prefix);
    config.breaker.failure_threshold = 1;
    config.breaker.half_open_probes = 1;
    let gw = InProcess::start(config).await;
    let _slow = Responder::start(
        &nats.url(),
        &format!("{prefix}.functions.http"),
        Duration::from_millis(500),
        |_| reply(200, &[], b"ok"),
    )
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
        if impatient
            .post(gw.data_url("/v1/functions/f"))
            .send()
            .await
            .is_err()
        {
            gone += 1;
        }
    }
    assert!(gone >= 190, "clients went away: {gone}");
    let breaker = gw
        .state
        .breakers
        .service(aura_gateway::proxy::service::Service::Functions);
    assert_eq!(
        breaker.state(),
        aura_gateway::breaker::BreakerState::Closed,
        "abandoned calls are no failures"
    );
    let r = client()
        .post(gw.data_url("/v1/functions/f"))
        .send()
        .await
        .expect("r");
    assert_eq!(r.status(), StatusCode::OK, "the probe slots all came back");
}
