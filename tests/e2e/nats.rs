//! The NATS envelope and delivery rules, end to end over real sockets and a real nats-server.

use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use reqwest::StatusCode;

use crate::support::gateway::{InProcess, test_config};
use crate::support::nats_server::{NatsServer, shared};
use crate::support::responder::{Responder, reply};
use crate::support::unique_prefix;

fn all_bytes() -> Vec<u8> {
    (0..=255u8).chain((0..=255u8).rev()).collect()
}

#[tokio::test]
async fn the_envelope_carries_the_request_field_by_field_and_the_reply_comes_back_byte_for_byte() {
    let nats = shared();
    let prefix = unique_prefix();
    let gw = InProcess::start(test_config(&nats.url(), &prefix)).await;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let _responder = Responder::start(
        &nats.url(),
        &format!("{prefix}.functions.http"),
        Duration::ZERO,
        move |envelope| {
            let id = envelope["id"].as_str().unwrap_or_default().to_owned();
            let _ = tx.send(envelope);
            reply(
                201,
                &[
                    ("content-type", "application/octet-stream"),
                    ("x-echo-id", &id),
                ],
                &all_bytes(),
            )
        },
    )
    .await;
    let body: Vec<u8> = (0..=255u8).collect();
    let response = crate::support::gateway::client()
        .post(gw.data_url("/v1/functions/hello%20world/x?a=1&b=%2F"))
        .header("content-type", "application/octet-stream")
        .header("x-api-key", crate::support::gateway::TEST_KEY)
        .header("x-aura-role", "service_role")
        .header("x-custom", "Kept")
        .header("connection", "keep-alive, x-hop")
        .header("x-hop", "dropped")
        .body(body.clone())
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), StatusCode::CREATED);
    let request_id = response.headers()["x-request-id"]
        .to_str()
        .expect("id")
        .to_owned();
    assert_eq!(response.headers()["x-echo-id"], request_id.as_str());
    assert_eq!(response.headers()["x-content-type-options"], "nosniff");
    assert_eq!(
        response.bytes().await.expect("body"),
        Bytes::from(all_bytes())
    );

    let envelope = rx.recv().await.expect("the responder saw the envelope");
    assert_eq!(envelope["v"], 1);
    assert_eq!(envelope["id"], request_id.as_str());
    assert_eq!(envelope["plane"], "data");
    assert_eq!(envelope["method"], "POST");
    assert_eq!(envelope["path"], "/v1/functions/hello%20world/x");
    assert_eq!(envelope["query"], "a=1&b=%2F");
    assert_eq!(
        STANDARD
            .decode(envelope["body"].as_str().expect("body"))
            .expect("b64"),
        body
    );
    let headers: Vec<(String, String)> = envelope["headers"]
        .as_array()
        .expect("headers")
        .iter()
        .map(|pair| {
            (
                pair[0].as_str().expect("name").to_owned(),
                pair[1].as_str().expect("value").to_owned(),
            )
        })
        .collect();
    let names: Vec<&str> = headers.iter().map(|(n, _)| n.as_str()).collect();
    for stripped in ["apikey", "x-api-key", "x-aura-role", "connection", "x-hop"] {
        assert!(
            !names.contains(&stripped),
            "{stripped} must not reach the backend: {names:?}"
        );
    }
    assert!(headers.contains(&("x-custom".into(), "Kept".into())));
    assert!(headers.contains(&("x-request-id".into(), request_id.clone())));
    assert!(names.iter().all(|n| *n == n.to_ascii_lowercase()));
    let actor = &envelope["actor"];
    assert_eq!(actor["role"], "anon");
    assert_eq!(actor["project"], crate::support::gateway::TEST_PROJECT);
    assert_eq!(actor["key_id"], "00000000-0000-4000-8000-0000000000e1");
    for field in ["user_id", "org_role"] {
        assert!(actor[field].is_null(), "actor.{field} = {}", actor[field]);
    }
    assert!(
        !envelope
            .to_string()
            .contains(crate::support::gateway::TEST_KEY)
    );
    let deadline = envelope["deadline_ms"].as_u64().expect("deadline_ms");
    assert!(
        deadline > 370_000 && deadline <= 380_000,
        "functions budget: {deadline}"
    );
}

