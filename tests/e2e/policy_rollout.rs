//! Trying a project's module on live traffic through the gateway binary, with both control
//! stores: a shadow that disagrees never changes a response and its disagreements are counted and
//! sampled; a canary decides for its share of actors, always the same ones; a canary failing on
//! its share is dropped by itself with the reason in the history; promote and abort.

use std::collections::HashMap;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::support::builder::{Gateway, Started};
use crate::support::call::{Answer, Call};
use crate::support::fixture::{Fixture, console_token, user_token};
use crate::support::gateway::Process;
use crate::support::metrics::metric;
use crate::support::policy::{Policies, b64, digest, testing_cors, testing_quota};
use crate::support::poll::poll;
use crate::support::postgres::{TestDatabase, control_table};
use crate::support::records::file_history_lines;
use crate::support::responder::{Responder, reply};

const APP: &str = "https://app.test";
const OTHER: &str = "https://other.test";

/// A gateway binary over `fx`'s records (`toml`: a `[control]` table of its own, or nothing for
/// the control file), its tenant refresh out of the way, `plugins` ending its `[plugins]`
/// table; it answers functions over NATS. A canary spinning on half its calls runs them all
/// (a core for heavy calls), so that each fails at its deadline rather than waiting for CPU
/// credit: what the canary's health counts.
async fn gateway(fx: &Fixture, toml: &str, plugins: &str) -> (Started, Responder) {
    let plugins = format!(
        "{toml}\n[plugins]\ntenant_refresh_secs = 3600\ntenant_heavy_cpu_share = 1\n{plugins}\n"
    );
    let started = Gateway::builder().fixture(fx).toml(plugins).binary();
    let bus = started.gw.bus.clone();
    let responder = bus.respond("functions", |_| reply(200, &[], b"ok")).await;
    (started, responder)
}

/// `GET /v1/functions/<path>` as `user` of alpha (with the anon key), with `origin` when given.
async fn call(gw: &Process, fx: &Fixture, path: &str, user: Uuid, origin: Option<&str>) -> Answer {
    let f = Call::get(gw.data_url(&format!("/v1/functions/{path}"))).key(&fx.anon_key);
    let f = f.bearer(user_token("alpha", user));
    match origin {
        Some(origin) => f.origin(origin),
        None => f,
    }
    .read()
    .await
}

/// Waits (30 s at the most) until `check` gives a value; fails naming `what`, with the log.
async fn eventually<T>(what: &str, gw: &Process, check: impl AsyncFnMut() -> Option<T>) -> T {
    let done = poll(Duration::from_secs(30), check).await;
    done.unwrap_or_else(|| panic!("{what} never happened; log:\n{}", gw.log_text()))
}

/// The disagreements of a shadow compared on 20 requests of which every other one (10) has an
/// origin it denies; a run skipped for want of a free place (only under load) is not compared.
fn every_other_disagrees(shadow: &Value) -> u64 {
    let skipped = shadow["skipped"].as_u64().expect("skipped");
    let disagreements = shadow["disagreements"].as_u64().expect("disagreements");
    assert!(
        skipped <= 2,
        "{skipped} of 20 sequential runs skipped: {shadow}"
    );
    assert!(
        (10 - skipped.min(10)..=10).contains(&disagreements),
        "{shadow}"
    );
    disagreements
}

