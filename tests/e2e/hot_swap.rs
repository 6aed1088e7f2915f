//! Hot swap of policy modules: SIGHUP under load, refusal of a bad module, automatic rollback.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use aura_gateway::policy::builtin::{QUOTA, TESTING_PLUGIN_PATH};
use reqwest::StatusCode;

use crate::support::gateway::{InProcess, Process, TEST_KEY, e2e_control_file, test_config};
use crate::support::nats_server::shared;
use crate::support::responder::{Responder, reply};
use crate::support::unique_prefix;

/// The swap's own compile competes with 8 clients for 2 cores: plugin deadlines are wall-clock
/// (docs/operations.md, known limits), so they get room here; this test is about the swap.
fn quota_config(nats: &str, prefix: &str, burst: u32) -> String {
    format!(
        "[nats]\nurl = {nats:?}\nsubject_prefix = {prefix:?}\n[control]\nfile = \"control.toml\"\n\
         [log]\nlevel = \"warn\"\n[plugins]\nwatch = false\ncall_deadline_ms = 1000\n\
         [rate_limit.data_plane_per_ip]\nrate_per_second = 1000000\nburst = 1000000\n\
         [data_plane.plugins.quota.config]\nrate_per_second = 100000\nburst = {burst}\n"
    )
}

#[tokio::test]
async fn sighup_swaps_the_quota_module_under_load_without_losing_a_request() {
    let nats = shared();
    let prefix = unique_prefix();
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("control.toml"), e2e_control_file()).expect("control");
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, quota_config(&nats.url(), &prefix, 100_000)).expect("config");
    let gw = Process::serve(&path, dir.path());
    let _f = Responder::start(
        &nats.url(),
        &format!("{prefix}.functions.http"),
        Duration::ZERO,
        |_| reply(200, &[], b"ok"),
    )
    .await;

    let stop = Arc::new(AtomicBool::new(false));
    let url = gw.data_url("/v1/functions/load");
    let mut workers = Vec::new();
    for _ in 0..8 {
        let (stop, url) = (stop.clone(), url.clone());
        workers.push(tokio::spawn(async move {
            let client = crate::support::gateway::client();
            let mut seen = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let r = client.get(&url).send().await.expect("request");
                let limit = r
                    .headers()
                    .get("ratelimit-limit")
                    .map(|v| v.to_str().unwrap_or("").to_owned());
                seen.push((r.status(), limit));
            }
            seen
        }));
    }
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    std::fs::write(&path, quota_config(&nats.url(), &prefix, 99_999)).expect("new config");
    let hup = std::process::Command::new("kill")
        .args(["-HUP", &gw.child.id().to_string()])
        .status()
        .expect("kill");
    assert!(hup.success());
    let probe = crate::support::gateway::client();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = probe.get(&url).send().await.expect("request");
        if r.headers()
            .get("ratelimit-limit")
            .is_some_and(|v| v == "99999")
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the new rules never applied:\n{}",
            gw.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    for w in workers {
        all.extend(w.await.expect("worker"));
    }
    let failed: Vec<_> = all.iter().filter(|(s, _)| *s != StatusCode::OK).collect();
    assert!(
        failed.is_empty(),
        "{} of {} requests failed: {:?}",
        failed.len(),
        all.len(),
        &failed[..failed.len().min(5)]
    );
    let old = all
        .iter()
        .filter(|(_, l)| l.as_deref() == Some("100000"))
        .count();
    let new = all
        .iter()
        .filter(|(_, l)| l.as_deref() == Some("99999"))
        .count();
    assert!(old > 0 && new > 0, "old rules {old}, new rules {new}");
    println!(
        "hot swap under load: {} requests, none failed ({old} before, {new} after)",
        all.len()
    );
    let _ = TEST_KEY;
}

async fn preflight_origin(gw: &InProcess, origin: &str) -> (StatusCode, Option<String>) {
    let r = reqwest::Client::new()
        .request(reqwest::Method::OPTIONS, gw.data_url("/v1/db/x"))
        .header("origin", origin)
        .header("access-control-request-method", "GET")
        .send()
        .await
        .expect("preflight");
    let allow = r
        .headers()
        .get("access-control-allow-origin")
        .map(|v| v.to_str().unwrap_or("").to_owned());
    (r.status(), allow)
}

fn write(path: &Path, cors_module: Option<&str>) {
    let mut text = String::from(
        "[plugins]\nwatch = false\nrollback_min_calls = 10\nrollback_failure_ratio = 0.3\n",
    );
    if let Some(module) = cors_module {
        text += &format!("[data_plane.plugins.cors]\nmodule = {module:?}\n");
    }
    std::fs::write(path, text).expect("config");
}

async fn gateway_with_file(dir: &Path) -> (InProcess, std::path::PathBuf) {
    let path = dir.join("gateway.toml");
    write(&path, None);
    let mut config = test_config(&shared().url(), &unique_prefix());
    config.plugins.rollback_min_calls = 10;
    config.plugins.rollback_failure_ratio = 0.3;
    let gw = InProcess::start(config).await;
    gw.state.config_path.set(path.clone()).expect("set once");
    (gw, path)
}

