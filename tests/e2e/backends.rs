//! HTTP backends (storage, realtime WebSocket/SSE/REST, dedicated PostgREST), db routing and
//! circuit breakers, end to end; WebSocket tunnels hold their connection slot while open and
//! end within the shutdown grace.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use aura_gateway::config::Config;
use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::response::IntoResponse;
use futures::{SinkExt, StreamExt};
use reqwest::StatusCode;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

use crate::support::builder::Gateway;
use crate::support::call::{Answer, Call, IntoCall, client};
use crate::support::config::write_config;
use crate::support::gateway::{InProcess, Process};
use crate::support::metrics::rss_kib;
use crate::support::nats_server::NatsServer;
use crate::support::poll::poll_every;
use crate::support::records::{TEST_KEY, e2e_control_file};
use crate::support::responder::{Bus, reply};
use crate::support::upstream::{serve_http, websocket_echo};

/// Serves `app` on an ephemeral port; returns its base URL.
async fn serve(app: Router) -> String {
    format!("http://{}", serve_http(app).await)
}

/// Echoes what it received as response headers: method, path, query and selected headers.
async fn echo_upstream() -> String {
    serve(Router::new().fallback(|request: Request| async move {
        let mut response = (StatusCode::OK, "upstream").into_response();
        let h = response.headers_mut();
        let uri = request.uri();
        h.insert(
            "x-seen-method",
            request.method().as_str().parse().expect("v"),
        );
        h.insert("x-seen-path", uri.path().parse().expect("v"));
        h.insert(
            "x-seen-query",
            uri.query().unwrap_or("-").parse().expect("v"),
        );
        for name in [
            "range",
            "if-none-match",
            "x-aura-role",
            "x-aura-project",
            "x-request-id",
            "apikey",
            "authorization",
            "x-aura-forged",
        ] {
            if let Some(v) = request.headers().get(name) {
                let seen = format!("x-seen-{name}");
                h.insert(
                    http::HeaderName::from_bytes(seen.as_bytes()).expect("n"),
                    v.clone(),
                );
            }
        }
        h.insert("connection", "x-drop-me".parse().expect("v"));
        h.insert("x-drop-me", "1".parse().expect("v"));
        response
    }))
    .await
}

#[tokio::test]
async fn storage_passes_paths_queries_and_content_headers_and_adds_the_actor() {
    let upstream = echo_upstream().await;
    let gw = Gateway::with(|c| c.upstreams.storage_url = Some(format!("{upstream}/storage/v1")));
    let gw = gw.start().await;
    let object = client()
        .get(gw.data_url("/v1/storage/object/avatars/a.png?x=1"))
        .call();
    let r = object
        .headers(&[
            ("range", "bytes=0-99"),
            ("if-none-match", "\"abc\""),
            ("x-aura-forged", "1"),
        ])
        .bearer(TEST_KEY)
        .expect(StatusCode::OK)
        .await;
    let h = &r.headers;
    assert_eq!(h["x-seen-path"], "/storage/v1/object/avatars/a.png");
    assert_eq!(h["x-seen-query"], "x=1");
    assert_eq!(h["x-seen-range"], "bytes=0-99");
    assert_eq!(h["x-seen-if-none-match"], "\"abc\"");
    assert_eq!(h["x-seen-x-aura-role"], "anon");
    assert_eq!(h["x-seen-x-aura-project"], "e2e");
    assert_eq!(h["x-seen-x-request-id"], h["x-request-id"]);
    let key_seen = h.get("x-seen-apikey").is_some();
    assert!(!key_seen, "the key never reaches a backend");
    let bearer_seen = h.get("x-seen-authorization").is_some();
    assert!(!bearer_seen, "a bearer equal to the key is dropped");
    assert!(h.get("x-seen-x-aura-forged").is_none());
    let hop = h.get("x-drop-me").is_some();
    assert!(!hop, "hop-by-hop headers named by Connection are removed");
    assert_eq!(h["x-frame-options"], "DENY");
}