/// A shadow CORS module that denies an origin the enforced one allows.
async fn shadow(gw: &Process, fx: &Fixture, console: &Policies) {
    let cors = aura_gateway::policy::stages::builtin::CORS;
    let (status, body) = console
        .put(
            "cors",
            json!({ "module": b64(cors), "config": { "allow_origins": [APP, OTHER] } }),
        )
        .await
        .parts();
    assert_eq!(status, StatusCode::OK, "{body}");
    let digest = body["digest"].as_str().expect("digest").to_owned();
    let (status, body) = console
        .put(
            "cors",
            json!({ "digest": digest, "config": { "allow_origins": [APP] }, "mode": "shadow" }),
        )
        .await
        .parts();
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["mode"], "shadow");

    let user = Uuid::new_v4();
    let mut ids = Vec::new();
    for i in 0..20 {
        let origin = if i % 2 == 0 { APP } else { OTHER };
        let r = call(gw, fx, "hello", user, Some(origin)).await;
        // The enforced decision, unchanged: both origins allowed.
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.headers["access-control-allow-origin"], origin);
        ids.push(r.headers["x-request-id"].to_str().expect("id").to_owned());
    }
    let candidate = eventually("twenty shadow runs accounted for", gw, async || {
        let body = console.body("cors").await;
        let shadow = &body["candidate"]["shadow"];
        let runs = shadow["compared"].as_u64()? + shadow["skipped"].as_u64()?;
        (runs == 20).then(|| body["candidate"].clone())
    })
    .await;
    let shadow = &candidate["shadow"];
    assert_eq!(candidate["mode"], "shadow");
    assert_eq!(candidate["config"], json!({ "allow_origins": [APP] }));
    let disagreements = every_other_disagrees(shadow);
    assert_eq!(shadow["failures"], 0);
    let sample = shadow["sample"].as_array().expect("sample");
    assert_eq!(sample.len() as u64, disagreements);
    for d in sample {
        assert_eq!(d["shadow"], "deny", "{d}");
        assert!(
            d["enforced"]
                .as_str()
                .is_some_and(|e| e.starts_with("allow origin=https://other.test")),
            "{d}"
        );
        assert_eq!(d["method"], "GET");
        assert_eq!(d["path"], "/v1/functions/hello");
        assert!(ids.iter().any(|id| d["request_id"] == id.as_str()), "{d}");
    }
    // No credential reaches the sample.
    let text = candidate.to_string();
    assert!(!text.contains(&fx.anon_key) && !text.contains("Bearer"));
    let metrics = gw.metrics().await;
    assert_eq!(
        metric(
            &metrics,
            "aura_policy_shadow_disagreements_total",
            &["project=\"alpha\"", "stage=\"cors\""]
        ),
        disagreements as f64,
        "{metrics}"
    );

    // Abort: the shadow goes, the module in force stays.
    let (status, _) = console.post("cors", "abort").await.parts();
    assert_eq!(status, StatusCode::NO_CONTENT);
    let body = console.body("cors").await;
    assert_eq!(body["candidate"], Value::Null);
    assert_eq!(body["digest"], digest.as_str());
    // The project's disagreement series goes with its last shadow: projects that tried a
    // module once do not pile up series.
    let metrics = gw.metrics().await;
    assert!(
        !metrics
            .lines()
            .any(|l| l.starts_with("aura_policy_shadow_disagreements_total")
                && l.contains("project=\"alpha\"")),
        "{metrics}"
    );
    let (status, body) = console.post("cors", "abort").await.parts();
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(body["error"]["code"], "no_candidate");
    let events = console.history("cors").await;
    let actions: Vec<(&str, &str)> = events
        .iter()
        .map(|e| {
            (
                e["action"].as_str().unwrap_or(""),
                e["mode"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        actions,
        [
            ("abort", "shadow"),
            ("install", "shadow"),
            ("install", "enforce")
        ]
    );
    assert_eq!(events[1]["actor"], fx.admin.to_string());
}

/// How many of `users` got the canary's burst on `path`, checking each user twice lands on the
/// same side.
async fn canary_share(gw: &Process, fx: &Fixture, users: &[Uuid], burst: &str) -> usize {
    let mut sides = HashMap::new();
    for round in 0..2 {
        for user in users {
            let r = call(gw, fx, "hello", *user, None).await;
            assert_eq!(r.status, StatusCode::OK);
            let on = r.headers["ratelimit-limit"] == burst;
            if round == 0 {
                sides.insert(*user, on);
            } else {
                assert_eq!(sides[user], on, "user {user} changed sides");
            }
        }
    }
    sides.values().filter(|on| **on).count()
}

/// A quota canary at 10 %, a failing canary dropped by itself, promote.
async fn canary(gw: &Process, fx: &Fixture, console: &Policies) {
    let quota = std::fs::read(aura_gateway::policy::stages::builtin::TESTING_QUOTA_PLUGIN_PATH)
        .expect("testing quota plugin");
    let users: Vec<Uuid> = (0..200).map(|_| Uuid::new_v4()).collect();
    let ten_percent = json!({
        "module": b64(&quota),
        "config": { "rate_per_second": 100, "burst": 777 },
        "mode": "canary",
        "percent": 10,
    });
    let (status, body) = console.put("quota", ten_percent.clone()).await.parts();
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        (body["mode"].clone(), body["percent"].clone()),
        (json!("canary"), json!(10))
    );
    let on = canary_share(gw, fx, &users, "777").await;
    // 10 % of 200 is 20; the binomial spread stays well within this range.
    assert!((6..=40).contains(&on), "{on} of 200 actors on the canary");
    let body = console.body("quota").await;
    assert_eq!(
        body["digest"],
        Value::Null,
        "no module of the project's own in force"
    );
    assert!(
        body["candidate"]["health"]["calls"]
            .as_u64()
            .is_some_and(|n| n >= 2 * on as u64),
        "{body}"
    );

    // A canary failing on its share: half the actors' calls spin past the deadline.
    let (status, body) = console
        .put(
            "quota",
            json!({ "module": b64(&quota), "config": {}, "mode": "canary", "percent": 50 }),
        )
        .await
        .parts();
    assert_eq!(status, StatusCode::OK, "{body}");
    let mut failed = 0;
    for user in &users {
        let r = call(gw, fx, "spin", *user, None).await;
        if r.status == StatusCode::INTERNAL_SERVER_ERROR {
            failed += 1;
        } else {
            assert_eq!(r.status, StatusCode::OK);
        }
    }
    assert!(failed >= 20, "{failed} requests failed on the canary");
    assert!(
        failed <= 30,
        "{failed}: the canary was not dropped in time; log:\n{}",
        gw.log_text()
    );
    let events = eventually("the canary dropped and recorded", gw, async || {
        let events = console.history("quota").await;
        (events.first()?["action"] == "automatic_rollback").then_some(events)
    })
    .await;
    assert_eq!(events[0]["mode"], "canary");
    assert_eq!(events[0]["actor"], "operator");
    let reason = events[0]["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("fails too often") && reason.contains("deadline"),
        "{reason}"
    );
    // Nothing of the project's own is left for the stage.
    assert_eq!(console.get("quota").await.status, StatusCode::NOT_FOUND);
    for user in users.iter().take(20) {
        assert_eq!(
            call(gw, fx, "spin", *user, None).await.status,
            StatusCode::OK
        );
    }

    // A developer may not promote; an admin does, and everyone gets the module.
    let developer = Policies::new(gw.mgmt_url(""), console_token(fx.developer));
    let (status, body) = console.put("quota", ten_percent).await.parts();
    assert_eq!(status, StatusCode::OK, "{body}");
    let digest = body["digest"].clone();
    assert_eq!(
        developer.post("quota", "promote").await.parts().0,
        StatusCode::FORBIDDEN
    );
    let (status, body) = console.post("quota", "promote").await.parts();
    assert_eq!(status, StatusCode::OK, "{body}");
    let body = console.body("quota").await;
    assert_eq!(body["digest"], digest);
    assert_eq!(
        body["config"],
        json!({ "rate_per_second": 100, "burst": 777 })
    );
    assert_eq!(body["candidate"], Value::Null);
    assert_eq!(canary_share(gw, fx, &users[..20], "777").await, 20);
    let events = console.history("quota").await;
    assert_eq!(events[0]["action"], "promote");
    assert_eq!(events[0]["mode"], "enforce");
    assert_eq!(events[0]["digest_after"], digest);
    assert_eq!(events[0]["actor"], fx.admin.to_string());

    // Replaced by the default quota module, then rolled back: the promoted module is back with
    // its configuration (a promote counts as having been in force).
    let (status, body) = console
        .put(
            "quota",
            json!({ "module": b64(aura_gateway::policy::stages::builtin::QUOTA), "config": {} }),
        )
        .await
        .parts();
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(canary_share(gw, fx, &users[..20], "777").await, 0);
    let (status, body) = console.post("quota", "rollback").await.parts();
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["digest"], digest);
    assert_eq!(console.body("quota").await["config"]["burst"], 777);
    assert_eq!(canary_share(gw, fx, &users[..20], "777").await, 20);
}

