//! A three-server NATS cluster: the gateway is given the three seed URLs, the server it is
//! connected to is killed under load, and it rides it: every request answers within its budget,
//! none is delivered twice, and requests are served again through another member.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::StatusCode;

use crate::support::builder::Gateway;
use crate::support::call::{IntoCall, client};
use crate::support::poll::poll_every;
use crate::support::responder::{Bus, envelope_header, reply};
use crate::support::topology::NatsCluster;

#[tokio::test]
async fn the_gateway_rides_the_loss_of_the_cluster_member_it_is_connected_to() {
    let mut cluster = NatsCluster::start().await;
    let gw = Gateway::with(|c| c.timeouts.default_ms = 3_000);
    let gw = gw.nats(cluster.seeds()).start().await;
    let on = cluster.member_with("aura-gateway").await;
    // The backend sits on another member, and counts every delivery by request id.
    let backend_member = (on + 1) % 3;
    let deliveries: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    let seen = deliveries.clone();
    let backend = Bus::new(&cluster.url(backend_member), &gw.bus.prefix);
    let _backend = backend
        .respond("auth", move |envelope| {
            let id = envelope_header(&envelope, "x-test-id");
            *seen.lock().expect("lock").entry(id).or_default() += 1;
            reply(200, &[], b"ok")
        })
        .await;
    // The subscription must be known across the cluster before the load starts.
    let c = client();
    let user = |id: &str| {
        c.get(gw.data_url("/v1/auth/user"))
            .call()
            .header("x-test-id", id)
    };
    let routed = poll_every(
        Duration::from_secs(10),
        Duration::from_millis(50),
        async || (user("warm-up").status().await == StatusCode::OK).then_some(()),
    );
    assert!(routed.await.is_some(), "no route to the backend");

    let mut results: Vec<(Instant, StatusCode, Duration)> = Vec::new();
    let load_started = Instant::now();
    let mut killed_at = None;
    let mut n = 0u32;
    while load_started.elapsed() < Duration::from_secs(8) {
        if killed_at.is_none() && load_started.elapsed() > Duration::from_secs(1) {
            // SIGKILL: no goodbye to the clients.
            cluster.kill(on);
            killed_at = Some(Instant::now());
        }
        n += 1;
        let sent = Instant::now();
        let r = user(&format!("r{n}"))
            .timeout(Duration::from_secs(10))
            .try_send()
            .await;
        let status = r.expect("every request is answered").status();
        results.push((sent, status, sent.elapsed()));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let killed_at = killed_at.expect("killed");
    // Within the route's budget (3 s), with the gateway's own answers while reconnecting.
    for (_, status, took) in &results {
        let late = *took >= Duration::from_millis(3_500);
        assert!(!late, "a request took {took:?}");
        let answers = [
            StatusCode::OK,
            StatusCode::SERVICE_UNAVAILABLE,
            StatusCode::GATEWAY_TIMEOUT,
        ];
        assert!(answers.contains(status), "unexpected {status}");
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
    assert_ne!(cluster.member_with("aura-gateway").await, on);
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