#[tokio::test]
async fn a_module_failing_its_checks_is_refused_and_the_old_one_keeps_serving() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (gw, path) = gateway_with_file(dir.path()).await;
    let wrong = dir.path().join("quota-as-cors.wasm");
    std::fs::write(&wrong, QUOTA).expect("write");
    write(&path, Some(&wrong.display().to_string()));
    let err = gw.state.reload_policies("test").await.expect_err("refused");
    assert!(
        matches!(err, aura_gateway::policy::reload::ReloadError::Module(_)),
        "a module refusal: {err}"
    );
    assert!(
        err.to_string()
            .contains("does not export the cors stage world"),
        "{err}"
    );
    let answer = err.into_gateway_error();
    assert_eq!(
        (answer.status.as_u16(), answer.code),
        (400, "policy_refused")
    );
    assert_eq!(
        preflight_origin(&gw, "https://a.example")
            .await
            .1
            .as_deref(),
        Some("*")
    );

    write(&path, Some(TESTING_PLUGIN_PATH));
    gw.state.reload_policies("test").await.expect("applied");
    assert_eq!(
        preflight_origin(&gw, "https://a.example")
            .await
            .1
            .as_deref(),
        Some("https://a.example"),
        "the new module answers"
    );
}

#[tokio::test]
async fn a_swapped_in_module_that_fails_too_often_is_rolled_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (gw, path) = gateway_with_file(dir.path()).await;
    write(&path, Some(TESTING_PLUGIN_PATH));
    gw.state.reload_policies("test").await.expect("applied");
    let mut rolled_back = false;
    for i in 0..40 {
        let origin = if i % 2 == 0 {
            "https://trap.test"
        } else {
            "https://ok.test"
        };
        let (status, allow) = preflight_origin(&gw, origin).await;
        if status == StatusCode::NO_CONTENT && allow.as_deref() == Some("*") {
            rolled_back = true;
            break;
        }
    }
    assert!(
        rolled_back,
        "the builtin module is back after a 50% failure share"
    );
    let (status, allow) = preflight_origin(&gw, "https://trap.test").await;
    assert_eq!(
        (status, allow.as_deref()),
        (StatusCode::NO_CONTENT, Some("*"))
    );
    assert!(
        gw.state
            .metrics
            .render()
            .contains(r#"aura_policy_reloads_total{result="rolled_back"} 1"#)
    );
    // The history has the reload and the automatic rollback, with its reason.
    let mut events = Vec::new();
    for _ in 0..100 {
        events = gw
            .state
            .auth
            .store
            .policy_events(None, Some("cors"), 10)
            .await
            .expect("history");
        if events.len() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(events.len(), 2, "{events:?}");
    let (rollback, reload) = (&events[0], &events[1]);
    assert_eq!(
        (rollback.action.as_str(), reload.action.as_str()),
        ("automatic_rollback", "operator_reload")
    );
    assert_eq!(rollback.actor, "operator");
    assert_eq!(rollback.digest_before, reload.digest_after);
    assert_eq!(rollback.digest_after, reload.digest_before);
    assert!(
        rollback
            .reason
            .as_deref()
            .is_some_and(|r| r.contains("fails too often") && r.contains("trap")),
        "{rollback:?}"
    );
}

#[tokio::test]
async fn a_module_named_by_digest_is_swapped_in_through_the_management_api() {
    use aura_gateway::control::ControlStore;
    let dir = tempfile::tempdir().expect("tempdir");
    let fx = crate::support::fixture::Fixture::new();
    let store = Arc::new(fx.file_store(dir.path()));
    let module = std::fs::read(TESTING_PLUGIN_PATH).expect("module");
    let digest = aura_gateway::policy::tenants::digest_of(&module);
    store.put_module(&digest, &module).await.expect("stored");

    let token = "admin-token-0123456789abcdef";
    let mut config = test_config(&shared().url(), &unique_prefix());
    config.plugins.admin_token = Some(token.into());
    let gw = InProcess::start_with_store(config, store).await;
    let path = dir.path().join("gateway.toml");
    std::fs::write(
        &path,
        format!(
            "[plugins]\nwatch = false\nadmin_token = {token:?}\n\
             [data_plane.plugins.cors]\nmodule = \"sha256:{digest}\"\n"
        ),
    )
    .expect("config");
    gw.state.config_path.set(path).expect("once");
    assert_eq!(
        preflight_origin(&gw, "https://a.example")
            .await
            .1
            .as_deref(),
        Some("*")
    );

    let client = reqwest::Client::new();
    let r = client
        .post(gw.mgmt_url("/v1/policies/reload"))
        .send()
        .await
        .expect("r");
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let r = client
        .post(gw.mgmt_url("/v1/policies/reload"))
        .bearer_auth(token)
        .send()
        .await
        .expect("r");
    assert_eq!(
        r.status(),
        StatusCode::OK,
        "{}",
        r.text().await.unwrap_or_default()
    );
    assert_eq!(
        preflight_origin(&gw, "https://a.example")
            .await
            .1
            .as_deref(),
        Some("https://a.example"),
        "the stored module is in force"
    );
}

#[tokio::test]
async fn a_changed_config_file_is_picked_up_by_itself() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, "[plugins]\nwatch = true\nwatch_interval_ms = 100\n").expect("config");
    let mut config = test_config(&shared().url(), &unique_prefix());
    config.plugins.watch_interval_ms = 100;
    let gw = InProcess::start(config).await;
    gw.state.config_path.set(path.clone()).expect("once");
    aura_gateway::policy::reload::spawn_triggers(
        &gw.state.policies,
        gw.state.config_path.get().cloned(),
        &gw.state.config,
    );
    assert_eq!(
        preflight_origin(&gw, "https://a.example")
            .await
            .1
            .as_deref(),
        Some("*")
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    std::fs::write(
        &path,
        format!("[plugins]\nwatch = true\nwatch_interval_ms = 100\n[data_plane.plugins.cors]\nmodule = {TESTING_PLUGIN_PATH:?}\n"),
    )
    .expect("new config");
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if preflight_origin(&gw, "https://a.example")
            .await
            .1
            .as_deref()
            == Some("https://a.example")
        {
            break;
        }
        assert!(Instant::now() < deadline, "the change was never picked up");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