async fn scenario(gw: &Process, fx: &Fixture) {
    let console = Policies::new(gw.mgmt_url(""), console_token(fx.admin));
    shadow(gw, fx, &console).await;
    canary(gw, fx, &console).await;
}

#[tokio::test]
async fn shadow_and_canary_through_the_binary_with_the_file_store() {
    let fx = Fixture::new();
    let (Started { gw, dir, .. }, _responder) = gateway(&fx, "", "").await;
    scenario(&gw, &fx).await;
    // The control file holds no candidate any more (promoted), the history file every change.
    let control = std::fs::read_to_string(dir.path().join("control.toml")).expect("file");
    assert!(!control.contains("policy_candidates"), "{control}");
    let lines = file_history_lines(dir.path());
    assert_eq!(lines, 10, "one history line per change");
}

#[tokio::test]
async fn shadow_and_canary_through_the_binary_with_postgres() {
    let fx = Fixture::new();
    let (db, store) = TestDatabase::seeded(&fx).await;
    let control = control_table(&db.url);
    let (Started { gw, .. }, _responder) = gateway(&fx, &control, "").await;
    scenario(&gw, &fx).await;
    use aura_gateway::control::ControlStore;
    assert!(store.policy_candidates().await.expect("read").is_empty());
    let events = store.policy_events(Some("alpha"), None, 100).await;
    assert_eq!(events.expect("read").len(), 10);
}