#[tokio::test]
async fn the_management_plane_sends_its_own_plane_and_an_empty_query_is_omitted() {
    let nats = shared();
    let prefix = unique_prefix();
    let gw = InProcess::start(test_config(&nats.url(), &prefix)).await;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let _responder = Responder::start(
        &nats.url(),
        &format!("{prefix}.control.http"),
        Duration::ZERO,
        move |e| {
            let _ = tx.send(e);
            reply(200, &[], b"")
        },
    )
    .await;
    let response = crate::support::gateway::console_client()
        .get(gw.mgmt_url("/v1/projects/e2e"))
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), StatusCode::OK);
    let envelope = rx.recv().await.expect("envelope");
    assert_eq!(envelope["plane"], "management");
    assert_eq!(envelope["path"], "/v1/projects/e2e");
    assert!(envelope.get("query").is_none(), "{envelope}");
    assert!(envelope.get("body").is_none(), "{envelope}");
    assert_eq!(envelope["actor"]["role"], "console");
    assert_eq!(envelope["actor"]["org_role"], "owner");
    assert_eq!(
        envelope["actor"]["user_id"],
        crate::support::gateway::TEST_CONSOLE_USER
    );
}

#[tokio::test]
async fn a_malformed_reply_is_a_502() {
    let nats = shared();
    let prefix = unique_prefix();
    let gw = InProcess::start(test_config(&nats.url(), &prefix)).await;
    let _responder = Responder::start(
        &nats.url(),
        &format!("{prefix}.ai.http"),
        Duration::ZERO,
        |_| Bytes::from_static(b"{\"status\": \"fine\"}"),
    )
    .await;
    let response = crate::support::gateway::client()
        .get(gw.data_url("/v1/ai/complete"))
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), StatusCode::BAD_GATEWAY);
    let body: serde_json::Value = response.json().await.expect("json");
    assert_eq!(body["error"]["code"], "bad_backend_reply");
}

#[tokio::test]
async fn no_responders_is_a_503_after_bounded_replays() {
    let nats = shared();
    let mut config = test_config(&nats.url(), &unique_prefix());
    config.nats.no_responder_retries = 2;
    config.nats.retry_backoff_ms = 10;
    let gw = InProcess::start(config).await;
    let started = Instant::now();
    let response = crate::support::gateway::client()
        .get(gw.data_url("/v1/notifications/send"))
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(response.headers().contains_key("retry-after"));
    let body: serde_json::Value = response.json().await.expect("json");
    assert_eq!(body["error"]["code"], "no_responders");
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn a_slow_responder_gets_exactly_one_delivery_and_the_caller_a_504() {
    let nats = shared();
    let prefix = unique_prefix();
    let mut config = test_config(&nats.url(), &prefix);
    config.timeouts.default_ms = 500;
    let gw = InProcess::start(config).await;
    let responder = Responder::start(
        &nats.url(),
        &format!("{prefix}.auth.http"),
        Duration::from_millis(1500),
        |_| reply(200, &[], b"late"),
    )
    .await;
    let started = std::time::Instant::now();
    let response = crate::support::gateway::client()
        .get(gw.data_url("/v1/auth/token"))
        .send()
        .await
        .expect("request");
    let took = started.elapsed();
    assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);
    assert!(
        took >= Duration::from_millis(480) && took < Duration::from_millis(1_000),
        "the 504 came at {took:?}, not at the 500 ms budget"
    );
    let body: serde_json::Value = response.json().await.expect("json");
    assert!(
        body["error"]["code"]
            .as_str()
            .expect("code")
            .ends_with("timeout"),
        "{body}"
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(responder.count(), 1, "a timeout is never replayed");
}

#[tokio::test]
async fn a_responder_that_subscribes_after_the_first_attempt_gets_exactly_one_delivery() {
    let nats = shared();
    let prefix = unique_prefix();
    let mut config = test_config(&nats.url(), &prefix);
    config.nats.no_responder_retries = 8;
    config.nats.retry_backoff_ms = 100;
    let gw = InProcess::start(config).await;
    let url = gw.data_url("/v1/control/thing");
    let request = tokio::spawn(async move {
        crate::support::gateway::client()
            .get(url)
            .send()
            .await
            .expect("request")
    });
    tokio::time::sleep(Duration::from_millis(150)).await;
    let responder = Responder::start(
        &nats.url(),
        &format!("{prefix}.control.http"),
        Duration::ZERO,
        |_| reply(200, &[], b"ok"),
    )
    .await;
    let response = request.await.expect("task");
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.text().await.expect("body"), "ok");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(responder.count(), 1);
}

