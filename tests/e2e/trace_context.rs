//! W3C trace context through the real binary: a trusted caller's trace continues into the
//! gateway's span (exported over OTLP/HTTPS to a receiver decoding the protobuf), and on to an
//! HTTP backend and a NATS backend with the gateway's span as their parent; an untrusted
//! caller's `traceparent` starts nothing. A request's span, exported over OTLP, carries its
//! request id.

use std::time::Duration;

use reqwest::StatusCode;

use crate::support::builder::{Gateway, Started};
use crate::support::call::Call;
use crate::support::config::write_config;
use crate::support::fixture::Fixture;
use crate::support::gateway::Process;
use crate::support::otlp::Receiver;
use crate::support::pki::Pki;
use crate::support::poll::poll_every;
use crate::support::responder::{Bus, Envelopes, envelope_header, reply};
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

/// A storage backend, and a functions backend on NATS keeping every envelope.
struct Backends {
    storage: Recorder,
    functions: Envelopes,
    bus: Bus,
}

impl Backends {
    async fn start() -> Self {
        let storage = Recorder::start().await;
        let bus = Bus::shared();
        let functions = bus.record(&["functions"], |_| reply(200, &[], b"fn")).await;
        Self {
            storage,
            functions,
            bus,
        }
    }

    /// The `traceparent` of the last envelope the NATS backend received.
    fn at_nats(&self) -> String {
        envelope_header(&self.functions.last(), "traceparent")
    }

    /// The gateway binary over `fx`'s records with these backends and `toml`.
    fn gateway(&self, fx: &Fixture, dir: &std::path::Path, toml: &str) -> Process {
        let storage = format!("[upstreams]\nstorage_url = \"{}\"\n\n", self.storage.url);
        let gw = Gateway::builder().bus(&self.bus).fixture(fx).dir(dir);
        let Started { gw, .. } = gw.toml(storage + toml).binary();
        gw
    }
}

/// `GET path` with the anon key, `traceparent` and `tracestate`: it must be served.
async fn traced(gw: &Process, fx: &Fixture, path: &str, traceparent: &str, tracestate: &str) {
    let get = Call::get(gw.data_url(path)).key(&fx.anon_key);
    let get = get
        .header("traceparent", traceparent)
        .header("tracestate", tracestate);
    let status = get.status().await;
    assert_eq!(status, StatusCode::OK, "{path}: {}", gw.log_text());
}

async fn call_both(gw: &Process, fx: &Fixture, traceparent: &str) {
    for path in ["/v1/storage/object/a.png", "/v1/functions/hello"] {
        traced(gw, fx, path, traceparent, "vendor=abc").await;
    }
}