/// A hostile shadow — it spins to the deadline on every call — never slows or changes a
/// response: the runs that find no free place are skipped and counted; bad trial requests are
/// refused naming the field, and change nothing.
#[tokio::test]
async fn a_spinning_shadow_changes_no_response_and_is_skipped_when_busy() {
    let fx = Fixture::new();
    let (Started { gw, .. }, _responder) = gateway(&fx, "", "call_deadline_ms = 300").await;
    let console = Policies::new(gw.mgmt_url(""), console_token(fx.admin));
    let testing = b64(&testing_cors());
    for (trial, field) in [
        (json!({ "mode": "dry-run" }), "mode"),
        (json!({ "mode": "canary" }), "percent"),
        (json!({ "mode": "canary", "percent": 0 }), "percent"),
        (json!({ "mode": "shadow", "percent": 5 }), "percent"),
        (json!({ "mode": "canary", "percent": 250 }), "percent"),
    ] {
        let mut body = trial;
        body["module"] = json!(testing);
        let (status, answer) = console.put("cors", body).await.parts();
        assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
        assert_eq!(answer["error"]["code"], "invalid_body");
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(field), "{message}");
    }
    assert_eq!(
        console.get("cors").await.status,
        StatusCode::NOT_FOUND,
        "nothing was installed"
    );

    let shadow = json!({ "module": testing, "mode": "shadow" });
    let (status, body) = console.put("cors", shadow).await.parts();
    assert_eq!(status, StatusCode::OK, "{body}");
    let user = Uuid::new_v4();
    let answers = futures::future::join_all(
        (0..40).map(|_| call(&gw, &fx, "hello", user, Some("https://loop.test"))),
    )
    .await;
    for r in &answers {
        // The plane's module decides, as before the shadow.
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.headers["access-control-allow-origin"], "*");
    }
    let shadow = eventually("every shadow run accounted for", &gw, async || {
        let body = console.body("cors").await;
        let s = &body["candidate"]["shadow"];
        let done = s["compared"].as_u64()? + s["skipped"].as_u64()?;
        (done == 40).then(|| s.clone())
    })
    .await;
    assert!(
        shadow["skipped"].as_u64().is_some_and(|n| n > 0),
        "{shadow}"
    );
    assert_eq!(shadow["failures"], shadow["compared"], "{shadow}");
    assert_eq!(shadow["disagreements"], shadow["compared"]);
    assert_eq!(
        shadow["sample"][0]["shadow"], "failed (deadline)",
        "{shadow}"
    );
    let metrics = gw.metrics().await;
    assert!(
        metric(
            &metrics,
            "aura_policy_shadow_runs_total",
            &["stage=\"cors\"", "outcome=\"skipped\""]
        ) > 0.0,
        "{metrics}"
    );
    // A delete takes the candidate with it (here the stage's only module of the project's).
    assert_eq!(console.delete("cors").await.status, StatusCode::NO_CONTENT);
    assert_eq!(console.get("cors").await.status, StatusCode::NOT_FOUND);
    let events = console.history("cors").await;
    assert_eq!(events[0]["action"], "abort", "{events:?}");
    assert_eq!(events[0]["mode"], "shadow");
}