fn rss(pid: u32) -> u64 {
    rss_kib(&pid.to_string()).expect("VmRSS") as u64
}

/// `SIZE / CHUNK` chunks of `CHUNK` bytes `byte`.
fn chunks(
    size: u64,
    chunk: usize,
    byte: u8,
) -> impl futures::Stream<Item = std::io::Result<bytes::Bytes>> {
    let chunk = bytes::Bytes::from(vec![byte; chunk]);
    futures::stream::iter((0..size / chunk.len() as u64).map(move |_| Ok(chunk.clone())))
}

#[tokio::test]
async fn a_gibibyte_streams_through_storage_both_ways_with_flat_memory() {
    const SIZE: u64 = 1 << 30;
    const CHUNK: usize = 256 * 1024;
    let received = Arc::new(AtomicUsize::new(0));
    let count = received.clone();
    let download = axum::routing::get(|| async {
        (
            [("content-length", SIZE.to_string())],
            Body::from_stream(chunks(SIZE, CHUNK, 7)),
        )
    });
    let upload = axum::routing::put(move |request: Request| async move {
        let mut body = request.into_body().into_data_stream();
        while let Some(chunk) = body.next().await {
            count.fetch_add(chunk.expect("chunk").len(), Ordering::Relaxed);
        }
        "stored"
    });
    let app = Router::new()
        .route("/object/big", download)
        .route("/object/upload", upload);
    let upstream = serve(app).await;
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("control.toml"), e2e_control_file()).expect("control");
    let storage = format!("[upstreams]\nstorage_url = \"{upstream}\"\n");
    let toml = format!("[control]\nfile = \"control.toml\"\n{storage}[log]\nlevel = \"warn\"\n");
    let gw = Process::serve(&write_config(dir.path(), &toml), dir.path());
    let pid = gw.child.id();
    // Warm up connections and buffers before the baseline.
    Call::get(gw.data_url("/health"))
        .expect(StatusCode::OK)
        .await;
    let baseline = rss(pid);
    let mut peak = baseline;

    let started = Instant::now();
    let download = client().get(gw.data_url("/v1/storage/object/big")).send();
    let mut download = download.await.expect("download");
    assert_eq!(download.status(), StatusCode::OK);
    let mut got: u64 = 0;
    let mut chunks_seen = 0u64;
    while let Some(chunk) = download.chunk().await.expect("chunk") {
        got += chunk.len() as u64;
        chunks_seen += 1;
        if chunks_seen.is_multiple_of(512) {
            peak = peak.max(rss(pid));
        }
    }
    assert_eq!(got, SIZE);
    let down_secs = started.elapsed().as_secs_f64();

    let started = Instant::now();
    let upload = client().put(gw.data_url("/v1/storage/object/upload"));
    let upload = upload.header("content-length", SIZE.to_string());
    let upload = tokio::spawn(
        upload
            .body(reqwest::Body::wrap_stream(chunks(SIZE, CHUNK, 9)))
            .send(),
    );
    while !upload.is_finished() {
        peak = peak.max(rss(pid));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let upload = upload.await.expect("task").expect("upload");
    assert_eq!(upload.status(), StatusCode::OK);
    assert_eq!(received.load(Ordering::Relaxed) as u64, SIZE);
    let up_secs = started.elapsed().as_secs_f64();
    let growth_mib = (peak.saturating_sub(baseline)) as f64 / 1024.0;
    println!(
        "storage 1 GiB: download {down_secs:.1} s, upload {up_secs:.1} s; gateway RSS {} MiB at rest, peak growth {growth_mib:.1} MiB",
        baseline / 1024
    );
    let flat = growth_mib < 64.0;
    assert!(flat, "RSS grew by {growth_mib:.1} MiB while streaming");
}

/// The next frame of `ws`, which must come.
async fn frame<S>(ws: &mut S) -> Message
where
    S: futures::Stream<Item = Result<Message, tokio_tungstenite::tungstenite::Error>> + Unpin,
{
    ws.next().await.expect("frame").expect("ok")
}