#[tokio::test]
async fn a_trusted_callers_trace_reaches_the_backends_and_the_collector() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fx = Fixture::new();
    let pki = Pki::new(&dir.path().join("pki"), "otlp");
    let (receiver, endpoint) = Receiver::start_tls(pki.rustls_server(false)).await;
    let b = Backends::start().await;
    let ca = pki.ca.display();
    let tracing = format!(
        "[rate_limit]\ntrusted_proxies = [\"127.0.0.1/32\"]\n\n\
         [tracing]\notlp_endpoint = \"{endpoint}\"\n\n\
         [tracing.otlp_tls]\nca_file = \"{ca}\"\n",
    );
    let gw = b.gateway(&fx, dir.path(), &tracing);
    let caller = format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01");
    call_both(&gw, &fx, &caller).await;

    let at_storage = b.storage.last().and_then(|s| s.one("traceparent"));
    let at_storage = at_storage.expect("the HTTP backend got a traceparent");
    let (storage_trace, storage_parent) = ids(&at_storage);
    let (nats_trace, nats_parent) = ids(&b.at_nats());
    assert_eq!(storage_trace, CLIENT_TRACE);
    assert_eq!(nats_trace, CLIENT_TRACE);
    // The backends' parent is the gateway's span, not the caller's.
    assert_ne!(storage_parent, CLIENT_SPAN);
    assert_ne!(nats_parent, CLIENT_SPAN);
    assert_ne!(storage_parent, nats_parent);
    let state = b.storage.last().and_then(|s| s.one("tracestate"));
    assert_eq!(state.as_deref(), Some("vendor=abc"));

    // Even from a trusted proxy, a malformed traceparent starts a new trace, and an oversized
    // tracestate is not forwarded.
    let oversized = "k=".to_owned() + &"v".repeat(8_192);
    let malformed = format!("{caller}-garbage");
    traced(&gw, &fx, "/v1/storage/object/b.png", &malformed, &oversized).await;
    let seen = b.storage.last().expect("storage reached");
    let (trace, _) = ids(&seen.one("traceparent").expect("a traceparent"));
    assert_ne!(trace, CLIENT_TRACE);
    assert!(seen.one("tracestate").is_none());
    traced(&gw, &fx, "/v1/storage/object/c.png", &caller, &oversized).await;
    let seen = b.storage.last().expect("storage reached");
    let continued = ids(&seen.one("traceparent").expect("a traceparent")).0;
    assert_eq!(continued, CLIENT_TRACE);
    let forwarded = seen.one("tracestate").is_some();
    assert!(!forwarded, "an oversized tracestate was forwarded");

    // Spans are flushed at exit: the collector has both request spans, children of the caller's.
    gw.signal("-TERM");
    let mut spans = Vec::new();
    let parents = [&storage_parent, &nats_parent];
    let _ = poll_every(
        Duration::from_secs(20),
        Duration::from_millis(100),
        async || {
            spans = receiver.spans();
            let exported = |id: &&String| spans.iter().any(|s| &&s.span_id == id);
            parents.iter().all(exported).then_some(())
        },
    )
    .await;
    for id in parents {
        let span = spans.iter().find(|s| &s.span_id == id);
        let log = || gw.log_text();
        let span = span
            .unwrap_or_else(|| panic!("span {id} not exported; got {spans:?}\nlog:\n{}", log()));
        assert_eq!(span.name, "request");
        assert_eq!(span.trace_id, CLIENT_TRACE);
        assert_eq!(span.parent_span_id, CLIENT_SPAN);
    }
}

#[tokio::test]
async fn an_untrusted_callers_traceparent_starts_a_new_trace() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fx = Fixture::new();
    let b = Backends::start().await;
    // No trusted proxies: the caller is 127.0.0.1 like any client on the internet.
    let gw = b.gateway(&fx, dir.path(), "");
    call_both(&gw, &fx, &format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01")).await;
    let seen = b.storage.last().expect("storage reached");
    let (storage_trace, _) = ids(&seen.one("traceparent").expect("a traceparent"));
    assert_ne!(storage_trace, CLIENT_TRACE);
    let forwarded = seen.one("tracestate").is_some();
    assert!(!forwarded, "an untrusted tracestate was forwarded");
    assert_eq!(seen.all("traceparent").len(), 1);
    let (nats_trace, _) = ids(&b.at_nats());
    assert_ne!(nats_trace, CLIENT_TRACE);
    // Each request is its own trace.
    assert_ne!(nats_trace, storage_trace);
}

#[tokio::test]
async fn spans_are_exported_over_otlp_with_the_request_id() {
    let bodies: std::sync::Arc<std::sync::Mutex<Vec<u8>>> = Default::default();
    let sink = bodies.clone();
    let traces = axum::routing::post(move |body: axum::body::Bytes| {
        sink.lock().expect("lock").extend_from_slice(&body);
        async { "" }
    });
    let app = axum::Router::new().route("/v1/traces", traces);
    let collector = crate::support::upstream::serve_http(app).await;

    let dir = tempfile::tempdir().expect("tempdir");
    let tracing = format!(
        "[tracing]\notlp_endpoint = \"http://{collector}\"\nservice_name = \"aura-gateway-e2e\"\n"
    );
    let path = write_config(dir.path(), &tracing);
    let gw = Process::serve(&path, dir.path());
    let id = Call::get(gw.data_url("/health")).read().await.request_id();
    let status = gw.terminate().await;
    assert!(status.success());
    let exported = String::from_utf8_lossy(&bodies.lock().expect("lock")).to_string();
    let carried = exported.contains(&id);
    assert!(carried, "the request span carries the request id");
    assert!(exported.contains("aura-gateway-e2e"), "service.name");
    assert!(exported.contains("request"), "the request span");
}
