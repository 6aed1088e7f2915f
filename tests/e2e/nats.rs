//! The NATS envelope and delivery rules, end to end over real sockets and a real nats-server; a
//! hostile backend's reply is read exactly or refused.

use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use reqwest::StatusCode;

use crate::support::builder::Gateway;
use crate::support::call::{Answer, IntoCall, client, console_client};
use crate::support::edge::Edge;
use crate::support::nats_server::NatsServer;
use crate::support::raw::{get, status_of};
use crate::support::records::{TEST_CONSOLE_USER, TEST_KEY, TEST_PROJECT};
use crate::support::responder::{header_names, reply};

fn all_bytes() -> Vec<u8> {
    (0..=255u8).chain((0..=255u8).rev()).collect()
}

#[tokio::test]
async fn the_envelope_carries_the_request_field_by_field_and_the_reply_comes_back_byte_for_byte() {
    let gw = Gateway::start().await;
    let mut envelopes = gw
        .bus
        .record(&["functions"], |envelope| {
            let id = envelope["id"].as_str().unwrap_or_default();
            let headers = [
                ("content-type", "application/octet-stream"),
                ("x-echo-id", id),
            ];
            reply(201, &headers, &all_bytes())
        })
        .await;
    let body: Vec<u8> = (0..=255u8).collect();
    let response = client()
        .post(gw.data_url("/v1/functions/hello%20world/x?a=1&b=%2F"))
        .call()
        .headers(&[
            ("content-type", "application/octet-stream"),
            ("x-api-key", TEST_KEY),
            ("x-aura-role", "service_role"),
            ("x-custom", "Kept"),
            ("connection", "keep-alive, x-hop"),
            ("x-hop", "dropped"),
        ])
        .body(body.clone())
        .expect(StatusCode::CREATED)
        .await;
    let request_id = response.request_id();
    assert_eq!(response.headers["x-echo-id"], request_id.as_str());
    assert_eq!(response.headers["x-content-type-options"], "nosniff");
    assert_eq!(response.body, Bytes::from(all_bytes()));

    let envelope = envelopes.next().await;
    assert_eq!(envelope["v"], 1);
    assert_eq!(envelope["id"], request_id.as_str());
    assert_eq!(envelope["plane"], "data");
    assert_eq!(envelope["method"], "POST");
    assert_eq!(envelope["path"], "/v1/functions/hello%20world/x");
    assert_eq!(envelope["query"], "a=1&b=%2F");
    let sent = STANDARD.decode(envelope["body"].as_str().expect("body"));
    assert_eq!(sent.expect("b64"), body);
    let headers: Vec<(String, String)> =
        serde_json::from_value(envelope["headers"].clone()).expect("header pairs");
    let names = header_names(&envelope);
    for stripped in ["apikey", "x-api-key", "x-aura-role", "connection", "x-hop"] {
        let reached = names.iter().any(|n| n == stripped);
        assert!(!reached, "{stripped} must not reach the backend: {names:?}");
    }
    assert!(headers.contains(&("x-custom".into(), "Kept".into())));
    assert!(headers.contains(&("x-request-id".into(), request_id.clone())));
    assert!(names.iter().all(|n| *n == n.to_ascii_lowercase()));
    let actor = &envelope["actor"];
    assert_eq!(actor["role"], "anon");
    assert_eq!(actor["project"], TEST_PROJECT);
    assert_eq!(actor["key_id"], "00000000-0000-4000-8000-0000000000e1");
    for field in ["user_id", "org_role"] {
        assert!(actor[field].is_null(), "actor.{field} = {}", actor[field]);
    }
    assert!(!envelope.to_string().contains(TEST_KEY));
    let deadline = envelope["deadline_ms"].as_u64().expect("deadline_ms");
    let budget = 370_001..=380_000;
    assert!(budget.contains(&deadline), "functions budget: {deadline}");
}

#[tokio::test]
async fn the_management_plane_sends_its_own_plane_and_an_empty_query_is_omitted() {
    let gw = Gateway::start().await;
    let mut envelopes = gw.bus.record(&["control"], |_| reply(200, &[], b"")).await;
    let projects = console_client().get(gw.mgmt_url("/v1/projects/e2e"));
    projects.call().expect(StatusCode::OK).await;
    let envelope = envelopes.next().await;
    assert_eq!(envelope["plane"], "management");
    assert_eq!(envelope["path"], "/v1/projects/e2e");
    assert!(envelope.get("query").is_none(), "{envelope}");
    assert!(envelope.get("body").is_none(), "{envelope}");
    assert_eq!(envelope["actor"]["role"], "console");
    assert_eq!(envelope["actor"]["org_role"], "owner");
    assert_eq!(envelope["actor"]["user_id"], TEST_CONSOLE_USER);
}