#[tokio::test]
async fn a_body_over_the_servers_max_payload_is_refused_before_sending() {
    let nats = NatsServer::start("max_payload: 65536");
    let prefix = unique_prefix();
    let mut config = test_config(&nats.url(), &prefix);
    config.server.max_body_bytes = 1 << 20;
    let gw = InProcess::start(config).await;
    let responder = Responder::start(
        &nats.url(),
        &format!("{prefix}.functions.http"),
        Duration::ZERO,
        |_| reply(200, &[], b""),
    )
    .await;
    // Let the gateway's connection learn the server's limit.
    let ok = crate::support::gateway::client()
        .post(gw.data_url("/v1/functions/f"))
        .body(vec![7u8; 1000])
        .send()
        .await
        .expect("request");
    assert_eq!(ok.status(), StatusCode::OK);
    let response = crate::support::gateway::client()
        .post(gw.data_url("/v1/functions/f"))
        .body(vec![7u8; 60_000])
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let body: serde_json::Value = response.json().await.expect("json");
    assert_eq!(body["error"]["code"], "payload_too_large");
    assert_eq!(responder.count(), 1, "the oversized request was never sent");
}

#[tokio::test]
async fn a_streamed_body_past_the_limit_is_a_413() {
    let nats = shared();
    let mut config = test_config(&nats.url(), &unique_prefix());
    config.server.max_body_bytes = 1000;
    let gw = InProcess::start(config).await;
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        (0..10).map(|_| Ok(vec![1u8; 500])).collect();
    let response = crate::support::gateway::client()
        .post(gw.data_url("/v1/functions/f"))
        .body(reqwest::Body::wrap_stream(futures::stream::iter(chunks)))
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert!(response.headers().contains_key("x-request-id"));
}

#[tokio::test]
async fn backend_cors_headers_never_reach_the_client() {
    let nats = shared();
    let prefix = unique_prefix();
    let gw = InProcess::start(test_config(&nats.url(), &prefix)).await;
    let _responder = Responder::start(
        &nats.url(),
        &format!("{prefix}.auth.http"),
        Duration::ZERO,
        |_| {
            reply(
                200,
                &[
                    ("access-control-allow-origin", "https://evil.example"),
                    ("access-control-allow-credentials", "true"),
                    ("x-frame-options", "ALLOWALL"),
                ],
                b"{}",
            )
        },
    )
    .await;
    let response = crate::support::gateway::client()
        .get(gw.data_url("/v1/auth/user"))
        .header("origin", "https://app.example")
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["access-control-allow-origin"], "*");
    assert!(
        !response
            .headers()
            .contains_key("access-control-allow-credentials")
    );
    assert_eq!(response.headers()["x-frame-options"], "DENY");
}

#[tokio::test]
async fn while_nats_is_unreachable_requests_fail_fast() {
    let dead = format!("nats://127.0.0.1:{}", crate::support::free_port());
    let gw = InProcess::start(test_config(&dead, &unique_prefix())).await;
    let started = Instant::now();
    let response = crate::support::gateway::client()
        .get(gw.data_url("/v1/functions/f"))
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(response.headers().contains_key("retry-after"));
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    let health = crate::support::gateway::client()
        .get(gw.data_url("/health"))
        .send()
        .await
        .expect("request");
    assert_eq!(health.status(), StatusCode::OK);
}