const ADMIN_TOKEN: &str = "admin-token-for-rollout-0123456789";

/// The operator's candidates from the configuration file.
fn operator_plugins(quota_candidate: &str) -> String {
    format!(
        r#"[admin]
token = "{ADMIN_TOKEN}"

[data_plane.plugins.cors]
config = {{ allow_origins = ["{APP}", "{OTHER}"] }}

[data_plane.plugins.cors.candidate]
config = {{ allow_origins = ["{APP}"] }}
mode = "shadow"

[data_plane.plugins.quota.candidate]
module = {path:?}
{quota_candidate}
"#,
        path = aura_gateway::policy::stages::builtin::TESTING_QUOTA_PLUGIN_PATH,
    )
}

/// `method /v1/admin/policies{path}` with the admin token: the status and the JSON body.
async fn admin(gw: &Process, method: reqwest::Method, path: &str) -> (StatusCode, Value) {
    let url = gw.mgmt_url(&format!("/v1/admin/policies{path}"));
    Call::new(method, url)
        .bearer(ADMIN_TOKEN)
        .read()
        .await
        .parts()
}

/// The body of `GET /v1/admin/policies{path}`.
async fn admin_get(gw: &Process, path: &str) -> Value {
    admin(gw, reqwest::Method::GET, path).await.1
}

/// The events of the operator's history once it has `at_least` of them.
async fn operator_history(gw: &Process, what: &str, at_least: usize) -> Vec<Value> {
    eventually(what, gw, async || {
        let events = admin_get(gw, "/history").await["events"]
            .as_array()?
            .clone();
        (events.len() >= at_least).then_some(events)
    })
    .await
}

