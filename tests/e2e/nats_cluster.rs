//! A three-server NATS cluster: the gateway is given the three seed URLs, the server it is
//! connected to is killed under load, and it rides it: every request answers within its budget,
//! none is delivered twice, and requests are served again through another member.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::StatusCode;

use crate::support::free_port;
use crate::support::gateway::{InProcess, client, test_config};
use crate::support::nats_server::NatsServer;
use crate::support::responder::{Responder, envelope_header, reply};
use crate::support::unique_prefix;

struct Member {
    server: Option<NatsServer>,
    client_port: u16,
    monitor_port: u16,
}

async fn monitor(port: u16, path: &str) -> serde_json::Value {
    reqwest::get(format!("http://127.0.0.1:{port}{path}"))
        .await
        .expect("monitoring")
        .json()
        .await
        .expect("json")
}

/// Three servers routed to each other, once the cluster is formed.
async fn cluster() -> Vec<Member> {
    let ports: Vec<(u16, u16, u16)> = (0..3)
        .map(|_| (free_port(), free_port(), free_port()))
        .collect();
    let members: Vec<Member> = (0..3)
        .map(|i| {
            let (client_port, route_port, monitor_port) = ports[i];
            let routes: Vec<String> = (0..3)
                .filter(|j| *j != i)
                .map(|j| format!("nats-route://127.0.0.1:{}", ports[j].1))
                .collect();
            let config = format!(
                "server_name: n{i}\nhttp: 127.0.0.1:{monitor_port}\n\
                 cluster {{\n  name: aura\n  listen: 127.0.0.1:{route_port}\n  routes: [{}]\n}}\n",
                routes.join(", ")
            );
            Member {
                server: Some(NatsServer::start_on(client_port, &config)),
                client_port,
                monitor_port,
            }
        })
        .collect();
    let started = Instant::now();
    for m in &members {
        while monitor(m.monitor_port, "/routez").await["num_routes"].as_u64() != Some(2) {
            assert!(
                started.elapsed() < Duration::from_secs(15),
                "the cluster did not form"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    members
}

/// The member the gateway's connection (named `aura-gateway`) is on.
async fn gateway_member(members: &[Member]) -> usize {
    let started = Instant::now();
    loop {
        for (i, m) in members.iter().enumerate() {
            if m.server.is_none() {
                continue;
            }
            let connz = monitor(m.monitor_port, "/connz").await;
            if connz["connections"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["name"] == "aura-gateway")
            {
                return i;
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "gateway not connected"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn the_gateway_rides_the_loss_of_the_cluster_member_it_is_connected_to() {
    let mut members = cluster().await;
    let seeds = members
        .iter()
        .map(|m| format!("nats://127.0.0.1:{}", m.client_port))
        .collect::<Vec<_>>()
        .join(",");
    let prefix = unique_prefix();
    let mut config = test_config(&seeds, &prefix);
    config.timeouts.default_ms = 3_000;
    let gw = InProcess::start(config).await;
    let on = gateway_member(&members).await;
    // The backend sits on another member, and counts every delivery by request id.
    let backend_member = (on + 1) % 3;
    let deliveries: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    let seen = deliveries.clone();
    let _backend = Responder::start(
        &format!("nats://127.0.0.1:{}", members[backend_member].client_port),
        &format!("{prefix}.auth.http"),
        Duration::ZERO,
        move |envelope| {
            let id = envelope_header(&envelope, "x-test-id");
            *seen.lock().expect("lock").entry(id).or_default() += 1;
            reply(200, &[], b"ok")
        },
    )
    .await;
    // The subscription must be known across the cluster before the load starts.
    let c = client();
    let started = Instant::now();
    loop {
        let r = c
            .get(gw.data_url("/v1/auth/user"))
            .header("x-test-id", "warm-up")
            .send()
            .await
            .expect("answer");
        if r.status() == StatusCode::OK {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no route to the backend"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let mut results: Vec<(Instant, StatusCode, Duration)> = Vec::new();
    let load_started = Instant::now();
    let mut killed_at = None;
    let mut n = 0u32;
    while load_started.elapsed() < Duration::from_secs(8) {
        if killed_at.is_none() && load_started.elapsed() > Duration::from_secs(1) {
            // SIGKILL: no goodbye to the clients.
            members[on].server = None;
            killed_at = Some(Instant::now());
        }
        n += 1;
        let sent = Instant::now();
        let r = c
            .get(gw.data_url("/v1/auth/user"))
            .header("x-test-id", format!("r{n}"))
            .timeout(Duration::from_secs(10))
            .send()
            .await
            .expect("every request is answered");
        results.push((sent, r.status(), sent.elapsed()));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let killed_at = killed_at.expect("killed");
    // Within the route's budget (3 s), with the gateway's own answers while reconnecting.
    for (_, status, took) in &results {
        assert!(
            *took < Duration::from_millis(3_500),
            "a request took {took:?}"
        );
        assert!(
            *status == StatusCode::OK
                || *status == StatusCode::SERVICE_UNAVAILABLE
                || *status == StatusCode::GATEWAY_TIMEOUT,
            "unexpected {status}"
        );
    }
    // Served again through another member, and for good.
    let after: Vec<_> = results
        .iter()
        .filter(|(at, _, _)| *at > killed_at)
        .collect();
    let first_ok = after
        .iter()
        .position(|(_, s, _)| *s == StatusCode::OK)
        .expect("served again after the member died");
    let recovered_after = after[first_ok].0 - killed_at;
    let failed_after_recovery = after[first_ok..]
        .iter()
        .filter(|(_, s, _)| *s != StatusCode::OK)
        .count();
    println!(
        "member killed: {} requests after it, served again after {recovered_after:?}, {} failed before, {failed_after_recovery} after",
        after.len(),
        first_ok
    );
    assert!(
        recovered_after < Duration::from_secs(5),
        "{recovered_after:?}"
    );
    assert_eq!(failed_after_recovery, 0);
    assert_ne!(gateway_member(&members).await, on);
    // No request was delivered twice.
    let twice: Vec<_> = deliveries
        .lock()
        .expect("lock")
        .iter()
        .filter(|(id, count)| id.starts_with('r') && **count > 1)
        .map(|(id, count)| format!("{id}×{count}"))
        .collect();
    assert!(twice.is_empty(), "delivered more than once: {twice:?}");
    // Every 200 was a delivery.
    let ok = results
        .iter()
        .filter(|(_, s, _)| *s == StatusCode::OK)
        .count();
    let delivered = deliveries
        .lock()
        .expect("lock")
        .keys()
        .filter(|id| id.starts_with('r'))
        .count();
    assert!(delivered >= ok, "{delivered} deliveries for {ok} answers");
}