#[tokio::test]
async fn websockets_pass_text_binary_ping_and_close_codes_both_ways() {
    let realtime = crate::support::upstream::websocket_echo().await;
    let gw = Gateway::with(|c| c.upstreams.realtime_url = Some(realtime))
        .start()
        .await;
    let url = format!("ws://{}/v1/realtime/websocket?apikey={TEST_KEY}", gw.data);
    let (mut ws, response) = tokio_tungstenite::connect_async(&url)
        .await
        .expect("handshake through the gateway");
    assert_eq!(response.status(), 101);
    ws.send(Message::text("hello")).await.expect("send");
    assert_eq!(frame(&mut ws).await, Message::text("hello"));
    let binary: Vec<u8> = (0..=255).collect();
    ws.send(Message::binary(binary.clone()))
        .await
        .expect("send");
    assert_eq!(frame(&mut ws).await, Message::binary(binary));
    ws.send(Message::Ping(b"p".to_vec().into()))
        .await
        .expect("ping");
    assert_eq!(frame(&mut ws).await, Message::Pong(b"p".to_vec().into()));
    let bye = CloseFrame {
        code: CloseCode::from(4001),
        reason: "bye".into(),
    };
    ws.close(Some(bye)).await.expect("close");
    match frame(&mut ws).await {
        Message::Close(Some(frame)) => assert_eq!(u16::from(frame.code), 4001),
        other => panic!("expected a close frame, got {other:?}"),
    }

    // A secret key in the URL is refused before any upgrade.
    let secret = "aura_sk_not_allowed_in_urls_0123456789";
    let service_key_url = format!("ws://{}/v1/realtime/websocket?apikey={secret}", gw.data);
    match tokio_tungstenite::connect_async(&service_key_url).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => assert_eq!(r.status(), 401),
        other => panic!("expected 401, got {other:?}"),
    }
}

#[tokio::test]
async fn sse_events_reach_the_client_while_the_stream_is_open() {
    let (release_tx, release_rx) = tokio::sync::oneshot::channel::<()>();
    let release_rx = Arc::new(tokio::sync::Mutex::new(Some(release_rx)));
    let sse = axum::routing::get(move || {
        let release_rx = release_rx.clone();
        async move {
            let rx = release_rx.lock().await.take().expect("one stream");
            let first = futures::stream::once(async {
                Ok::<_, std::io::Error>(bytes::Bytes::from("data: first\n\n"))
            });
            let second = futures::stream::once(async move {
                let _ = rx.await;
                Ok(bytes::Bytes::from("data: second\n\n"))
            });
            let body = Body::from_stream(first.chain(second));
            ([("content-type", "text/event-stream")], body)
        }
    });
    let upstream = serve(Router::new().route("/sse", sse)).await;
    let gw = Gateway::with(|c| c.upstreams.realtime_url = Some(upstream))
        .with(|c| c.timeouts.default_ms = 500)
        .start()
        .await;
    let sse = Call::get(gw.data_url(&format!("/v1/realtime/sse?apikey={TEST_KEY}")));
    let mut r = sse.send().await;
    assert_eq!(r.status(), StatusCode::OK);
    let first = tokio::time::timeout(Duration::from_secs(5), r.chunk())
        .await
        .expect("the first event arrives while the stream is open")
        .expect("chunk")
        .expect("data");
    assert_eq!(&first[..], b"data: first\n\n");
    // The stream outlives the route's 500 ms budget.
    tokio::time::sleep(Duration::from_millis(800)).await;
    release_tx.send(()).expect("release");
    let second = r.chunk().await.expect("chunk").expect("data");
    assert_eq!(&second[..], b"data: second\n\n");
}

