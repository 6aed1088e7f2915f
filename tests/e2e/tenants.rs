//! Per-project policy modules installed through the management plane, and what one project's
//! modules cannot take from the others: a shadow runs in its own project's share of the tenant
//! threads, a module that waits, spins or sets up slowly is stopped within its deadline, upload
//! places are shared between organizations, and a preflight flood is limited per IP before any
//! module runs.

use std::sync::Arc;
use std::time::{Duration, Instant};

use aura_gateway::planes::build_data_plane_router;
use aura_gateway::policy::Stage;
use http::Request;
use reqwest::StatusCode;
use serde_json::json;
use tokio::io::AsyncWriteExt;
use tower::ServiceExt;

use crate::support::builder::{Gateway, Started, offline};
use crate::support::call::{Call, IntoCall};
use crate::support::config::test_config;
use crate::support::fixture::{Fixture, console_token};
use crate::support::gateway::Process;
use crate::support::metrics::metric;
use crate::support::policy::{Policies, admin, b64, testing_cors};
use crate::support::poll::poll;
use crate::support::router::{from, with_module};

#[tokio::test]
async fn a_tenant_installs_its_own_cors_and_quota_modules_and_other_projects_are_unaffected() {
    let fx = Fixture::new();
    let gw = Gateway::with(|c| c.data_plane.project_host_suffix = Some(".api.test".into()));
    let gw = gw.fixture(&fx).start().await;
    let admin = Policies::new(gw.mgmt_url(""), console_token(fx.admin));
    let module = b64(&testing_cors());

    // A module that traps on every call is refused at upload, with the reason.
    let trapping = json!({ "module": module, "config": { "trap_always": true } });
    let (status, body) = admin.put("cors", trapping).await.parts();
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["code"], "policy_refused");
    let message = body["error"]["message"].as_str().expect("message");
    assert!(message.contains("conformance"), "{body}");

    // A developer may not install modules.
    let developer = Policies::new(gw.mgmt_url(""), console_token(fx.developer));
    let r = developer.put("cors", json!({ "module": module })).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);

    let r = admin
        .put("cors", json!({ "module": module, "config": {} }))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let installed = admin.get("cors").await.json();
    assert_eq!(installed["digest"].as_str().map(str::len), Some(64));

    let preflight = |host: &'static str| {
        let url = gw.data_url("/v1/db/todos");
        Call::preflight(url, "https://tenant.example")
            .host(host)
            .read()
    };
    let r = preflight("alpha.api.test").await;
    let allowed = &r.headers["access-control-allow-origin"];
    assert_eq!(allowed, "https://tenant.example", "alpha's module");
    assert_eq!(r.headers["access-control-allow-headers"], "x-testing");
    let r = preflight("beta.api.test").await;
    let allowed = &r.headers["access-control-allow-origin"];
    assert_eq!(allowed, "*", "beta keeps the plane's module");

    // An actual request of alpha (known by its key) follows alpha's module too.
    let health = Call::get(gw.data_url("/health")).key(&fx.anon_key);
    let r = health.origin("https://tenant.example").read().await;
    let allowed = &r.headers["access-control-allow-origin"];
    assert_eq!(allowed, "https://tenant.example");

    // A quota module for alpha: the builtin one, configured tighter.
    let quota = aura_gateway::policy::stages::builtin::QUOTA;
    let tight = json!({ "rate_per_second": 1, "burst": 2 });
    assert_eq!(
        admin.install("quota", quota, tight).await.status,
        StatusCode::OK
    );
    let storage = |key: &str| Call::get(gw.data_url("/v1/storage/x")).key(key).status();
    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(storage(&fx.anon_key).await);
    }
    let limited = statuses[2] == StatusCode::TOO_MANY_REQUESTS;
    assert!(limited, "alpha's own quota: {statuses:?}");
    let other = storage(&fx.other_project_key).await;
    assert_ne!(
        other,
        StatusCode::TOO_MANY_REQUESTS,
        "another project is unaffected"
    );

    // Removing the module brings the plane's back.
    assert_eq!(admin.delete("cors").await.status, StatusCode::NO_CONTENT);
    let r = preflight("alpha.api.test").await;
    assert_eq!(r.headers["access-control-allow-origin"], "*");
    assert_eq!(admin.get("cors").await.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_failing_tenant_module_never_rolls_back_the_operators_modules() {
    let fx = Fixture::new();
    let gw = Gateway::with(|c| c.plugins.rollback_min_calls = 5);
    let gw = gw.fixture(&fx).start().await;
    // A reload happened: there is a previous set of modules to roll back to.
    let policies = &gw.state.policies;
    let reloaded = aura_gateway::policy::Policies::load(&policies.runtime, &gw.state.config, None);
    policies.swap(reloaded.expect("policies"));
    let in_force = policies.snapshot();

    let admin = Policies::new(gw.mgmt_url(""), console_token(fx.admin));
    let installed = admin.install("cors", &testing_cors(), json!({})).await;
    assert_eq!(installed.status, StatusCode::OK);
    // Every call of alpha's module fails: alpha's requests fail closed…
    let trap = |key: &str| {
        let health = Call::get(gw.data_url("/health")).key(key);
        health.origin("https://trap.test").status()
    };
    for _ in 0..40 {
        assert_eq!(trap(&fx.anon_key).await, StatusCode::INTERNAL_SERVER_ERROR);
    }
    // …and nothing else changes: the operator's modules stay in force.
    let kept = Arc::ptr_eq(&in_force, &policies.snapshot());
    assert!(
        kept,
        "a tenant module's failures rolled back the plane's modules"
    );
    let metrics = gw.state.metrics.render();
    assert!(!metrics.contains(r#"aura_policy_reloads_total{result="rolled_back"}"#));
    let other = trap(&fx.other_project_key).await;
    assert_eq!(other, StatusCode::OK, "another project is unaffected");
}

#[tokio::test]
async fn a_fifty_megabyte_module_is_refused_before_it_is_read_and_the_gateway_keeps_serving() {
    let fx = Fixture::new();
    let gw = Gateway::builder().fixture(&fx).start().await;
    let admin = Policies::new(gw.mgmt_url(""), console_token(fx.admin));
    let module = "A".repeat(50 * 1024 * 1024 / 3 * 4);
    let started = std::time::Instant::now();
    let upload = admin.call(reqwest::Method::PUT, "quota", "");
    let r = upload.json(&json!({ "module": module })).try_send().await;
    // Refused with 413, or the connection closed while the client was still sending.
    if let Ok(r) = r {
        assert_eq!(r.status(), StatusCode::PAYLOAD_TOO_LARGE);
    }
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    let health = Call::get(gw.data_url("/health")).status().await;
    assert_eq!(health, StatusCode::OK, "still serving");
    let quota = admin.get("quota").await.status;
    assert_eq!(quota, StatusCode::NOT_FOUND, "nothing was installed");
}

/// `bytes` with a custom section of `pad` bytes appended: still a valid component.
fn padded(bytes: Vec<u8>, pad: usize) -> Vec<u8> {
    crate::support::wasm::with_custom_section(bytes, b"padding", &vec![0; pad])
}

#[tokio::test]
async fn a_module_up_to_the_configured_size_is_accepted_and_a_larger_one_gets_a_json_413() {
    let fx = Fixture::new();
    let gw = Gateway::builder().fixture(&fx).start().await;
    let admin = Policies::new(gw.mgmt_url(""), console_token(fx.admin));
    // 3 MiB: under `plugins.tenant_max_module_bytes` (4 MiB), 4 MiB once base64 in JSON.
    let upload = async |module: Vec<u8>| admin.install("cors", &module, json!({})).await;
    let r = upload(padded(testing_cors(), 3 * 1024 * 1024)).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    // 5 MiB: over the module limit, under the body limit: the gateway's own JSON 413.
    let r = upload(padded(testing_cors(), 5 * 1024 * 1024)).await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE);
    let body = r.json();
    assert_eq!(body["error"]["code"], "payload_too_large", "{body}");
}

fn testing_module() -> String {
    b64(&testing_cors())
}

/// A gateway binary with `plugins` settings.
fn started(plugins: &str) -> Started {
    Gateway::builder()
        .toml(format!("[plugins]\n{plugins}"))
        .binary()
}

/// Puts `body` as `project`'s CORS module on `gw`, as `user`; it must be accepted.
async fn install(gw: &Process, user: uuid::Uuid, project: &str, body: serde_json::Value) {
    let policies = Policies::new(gw.mgmt_url(""), console_token(user)).of(project);
    let r = policies.put("cors", body).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
}

/// `GET /health` with `key` from `origin`: the project's CORS module decides.
async fn from_origin(gw: &Process, key: &str, origin: &str) -> (StatusCode, String, Duration) {
    let started = Instant::now();
    let r = Call::get(gw.data_url("/health"))
        .key(key)
        .origin(origin)
        .send()
        .await;
    let status = r.status();
    (
        status,
        r.text().await.unwrap_or_default(),
        started.elapsed(),
    )
}

fn p90(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples
        .get(samples.len() * 9 / 10)
        .copied()
        .unwrap_or_default()
}

/// A project whose shadow spins to the deadline on every request used to run it outside the
/// project's share (only half the tenant threads bounded shadows): with its own module's calls
/// beside them, one project held every tenant thread and the others' calls waited (victim p90
/// 4.2 → 17.7 ms). A shadow now takes a place of the project's own share — while it runs, the
/// project's next call waits for that place like any other — and is skipped when there is none;
/// the other projects keep their threads.
#[tokio::test]
async fn a_projects_shadow_takes_its_own_share_never_the_other_projects_threads() {
    let Started { gw, fx, dir: _dir } = started(
        "call_deadline_ms = 300\ntenant_threads = 2\ntenant_max_concurrent_calls = 1\ntenant_queue_timeout_ms = 100\n",
    );
    let module = testing_module();
    // Alpha's module answers at once; its shadow (the same module, hostile origins on) spins
    // to the deadline on `loop.test`.
    let echo_all = json!({ "module": module, "config": { "echo_all": true } });
    install(&gw, fx.admin, "alpha", echo_all.clone()).await;
    let shadow = json!({ "module": module, "mode": "shadow" });
    install(&gw, fx.admin, "alpha", shadow).await;
    install(&gw, fx.outsider, "other", echo_all).await;
    let alpha = async || from_origin(&gw, &fx.anon_key, "https://loop.test").await;
    let other = async || from_origin(&gw, &fx.other_project_key, "https://b.example").await;
    let (status, body, _) = alpha().await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // Its shadow now spins in alpha's one place: alpha's next call finds none.
    let (status, body, _) = alpha().await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(body.contains("policy_busy"), "{body}");
    let (status, body, _) = other().await;
    assert_eq!(status, StatusCode::OK, "another project's call: {body}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (status, body, _) = alpha().await;
    assert_eq!(status, StatusCode::OK, "alpha's place is back: {body}");

    // Under a flood of alpha's spinning shadows, the other project's calls keep a thread.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut flood = Vec::new();
    for _ in 0..8 {
        let (url, key, stop) = (gw.data_url("/health"), fx.anon_key.clone(), stop.clone());
        flood.push(tokio::spawn(async move {
            let c = reqwest::Client::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let spinning = c.get(&url).header("apikey", &key);
                let _ = spinning.header("origin", "https://loop.test").send().await;
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut latencies = Vec::new();
    for i in 0..30 {
        let (status, body, took) = other().await;
        let served = status == StatusCode::OK;
        assert!(served, "request {i} of the other project: {status} {body}");
        latencies.push(took);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for task in flood {
        let _ = task.await;
    }
    let p90 = p90(latencies);
    eprintln!("the other project's p90 while alpha's shadows spin: {p90:?}");
}

/// A module that waits (a WASI sleep) used to panic its tenant thread ("no reactor running"):
/// `503 policy_busy`, the failure not counted, a canary never judged failing, and the panic's
/// text on stderr past the log's limits. It traps inside its deadline now, like any failure.
#[tokio::test]
async fn a_module_that_waits_traps_within_its_deadline_and_a_waiting_canary_is_dropped() {
    let Started { gw, fx, dir: _dir } =
        started("call_deadline_ms = 500\nrollback_min_calls = 5\nrollback_window_secs = 60\n");
    let module = testing_module();
    install(&gw, fx.admin, "alpha", json!({ "module": module })).await;
    let (status, body, took) = from_origin(&gw, &fx.anon_key, "https://sleep.test").await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{body}");
    assert!(body.contains("policy_failed"), "{body}");
    assert!(took < Duration::from_secs(3), "{took:?}");
    let text = gw.metrics().await;
    let labels = ["stage=\"cors\"", "kind=\"trap\""];
    let counted = metric(&text, "aura_plugin_failures_total", &labels) >= 1.0;
    assert!(counted, "the failure is counted: {text}");

    // The same module as a canary for every actor of another project: dropped for failing.
    let outsider = console_token(fx.outsider);
    let canary = json!({ "module": module, "mode": "canary", "percent": 100 });
    install(&gw, fx.outsider, "other", canary).await;
    for _ in 0..8 {
        let _ = from_origin(&gw, &fx.other_project_key, "https://sleep.test").await;
    }
    let other = Policies::new(gw.mgmt_url(""), &outsider).of("other");
    let mut last = String::new();
    let dropped = poll(Duration::from_secs(5), async || {
        let r = other.get("cors").await;
        last = r.text();
        (r.status == StatusCode::NOT_FOUND).then_some(())
    });
    assert!(
        dropped.await.is_some(),
        "the waiting canary was not dropped: {last}"
    );
    let log = gw.log_text();
    assert!(!log.contains("no reactor running"), "{log}");
    assert!(!log.contains("panicked at"), "{log}");
}

/// After a failed call a project's module is set up again for the next; its setup used to get
/// a second (fifty call deadlines) on a tenant thread. It gets twice the call deadline.
#[tokio::test]
async fn a_projects_module_is_set_up_within_twice_its_call_deadline() {
    let Started { gw, fx, dir: _dir } = started("call_deadline_ms = 100\n");
    // Slow from 8 s on: time enough for the upload's own checks (one setup) on a loaded machine.
    let slow_from = aura_gateway::fleet::now_millis() + 8_000;
    let config = json!({ "spin_configure_after_ms": slow_from });
    let body = json!({ "module": testing_module(), "config": config });
    install(&gw, fx.admin, "alpha", body).await;
    let (status, _, _) = from_origin(&gw, &fx.anon_key, "https://a.example").await;
    assert_eq!(status, StatusCode::OK);
    while aura_gateway::fleet::now_millis() < slow_from + 100 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A trap discards the instance; the next call sets one up, which now spins in configure.
    let (status, _, _) = from_origin(&gw, &fx.anon_key, "https://trap.test").await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    let (status, body, took) = from_origin(&gw, &fx.anon_key, "https://a.example").await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{body}");
    eprintln!("a setup that spins was stopped after {took:?} (call deadline 100 ms)");
    assert!(took < Duration::from_millis(800), "{took:?}");
}

/// Two upload places per instance used to be shared by every organization: one tenant holding
/// both kept every other at `503 uploads_busy`. An organization takes at most its share.
#[tokio::test]
async fn upload_places_are_shared_between_organizations() {
    let Started { gw, fx, dir: _dir } =
        started("tenant_max_concurrent_uploads = 2\ntenant_max_concurrent_uploads_per_org = 1\n");
    // Organization A holds a place with an upload whose body never ends.
    let held = tokio::net::TcpStream::connect(("127.0.0.1", gw.management_port));
    let mut held = held.await.expect("connect");
    let token = console_token(fx.admin);
    let head = format!(
        "PUT /v1/projects/alpha/policies/cors HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer {token}\r\n\
         content-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n5\r\n{{\"mod\r\n",
    );
    held.write_all(head.as_bytes()).await.expect("write");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let module = testing_module();
    let beta = Policies::new(gw.mgmt_url(""), console_token(fx.admin)).of("beta");
    let r = beta.put("cors", json!({ "module": module })).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    let body = r.text();
    let busy = body.contains("uploads_busy") && body.contains("organization");
    assert!(busy, "{body}");
    // Organization B still uploads.
    install(&gw, fx.outsider, "other", json!({ "module": module })).await;
    let labels = ["scope=\"organization\""];
    let busy = metric(
        &gw.metrics().await,
        "aura_tenant_uploads_busy_total",
        &labels,
    );
    assert!(busy >= 1.0);
    drop(held);
}

#[tokio::test]
async fn a_spinning_tenant_module_cannot_take_the_workers_of_other_projects() {
    let Started { gw, fx, dir: _dir } = offline(
        "spin",
        "[plugins]\ncall_deadline_ms = 1500\ntenant_threads = 2\ntenant_max_concurrent_calls = 1\n\n[data_plane]\nproject_host_suffix = \".api.test\"\n\n[data_plane.plugins.quota.config]\nrate_per_second = 1000000\nburst = 1000000\n",
    );
    let cors = testing_cors();
    admin(gw.mgmt_url(""), &fx)
        .install_ok("cors", &cors, json!({}))
        .await;
    let client = reqwest::Client::new();
    let url = gw.data_url("/v1/db/todos");
    let spin = || {
        let preflight = client.request(reqwest::Method::OPTIONS, &url);
        let preflight = preflight
            .header("host", "alpha.api.test")
            .header("origin", "https://loop.test");
        preflight
            .header("access-control-request-method", "GET")
            .send()
    };
    let other = || {
        let health = client
            .get(gw.data_url("/health"))
            .header("apikey", &fx.other_project_key);
        health.header("origin", "https://app.example").send()
    };
    assert_eq!(other().await.expect("r").status(), StatusCode::OK);

    // Four spinning calls at once, then a request of another project.
    let started = Instant::now();
    let spinners: Vec<_> = (0..4)
        .map(|_| {
            let f = spin();
            tokio::spawn(async move { (f.await.expect("answered").status(), started.elapsed()) })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let r = other().await.expect("answered");
    let other_done = started.elapsed();
    assert_eq!(r.status(), StatusCode::OK);
    let mut spun = Vec::new();
    for s in spinners {
        spun.push(s.await.expect("task"));
    }
    // The calls that ran alpha's module (the others were refused at its cap).
    let ran = spun
        .iter()
        .filter(|(s, _)| *s == StatusCode::INTERNAL_SERVER_ERROR);
    let first_spinner_done = ran.map(|(_, at)| *at).min().expect("a spinning call ran");
    println!("other project answered at {other_done:?}; spinners: {spun:?}");
    assert!(
        other_done < first_spinner_done,
        "another project waited for alpha's spinning module ({other_done:?} vs {first_spinner_done:?})"
    );
    let statuses: Vec<u16> = spun.iter().map(|(s, _)| s.as_u16()).collect();
    let closed = statuses.iter().all(|s| *s == 500 || *s == 503);
    assert!(closed, "alpha's own requests fail closed: {statuses:?}");
    let busy = statuses.contains(&503);
    assert!(busy, "past the project's cap: 503 policy_busy");

    // Sustained: alpha's module spins on every call while another project measures latency.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut load = Vec::new();
    for _ in 0..8 {
        let (stop, url) = (stop.clone(), url.clone());
        load.push(tokio::spawn(async move {
            let c = reqwest::Client::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let preflight = c.request(reqwest::Method::OPTIONS, &url).call();
                let preflight = preflight.host("alpha.api.test").origin("https://loop.test");
                let _ = preflight
                    .header("access-control-request-method", "GET")
                    .try_send()
                    .await;
            }
        }));
    }
    let mut latencies = Vec::new();
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        let t = Instant::now();
        assert_eq!(other().await.expect("r").status(), StatusCode::OK);
        latencies.push(t.elapsed());
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for l in load {
        let _ = l.await;
    }
    latencies.sort();
    let at = |q: f64| latencies[((latencies.len() - 1) as f64 * q) as usize];
    println!(
        "other project while alpha's module spins: {} requests, p50 {:?}, p90 {:?}, p99 {:?}",
        latencies.len(),
        at(0.5),
        at(0.9),
        at(0.99)
    );
}

#[tokio::test]
async fn a_preflight_flood_is_limited_per_ip_before_any_module_runs() {
    let fx = Fixture::new();
    let mut config = test_config("nats://127.0.0.1:1", "preflight");
    config.data_plane.project_host_suffix = Some(".api.test".into());
    config.rate_limit.data_plane_per_ip.rate_per_second = 1;
    config.rate_limit.data_plane_per_ip.burst = 5;
    let cors = testing_cors();
    let (state, digest, _dir) = with_module(config, &fx, Stage::Cors, &cors).await;
    let calls = || {
        let labels = ["stage=\"cors\"", &format!("digest=\"{digest}\"")];
        metric(&state.metrics.render(), "aura_plugin_calls_total", &labels)
    };
    let before = calls();
    let router = build_data_plane_router(state.clone());
    let mut statuses = Vec::new();
    for _ in 0..20 {
        let preflight = Request::options("/v1/db/todos").header("host", "alpha.api.test");
        let preflight = preflight.header("origin", "https://tenant.example");
        let preflight = preflight.header("access-control-request-method", "GET");
        let r = router
            .clone()
            .oneshot(from("198.51.100.3:1", preflight))
            .await;
        statuses.push(r.expect("infallible").status().as_u16());
    }
    let count = |status: u16| statuses.iter().filter(|s| **s == status).count();
    assert_eq!(count(204), 5, "{statuses:?}");
    assert_eq!(count(429), 15, "{statuses:?}");
    let reached = calls() - before;
    assert_eq!(
        reached, 5.0,
        "only the admitted preflights reached the module"
    );
}