#[tokio::test]
async fn a_malformed_reply_is_a_502() {
    let gw = Gateway::start().await;
    let _responder = gw
        .bus
        .respond("ai", |_| Bytes::from_static(b"{\"status\": \"fine\"}"))
        .await;
    let complete = client().get(gw.data_url("/v1/ai/complete")).call();
    let answer = complete.expect(StatusCode::BAD_GATEWAY).await;
    assert_eq!(answer.code(), "bad_backend_reply");
}

#[tokio::test]
async fn no_responders_is_a_503_after_bounded_replays() {
    let gw = Gateway::with(|c| (c.nats.no_responder_retries, c.nats.retry_backoff_ms) = (2, 10))
        .start()
        .await;
    let started = Instant::now();
    let send = client().get(gw.data_url("/v1/notifications/send")).call();
    let answer = send.expect(StatusCode::SERVICE_UNAVAILABLE).await;
    assert!(answer.headers.contains_key("retry-after"));
    assert_eq!(answer.code(), "no_responders");
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn a_slow_responder_gets_exactly_one_delivery_and_the_caller_a_504() {
    let gw = Gateway::start_with(|c| c.timeouts.default_ms = 500).await;
    let (late, answer) = (Duration::from_millis(1500), |_| reply(200, &[], b"late"));
    let responder = gw.bus.respond_after("auth", late, answer).await;
    let started = std::time::Instant::now();
    let response = client()
        .get(gw.data_url("/v1/auth/token"))
        .call()
        .send()
        .await;
    let took = started.elapsed();
    let answer = Answer::of(response).await;
    assert_eq!(answer.status, StatusCode::GATEWAY_TIMEOUT);
    assert!(
        took >= Duration::from_millis(480) && took < Duration::from_millis(1_000),
        "the 504 came at {took:?}, not at the 500 ms budget"
    );
    let body = answer.json();
    let code = body["error"]["code"].as_str().expect("code");
    assert!(code.ends_with("timeout"), "{body}");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(responder.count(), 1, "a timeout is never replayed");
}

#[tokio::test]
async fn a_responder_that_subscribes_after_the_first_attempt_gets_exactly_one_delivery() {
    let gw = Gateway::with(|c| (c.nats.no_responder_retries, c.nats.retry_backoff_ms) = (8, 100))
        .start()
        .await;
    let request = tokio::spawn(client().get(gw.data_url("/v1/control/thing")).call().read());
    tokio::time::sleep(Duration::from_millis(150)).await;
    let responder = gw.bus.respond("control", |_| reply(200, &[], b"ok")).await;
    let answer = request.await.expect("task");
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.text(), "ok");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(responder.count(), 1);
}

#[tokio::test]
async fn a_body_over_the_servers_max_payload_is_refused_before_sending() {
    let nats = NatsServer::start("max_payload: 65536");
    let gw = Gateway::builder()
        .nats(nats.url())
        .with(|c| c.server.max_body_bytes = 1 << 20)
        .start()
        .await;
    let responder = gw.bus.respond("functions", |_| reply(200, &[], b"")).await;
    let post = |size: usize| {
        client()
            .post(gw.data_url("/v1/functions/f"))
            .body(vec![7u8; size])
    };
    // Let the gateway's connection learn the server's limit.
    post(1000).call().expect(StatusCode::OK).await;
    let answer = post(60_000)
        .call()
        .expect(StatusCode::PAYLOAD_TOO_LARGE)
        .await;
    assert_eq!(answer.code(), "payload_too_large");
    assert_eq!(responder.count(), 1, "the oversized request was never sent");
}

#[tokio::test]
async fn a_streamed_body_past_the_limit_is_a_413() {
    let gw = Gateway::start_with(|c| c.server.max_body_bytes = 1000).await;
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        (0..10).map(|_| Ok(vec![1u8; 500])).collect();
    let body = reqwest::Body::wrap_stream(futures::stream::iter(chunks));
    let post = client().post(gw.data_url("/v1/functions/f")).body(body);
    let answer = post.call().expect(StatusCode::PAYLOAD_TOO_LARGE).await;
    assert!(answer.headers.contains_key("x-request-id"));
}

#[tokio::test]
async fn backend_cors_headers_never_reach_the_client() {
    let gw = Gateway::start().await;
    let _responder = gw
        .bus
        .respond("auth", |_| {
            let headers = [
                ("access-control-allow-origin", "https://evil.example"),
                ("access-control-allow-credentials", "true"),
                ("x-frame-options", "ALLOWALL"),
            ];
            reply(200, &headers, b"{}")
        })
        .await;
    let user = client().get(gw.data_url("/v1/auth/user")).call();
    let answer = user
        .origin("https://app.example")
        .expect(StatusCode::OK)
        .await;
    assert_eq!(answer.headers["access-control-allow-origin"], "*");
    let credentials = answer
        .headers
        .contains_key("access-control-allow-credentials");
    assert!(!credentials);
    assert_eq!(answer.headers["x-frame-options"], "DENY");
}