#[tokio::test]
async fn db_requests_are_routed_per_project() {
    let pgrst_hits = Arc::new(AtomicUsize::new(0));
    let hits = pgrst_hits.clone();
    let postgrest = serve(Router::new().fallback(move |request: Request| {
        hits.fetch_add(1, Ordering::SeqCst);
        let (path, query) = (
            request.uri().path().to_owned(),
            request.uri().query().map(str::to_owned),
        );
        async move { format!("postgrest {path}?{}", query.unwrap_or_default()) }
    }))
    .await;
    let keys = [
        "aura_pk_dedicated_0123456789abcdefghij",
        "aura_pk_shared_0123456789abcdefghijkl",
        "aura_pk_mongo_0123456789abcdefghijklm",
        "aura_pk_unresolved_0123456789abcdefgh",
    ];
    let hash = aura_gateway::auth::keys::hash_key;
    let org = "00000000-0000-4000-8000-0000000000d0";
    let mut file = format!("[[organizations]]\nid = \"{org}\"\nname = \"db\"\n");
    for (i, (project, engine, topology, url)) in [
        ("ded", "postgres", "dedicated", Some(postgrest.as_str())),
        ("shr", "postgres", "shared", None),
        ("mgo", "mongodb", "shared", None),
        ("unr", "postgres", "dedicated", None),
    ]
    .iter()
    .enumerate()
    {
        file += &format!(
            "[[projects]]\nref = \"{project}\"\norganization_id = \"{org}\"\ndb_engine = \"{engine}\"\ntopology = \"{topology}\"\n"
        );
        if let Some(url) = url {
            file += &format!("postgrest_url = \"{url}\"\n");
        }
        file += &format!(
            "[[api_keys]]\nid = \"00000000-0000-4000-8000-0000000000d{i}\"\nproject_ref = \"{project}\"\nrole = \"anon\"\nkey_sha256 = \"{}\"\n",
            hash(keys[i])
        );
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let control = dir.path().join("control.toml");
    std::fs::write(&control, file).expect("control");
    let gw = Gateway::with(|c| c.control.file = Some(control.display().to_string()));
    let gw = gw.start().await;
    let mut envelopes = gw.bus.record(&["db"], |_| reply(200, &[], b"nats")).await;
    let get = |key: &str, path: &str| Call::get(gw.data_url(path)).key(key);

    let r = get(keys[0], "/v1/db/todos?select=*")
        .expect(StatusCode::OK)
        .await;
    assert_eq!(r.text(), "postgrest /todos?select=*");
    let r = get(keys[0], "/v1/db/schema").read().await;
    assert_eq!(r.text(), "nats", "management routes go over NATS");
    let r = Call::put(gw.data_url("/v1/db/todos"))
        .key(keys[0])
        .read()
        .await;
    assert_eq!(r.text(), "nats", "PUT goes over NATS");
    for _ in 0..2 {
        envelopes.next().await; // the schema and PUT envelopes
    }
    for key in [keys[1], keys[2]] {
        assert_eq!(
            get(key, "/v1/db/todos?select=*").read().await.text(),
            "nats"
        );
        assert_eq!(envelopes.next().await["path"], "/v1/db/todos");
    }
    let r = get(keys[3], "/v1/db/todos")
        .expect(StatusCode::SERVICE_UNAVAILABLE)
        .await;
    assert_eq!(r.code(), "db_target_unresolved");
    let hits = pgrst_hits.load(Ordering::SeqCst);
    assert_eq!(hits, 1, "never a fallback to another target");
}

#[tokio::test]
async fn an_unreachable_upstream_is_a_502_then_the_breaker_answers_without_the_network() {
    let dead = format!("http://127.0.0.1:{}", crate::support::free_port());
    let gw = Gateway::with(|c| c.upstreams.storage_url = Some(dead))
        .with(|c| (c.breaker.failure_threshold, c.breaker.open_ms) = (3, 60_000))
        .start()
        .await;
    let object = || client().get(gw.data_url("/v1/storage/object/x")).call();
    for _ in 0..3 {
        object().expect(StatusCode::BAD_GATEWAY).await;
    }
    let r = object().expect(StatusCode::SERVICE_UNAVAILABLE).await;
    assert!(r.headers.contains_key("retry-after"));
    assert_eq!(r.code(), "circuit_open");
}

/// A NATS server of the test's own and a gateway on it whose breakers open after five failures,
/// for `open_ms`; `edit` applied to its configuration.
async fn on_own_nats(open_ms: u64, edit: impl FnOnce(&mut Config)) -> (NatsServer, InProcess) {
    let nats = NatsServer::start("");
    let gw = Gateway::with(|c| (c.breaker.failure_threshold, c.breaker.open_ms) = (5, open_ms));
    let gw = gw.with(edit).nats(nats.url()).start().await;
    (nats, gw)
}

#[tokio::test]
async fn nats_killed_under_load_opens_the_breaker_and_traffic_recovers_when_it_returns() {
    let (nats, gw) = on_own_nats(1_000, |c| c.timeouts.default_ms = 2_000).await;
    let port = nats.port;
    let ok = |_| reply(200, &[], b"ok");
    let responder = gw.bus.respond("functions", ok).await;
    let c = client();
    let f = || c.post(gw.data_url("/v1/functions/f")).call();
    for _ in 0..20 {
        assert_eq!(f().status().await, StatusCode::OK);
    }
    drop(responder);
    drop(nats);
    // Give the client a moment to see the connection drop.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut codes = Vec::new();
    let mut fast = Duration::MAX;
    for _ in 0..20 {
        let started = Instant::now();
        let r = f().send().await;
        let took = started.elapsed();
        let r = Answer::of(r).await;
        assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
        let code = r.code();
        if code == "circuit_open" {
            fast = fast.min(took);
        }
        codes.push(code);
    }
    let first_open = codes.iter().position(|c| c == "circuit_open");
    let first_open = first_open.expect("the breaker opened");
    assert!(first_open <= 5, "opened within its threshold: {codes:?}");
    assert!(
        fast < Duration::from_millis(50),
        "open answers are fast: {fast:?}"
    );

    // NATS comes back on the same port: the gateway recovers by itself.
    let _nats = NatsServer::start_on(port, "");
    let _responder = gw.bus.respond("functions", ok).await;
    let every = Duration::from_millis(200);
    let recovered = poll_every(Duration::from_secs(30), every, async || {
        (f().status().await == StatusCode::OK).then_some(())
    });
    assert!(recovered.await.is_some(), "no recovery within 30 s");
    for _ in 0..10 {
        assert_eq!(f().status().await, StatusCode::OK);
    }
}

/// NATS dies while requests are in flight and comes back: every request is answered within its
/// budget, and no request is delivered to a backend after its client got an answer.
#[tokio::test]
async fn nats_killed_with_requests_in_flight_answers_within_budget_and_never_delivers_late() {
    use std::sync::Mutex;
    let (nats, gw) = on_own_nats(500, |c| c.timeouts.functions_ms = 1_000).await;
    let port = nats.port;
    let budget = Duration::from_millis(1_000);
    // Deliveries by request id, with the time they reached a backend.
    let deliveries: Arc<Mutex<Vec<(String, Instant)>>> = Arc::default();
    let responder = |bus: Bus| {
        let deliveries = deliveries.clone();
        async move {
            let delay = Duration::from_millis(20);
            bus.respond_after("functions", delay, move |e| {
                let id = e["id"].as_str().unwrap_or_default().to_owned();
                deliveries.lock().expect("lock").push((id, Instant::now()));
                reply(200, &[], b"ok")
            })
            .await
        }
    };
    let first = responder(gw.bus.clone()).await;
    let c = client();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Eight clients keep requests in flight the whole time.
    let workers: Vec<_> = (0..8)
        .map(|_| {
            let (c, url, stop) = (c.clone(), gw.data_url("/v1/functions/f"), stop.clone());
            tokio::spawn(async move {
                let mut answers = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let started = Instant::now();
                    let r = c.post(&url).send().await.expect("answered");
                    let answered = Instant::now();
                    let id = r.headers()["x-request-id"].to_str().expect("id").to_owned();
                    answers.push((id, r.status(), answered - started, answered));
                    if r.status() != StatusCode::OK {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
                answers
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    drop(nats);
    drop(first);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let _nats = NatsServer::start_on(port, "");
    let back_bus = Bus::new(&format!("nats://127.0.0.1:{port}"), &gw.bus.prefix);
    let _second = responder(back_bus).await;
    let back = Instant::now();
    let every = Duration::from_millis(200);
    let recovered = poll_every(Duration::from_secs(30), Duration::ZERO, async || {
        tokio::time::sleep(every).await;
        let deliveries = deliveries.lock().expect("lock");
        (deliveries.iter().filter(|(_, at)| *at > back).count() >= 50).then_some(())
    });
    assert!(recovered.await.is_some(), "no recovery within 30 s");
    stop.store(true, Ordering::Relaxed);
    let mut answers = Vec::new();
    for w in workers {
        answers.extend(w.await.expect("worker"));
    }
    let delivered = deliveries.lock().expect("lock").clone();
    let failed = answers.iter().filter(|a| a.1 != StatusCode::OK).count();
    let slowest = answers.iter().map(|a| a.2).max().unwrap_or_default();
    println!(
        "nats killed under load: {} answers ({failed} failed fast or timed out), slowest {slowest:?}, \
         {} deliveries",
        answers.len(),
        delivered.len()
    );
    assert!(failed > 0, "the outage was seen");
    let served = answers.iter().filter(|a| a.1 == StatusCode::OK).count();
    assert!(served > 50, "traffic recovered");
    for (id, status, took, _) in &answers {
        let expected = [
            StatusCode::OK,
            StatusCode::SERVICE_UNAVAILABLE,
            StatusCode::GATEWAY_TIMEOUT,
        ];
        assert!(expected.contains(status), "{id}: {status}");
        let late = *took >= budget + Duration::from_millis(300);
        assert!(
            !late,
            "{id} answered after {took:?}, past its {budget:?} budget"
        );
    }
    let answered_at: std::collections::HashMap<&str, (StatusCode, Instant)> = answers
        .iter()
        .map(|(id, status, _, at)| (id.as_str(), (*status, *at)))
        .collect();
    let mut per_id: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for (id, at) in &delivered {
        *per_id.entry(id.as_str()).or_default() += 1;
        if let Some((status, answered)) = answered_at.get(id.as_str()) {
            let after = *at - *answered;
            assert!(
                *at <= *answered,
                "{id} reached a backend {after:?} after its client got {status}"
            );
        }
    }
    let once = per_id.values().all(|n| *n == 1);
    assert!(once, "a request was delivered twice");
}

/// Each request's headers, as (name, value) in the order they arrived.
type Recorded = Arc<std::sync::Mutex<Vec<Vec<(String, String)>>>>;

/// Records the headers of each request it receives and reads its body to the end.
async fn recording_upstream() -> (String, Recorded) {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = seen.clone();
    let url = serve(Router::new().fallback(move |request: Request| {
        let record = record.clone();
        async move {
            let names = request
                .headers()
                .iter()
                .map(|(n, v)| {
                    let value = String::from_utf8_lossy(v.as_bytes()).into_owned();
                    (n.as_str().to_owned(), value)
                })
                .collect();
            record.lock().expect("lock").push(names);
            let read = axum::body::to_bytes(request.into_body(), usize::MAX).await;
            (
                StatusCode::OK,
                read.map(|b| b.len()).unwrap_or(0).to_string(),
            )
                .into_response()
        }
    }))
    .await;
    (url, seen)
}

#[tokio::test]
async fn a_chunked_upload_past_the_storage_limit_is_a_413_and_no_breaker_failure() {
    let (upstream, _seen) = recording_upstream().await;
    let gw = Gateway::with(|c| c.upstreams.storage_url = Some(upstream))
        .with(|c| c.upstreams.storage_max_body_bytes = 64 * 1024)
        .with(|c| c.breaker.failure_threshold = 1)
        .start()
        .await;
    // No Content-Length: the limit can only be found while streaming.
    let upload = |name: &str, chunks: usize| {
        let chunk = || Ok::<_, std::io::Error>(bytes::Bytes::from(vec![7u8; 8 * 1024]));
        let body = futures::stream::iter((0..chunks).map(move |_| chunk()));
        let put = client().put(gw.data_url(&format!("/v1/storage/object/b/{name}")));
        put.body(reqwest::Body::wrap_stream(body)).call()
    };
    let r = upload("big.bin", 32)
        .expect(StatusCode::PAYLOAD_TOO_LARGE)
        .await;
    let body = r.json();
    assert_eq!(body["error"]["code"], "payload_too_large", "{body}");
    // Within the limit, streamed the same way: served, and the breaker never counted a failure.
    let r = upload("small.bin", 4).expect(StatusCode::OK).await;
    assert_eq!(r.text(), (32 * 1024).to_string());
}

#[tokio::test]
async fn hop_by_hop_and_client_identity_headers_never_reach_an_http_backend() {
    let (upstream, seen) = recording_upstream().await;
    let authority = upstream
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    let gw = Gateway::with(|c| c.upstreams.storage_url = Some(upstream))
        .start()
        .await;
    let object = client()
        .get(gw.data_url("/v1/storage/object/b/a.txt"))
        .call();
    let object = object.headers(&[
        ("connection", "keep-alive, x-hop"),
        ("x-hop", "1"),
        ("keep-alive", "timeout=5"),
        ("te", "trailers"),
        ("trailer", "x-t"),
        ("proxy-authorization", "Basic Zm9vOmJhcg=="),
        ("proxy-connection", "keep-alive"),
        ("x-aura-role", "service_role"),
        ("x-aura-project", "other"),
        ("x-aura-user-id", "00000000-0000-4000-8000-000000000000"),
        ("x-api-key", TEST_KEY),
        ("x-kept", "1"),
        ("x-forwarded-for", "6.6.6.6"),
        ("x-aura-client-ip", "6.6.6.6"),
        ("forwarded", "for=6.6.6.6"),
        ("x-request-id", "client-chosen"),
        ("x-kept-after", "2"),
    ]);
    object.expect(StatusCode::OK).await;
    let seen = seen.lock().expect("lock").clone();
    assert_eq!(seen.len(), 1);
    let names = &seen[0];
    let has = |name: &str| names.iter().filter(|(n, _)| n == name).count();
    let value = |name: &str| {
        let values: Vec<&str> = names
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
            .collect();
        assert_eq!(values.len(), 1, "{name} once: {names:?}");
        values[0].to_owned()
    };
    // The backend's own authority, the gateway's account of the client, its own request id.
    assert_eq!(value("host"), authority, "{names:?}");
    assert_eq!(value("x-forwarded-for"), "127.0.0.1");
    assert_eq!(value("x-aura-client-ip"), "127.0.0.1");
    assert_eq!(has("forwarded"), 0, "{names:?}");
    let id = value("x-request-id");
    assert!(
        id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()),
        "{id}"
    );
    assert_eq!(value("x-kept"), "1");
    assert_eq!(value("x-kept-after"), "2");
    assert!(has("x-kept") > 0, "ordinary headers pass: {names:?}");
    for stripped in [
        "x-hop",
        "keep-alive",
        "te",
        "trailer",
        "proxy-authorization",
        "proxy-connection",
        "x-api-key",
        "apikey",
        "x-aura-user-id",
    ] {
        assert!(
            has(stripped) == 0,
            "{stripped} reached the backend: {names:?}"
        );
    }
    // The gateway's own identity headers replace the client's.
    assert!(has("x-aura-role") == 1);
    assert!(has("x-aura-project") == 1);
}

/// A user token whose `sub` carries CR LF and a header of its own (a project's issuer decides
/// what `sub` says): the head the gateway writes for the backend leaves the user id out rather
/// than let it start a line, and the role stays the gateway's.
#[tokio::test]
async fn a_user_id_that_would_split_the_head_never_reaches_an_http_backend() {
    use crate::support::fixture::{USER_SECRET, epoch, hs256};
    let (upstream, seen) = recording_upstream().await;
    let gw = Gateway::with(|c| c.upstreams.storage_url = Some(upstream))
        .start()
        .await;
    let token = hs256(
        USER_SECRET,
        serde_json::json!({ "sub": "evil\r\nx-aura-role: service_role\r\nx-injected: 1",
                            "aud": "authenticated", "ref": "e2e", "exp": epoch() + 600 }),
    );
    let object = client()
        .get(gw.data_url("/v1/storage/object/b/a.txt"))
        .call();
    object.bearer(&token).expect(StatusCode::OK).await;
    let fine = hs256(
        USER_SECRET,
        serde_json::json!({ "sub": "user-1", "aud": "authenticated", "ref": "e2e",
                            "exp": epoch() + 600 }),
    );
    let object = client()
        .get(gw.data_url("/v1/storage/object/b/a.txt"))
        .call();
    object.bearer(&fine).expect(StatusCode::OK).await;
    let seen = seen.lock().expect("lock").clone();
    assert_eq!(seen.len(), 2);
    let values = |at: usize, name: &str| -> Vec<String> {
        seen[at]
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
            .collect()
    };
    assert!(values(0, "x-aura-user-id").is_empty(), "{:?}", seen[0]);
    assert!(values(0, "x-injected").is_empty(), "{:?}", seen[0]);
    assert_eq!(values(0, "x-aura-role"), ["authenticated"], "{:?}", seen[0]);
    assert_eq!(values(0, "x-aura-project"), ["e2e"]);
    // The same request with a user id that is a header value carries it.
    assert_eq!(values(1, "x-aura-user-id"), ["user-1"], "{:?}", seen[1]);
    assert_eq!(values(1, "x-aura-role"), ["authenticated"]);
}

#[tokio::test]
async fn websocket_tunnels_hold_their_connection_slot_and_end_within_the_grace() {
    let realtime = websocket_echo().await;
    let gw = Gateway::with(|c| c.upstreams.realtime_url = Some(realtime))
        .with(|c| (c.server.max_connections, c.server.shutdown_grace_secs) = (2, 1))
        .start()
        .await;
    let url = format!("ws://{}/v1/realtime/websocket?apikey={TEST_KEY}", gw.data);
    let (first, _) = tokio_tungstenite::connect_async(&url)
        .await
        .expect("tunnel 1");
    let (mut second, _) = tokio_tungstenite::connect_async(&url)
        .await
        .expect("tunnel 2");
    // Both slots are held by open tunnels: a third connection waits in the backlog.
    let health = gw.data_url("/health");
    let third = tokio::spawn(async move {
        let started = Instant::now();
        let r = Call::get(&health).try_send().await;
        (r.map(|r| r.status()), started.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(800)).await;
    let served = third.is_finished();
    assert!(
        !served,
        "a third connection was served while two tunnels were open"
    );
    drop(first);
    let third = tokio::time::timeout(Duration::from_secs(5), third).await;
    let (status, waited) = third.expect("served once a tunnel ended").expect("task");
    assert_eq!(status.expect("answered"), StatusCode::OK);
    assert!(waited >= Duration::from_millis(700), "{waited:?}");

    // Shutdown: the open tunnel ends within the grace (1 s).
    let started = Instant::now();
    let shutdown = tokio::spawn(gw.shutdown());
    let ended = tokio::time::timeout(Duration::from_secs(5), async {
        while let Some(Ok(_)) = second.next().await {}
    })
    .await;
    assert!(ended.is_ok(), "the tunnel outlived the shutdown grace");
    let took = started.elapsed();
    shutdown.await.expect("shut down");
    println!("tunnel closed {took:?} after shutdown began (grace 1 s)");
    assert!(took < Duration::from_secs(3), "{took:?}");
}
