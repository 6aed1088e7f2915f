//! Hot swap of policy modules: SIGHUP under load, refusal of a bad module, automatic rollback.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use aura_gateway::policy::stages::builtin::{QUOTA, TESTING_PLUGIN_PATH};
use reqwest::StatusCode;

use crate::support::builder::Gateway;
use crate::support::call::{Call, IntoCall, client};
use crate::support::config::write_config;
use crate::support::gateway::{InProcess, Process};
use crate::support::poll::{poll_every, poll_tries};
use crate::support::records::e2e_control_file;
use crate::support::responder::{Bus, reply};

/// The swap's own compile competes with 8 clients for 2 cores: plugin deadlines are wall-clock
/// (docs/operations.md, known limits), so they get room here; this test is about the swap.
fn quota_config(bus: &Bus, burst: u32) -> String {
    let (nats, prefix) = (&bus.url, &bus.prefix);
    format!(
        "[nats]\nurl = {nats:?}\nsubject_prefix = {prefix:?}\n[control]\nfile = \"control.toml\"\n\
         [log]\nlevel = \"warn\"\n[plugins]\nwatch = false\ncall_deadline_ms = 1000\n\
         [rate_limit.data_plane_per_ip]\nrate_per_second = 1000000\nburst = 1000000\n\
         [data_plane.plugins.quota.config]\nrate_per_second = 100000\nburst = {burst}\n"
    )
}

/// The `RateLimit-Limit` of an answer.
fn limit_of(r: &reqwest::Response) -> Option<String> {
    let limit = r.headers().get("ratelimit-limit");
    limit.map(|v| v.to_str().unwrap_or("").to_owned())
}

#[tokio::test]
async fn sighup_swaps_the_quota_module_under_load_without_losing_a_request() {
    let bus = Bus::shared();
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("control.toml"), e2e_control_file()).expect("control");
    let path = write_config(dir.path(), &quota_config(&bus, 100_000));
    let gw = Process::serve(&path, dir.path());
    let _f = bus.respond("functions", |_| reply(200, &[], b"ok")).await;

    let stop = Arc::new(AtomicBool::new(false));
    let url = gw.data_url("/v1/functions/load");
    let mut workers = Vec::new();
    for _ in 0..8 {
        let (stop, url) = (stop.clone(), url.clone());
        workers.push(tokio::spawn(async move {
            let client = client();
            let mut seen = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let r = client.get(&url).send().await.expect("request");
                seen.push((r.status(), limit_of(&r)));
            }
            seen
        }));
    }
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    write_config(dir.path(), &quota_config(&bus, 99_999));
    gw.signal("-HUP");
    let probe = client();
    let applied = poll_every(
        Duration::from_secs(20),
        Duration::from_millis(50),
        async || {
            let r = probe.get(&url).send().await.expect("request");
            (limit_of(&r).as_deref() == Some("99999")).then_some(())
        },
    );
    let applied = applied.await.is_some();
    assert!(applied, "the new rules never applied:\n{}", gw.log_text());
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    for w in workers {
        all.extend(w.await.expect("worker"));
    }
    let failed: Vec<_> = all.iter().filter(|(s, _)| *s != StatusCode::OK).collect();
    let (failures, total, first) = (failed.len(), all.len(), &failed[..failed.len().min(5)]);
    assert!(
        failed.is_empty(),
        "{failures} of {total} requests failed: {first:?}"
    );
    let under = |limit: &str| {
        all.iter()
            .filter(|(_, l)| l.as_deref() == Some(limit))
            .count()
    };
    let (old, new) = (under("100000"), under("99999"));
    assert!(old > 0 && new > 0, "old rules {old}, new rules {new}");
    println!("hot swap under load: {total} requests, none failed ({old} before, {new} after)");
}

/// A preflight from `origin`: its status and the origin it allows.
async fn preflight_origin(gw: &InProcess, origin: &str) -> (StatusCode, Option<String>) {
    let r = Call::preflight(gw.data_url("/v1/db/x"), origin)
        .send()
        .await;
    let allow = r.headers().get("access-control-allow-origin");
    let allow = allow.map(|v| v.to_str().unwrap_or("").to_owned());
    (r.status(), allow)
}

