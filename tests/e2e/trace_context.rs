//! W3C trace context through the real binary: a trusted caller's trace continues into the
//! gateway's span (exported over OTLP/HTTPS to a receiver decoding the protobuf), and on to an
//! HTTP backend and a NATS backend with the gateway's span as their parent; an untrusted
//! caller's `traceparent` starts nothing.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::StatusCode;

use crate::support::fixture::Fixture;
use crate::support::gateway::{Process, binary_config, terminate};
use crate::support::nats_server::shared;
use crate::support::otlp::Receiver;
use crate::support::pki::Pki;
use crate::support::responder::{Responder, envelope_header, reply};
use crate::support::unique_prefix;
use crate::support::upstream::Recorder;

const CLIENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

/// `(trace id, parent id)` of a `traceparent`.
fn ids(traceparent: &str) -> (String, String) {
    let parts: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(parts.len(), 4, "{traceparent}");
    assert_eq!(parts[0], "00");
    (parts[1].to_owned(), parts[2].to_owned())
}

struct Backends {
    storage: Recorder,
    /// The `traceparent` of each envelope the NATS backend received.
    nats_seen: Arc<Mutex<Vec<String>>>,
    _responder: Responder,
}

async fn backends(prefix: &str) -> Backends {
    let storage = Recorder::start().await;
    let nats_seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let seen = nats_seen.clone();
    let responder = Responder::start(
        &shared().url(),
        &format!("{prefix}.functions.http"),
        Duration::ZERO,
        move |envelope| {
            let traceparent = envelope_header(&envelope, "traceparent");
            seen.lock().expect("lock").push(traceparent);
            reply(200, &[], b"fn")
        },
    )
    .await;
    Backends {
        storage,
        nats_seen,
        _responder: responder,
    }
}

async fn call_both(gw: &Process, fx: &Fixture, traceparent: &str) {
    let client = reqwest::Client::new();
    for path in ["/v1/storage/object/a.png", "/v1/functions/hello"] {
        let r = client
            .get(gw.data_url(path))
            .header("apikey", &fx.anon_key)
            .header("traceparent", traceparent)
            .header("tracestate", "vendor=abc")
            .send()
            .await
            .expect("answer");
        assert_eq!(r.status(), StatusCode::OK, "{path}: {}", gw.log_text());
    }
}

#[tokio::test]
async fn a_trusted_callers_trace_reaches_the_backends_and_the_collector() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fx = Fixture::new();
    let pki = Pki::new(&dir.path().join("pki"), "otlp");
    let (receiver, endpoint) = Receiver::start_tls(pki.rustls_server(false)).await;
    let prefix = unique_prefix();
    let b = backends(&prefix).await;
    let config = binary_config(
        dir.path(),
        &fx,
        "",
        &shared().url(),
        &prefix,
        &format!(
            "[rate_limit]\ntrusted_proxies = [\"127.0.0.1/32\"]\n\n\
             [upstreams]\nstorage_url = \"{}\"\n\n\
             [tracing]\notlp_endpoint = \"{endpoint}\"\n\n\
             [tracing.otlp_tls]\nca_file = \"{}\"\n",
            b.storage.url,
            pki.ca.display()
        ),
    );
    let gw = Process::serve(&config, dir.path());
    call_both(&gw, &fx, &format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01")).await;

    let at_storage = b
        .storage
        .last()
        .and_then(|s| s.one("traceparent"))
        .expect("the HTTP backend got a traceparent");
    let at_nats = b
        .nats_seen
        .lock()
        .expect("lock")
        .last()
        .cloned()
        .expect("an envelope");
    let (storage_trace, storage_parent) = ids(&at_storage);
    let (nats_trace, nats_parent) = ids(&at_nats);
    assert_eq!(storage_trace, CLIENT_TRACE);
    assert_eq!(nats_trace, CLIENT_TRACE);
    // The backends' parent is the gateway's span, not the caller's.
    assert_ne!(storage_parent, CLIENT_SPAN);
    assert_ne!(nats_parent, CLIENT_SPAN);
    assert_ne!(storage_parent, nats_parent);
    assert_eq!(
        b.storage
            .last()
            .and_then(|s| s.one("tracestate"))
            .as_deref(),
        Some("vendor=abc")
    );

    // Even from a trusted proxy, a malformed traceparent starts a new trace, and an oversized
    // tracestate is not forwarded.
    let r = reqwest::Client::new()
        .get(gw.data_url("/v1/storage/object/b.png"))
        .header("apikey", &fx.anon_key)
        .header(
            "traceparent",
            format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01-garbage"),
        )
        .header("tracestate", "k=".to_owned() + &"v".repeat(8_192))
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status(), StatusCode::OK);
    let seen = b.storage.last().expect("storage reached");
    let (trace, _) = ids(&seen.one("traceparent").expect("a traceparent"));
    assert_ne!(trace, CLIENT_TRACE);
    assert!(seen.one("tracestate").is_none());
    let r = reqwest::Client::new()
        .get(gw.data_url("/v1/storage/object/c.png"))
        .header("apikey", &fx.anon_key)
        .header("traceparent", format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"))
        .header("tracestate", "k=".to_owned() + &"v".repeat(8_192))
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status(), StatusCode::OK);
    let seen = b.storage.last().expect("storage reached");
    assert_eq!(
        ids(&seen.one("traceparent").expect("a traceparent")).0,
        CLIENT_TRACE
    );
    assert!(
        seen.one("tracestate").is_none(),
        "an oversized tracestate was forwarded"
    );

    // Spans are flushed at exit: the collector has both request spans, children of the caller's.
    terminate(&gw.child);
    let started = Instant::now();
    let mut spans = Vec::new();
    while started.elapsed() < Duration::from_secs(20) {
        spans = receiver.spans();
        if [&storage_parent, &nats_parent]
            .iter()
            .all(|id| spans.iter().any(|s| &&s.span_id == id))
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for id in [&storage_parent, &nats_parent] {
        let span = spans.iter().find(|s| &s.span_id == id).unwrap_or_else(|| {
            panic!(
                "span {id} not exported; got {spans:?}\nlog:\n{}",
                gw.log_text()
            )
        });
        assert_eq!(span.name, "request");
        assert_eq!(span.trace_id, CLIENT_TRACE);
        assert_eq!(span.parent_span_id, CLIENT_SPAN);
    }
}

#[tokio::test]
async fn an_untrusted_callers_traceparent_starts_a_new_trace() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fx = Fixture::new();
    let prefix = unique_prefix();
    let b = backends(&prefix).await;
    // No trusted proxies: the caller is 127.0.0.1 like any client on the internet.
    let config = binary_config(
        dir.path(),
        &fx,
        "",
        &shared().url(),
        &prefix,
        &format!("[upstreams]\nstorage_url = \"{}\"\n", b.storage.url),
    );
    let gw = Process::serve(&config, dir.path());
    call_both(&gw, &fx, &format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01")).await;
    let seen = b.storage.last().expect("storage reached");
    let (storage_trace, _) = ids(&seen.one("traceparent").expect("a traceparent"));
    assert_ne!(storage_trace, CLIENT_TRACE);
    assert!(
        seen.one("tracestate").is_none(),
        "an untrusted tracestate was forwarded"
    );
    assert_eq!(seen.all("traceparent").len(), 1);
    let at_nats = b
        .nats_seen
        .lock()
        .expect("lock")
        .last()
        .cloned()
        .expect("an envelope");
    let (nats_trace, _) = ids(&at_nats);
    assert_ne!(nats_trace, CLIENT_TRACE);
    // Each request is its own trace.
    assert_ne!(nats_trace, storage_trace);
}