#[tokio::test]
async fn while_nats_is_unreachable_requests_fail_fast() {
    let dead = format!("nats://127.0.0.1:{}", crate::support::free_port());
    let gw = Gateway::builder().nats(dead).start().await;
    let started = Instant::now();
    let f = client().get(gw.data_url("/v1/functions/f")).call();
    let answer = f.expect(StatusCode::SERVICE_UNAVAILABLE).await;
    assert!(answer.headers.contains_key("retry-after"));
    let took = started.elapsed();
    assert!(took < Duration::from_secs(2), "{took:?}");
    let health = client().get(gw.data_url("/health")).call();
    health.expect(StatusCode::OK).await;
}

/// A hostile NATS backend's replies, through the binary: each reply is parsed with its strings
/// borrowed where the JSON did not escape them, so escapes must still be read exactly, values
/// that are not visible ASCII (a header injection among them) refused, and framing headers
/// dropped, and a reply listing more headers than an answer may carry refused rather than
/// overflowing the header map; the gateway keeps serving after each refusal.
#[tokio::test]
async fn a_hostile_nats_reply_is_read_exactly_or_refused_and_its_framing_headers_dropped() {
    let edge = Edge::start("").await;
    let _hostile = edge
        .gw
        .bus
        .respond("ai", |envelope| {
            let reply: &'static str = match envelope["path"].as_str() {
                // Escapes in a name, in a value and in the body (`\/` in the base64 of "hi?"),
                // and framing headers a backend has no say over.
                Some("/v1/ai/escaped") => {
                    r#"{"status":201,"headers":[["x-plain","a b"],["x\u002descaped","say \"hi\"\tnow"],["content-length","999"],["transfer-encoding","chunked"]],"body":"aGk\/"}"#
                }
                Some("/v1/ai/escaped-beyond-ascii") => {
                    r#"{"status":200,"headers":[["x-a","caf\u00e9"]]}"#
                }
                Some("/v1/ai/beyond-ascii") => "{\"status\":200,\"headers\":[[\"x-a\",\"caf\u{e9}\"]]}",
                Some("/v1/ai/nul") => r#"{"status":200,"headers":[["x-a","a\u0000b"]]}"#,
                Some("/v1/ai/injection") => {
                    r#"{"status":200,"headers":[["x-a","a\r\nx-injected: 1"]]}"#
                }
                // More headers than a header map can hold.
                Some("/v1/ai/flood") => {
                    let pairs = vec![r#"["x-a","1"]"#; 40_000].join(",");
                    return bytes::Bytes::from(format!(r#"{{"status":200,"headers":[{pairs}]}}"#));
                }
                _ => r#"{"status":200,"body":"b2s="}"#,
            };
            bytes::Bytes::from_static(reply.as_bytes())
        })
        .await;
    let call = |path: &str| edge.data(get(path, &[("apikey", &edge.fx.anon_key)]));

    let answer = call("/v1/ai/escaped").await;
    assert_eq!(status_of(&answer), 201, "{answer}");
    let (head, body) = answer.split_once("\r\n\r\n").expect("a head and a body");
    let lines: Vec<&str> = head.lines().collect();
    assert!(lines.contains(&"x-plain: a b"), "{head}");
    assert!(lines.contains(&"x-escaped: say \"hi\"\tnow"), "{head}");
    assert_eq!(body, "hi?");
    let framing = |l: &&&str| l.starts_with("content-length") || l.starts_with("transfer-encoding");
    let framing: Vec<&&str> = lines.iter().filter(framing).collect();
    assert_eq!(framing, [&"content-length: 3"], "{head}");

    for path in [
        "/v1/ai/escaped-beyond-ascii",
        "/v1/ai/beyond-ascii",
        "/v1/ai/nul",
        "/v1/ai/injection",
        "/v1/ai/flood",
    ] {
        let answer = call(path).await;
        assert_eq!(status_of(&answer), 502, "{path}: {answer}");
        assert!(answer.contains("\"bad_backend_reply\""), "{path}: {answer}");
        assert!(!answer.contains("x-injected"), "{path}: {answer}");
        let answer = call("/v1/ai/ok").await;
        assert_eq!(status_of(&answer), 200, "after {path}: {answer}");
        assert!(answer.ends_with("\r\n\r\nok"), "after {path}: {answer}");
    }
}