/// The origin a preflight from `https://a.example` is allowed.
async fn allowed(gw: &InProcess) -> Option<String> {
    preflight_origin(gw, "https://a.example").await.1
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
    let rollback = |c: &mut aura_gateway::config::Config| {
        (
            c.plugins.rollback_min_calls,
            c.plugins.rollback_failure_ratio,
        ) = (10, 0.3)
    };
    let gw = Gateway::start_with(rollback).await;
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
    let module = matches!(err, aura_gateway::policy::reload::ReloadError::Module(_));
    assert!(module, "a module refusal: {err}");
    let named = err
        .to_string()
        .contains("does not export the cors stage world");
    assert!(named, "{err}");
    let answer = err.into_gateway_error();
    assert_eq!(
        (answer.status.as_u16(), answer.code),
        (400, "policy_refused")
    );
    assert_eq!(allowed(&gw).await.as_deref(), Some("*"));

    write(&path, Some(TESTING_PLUGIN_PATH));
    gw.state.reload_policies("test").await.expect("applied");
    let origin = allowed(&gw).await;
    assert_eq!(
        origin.as_deref(),
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
    let metrics = gw.state.metrics.render();
    assert!(metrics.contains(r#"aura_policy_reloads_total{result="rolled_back"} 1"#));
    // The history has the reload and the automatic rollback, with its reason.
    let store = &gw.state.auth.store;
    let mut events = Vec::new();
    let _ = poll_tries(100, Duration::from_millis(20), async || {
        events = store
            .policy_events(None, Some("cors"), 10)
            .await
            .expect("history");
        (events.len() >= 2).then_some(())
    })
    .await;
    assert_eq!(events.len(), 2, "{events:?}");
    let (rollback, reload) = (&events[0], &events[1]);
    let actions = (rollback.action.as_str(), reload.action.as_str());
    assert_eq!(actions, ("automatic_rollback", "operator_reload"));
    assert_eq!(rollback.actor, "operator");
    assert_eq!(rollback.digest_before, reload.digest_after);
    assert_eq!(rollback.digest_after, reload.digest_before);
    let reason = rollback.reason.as_deref();
    let told = reason.is_some_and(|r| r.contains("fails too often") && r.contains("trap"));
    assert!(told, "{rollback:?}");
}

#[tokio::test]
async fn a_module_named_by_digest_is_swapped_in_through_the_management_api() {
    use aura_gateway::control::ControlStore;
    let dir = tempfile::tempdir().expect("tempdir");
    let fx = crate::support::fixture::Fixture::new();
    let store = Arc::new(fx.file_store(dir.path()));
    let module = std::fs::read(TESTING_PLUGIN_PATH).expect("module");
    let digest = aura_gateway::policy::digest_of(&module);
    store.put_module(&digest, &module).await.expect("stored");

    let token = "admin-token-0123456789abcdef";
    let gw = Gateway::with(|c| c.plugins.admin_token = Some(token.into()));
    let gw = gw.store(store).start().await;
    let config = format!(
        "[plugins]\nwatch = false\nadmin_token = {token:?}\n\
         [data_plane.plugins.cors]\nmodule = \"sha256:{digest}\"\n"
    );
    let path = write_config(dir.path(), &config);
    gw.state.config_path.set(path).expect("once");
    assert_eq!(allowed(&gw).await.as_deref(), Some("*"));

    let client = reqwest::Client::new();
    let reload = || client.post(gw.mgmt_url("/v1/policies/reload")).call();
    assert_eq!(reload().status().await, StatusCode::UNAUTHORIZED);
    reload().bearer(token).expect(StatusCode::OK).await;
    let origin = allowed(&gw).await;
    assert_eq!(
        origin.as_deref(),
        Some("https://a.example"),
        "the stored module is in force"
    );
}

#[tokio::test]
async fn a_changed_config_file_is_picked_up_by_itself() {
    let dir = tempfile::tempdir().expect("tempdir");
    let watch = "[plugins]\nwatch = true\nwatch_interval_ms = 100\n";
    let path = write_config(dir.path(), watch);
    let gw = Gateway::start_with(|c| c.plugins.watch_interval_ms = 100).await;
    gw.state.config_path.set(path.clone()).expect("once");
    let (policies, config) = (&gw.state.policies, &gw.state.config);
    let config_path = gw.state.config_path.get().cloned();
    aura_gateway::policy::reload::spawn_triggers(policies, config_path, config);
    assert_eq!(allowed(&gw).await.as_deref(), Some("*"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let cors = format!("[data_plane.plugins.cors]\nmodule = {TESTING_PLUGIN_PATH:?}\n");
    std::fs::write(&path, format!("{watch}{cors}")).expect("new config");
    let every = Duration::from_millis(100);
    let picked = poll_every(Duration::from_secs(15), every, async || {
        (allowed(&gw).await.as_deref() == Some("https://a.example")).then_some(())
    });
    assert!(picked.await.is_some(), "the change was never picked up");
}
