//! `/ready` and the drain: through the real binary.

use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use reqwest::StatusCode;

use crate::support::fixture::Fixture;
use crate::support::gateway::{Process, binary, binary_config};
use crate::support::nats_server::shared;
use crate::support::unique_prefix;

async fn ready(gw: &Process) -> (StatusCode, serde_json::Value) {
    let r = reqwest::Client::new()
        .get(gw.mgmt_url("/ready"))
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .expect("/ready answers");
    let status = r.status();
    (status, r.json().await.expect("json"))
}

/// Whether alpha's own CORS module (the testing plugin) answered this request.
async fn alphas_module_answers(gw: &Process, fx: &Fixture) -> bool {
    let r = crate::support::gateway::cors_probe(gw, &fx.anon_key).await;
    assert_eq!(r.status(), StatusCode::OK);
    r.headers()
        .get("access-control-expose-headers")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("x-testing-plugin"))
}

#[tokio::test]
async fn ready_waits_for_the_projects_modules_and_answers_503_while_draining() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fx = Fixture::new();
    // Project alpha has a CORS module of its own in the store.
    let module =
        std::fs::read(aura_gateway::policy::builtin::TESTING_PLUGIN_PATH).expect("testing plugin");
    let record = crate::support::gateway::stored_cors_module(dir.path(), "alpha", &module);
    // Compiling it takes three seconds (a compile worker that sleeps first): until then the
    // instance serves, but must not say it is ready.
    let worker = dir.path().join("slow-compile-worker");
    std::fs::write(
        &worker,
        format!("#!/bin/sh\nsleep 3\nexec '{}' \"$@\"\n", binary().display()),
    )
    .expect("worker");
    std::fs::set_permissions(&worker, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let config = binary_config(
        dir.path(),
        &fx,
        &record,
        &shared().url(),
        &unique_prefix(),
        &format!(
            "[server]\ndrain_delay_secs = 2\n\n[plugins]\ntenant_compile_worker = \"{}\"\n",
            worker.display()
        ),
    );
    let mut gw = Process::serve(&config, dir.path());
    let started = Instant::now();

    let (status, body) = ready(&gw).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["error"]["code"], "not_ready", "{body}");
    assert_eq!(body["checks"]["tenant_modules"], "loading", "{body}");
    assert!(
        !alphas_module_answers(&gw, &fx).await,
        "alpha is served by the plane's module meanwhile"
    );

    let mut became_ready = None;
    while started.elapsed() < Duration::from_secs(30) {
        let (status, body) = ready(&gw).await;
        if status == StatusCode::OK {
            assert_eq!(body["checks"]["tenant_modules"], "loaded", "{body}");
            became_ready = Some(started.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let became_ready =
        became_ready.unwrap_or_else(|| panic!("never ready; log:\n{}", gw.log_text()));
    println!("ready {became_ready:?} after the listeners opened");
    assert!(
        became_ready >= Duration::from_millis(2_500),
        "ready before alpha's module could be compiled ({became_ready:?})"
    );
    assert!(
        alphas_module_answers(&gw, &fx).await,
        "ready means alpha's own module is in force"
    );

    // SIGTERM: /ready answers 503 at once, requests are still served for the drain delay.
    let term = Instant::now();
    crate::support::gateway::terminate(&gw.child);
    let mut draining_seen = None;
    while term.elapsed() < Duration::from_millis(1_500) {
        let (status, body) = ready(&gw).await;
        if status == StatusCode::SERVICE_UNAVAILABLE {
            assert_eq!(body["error"]["code"], "draining", "{body}");
            assert_eq!(body["checks"]["draining"], true, "{body}");
            draining_seen = Some(term.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let draining_seen = draining_seen.expect("/ready answered 503 after SIGTERM");
    let mut served_while_draining = 0;
    while term.elapsed() < Duration::from_millis(1_500) {
        assert!(
            alphas_module_answers(&gw, &fx).await,
            "still served, by the same modules"
        );
        served_while_draining += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!(
        "draining reported {draining_seen:?} after SIGTERM; {served_while_draining} requests served while draining"
    );
    assert!(served_while_draining >= 5);
    let status = tokio::task::spawn_blocking(move || {
        let status = gw.child.wait();
        (status, term.elapsed())
    })
    .await
    .expect("join");
    let (status, stopped_after) = (status.0.expect("wait"), status.1);
    println!("stopped {stopped_after:?} after SIGTERM");
    assert!(status.success(), "{status:?}");
    assert!(
        stopped_after >= Duration::from_secs(2),
        "the listeners closed before the drain delay ({stopped_after:?})"
    );
    assert!(stopped_after < Duration::from_secs(10), "{stopped_after:?}");
}
