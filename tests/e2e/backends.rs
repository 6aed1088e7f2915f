//! HTTP backends (storage, realtime WebSocket/SSE/REST, dedicated PostgREST), db routing and
//! circuit breakers, end to end.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::response::IntoResponse;
use futures::{SinkExt, StreamExt};
use reqwest::StatusCode;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

use crate::support::gateway::{InProcess, TEST_KEY, client, test_config};
use crate::support::nats_server::{NatsServer, shared};
use crate::support::responder::{Responder, reply};
use crate::support::unique_prefix;

/// Serves `app` on an ephemeral port; returns its base URL.
async fn serve(app: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
}

/// Echoes what it received as response headers: method, path, query and selected headers.
async fn echo_upstream() -> String {
    serve(Router::new().fallback(|request: Request| async move {
        let mut response = (StatusCode::OK, "upstream").into_response();
        let h = response.headers_mut();
        h.insert(
            "x-seen-method",
            request.method().as_str().parse().expect("v"),
        );
        h.insert("x-seen-path", request.uri().path().parse().expect("v"));
        h.insert(
            "x-seen-query",
            request.uri().query().unwrap_or("-").parse().expect("v"),
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
                h.insert(
                    http::HeaderName::from_bytes(format!("x-seen-{name}").as_bytes()).expect("n"),
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
    let mut config = test_config(&shared().url(), &unique_prefix());
    config.upstreams.storage_url = Some(format!("{upstream}/storage/v1"));
    let gw = InProcess::start(config).await;
    let r = client()
        .get(gw.data_url("/v1/storage/object/avatars/a.png?x=1"))
        .header("range", "bytes=0-99")
        .header("if-none-match", "\"abc\"")
        .header("x-aura-forged", "1")
        .header("authorization", format!("Bearer {TEST_KEY}"))
        .send()
        .await
        .expect("request");
    assert_eq!(r.status(), StatusCode::OK);
    let h = r.headers();
    assert_eq!(h["x-seen-path"], "/storage/v1/object/avatars/a.png");
    assert_eq!(h["x-seen-query"], "x=1");
    assert_eq!(h["x-seen-range"], "bytes=0-99");
    assert_eq!(h["x-seen-if-none-match"], "\"abc\"");
    assert_eq!(h["x-seen-x-aura-role"], "anon");
    assert_eq!(h["x-seen-x-aura-project"], "e2e");
    assert_eq!(h["x-seen-x-request-id"], h["x-request-id"]);
    assert!(
        h.get("x-seen-apikey").is_none(),
        "the key never reaches a backend"
    );
    assert!(
        h.get("x-seen-authorization").is_none(),
        "a bearer equal to the key is dropped"
    );
    assert!(h.get("x-seen-x-aura-forged").is_none());
    assert!(
        h.get("x-drop-me").is_none(),
        "hop-by-hop headers named by Connection are removed"
    );
    assert_eq!(h["x-frame-options"], "DENY");
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

#[tokio::test]
async fn a_gibibyte_streams_through_storage_both_ways_with_flat_memory() {
    const SIZE: u64 = 1 << 30;
    const CHUNK: usize = 256 * 1024;
    let received = Arc::new(AtomicUsize::new(0));
    let count = received.clone();
    let upstream = serve(
        Router::new()
            .route(
                "/object/big",
                axum::routing::get(|| async {
                    let chunk = bytes::Bytes::from(vec![7u8; CHUNK]);
                    let stream = futures::stream::iter(
                        (0..SIZE / CHUNK as u64)
                            .map(move |_| Ok::<_, std::io::Error>(chunk.clone())),
                    );
                    (
                        [("content-length", SIZE.to_string())],
                        Body::from_stream(stream),
                    )
                }),
            )
            .route(
                "/object/upload",
                axum::routing::put(move |request: Request| async move {
                    let mut body = request.into_body().into_data_stream();
                    while let Some(chunk) = body.next().await {
                        count.fetch_add(chunk.expect("chunk").len(), Ordering::Relaxed);
                    }
                    "stored"
                }),
            ),
    )
    .await;
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("control.toml"),
        crate::support::gateway::e2e_control_file(),
    )
    .expect("control");
    let config = dir.path().join("gateway.toml");
    std::fs::write(
        &config,
        format!("[control]\nfile = \"control.toml\"\n[upstreams]\nstorage_url = \"{upstream}\"\n[log]\nlevel = \"warn\"\n"),
    )
    .expect("config");
    let gw = crate::support::gateway::Process::serve(&config, dir.path());
    let pid = gw.child.id();
    // Warm up connections and buffers before the baseline.
    let warm = client()
        .get(gw.data_url("/health"))
        .send()
        .await
        .expect("warm");
    assert_eq!(warm.status(), StatusCode::OK);
    let baseline = rss_kib(pid);
    let mut peak = baseline;

    let started = Instant::now();
    let mut download = client()
        .get(gw.data_url("/v1/storage/object/big"))
        .send()
        .await
        .expect("download");
    assert_eq!(download.status(), StatusCode::OK);
    let mut got: u64 = 0;
    let mut chunks = 0u64;
    while let Some(chunk) = download.chunk().await.expect("chunk") {
        got += chunk.len() as u64;
        chunks += 1;
        if chunks.is_multiple_of(512) {
            peak = peak.max(rss_kib(pid));
        }
    }
    assert_eq!(got, SIZE);
    let down_secs = started.elapsed().as_secs_f64();

    let started = Instant::now();
    let chunk = bytes::Bytes::from(vec![9u8; CHUNK]);
    let upload_body = futures::stream::iter(
        (0..SIZE / CHUNK as u64).map(move |_| Ok::<_, std::io::Error>(chunk.clone())),
    );
    let upload = tokio::spawn(
        client()
            .put(gw.data_url("/v1/storage/object/upload"))
            .header("content-length", SIZE.to_string())
            .body(reqwest::Body::wrap_stream(upload_body))
            .send(),
    );
    while !upload.is_finished() {
        peak = peak.max(rss_kib(pid));
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
    assert!(
        growth_mib < 64.0,
        "RSS grew by {growth_mib:.1} MiB while streaming"
    );
}

#[tokio::test]
async fn websockets_pass_text_binary_ping_and_close_codes_both_ways() {
    let realtime = crate::support::upstream::websocket_echo().await;
    let mut config = test_config(&shared().url(), &unique_prefix());
    config.upstreams.realtime_url = Some(realtime);
    let gw = InProcess::start(config).await;
    let url = format!("ws://{}/v1/realtime/websocket?apikey={TEST_KEY}", gw.data);
    let (mut ws, response) = tokio_tungstenite::connect_async(&url)
        .await
        .expect("handshake through the gateway");
    assert_eq!(response.status(), 101);
    ws.send(Message::text("hello")).await.expect("send");
    assert_eq!(
        ws.next().await.expect("frame").expect("ok"),
        Message::text("hello")
    );
    let binary: Vec<u8> = (0..=255).collect();
    ws.send(Message::binary(binary.clone()))
        .await
        .expect("send");
    assert_eq!(
        ws.next().await.expect("frame").expect("ok"),
        Message::binary(binary)
    );
    ws.send(Message::Ping(b"p".to_vec().into()))
        .await
        .expect("ping");
    assert_eq!(
        ws.next().await.expect("frame").expect("ok"),
        Message::Pong(b"p".to_vec().into())
    );
    ws.close(Some(CloseFrame {
        code: CloseCode::from(4001),
        reason: "bye".into(),
    }))
    .await
    .expect("close");
    match ws.next().await.expect("frame").expect("ok") {
        Message::Close(Some(frame)) => assert_eq!(u16::from(frame.code), 4001),
        other => panic!("expected a close frame, got {other:?}"),
    }

    // A secret key in the URL is refused before any upgrade.
    let service_key_url = format!(
        "ws://{}/v1/realtime/websocket?apikey=aura_sk_not_allowed_in_urls_0123456789",
        gw.data
    );
    match tokio_tungstenite::connect_async(&service_key_url).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => assert_eq!(r.status(), 401),
        other => panic!("expected 401, got {other:?}"),
    }
}

#[tokio::test]
async fn sse_events_reach_the_client_while_the_stream_is_open() {
    let (release_tx, release_rx) = tokio::sync::oneshot::channel::<()>();
    let release_rx = Arc::new(tokio::sync::Mutex::new(Some(release_rx)));
    let upstream = serve(Router::new().route(
        "/sse",
        axum::routing::get(move || {
            let release_rx = release_rx.clone();
            async move {
                let rx = release_rx.lock().await.take().expect("one stream");
                let stream = futures::stream::once(async {
                    Ok::<_, std::io::Error>(bytes::Bytes::from("data: first\n\n"))
                })
                .chain(futures::stream::once(async move {
                    let _ = rx.await;
                    Ok(bytes::Bytes::from("data: second\n\n"))
                }));
                (
                    [("content-type", "text/event-stream")],
                    Body::from_stream(stream),
                )
            }
        }),
    ))
    .await;
    let mut config = test_config(&shared().url(), &unique_prefix());
    config.upstreams.realtime_url = Some(upstream);
    config.timeouts.default_ms = 500;
    let gw = InProcess::start(config).await;
    let mut r = reqwest::Client::new()
        .get(gw.data_url(&format!("/v1/realtime/sse?apikey={TEST_KEY}")))
        .send()
        .await
        .expect("sse");
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
        async move {
            format!(
                "postgrest {}?{}",
                request.uri().path(),
                request.uri().query().unwrap_or("")
            )
        }
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
    let nats = shared();
    let prefix = unique_prefix();
    let mut config = test_config(&nats.url(), &prefix);
    config.control.file = Some(control.display().to_string());
    let gw = InProcess::start(config).await;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let _db = Responder::start(
        &nats.url(),
        &format!("{prefix}.db.http"),
        Duration::ZERO,
        move |e| {
            let _ = tx.send(e);
            reply(200, &[], b"nats")
        },
    )
    .await;
    let get = |key: &'static str, path: &str| {
        reqwest::Client::new()
            .get(gw.data_url(path))
            .header("apikey", key)
            .send()
    };

    let r = get(keys[0], "/v1/db/todos?select=*").await.expect("r");
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.text().await.expect("body"), "postgrest /todos?select=*");
    let r = get(keys[0], "/v1/db/schema").await.expect("r");
    assert_eq!(
        r.text().await.expect("body"),
        "nats",
        "management routes go over NATS"
    );
    let r = reqwest::Client::new()
        .put(gw.data_url("/v1/db/todos"))
        .header("apikey", keys[0])
        .send()
        .await
        .expect("r");
    assert_eq!(r.text().await.expect("body"), "nats", "PUT goes over NATS");
    for _ in 0..2 {
        rx.recv().await.expect("the schema and PUT envelopes");
    }
    for key in [keys[1], keys[2]] {
        let r = get(key, "/v1/db/todos?select=*").await.expect("r");
        assert_eq!(r.text().await.expect("body"), "nats");
        let e = rx.recv().await.expect("envelope");
        assert_eq!(e["path"], "/v1/db/todos");
    }
    let r = get(keys[3], "/v1/db/todos").await.expect("r");
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    let body: serde_json::Value = r.json().await.expect("json");
    assert_eq!(body["error"]["code"], "db_target_unresolved");
    assert_eq!(
        pgrst_hits.load(Ordering::SeqCst),
        1,
        "never a fallback to another target"
    );
}

#[tokio::test]
async fn an_unreachable_upstream_is_a_502_then_the_breaker_answers_without_the_network() {
    let dead = format!("http://127.0.0.1:{}", crate::support::free_port());
    let mut config = test_config(&shared().url(), &unique_prefix());
    config.upstreams.storage_url = Some(dead);
    config.breaker.failure_threshold = 3;
    config.breaker.open_ms = 60_000;
    let gw = InProcess::start(config).await;
    for _ in 0..3 {
        let r = client()
            .get(gw.data_url("/v1/storage/object/x"))
            .send()
            .await
            .expect("r");
        assert_eq!(r.status(), StatusCode::BAD_GATEWAY);
    }
    let r = client()
        .get(gw.data_url("/v1/storage/object/x"))
        .send()
        .await
        .expect("r");
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(r.headers().contains_key("retry-after"));
    let body: serde_json::Value = r.json().await.expect("json");
    assert_eq!(body["error"]["code"], "circuit_open");
}

#[tokio::test]
async fn nats_killed_under_load_opens_the_breaker_and_traffic_recovers_when_it_returns() {
    let nats = NatsServer::start("");
    let port = nats.port;
    let prefix = unique_prefix();
    let mut config = test_config(&nats.url(), &prefix);
    config.breaker.failure_threshold = 5;
    config.breaker.open_ms = 1_000;
    config.timeouts.default_ms = 2_000;
    let gw = InProcess::start(config).await;
    let responder = Responder::start(
        &nats.url(),
        &format!("{prefix}.functions.http"),
        Duration::ZERO,
        |_| reply(200, &[], b"ok"),
    )
    .await;
    let c = client();
    for _ in 0..20 {
        assert_eq!(
            c.post(gw.data_url("/v1/functions/f"))
                .send()
                .await
                .expect("r")
                .status(),
            StatusCode::OK
        );
    }
    drop(responder);
    drop(nats);
    // Give the client a moment to see the connection drop.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut codes = Vec::new();
    let mut fast = Duration::MAX;
    for _ in 0..20 {
        let started = Instant::now();
        let r = c
            .post(gw.data_url("/v1/functions/f"))
            .send()
            .await
            .expect("r");
        let took = started.elapsed();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        let body: serde_json::Value = r.json().await.expect("json");
        let code = body["error"]["code"].as_str().expect("code").to_owned();
        if code == "circuit_open" {
            fast = fast.min(took);
        }
        codes.push(code);
    }
    let first_open = codes
        .iter()
        .position(|c| c == "circuit_open")
        .expect("the breaker opened");
    assert!(first_open <= 5, "opened within its threshold: {codes:?}");
    assert!(
        fast < Duration::from_millis(50),
        "open answers are fast: {fast:?}"
    );

    // NATS comes back on the same port: the gateway recovers by itself.
    let _nats = NatsServer::start_on(port, "");
    let _responder = Responder::start(
        &format!("nats://127.0.0.1:{port}"),
        &format!("{prefix}.functions.http"),
        Duration::ZERO,
        |_| reply(200, &[], b"ok"),
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = c
            .post(gw.data_url("/v1/functions/f"))
            .send()
            .await
            .expect("r");
        if r.status() == StatusCode::OK {
            break;
        }
        assert!(Instant::now() < deadline, "no recovery within 30 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for _ in 0..10 {
        assert_eq!(
            c.post(gw.data_url("/v1/functions/f"))
                .send()
                .await
                .expect("r")
                .status(),
            StatusCode::OK
        );
    }
}

/// NATS dies while requests are in flight and comes back: every request is answered within its
/// budget, and no request is delivered to a backend after its client got an answer.
#[tokio::test]
async fn nats_killed_with_requests_in_flight_answers_within_budget_and_never_delivers_late() {
    use std::sync::Mutex;
    let nats = NatsServer::start("");
    let port = nats.port;
    let prefix = unique_prefix();
    let mut config = test_config(&nats.url(), &prefix);
    config.breaker.failure_threshold = 5;
    config.breaker.open_ms = 500;
    config.timeouts.functions_ms = 1_000;
    let budget = Duration::from_millis(1_000);
    let gw = InProcess::start(config).await;
    // Deliveries by request id, with the time they reached a backend.
    let deliveries: Arc<Mutex<Vec<(String, Instant)>>> = Arc::default();
    let responder = |url: String, deliveries: Arc<Mutex<Vec<(String, Instant)>>>| {
        let prefix = prefix.clone();
        async move {
            Responder::start(
                &url,
                &format!("{prefix}.functions.http"),
                Duration::from_millis(20),
                move |e| {
                    let id = e["id"].as_str().unwrap_or_default().to_owned();
                    deliveries.lock().expect("lock").push((id, Instant::now()));
                    reply(200, &[], b"ok")
                },
            )
            .await
        }
    };
    let first = responder(nats.url(), deliveries.clone()).await;
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
    let _second = responder(format!("nats://127.0.0.1:{port}"), deliveries.clone()).await;
    let back = Instant::now();
    let deadline = back + Duration::from_secs(30);
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let served_since = deliveries
            .lock()
            .expect("lock")
            .iter()
            .filter(|(_, at)| *at > back)
            .count();
        if served_since >= 50 {
            break;
        }
        assert!(Instant::now() < deadline, "no recovery within 30 s");
    }
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
    assert!(
        answers.iter().filter(|a| a.1 == StatusCode::OK).count() > 50,
        "traffic recovered"
    );
    for (id, status, took, _) in &answers {
        assert!(
            matches!(
                *status,
                StatusCode::OK | StatusCode::SERVICE_UNAVAILABLE | StatusCode::GATEWAY_TIMEOUT
            ),
            "{id}: {status}"
        );
        assert!(
            *took < budget + Duration::from_millis(300),
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
            assert!(
                *at <= *answered,
                "{id} reached a backend {:?} after its client got {status}",
                *at - *answered
            );
        }
    }
    assert!(
        per_id.values().all(|n| *n == 1),
        "a request was delivered twice"
    );
}

/// Records the header names of each request it receives and reads its body to the end.
async fn recording_upstream() -> (String, std::sync::Arc<std::sync::Mutex<Vec<Vec<String>>>>) {
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = seen.clone();
    let url = serve(Router::new().fallback(move |request: Request| {
        let record = record.clone();
        async move {
            let names = request
                .headers()
                .keys()
                .map(|n| n.as_str().to_owned())
                .collect();
            record.lock().expect("lock").push(names);
            let read = axum::body::to_bytes(request.into_body(), usize::MAX)
                .await
                .map(|b| b.len())
                .unwrap_or(0);
            (StatusCode::OK, read.to_string()).into_response()
        }
    }))
    .await;
    (url, seen)
}

#[tokio::test]
async fn a_chunked_upload_past_the_storage_limit_is_a_413_and_no_breaker_failure() {
    let (upstream, _seen) = recording_upstream().await;
    let mut config = test_config(&shared().url(), &unique_prefix());
    config.upstreams.storage_url = Some(upstream);
    config.upstreams.storage_max_body_bytes = 64 * 1024;
    config.breaker.failure_threshold = 1;
    let gw = InProcess::start(config).await;
    // No Content-Length: the limit can only be found while streaming.
    let chunks = futures::stream::iter(
        (0..32).map(|_| Ok::<_, std::io::Error>(bytes::Bytes::from(vec![7u8; 8 * 1024]))),
    );
    let r = client()
        .put(gw.data_url("/v1/storage/object/b/big.bin"))
        .body(reqwest::Body::wrap_stream(chunks))
        .send()
        .await
        .expect("answered");
    assert_eq!(r.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let body: serde_json::Value = r.json().await.expect("json");
    assert_eq!(body["error"]["code"], "payload_too_large", "{body}");
    // Within the limit, streamed the same way: served, and the breaker never counted a failure.
    let chunks = futures::stream::iter(
        (0..4).map(|_| Ok::<_, std::io::Error>(bytes::Bytes::from(vec![7u8; 8 * 1024]))),
    );
    let r = client()
        .put(gw.data_url("/v1/storage/object/b/small.bin"))
        .body(reqwest::Body::wrap_stream(chunks))
        .send()
        .await
        .expect("answered");
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.text().await.expect("text"), (32 * 1024).to_string());
}

#[tokio::test]
async fn hop_by_hop_and_client_identity_headers_never_reach_an_http_backend() {
    let (upstream, seen) = recording_upstream().await;
    let mut config = test_config(&shared().url(), &unique_prefix());
    config.upstreams.storage_url = Some(upstream);
    let gw = InProcess::start(config).await;
    let r = client()
        .get(gw.data_url("/v1/storage/object/b/a.txt"))
        .header("connection", "keep-alive, x-hop")
        .header("x-hop", "1")
        .header("keep-alive", "timeout=5")
        .header("te", "trailers")
        .header("trailer", "x-t")
        .header("proxy-authorization", "Basic Zm9vOmJhcg==")
        .header("proxy-connection", "keep-alive")
        .header("x-aura-role", "service_role")
        .header("x-aura-project", "other")
        .header("x-aura-user-id", "00000000-0000-4000-8000-000000000000")
        .header("x-api-key", TEST_KEY)
        .header("x-kept", "1")
        .send()
        .await
        .expect("answered");
    assert_eq!(r.status(), StatusCode::OK);
    let seen = seen.lock().expect("lock").clone();
    assert_eq!(seen.len(), 1);
    let names = &seen[0];
    assert!(
        names.iter().any(|n| n == "x-kept"),
        "ordinary headers pass: {names:?}"
    );
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
            !names.iter().any(|n| n == stripped),
            "{stripped} reached the backend: {names:?}"
        );
    }
    // The gateway's own identity headers replace the client's.
    assert!(names.iter().filter(|n| *n == "x-aura-role").count() == 1);
    assert!(names.iter().filter(|n| *n == "x-aura-project").count() == 1);
}
