//! What the gateway forwards to its backends, through the real binary: the client's address as
//! the gateway saw it (or as a trusted proxy told it), never a client's claim; its own headers,
//! which a `Connection` header cannot remove; and hostile header bytes, refused as a key or
//! carried exactly in a NATS envelope.

use reqwest::StatusCode;
use uuid::Uuid;

use crate::support::builder::Gateway;
use crate::support::call::{Call, IntoCall};
use crate::support::edge::Edge;
use crate::support::fixture::user_token;
use crate::support::raw::{get, status_of};
use crate::support::records::TEST_KEY;
use crate::support::upstream::Recorder;

#[tokio::test]
async fn hostile_header_bytes_are_refused_as_a_key_and_reach_an_envelope_exactly() {
    let edge = Edge::start("").await;
    let key = edge.fx.anon_key.clone();
    let head = |path: &str| {
        format!("GET {path} HTTP/1.1\r\nhost: gw\r\nconnection: close\r\n").into_bytes()
    };

    // A key with a byte that is not UTF-8: the stage sees U+FFFD, no key has that form, 401.
    let mut raw = head("/v1/storage/object/x");
    raw.extend_from_slice(format!("apikey: {key}").as_bytes());
    raw.extend_from_slice(b"\xff\r\n\r\n");
    let answer = edge.data(raw).await;
    assert_eq!(status_of(&answer), 401, "{answer}");
    assert!(answer.contains("\"invalid_api_key\""), "{answer}");
    assert!(edge.storage.seen().is_empty(), "nothing forwarded");

    // Quotes, backslashes, a tab and bytes beyond ASCII in the headers of a NATS route: the
    // envelope is JSON and carries each value as sent (bytes that are not UTF-8 as U+FFFD).
    let mut raw = head("/v1/functions/v1/hostile");
    raw.extend_from_slice(format!("apikey: {key}\r\nx-q: a\"b\\c\td\r\nx-obs: ").as_bytes());
    raw.extend_from_slice(b"caf\xc3\xa9 \xe9\xff\r\n\r\n");
    let answer = edge.data(raw).await;
    assert_eq!(status_of(&answer), 200, "{answer}");
    let mut envelopes = edge.envelopes().into_iter();
    let envelope = envelopes.rfind(|e| e["path"] == "/v1/functions/v1/hostile");
    let envelope = envelope.expect("the envelope reached the responder");
    let header = |name: &str| {
        let pairs = envelope["headers"].as_array().expect("headers");
        let pair = pairs.iter().find(|pair| pair[0] == name);
        pair.and_then(|pair| pair[1].as_str()).map(str::to_owned)
    };
    assert_eq!(header("x-q").as_deref(), Some("a\"b\\c\td"));
    let obs = String::from_utf8_lossy(b"caf\xc3\xa9 \xe9\xff").into_owned();
    assert_eq!(header("x-obs"), Some(obs));
    assert!(header("apikey").is_none(), "the key is not forwarded");
}

#[tokio::test]
async fn connection_cannot_remove_the_gateways_own_headers() {
    let edge = Edge::start("").await;
    let token = format!("Bearer {}", user_token("alpha", Uuid::new_v4()));
    let raw = get(
        "/v1/storage/object/x",
        &[
            ("apikey", &edge.fx.anon_key),
            ("authorization", &token),
            (
                "connection",
                "close, x-request-id, Authorization, x-forwarded-for, x-aura-role, x-hop",
            ),
            ("x-hop", "1"),
        ],
    );
    let answer = edge.data(raw).await;
    assert_eq!(status_of(&answer), 200, "{answer}");
    let seen = edge.storage.last().expect("forwarded");
    let id = answer.lines().find_map(|l| {
        let l = l.to_ascii_lowercase();
        l.strip_prefix("x-request-id: ").map(str::to_owned)
    });
    let id = id.expect("request id");
    let forwarded_id = seen.one("x-request-id").map(|v| v.to_ascii_lowercase());
    assert_eq!(forwarded_id, Some(id.trim().to_owned()));
    assert_eq!(seen.one("authorization"), Some(token));
    assert_eq!(seen.one("x-aura-role").as_deref(), Some("authenticated"));
    assert_eq!(seen.one("x-forwarded-for").as_deref(), Some("127.0.0.1"));
    let hop = seen.one("x-hop").is_some();
    assert!(!hop, "a client's own hop header is still removed");
}

#[tokio::test]
async fn backends_learn_the_client_ip_from_the_gateway_not_the_client() {
    let edge = Edge::start("").await;
    let client = reqwest::Client::new();
    let spoofed = [
        ("x-forwarded-for", "6.6.6.6"),
        ("x-real-ip", "6.6.6.6"),
        ("forwarded", "for=6.6.6.6"),
        ("x-aura-client-ip", "6.6.6.6"),
    ];
    let spoofing = |path: &str| {
        let request = client
            .get(edge.gw.data_url(path))
            .call()
            .key(&edge.fx.anon_key);
        request.headers(&spoofed)
    };
    assert_eq!(
        spoofing("/v1/storage/object/x").status().await,
        StatusCode::OK
    );
    let seen = edge.storage.last().expect("forwarded");
    assert_eq!(seen.all("x-forwarded-for"), vec!["127.0.0.1"]);
    assert_eq!(seen.all("x-aura-client-ip"), vec!["127.0.0.1"]);
    assert!(seen.one("x-real-ip").is_none());
    assert!(seen.one("forwarded").is_none());

    assert_eq!(spoofing("/v1/auth/user").read().await.text(), "nats");
    let envelope = edge.envelopes().pop().expect("envelope");
    assert_eq!(envelope["actor"]["client_ip"], "127.0.0.1");
    let headers: Vec<(String, String)> =
        serde_json::from_value(envelope["headers"].clone()).expect("pairs");
    let named = |n: &str| {
        let values = headers.iter().filter(|(h, _)| h == n);
        values.map(|(_, v)| v.clone()).collect::<Vec<_>>()
    };
    assert_eq!(named("x-forwarded-for"), vec!["127.0.0.1"]);
    assert!(named("x-real-ip").is_empty() && named("forwarded").is_empty());
    assert!(named("x-aura-client-ip").is_empty());
}

#[tokio::test]
async fn behind_a_trusted_proxy_the_forwarded_client_is_told() {
    let storage = Recorder::start().await;
    let gw = Gateway::with(|c| c.upstreams.storage_url = Some(storage.url.clone()))
        .with(|c| c.rate_limit.trusted_proxies = vec!["127.0.0.0/8".parse().expect("net")])
        .start()
        .await;
    let object = Call::get(gw.data_url("/v1/storage/object/x")).key(TEST_KEY);
    let proxied = object.header("x-forwarded-for", "6.6.6.6, 203.0.113.9");
    proxied.expect(StatusCode::OK).await;
    let seen = storage.last().expect("forwarded");
    assert_eq!(seen.all("x-forwarded-for"), vec!["203.0.113.9"]);
    assert_eq!(seen.all("x-aura-client-ip"), vec!["203.0.113.9"]);
}