/// The operator's own shadow and canary, from the configuration: compared and shared like a
/// project's; aborted, promoted and rolled back on the admin routes; a failing canary dropped by
/// itself; every change in the operator's history.
#[tokio::test]
async fn the_operators_shadow_and_canary_from_the_configuration() {
    let fx = Fixture::new();
    let ten_percent =
        "config = { rate_per_second = 100, burst = 777 }\nmode = \"canary\"\npercent = 10";
    // The `[plugins]` table of the helper's configuration ends the file: the operator's tables
    // come after a line of their own. Reloads come from SIGHUP alone (one per change).
    let plugins = format!("watch = false\n{}", operator_plugins(ten_percent));
    let (Started { gw, dir, .. }, _responder) = gateway(&fx, "", &plugins).await;

    // The shadow: compared on the requests the plane's module decides, nothing changed.
    let user = Uuid::new_v4();
    for i in 0..20 {
        let origin = if i % 2 == 0 { APP } else { OTHER };
        let r = call(&gw, &fx, "hello", user, Some(origin)).await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.headers["access-control-allow-origin"], origin);
    }
    let shadow = eventually(
        "the operator's shadow runs accounted for",
        &gw,
        async || {
            let shadow = admin_get(&gw, "").await["candidates"]["data"]["cors"]["shadow"].clone();
            let runs = shadow["compared"].as_u64()? + shadow["skipped"].as_u64()?;
            (runs == 20).then_some(shadow)
        },
    )
    .await;
    let disagreements = every_other_disagrees(&shadow);
    assert_eq!(shadow["sample"][0]["shadow"], "deny");
    let metrics = gw.metrics().await;
    let labels = ["project=\"-\"", "stage=\"cors\""];
    let counted = metric(&metrics, "aura_policy_shadow_disagreements_total", &labels);
    assert_eq!(counted, disagreements as f64);

    // The canary on about 10 % of actors, always the same ones.
    let users: Vec<Uuid> = (0..200).map(|_| Uuid::new_v4()).collect();
    let on = canary_share(&gw, &fx, &users, "777").await;
    assert!((6..=40).contains(&on), "{on} of 200 actors on the canary");

    // Abort the shadow, promote the canary: on this instance, until the next reload.
    let post = |path: &'static str| admin(&gw, reqwest::Method::POST, path);
    let (status, body) = post("/data/cors/abort").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = post("/data/cors/abort").await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["code"], "no_candidate");
    let (status, body) = post("/data/quota/promote").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(canary_share(&gw, &fx, &users[..20], "777").await, 20);
    let body = admin_get(&gw, "").await;
    assert_eq!(body["candidates"]["data"]["cors"]["tried"], false, "{body}");
    assert_eq!(body["candidates"]["data"]["quota"], Value::Null, "{body}");
    let quota_digest = digest(&testing_quota());
    assert_eq!(
        body["planes"]["data"]["quota"]["digest"],
        quota_digest.as_str()
    );
    let history = operator_history(&gw, "the operator's changes recorded", 2).await;
    assert_eq!(history[0]["action"], "promote", "{history:?}");
    assert_eq!(history[0]["mode"], "enforce");
    assert_eq!(history[0]["digest_after"], quota_digest.as_str());
    assert_eq!(history[1]["action"], "abort");
    assert_eq!(history[1]["mode"], "shadow");
    assert_eq!(history[1]["project"], Value::Null);
    // The operator's rollback puts the set before the promote back.
    assert_eq!(post("/rollback").await.0, StatusCode::OK);
    let back = canary_share(&gw, &fx, &users, "777").await;
    assert_eq!(back, on, "the canary's share is back as it was");
    // The rollback is recorded for the module in force and for the candidate that came back.
    let history = operator_history(&gw, "the rollback recorded", 4).await;
    let rollbacks = history.iter().filter(|e| e["action"] == "rollback");
    let text = |v: &Value| v.as_str().unwrap_or("").to_owned();
    let rolled: Vec<(String, String)> = rollbacks
        .map(|e| (text(&e["mode"]), text(&e["digest_after"])))
        .collect();
    let canary_back = ("canary".to_owned(), quota_digest.clone());
    assert!(rolled.contains(&canary_back), "{history:?}");
    assert_eq!(rolled.len(), 2, "{history:?}");

    // A canary failing on its share, after a reload, is dropped by itself.
    let config = dir.path().join("gateway.toml");
    let toml = std::fs::read_to_string(&config).expect("config");
    let toml = toml.replace(ten_percent, "mode = \"canary\"\npercent = 50");
    std::fs::write(&config, toml).expect("config");
    gw.signal("-HUP");
    eventually("the reload", &gw, async || {
        let body = admin_get(&gw, "").await;
        (body["candidates"]["data"]["quota"]["percent"] == 50).then_some(())
    })
    .await;
    let mut failed = 0;
    for user in &users {
        let status = call(&gw, &fx, "spin", *user, None).await.status;
        failed += usize::from(status == StatusCode::INTERNAL_SERVER_ERROR);
    }
    let share = (20..=30).contains(&failed);
    assert!(share, "{failed} requests failed on the canary");
    let body = admin_get(&gw, "").await;
    assert_eq!(
        body["candidates"]["data"]["quota"]["tried"], false,
        "{body}"
    );
    let dropped = eventually("the drop recorded", &gw, async || {
        let events = admin_get(&gw, "/history").await["events"]
            .as_array()?
            .clone();
        events
            .into_iter()
            .find(|e| e["action"] == "automatic_rollback")
    })
    .await;
    assert_eq!(dropped["mode"], "canary");
    assert_eq!(dropped["stage"], "quota");
    let reason = dropped["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("deadline"), "{reason}");
    // Judged alone: the canary's failures never rolled back the modules in force.
    let body = admin_get(&gw, "/history").await;
    let events = body["events"].as_array().cloned().unwrap_or_default();
    let automatic = events
        .iter()
        .filter(|e| e["action"] == "automatic_rollback")
        .count();
    assert_eq!(automatic, 1, "{events:?}");
}
