//! Conformance of the default plugins and the sandbox, on the built components through the
//! real runtime; and through the real binary: a stage pointed at another module by path, plugins
//! that trap, loop, log or reach for what they are not granted, the compile cache, the header
//! names an `api-key` module may ask for, and stage inputs larger than a plugin's arena.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use aura_gateway::actor::{Actor, Role};
use aura_gateway::config::{Config, InstanceReuse};
use aura_gateway::plane::Plane;
use aura_gateway::policy::stages::builtin::TESTING_PLUGIN_PATH;
use aura_gateway::policy::stages::quota::BucketScope;
use aura_gateway::policy::stages::{
    ApiKey, Cors, CorsDecision, CorsInput, DbEngine, DbInput, DbRoute, DbRouting, KeyDecision,
    KeyRequest, KeyRole, KeySource, ProjectDb, Quota, QuotaDecision, QuotaInput, Topology,
};
use aura_gateway::policy::{FailureKind, PluginError, Policies, PolicyEngine};
use reqwest::StatusCode;

use crate::support::call::{Answer, Call, IntoCall};
use crate::support::cli::{check_config, stderr, succeeded};
use crate::support::config::{METRICS_TOKEN, write_config};
use crate::support::edge::Edge;
use crate::support::gateway::Process;
use crate::support::metrics::metric;
use crate::support::poll::{eventually, poll_tries};

fn load(config: &Config) -> Result<Policies, PluginError> {
    let runtime = PolicyEngine::new(&config.plugins).expect("engine");
    Policies::load(&runtime, config, None)
}

/// The default configuration, with a deadline generous enough for a loaded test machine
/// (deadlines themselves are tested with hostile plugins).
fn config() -> Config {
    let mut c = Config::default();
    c.plugins.call_deadline_ms = 2_000;
    c
}

fn defaults() -> Policies {
    load(&config()).expect("default plugins load")
}

fn key_request(path: &str, query_keys: &[&str], headers: &[(&str, &str)]) -> KeyRequest {
    let owned = |s: &&str| (*s).to_owned();
    let headers = headers.iter().map(|(n, v)| (owned(n), owned(v))).collect();
    let query_keys = query_keys.iter().map(owned).collect();
    let (method, path) = ("GET".into(), path.into());
    KeyRequest {
        method,
        path,
        query_keys,
        headers,
    }
}

#[test]
fn api_key_stage_follows_the_contract() {
    let p = defaults();
    let stage = p
        .data
        .module::<ApiKey>()
        .expect("data plane has the api-key stage");
    assert_eq!(stage.headers(), ["apikey", "x-api-key"]);
    let extract = |r: KeyRequest| stage.extract(None, r).expect("call");
    match extract(key_request(
        "/v1/db/todos",
        &[],
        &[("x-api-key", "aura_pk_1")],
    )) {
        KeyDecision::Present(c) => {
            assert_eq!(c.key, "aura_pk_1");
            assert_eq!(c.source, KeySource::Header);
            assert_eq!(c.allowed_roles, vec![KeyRole::Anon, KeyRole::ServiceRole]);
        }
        other => panic!("unexpected {other:?}"),
    }
    for path in ["/v1/realtime/websocket", "/v1/realtime/sse"] {
        match extract(key_request(path, &["aura_pk_1"], &[])) {
            KeyDecision::Present(c) => {
                assert_eq!(c.source, KeySource::Query);
                assert_eq!(
                    c.allowed_roles,
                    vec![KeyRole::Anon],
                    "never service_role in a URL"
                );
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(matches!(
        extract(key_request("/v1/db/todos", &["aura_pk_1"], &[])),
        KeyDecision::Refuse(_)
    ));
    assert!(matches!(
        extract(key_request("/v1/realtime/channels", &["aura_pk_1"], &[])),
        KeyDecision::Refuse(_)
    ));
    assert!(matches!(
        extract(key_request(
            "/x",
            &[],
            &[("apikey", "a"), ("x-api-key", "b")]
        )),
        KeyDecision::Refuse(_)
    ));
    assert_eq!(
        extract(key_request("/health", &[], &[])),
        KeyDecision::Absent
    );
}

#[test]
fn api_key_stage_reads_a_request_head_borrowed_and_passes_bytes_that_are_not_utf8_lossily() {
    let p = defaults();
    let stage = p.data.module::<ApiKey>().expect("api-key stage");
    let head = |pairs: &[(&'static str, &[u8])]| {
        let mut headers = http::HeaderMap::new();
        for (name, value) in pairs {
            headers.append(
                http::header::HeaderName::from_static(name),
                http::HeaderValue::from_bytes(value).expect("value"),
            );
        }
        headers
    };
    let uri: http::Uri = "/v1/db/todos?select=*".parse().expect("uri");
    let extract = |headers: &http::HeaderMap| {
        stage
            .extract_head(None, "GET", &uri, headers, None)
            .expect("call")
    };
    // Headers the stage did not ask for are not passed: a key there is not found.
    assert_eq!(
        extract(&head(&[
            ("authorization", b"Bearer aura_pk_1"),
            ("x-key", b"k")
        ])),
        KeyDecision::Absent
    );
    match extract(&head(&[("accept", b"*/*"), ("apikey", b"aura_pk_1")])) {
        KeyDecision::Present(c) => assert_eq!(c.key, "aura_pk_1"),
        other => panic!("unexpected {other:?}"),
    }
    // Both names are passed, so two different keys are seen and refused.
    assert!(matches!(
        extract(&head(&[
            ("apikey", b"aura_pk_1"),
            ("x-api-key", b"aura_pk_2")
        ])),
        KeyDecision::Refuse(_)
    ));
    // A value that is not UTF-8 reaches the plugin with U+FFFD in place of the bad byte.
    match extract(&head(&[("apikey", b"aura_pk_\xff1")])) {
        KeyDecision::Present(c) => assert_eq!(c.key, "aura_pk_\u{fffd}1"),
        other => panic!("unexpected {other:?}"),
    }
    // The same head as the WIT record gives the same answers.
    assert_eq!(
        stage
            .extract(
                None,
                key_request("/v1/db/todos", &[], &[("apikey", "aura_pk_1")])
            )
            .expect("call"),
        extract(&head(&[("apikey", b"aura_pk_1")]))
    );
}

#[test]
fn cors_stage_answers_per_plane() {
    let mut config = config();
    config.management_plane.plugins.cors.config =
        serde_json::json!({ "allow_origins": ["https://studio.example"] });
    let p = load(&config).expect("loads");
    let input = |origin| CorsInput {
        method: "OPTIONS",
        path: "/v1/db/x",
        origin,
        request_method: Some("GET"),
        request_headers: None,
        client: None,
    };
    match &*p
        .data
        .module::<Cors>()
        .expect("cors stage")
        .decide(None, input("https://a.example"))
        .expect("call")
    {
        CorsDecision::Allow(a) => assert_eq!(a.allow_origin, "*"),
        other => panic!("unexpected {other:?}"),
    }
    let m = p.management.module::<Cors>().expect("cors stage");
    assert_eq!(
        *m.decide(None, input("https://a.example")).expect("call"),
        CorsDecision::Deny
    );
    match &*m
        .decide(None, input("https://studio.example"))
        .expect("call")
    {
        CorsDecision::Allow(a) => assert_eq!(a.allow_origin, "https://studio.example"),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn a_wildcard_management_cors_config_is_refused_at_load() {
    let mut config = config();
    config.management_plane.plugins.cors.config = serde_json::json!({ "allow_origins": ["*"] });
    let err = load(&config).expect_err("refused");
    let text = err.to_string();
    assert!(text.contains("management_plane.plugins.cors"), "{text}");
    assert!(text.contains("\"*\""), "{text}");
    assert_eq!(err.kind(), Some(FailureKind::Refused));
}

/// The data plane's quota decision for one request.
fn quota(
    p: &Policies,
    method: &str,
    path: &str,
    route_group: &str,
    actor: &Actor,
) -> Result<QuotaDecision, PluginError> {
    let route_group = aura_gateway::routes::RouteGroup::all()
        .find(|g| g.as_str() == route_group)
        .expect("a route group");
    p.data
        .module::<Quota>()
        .expect("quota stage")
        .decide(
            None,
            QuotaInput {
                method,
                path,
                route_group,
                actor,
                headers: None,
            },
        )
        .map(std::sync::Arc::unwrap_or_clone)
}

fn actor(role: Role, key: Option<&str>, user: Option<&str>) -> Actor {
    let mut a = Actor::unauthenticated(Plane::Data);
    a.role = role;
    a.project = Some("proj".into());
    a.key_id = key.map(str::to_owned);
    a.user_id = user.map(str::to_owned);
    a
}

#[test]
fn quota_stage_defaults_and_configuration() {
    let p = defaults();
    match quota(
        &p,
        "GET",
        "/v1/db/t",
        "db",
        &actor(Role::Anon, Some("k1"), None),
    )
    .expect("call")
    {
        QuotaDecision::Limit(r) => {
            assert_eq!(
                (r.scope, r.rate_per_second, r.burst, r.cost),
                (BucketScope::Key, 100, 1000, 1)
            );
        }
        other => panic!("unexpected {other:?}"),
    }
    match quota(
        &p,
        "GET",
        "/v1/db/t",
        "db",
        &actor(Role::Authenticated, Some("k1"), Some("u1")),
    )
    .expect("call")
    {
        QuotaDecision::Limit(r) => assert_eq!(r.scope, BucketScope::User),
        other => panic!("unexpected {other:?}"),
    }
    let keyless = Actor::unauthenticated(Plane::Data);
    assert_eq!(
        quota(&p, "GET", "/health", "gateway", &keyless).expect("call"),
        QuotaDecision::Exempt
    );
    let mut config = config();
    config.data_plane.plugins.quota.config = serde_json::json!({
        "plans": { "pro": { "rate_per_second": 500, "burst": 5000 } },
        "costs": { "functions": 10 }
    });
    let p = load(&config).expect("loads");
    let mut pro = actor(Role::ServiceRole, Some("k2"), None);
    pro.plan = Some("pro".into());
    match quota(&p, "POST", "/v1/functions/f", "functions", &pro).expect("call") {
        QuotaDecision::Limit(r) => {
            assert_eq!((r.rate_per_second, r.burst, r.cost), (500, 5000, 10))
        }
        other => panic!("unexpected {other:?}"),
    }
    config.data_plane.plugins.quota.config = serde_json::json!({ "burst": 0 });
    let err = load(&config).expect_err("refused");
    assert!(
        err.to_string().contains("data_plane.plugins.quota"),
        "{err}"
    );
}

#[test]
fn db_routing_stage_applies_the_six_rules_in_order() {
    let p = defaults();
    let dedicated = |url: Option<&str>| ProjectDb {
        engine: DbEngine::Postgres,
        topology: Topology::Dedicated,
        postgrest_url: url.map(str::to_owned),
        replicas: Vec::new(),
    };
    let decide = |method: &str, path: &str, project: Option<ProjectDb>| {
        p.data
            .module::<DbRouting>()
            .expect("db-routing stage")
            .decide(
                None,
                DbInput {
                    method,
                    path,
                    project: project.as_ref(),
                    client_region: None,
                    actor: None,
                },
            )
            .map(std::sync::Arc::unwrap_or_clone)
            .expect("call")
    };
    let url = Some("http://pgrst-a:3000");
    for (method, path) in [
        ("GET", "/v1/db/schema"),
        ("GET", "/v1/db/policies/x"),
        ("POST", "/v1/db/sql"),
        ("PUT", "/v1/db/todos"),
    ] {
        let route = decide(method, path, Some(dedicated(url)));
        assert_eq!(route, DbRoute::Nats, "{method} {path}");
    }
    let mongo = ProjectDb {
        engine: DbEngine::Mongodb,
        ..dedicated(url)
    };
    assert_eq!(decide("GET", "/v1/db/todos", Some(mongo)), DbRoute::Nats);
    let shared = ProjectDb {
        topology: Topology::Shared,
        ..dedicated(url)
    };
    assert_eq!(decide("GET", "/v1/db/todos", Some(shared)), DbRoute::Nats);
    assert_eq!(
        decide("GET", "/v1/db/todos", Some(dedicated(url))),
        DbRoute::Postgrest("http://pgrst-a:3000".into())
    );
    assert_eq!(
        decide("GET", "/v1/db/todos", Some(dedicated(None))),
        DbRoute::Unresolved
    );
}

fn hostile(reuse: InstanceReuse) -> Policies {
    let mut config = config();
    config.plugins.instance_reuse = reuse;
    config.plugins.call_deadline_ms = 200;
    config.plugins.memory_limit_bytes = 4 << 20;
    config.data_plane.plugins.cors.module = TESTING_PLUGIN_PATH.into();
    load(&config).expect("the testing plugin loads")
}

fn cors_call(p: &Policies, origin: &str) -> Result<CorsDecision, PluginError> {
    p.data
        .module::<Cors>()
        .expect("cors stage")
        .decide(
            None,
            CorsInput {
                method: "GET",
                path: "/health",
                origin,
                request_method: None,
                request_headers: None,
                client: None,
            },
        )
        .map(std::sync::Arc::unwrap_or_clone)
}

#[test]
fn hostile_plugins_fail_closed_and_the_next_call_is_served() {
    for reuse in [InstanceReuse::Pooled, InstanceReuse::Fresh] {
        let p = hostile(reuse);
        for (origin, kind) in [
            ("https://trap.test", FailureKind::Trap),
            ("https://loop.test", FailureKind::Deadline),
            ("https://grow.test", FailureKind::Memory),
            ("https://recurse.test", FailureKind::Trap),
        ] {
            let started = Instant::now();
            let err = cors_call(&p, origin).expect_err(origin);
            assert_eq!(err.kind(), Some(kind), "{origin}: {err}");
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "{origin} was not stopped: {:?}",
                started.elapsed()
            );
            match cors_call(&p, "https://ok.test").expect("next call served") {
                CorsDecision::Allow(a) => assert_eq!(a.allow_origin, "https://ok.test"),
                other => panic!("unexpected {other:?}"),
            }
        }
    }
}

/// The epoch ticker sleeps while no guest runs (an idle gateway, or one answered from the
/// decision cache, has no thread waking every few milliseconds); a call that starts while it
/// sleeps wakes it, so a module that loops forever is still stopped at its deadline.
#[test]
fn a_call_made_while_the_epoch_ticker_sleeps_is_still_stopped_at_its_deadline() {
    let mut config = config();
    config.plugins.call_deadline_ms = 200;
    config.data_plane.plugins.cors.module = TESTING_PLUGIN_PATH.into();
    let runtime = PolicyEngine::new(&config.plugins).expect("engine");
    let policies = Arc::new(Policies::load(&runtime, &config, None).expect("loads"));
    for round in 0..2 {
        let waited = Instant::now();
        while !runtime.ticker().asleep() {
            assert!(
                waited.elapsed() < Duration::from_secs(10),
                "the ticker sleeps once no guest has run for a second"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        let sleeps = runtime.ticker().sleeps();
        let (done, outcome) = std::sync::mpsc::channel();
        let p = policies.clone();
        std::thread::spawn(move || {
            let started = Instant::now();
            let result = cors_call(&p, "https://loop.test");
            let _ = done.send((result.map(|_| ()), started.elapsed()));
        });
        // Were the ticker left asleep, the call would never end.
        let (result, took) = outcome
            .recv_timeout(Duration::from_secs(20))
            .expect("a looping call started while the ticker slept is stopped");
        let err = result.expect_err("the loop fails closed");
        assert_eq!(
            err.kind(),
            Some(FailureKind::Deadline),
            "round {round}: {err}"
        );
        assert!(
            took >= Duration::from_millis(200),
            "stopped early: {took:?}"
        );
        eprintln!("round {round}: a loop started while the ticker slept stopped after {took:?}");
        assert_eq!(
            runtime.ticker().sleeps(),
            sleeps,
            "it ticked through the call"
        );
        match cors_call(&policies, "https://ok.test").expect("next call served") {
            CorsDecision::Allow(a) => assert_eq!(a.allow_origin, "https://ok.test"),
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[test]
fn a_module_with_the_wrong_exports_is_refused_at_load() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("quota-as-cors.wasm");
    std::fs::write(&path, aura_gateway::policy::stages::builtin::QUOTA).expect("write");
    let mut config = config();
    config.data_plane.plugins.cors.module = path.display().to_string();
    let err = load(&config).expect_err("refused");
    assert!(
        err.to_string()
            .contains("does not export the cors stage world"),
        "{err}"
    );
    let junk = dir.path().join("junk.wasm");
    std::fs::write(&junk, b"\0asm not really").expect("write");
    config.data_plane.plugins.cors.module = junk.display().to_string();
    let err = load(&config).expect_err("refused");
    assert!(err.to_string().contains("not a valid component"), "{err}");
}

#[test]
fn a_plugin_may_refuse_its_configuration() {
    let mut config = config();
    config.data_plane.plugins.cors.module = TESTING_PLUGIN_PATH.into();
    config.data_plane.plugins.cors.config = serde_json::json!({ "refuse": true });
    let err = load(&config).expect_err("refused");
    assert!(err.to_string().contains("refused as asked"), "{err}");
}

#[test]
fn calls_from_many_threads_share_one_module_safely() {
    let p = Arc::new(defaults());
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let p = p.clone();
            std::thread::spawn(move || {
                for i in 0..200 {
                    let key = format!("aura_pk_{t}_{i}");
                    let r = key_request("/v1/db/x", &[], &[("apikey", key.as_str())]);
                    match p
                        .data
                        .module::<ApiKey>()
                        .expect("stage")
                        .extract(None, r)
                        .expect("call")
                    {
                        KeyDecision::Present(c) => assert_eq!(c.key, key),
                        other => panic!("unexpected {other:?}"),
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("thread");
    }
}

/// Plugins of every WIT version load side by side, the older ones lifted into the current
/// decisions: the hostile quota plugin is written against `aura:gateway@0.1.0`, the legacy cors
/// plugin against `0.2.0`, the api-key test plugin against `0.3.0` (its declaration read with
/// the four flags it had), the default db-routing plugin against `0.5.0` (a quota plugin of
/// `0.4.0`, passed the route group as that version's enum, is tried through the binary in
/// `decisions.rs`).
#[test]
fn plugins_of_every_wit_version_load_and_answer() {
    use aura_gateway::policy::Stage;
    use aura_gateway::policy::stages::AnyModule;
    use aura_gateway::policy::stages::builtin::{
        TESTING_API_KEY_PLUGIN_PATH, TESTING_LEGACY_PLUGIN_PATH, TESTING_QUOTA_PLUGIN_PATH,
    };
    let mut config = config();
    config.data_plane.plugins.quota.module = TESTING_QUOTA_PLUGIN_PATH.into();
    config.data_plane.plugins.cors.module = TESTING_LEGACY_PLUGIN_PATH.into();
    config.data_plane.plugins.api_key.module = TESTING_API_KEY_PLUGIN_PATH.into();
    let p = load(&config).expect("all load");
    assert_eq!(p.wit_version(Plane::Data, Stage::Quota), Some("0.1.0"));
    assert_eq!(p.wit_version(Plane::Data, Stage::Cors), Some("0.2.0"));
    assert_eq!(p.wit_version(Plane::Data, Stage::ApiKey), Some("0.3.0"));
    assert_eq!(
        p.wit_version(Plane::Data, Stage::DbRouting),
        Some("0.5.0"),
        "the default plugins"
    );
    // The `0.3.0` module declared `path`: a key is decided once per path.
    let keys = p.data.module::<ApiKey>().expect("stage");
    assert_eq!(
        keys.declared_inputs(),
        Some(vec!["path", "query-keys", "headers"])
    );
    for path in ["/v1/db/a", "/v1/db/b", "/v1/db/a"] {
        let r = key_request(path, &[], &[("apikey", "aura_pk_v3")]);
        match keys.extract(None, r).expect("a 0.3.0 plugin answers") {
            KeyDecision::Present(c) => assert_eq!(c.key, "aura_pk_v3"),
            other => panic!("unexpected {other:?}"),
        }
    }
    let kept = keys.cache_report().expect("its decisions are kept");
    assert_eq!((kept.misses, kept.hits, kept.entries), (2, 1, 2));
    let refused = keys.extract(None, key_request("/v1/db/a", &["aura_pk_v3"], &[]));
    assert!(matches!(refused, Ok(KeyDecision::Refuse(_))), "{refused:?}");
    let anon = actor(Role::Anon, Some("k1"), None);
    let answered = quota(&p, "GET", "/v1/db/t", "db", &anon).expect("a 0.1.0 plugin answers");
    match answered {
        // A legacy module's bucket is its own name, kept in the host's namespace.
        QuotaDecision::Limit(rule) => {
            assert!(matches!(&rule.scope, BucketScope::Named(n) if !n.is_empty()))
        }
        other => panic!("unexpected {other:?}"),
    }
    match cors_call(&p, "https://ok.test").expect("a 0.2.0 plugin answers") {
        CorsDecision::Allow(a) => assert_eq!(a.expose_headers, ["x-testing-legacy"]),
        other => panic!("unexpected {other:?}"),
    }
}

/// A CORS preflight from `https://app.example` to `url`.
async fn app_preflight(url: String) -> Answer {
    Call::preflight(url, "https://app.example").read().await
}

#[tokio::test]
async fn pointing_the_cors_stage_at_another_module_changes_the_answer_without_rebuilding() {
    let dir = tempfile::tempdir().expect("tempdir");
    let builtin = write_config(dir.path(), "");
    let gw = Process::serve(&builtin, dir.path());
    let r = app_preflight(gw.data_url("/v1/db/x")).await;
    assert_eq!(r.headers["access-control-allow-origin"], "*");
    drop(gw);

    let module = format!("[data_plane.plugins.cors]\nmodule = {TESTING_PLUGIN_PATH:?}\n");
    let swapped = write_config(dir.path(), &module);
    let gw = Process::serve(&swapped, dir.path());
    let r = app_preflight(gw.data_url("/v1/db/x")).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    assert_eq!(
        r.headers["access-control-allow-origin"],
        "https://app.example"
    );
    assert_eq!(r.headers["access-control-allow-headers"], "x-testing");
}

/// A gateway binary with the testing CORS module on the data plane and `plugins` settings.
fn with_testing_cors(dir: &Path, head: &str, plugins: &str) -> Process {
    let cors = format!("[data_plane.plugins.cors]\nmodule = {TESTING_PLUGIN_PATH:?}\n");
    let path = write_config(dir, &format!("{head}[plugins]\n{plugins}\n{cors}"));
    Process::serve(&path, dir)
}

/// `GET /health` from `origin`: a request fails closed, the next one from `ok.test` is served.
async fn fails_closed_then_serves(gw: &Process, client: &reqwest::Client, origin: &str) -> Answer {
    let health = |origin: &str| client.get(gw.data_url("/health")).call().origin(origin);
    let r = health(origin).read().await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR, "{origin}");
    let next = health("https://ok.test").status().await;
    assert_eq!(next, StatusCode::OK, "served after {origin}");
    r
}

#[tokio::test]
async fn a_trapping_or_looping_plugin_fails_its_request_closed_and_the_next_is_served() {
    let dir = tempfile::tempdir().expect("tempdir");
    let gw = with_testing_cors(dir.path(), "", "call_deadline_ms = 50");
    let client = reqwest::Client::new();
    for origin in [
        "https://trap.test",
        "https://loop.test",
        "https://grow.test",
    ] {
        let r = fails_closed_then_serves(&gw, &client, origin).await;
        assert!(r.headers.contains_key("x-request-id"));
        assert_eq!(r.code(), "policy_failed", "{origin}");
    }
    // Idle, the epoch ticker sleeps: its thread is not switched in at all for a while.
    let ticker = || {
        gw.thread_switches("aura-epoch")
            .expect("an aura-epoch thread")
    };
    let waited = std::time::Instant::now();
    loop {
        let before = ticker();
        tokio::time::sleep(Duration::from_millis(500)).await;
        let after = ticker();
        if after == before {
            break;
        }
        let waking = format!("{} wake-ups in 500 ms", after - before);
        assert!(
            waited.elapsed() < Duration::from_secs(10),
            "idle ticker: {waking}"
        );
    }
    // A loop started now wakes it, and is stopped at its deadline.
    let looping = fails_closed_then_serves(&gw, &client, "https://loop.test");
    let r = tokio::time::timeout(Duration::from_secs(10), looping)
        .await
        .expect("a loop started while the ticker slept is stopped");
    assert_eq!(r.code(), "policy_failed");
    let log = gw.log_text();
    assert!(log.contains("policy plugin failed"), "{log}");
    let stage = log.contains("stage=cors") || log.contains("stage\":\"cors");
    assert!(stage, "{log}");
    let named = log.contains(TESTING_PLUGIN_PATH);
    assert!(named, "the log names the plugin: {log}");
}

/// A module failing on every request does not write a line per request into the gateway's
/// log: at most a burst of five and one a second, the rest counted, and the next line written
/// says how many were left out. Every failure is still counted and answered.
#[tokio::test]
async fn a_module_failing_on_every_request_writes_a_few_lines_and_counts_the_rest() {
    let dir = tempfile::tempdir().expect("tempdir");
    let metrics = format!("[metrics]\ntoken = {METRICS_TOKEN:?}\n");
    let gw = with_testing_cors(dir.path(), &metrics, "call_deadline_ms = 1000");
    let client = reqwest::Client::new();
    let trap = || {
        client
            .get(gw.data_url("/health"))
            .call()
            .origin("https://trap.test")
    };
    const TRAPS: usize = 60;
    let started = Instant::now();
    for _ in 0..TRAPS {
        let r = trap().read().await;
        assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(r.code(), "policy_failed");
    }
    let seconds = started.elapsed().as_secs() as usize;
    let failure_lines = |log: &str| {
        log.lines()
            .filter(|l| l.contains("policy plugin failed"))
            .count()
    };
    let metrics = gw.metrics().await;
    let failures = metric(&metrics, "aura_plugin_failures_total", &["kind=\"trap\""]);
    assert_eq!(
        failures, TRAPS as f64,
        "every failure is counted: {metrics}"
    );
    let left_out = metric(
        &metrics,
        "aura_plugin_log_dropped_total",
        &["reason=\"failures\""],
    );
    // The log is written by a thread of its own: wait for the lines admitted.
    let _ = poll_tries(50, Duration::from_millis(100), async || {
        (failure_lines(&gw.log_text()) + left_out as usize >= TRAPS).then_some(())
    })
    .await;
    let written = failure_lines(&gw.log_text());
    assert!(
        written >= 5 && written <= 5 + seconds + 1,
        "{written} lines for {TRAPS} failures in {seconds} s"
    );
    assert_eq!(
        written + left_out as usize,
        TRAPS,
        "each failure written or counted"
    );

    // A second later, the next failure is written and says how many were left out.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let r = trap().read().await;
    assert_eq!(r.code(), "policy_failed");
    let (text, json) = (
        format!("left_out={left_out}"),
        format!("\"left_out\":{left_out}"),
    );
    let says = |log: &str| log.contains(&text) || log.contains(&json);
    let log = poll_tries(50, Duration::from_millis(100), async || {
        let log = gw.log_text();
        says(&log).then_some(log)
    })
    .await
    .unwrap_or_else(|| gw.log_text());
    assert!(says(&log), "no line says {text}: {log}");
    // Other requests are served meanwhile.
    let ok = client
        .get(gw.data_url("/health"))
        .call()
        .origin("https://ok.test");
    assert_eq!(ok.status().await, StatusCode::OK);
}

/// What a plugin writes is bounded and attributed; the WASI it gets reaches nothing outside;
/// a plugin that tries to wait, to take a socket or to make the host allocate for it fails
/// its own request and nothing else.
#[tokio::test]
async fn a_plugin_logs_within_bounds_and_nothing_in_its_wasi_reaches_out() {
    let dir = tempfile::tempdir().expect("tempdir");
    let metrics = format!("[metrics]\ntoken = {METRICS_TOKEN:?}\n");
    let gw = with_testing_cors(dir.path(), &metrics, "call_deadline_ms = 1000");
    let client = reqwest::Client::new();
    let get = |origin: &'static str| client.get(gw.data_url("/health")).call().origin(origin);

    // `log`, stdout and stderr, each with the request id; a newline cannot forge a line.
    let logged = get("https://log.test")
        .expect(StatusCode::OK)
        .await
        .request_id();
    // 1,000 lines of 1 MiB and 1 MiB of stdout: the call keeps 16 lines of at most 1 KiB.
    let flooded = get("https://flood.test")
        .expect(StatusCode::OK)
        .await
        .request_id();
    fn plugin_lines<'a>(log: &'a str, id: &str) -> Vec<&'a str> {
        log.lines()
            .filter(|l| l.contains("aura::plugin") && l.contains(id))
            .collect()
    }
    // The log is written by a thread of its own: on a loaded machine it may lag.
    let mut log = String::new();
    let _ = poll_tries(300, Duration::from_millis(100), async || {
        log = gw.log_text();
        let of = |id: &str| plugin_lines(&log, id).len();
        (of(&logged) >= 3 && of(&flooded) >= 16).then_some(())
    })
    .await;
    let lines = |id: &str| plugin_lines(&log, id);
    let of_logged = lines(&logged);
    let warned =
        |l: &&str| l.contains("WARN") && l.contains("testing plugin saw log.test forged line");
    assert!(of_logged.iter().any(warned), "{log}");
    assert!(of_logged.iter().any(|l| l.contains("to stdout")), "{log}");
    assert!(of_logged.iter().any(|l| l.contains("to stderr")), "{log}");
    let forged = log.lines().any(|l| l.starts_with("forged line"));
    assert!(!forged, "a plugin's newline started a line of its own");
    let of_flood = lines(&flooded);
    assert_eq!(of_flood.len(), 16, "lines kept for one call");
    assert!(of_flood.iter().all(|l| l.len() < 1_500), "lines are cut");
    let metrics = gw.metrics().await;
    for reason in ["per_call", "bytes"] {
        let label = format!("reason=\"{reason}\"");
        let dropped = metric(&metrics, "aura_plugin_log_dropped_total", &[&label]);
        assert!(dropped >= 1.0, "{reason}: {metrics}");
    }

    // No file, no environment: the plugin could do neither, so it denies the preflight.
    let preflight = client
        .request(reqwest::Method::OPTIONS, gw.data_url("/v1/db/x"))
        .call();
    let preflight = preflight.origin("https://file.test");
    let preflight = preflight.header("access-control-request-method", "GET");
    assert_eq!(preflight.status().await, StatusCode::FORBIDDEN);

    // A sleep, a socket, 1 MiB of host randomness: that request fails closed at once, the
    // next one is served.
    for origin in [
        "https://sleep.test",
        "https://socket.test",
        "https://random.test",
    ] {
        let started = std::time::Instant::now();
        let r = get(origin).read().await;
        assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR, "{origin}");
        let waited = started.elapsed() >= Duration::from_secs(5);
        assert!(!waited, "{origin} waited");
        assert_eq!(r.code(), "policy_failed", "{origin}");
        let next = get("https://ok.test").status().await;
        assert_eq!(next, StatusCode::OK, "served after {origin}");
    }
    // The log is written off the request's path: read once both lines are in.
    let logged = |log: &str| {
        log.contains("a plugin may not wait") && log.contains("is not granted to plugins")
    };
    let both = eventually(Duration::from_secs(5), async || logged(&gw.log_text())).await;
    assert!(both, "{}", gw.log_text());
}

/// The compile cache holds native code: a folder others may write to is refused with its key,
/// and a file that is not a compiled module is compiled again, neither trusted nor fatal.
#[tokio::test]
async fn the_compile_cache_refuses_an_open_folder_and_recompiles_a_bad_file() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = dir.path().join("cache");
    std::fs::create_dir(&cache).expect("mkdir");
    let chmod = |mode| std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(mode));
    chmod(0o777).expect("chmod");
    let toml = format!(
        "[plugins]\ncompile_cache_dir = \"cache\"\n[data_plane.plugins.cors]\nmodule = {TESTING_PLUGIN_PATH:?}\n"
    );
    let config = || write_config(dir.path(), &toml);
    let out = check_config(&config());
    assert!(!out.status.success());
    let stderr = stderr(&out);
    let named =
        stderr.contains("plugins.compile_cache_dir") && stderr.contains("writable by no one else");
    assert!(named, "{stderr}");

    chmod(0o700).expect("chmod");
    succeeded(&check_config(&config()));
    let files = std::fs::read_dir(&cache).expect("cache");
    let mut files: Vec<_> = files.map(|e| e.expect("entry").path()).collect();
    files.sort();
    assert_eq!(
        files.len(),
        5,
        "the testing plugin and the 4 defaults: {files:?}"
    );
    // Every file replaced by garbage: the gateway compiles again, serves, and rewrites them.
    for file in &files {
        std::fs::write(file, b"not a compiled module").expect("overwrite");
    }
    let gw = Process::serve(&config(), dir.path());
    let health = Call::get(gw.data_url("/health")).origin("https://ok.test");
    let r = health.expect(StatusCode::OK).await;
    let origin = &r.headers["access-control-allow-origin"];
    assert_eq!(origin, "https://ok.test", "the testing plugin is in force");
    let log = gw.log_text();
    assert!(log.contains("does not load; compiling again"), "{log}");
    for file in &files {
        assert_ne!(std::fs::read(file).expect("file"), b"not a compiled module");
    }
}

#[test]
fn an_api_key_module_asking_for_too_many_or_too_long_header_names_is_refused() {
    // Every request is searched for each name the `api-key` stage asks to read: the host bounds
    // the module's answer (here the default module, configured by the operator).
    let dir = tempfile::tempdir().expect("tempdir");
    let names = |n: usize, len: usize| {
        let name = |i| format!("\"x-{}{i:02}\"", "k".repeat(len.saturating_sub(4)));
        (0..n).map(name).collect::<Vec<_>>().join(", ")
    };
    let config = |list: String| {
        let toml = format!("[data_plane.plugins.api_key.config]\nheaders = [{list}]\n");
        write_config(dir.path(), &toml)
    };
    succeeded(&check_config(&config(names(16, 64))));
    for (what, list, expected) in [
        (
            "17 names",
            names(17, 8),
            "17 header names to read, more than 16",
        ),
        (
            "a 65-byte name",
            names(1, 65),
            "not a lower-case header name of 1 to 64 bytes",
        ),
    ] {
        let out = check_config(&config(list));
        assert!(!out.status.success(), "{what}");
        let stderr = stderr(&out);
        let named = stderr.contains("data_plane.plugins.api_key");
        assert!(named, "{what}: {stderr}");
        assert!(stderr.contains(expected), "{what}: {stderr}");
    }
}

#[tokio::test]
async fn stage_inputs_larger_than_the_plugins_arena_are_served_and_leave_it_usable() {
    // The default plugins serve a call's blocks from a 16 KiB region and anything larger from
    // their system allocator: a client decides how large the `apikey` and `Origin` values the
    // stages receive are (up to `server.max_header_bytes`).
    let edge = Edge::start("").await;
    let client = reqwest::Client::new();
    let url = edge.gw.data_url("/v1/storage/object/x");
    let object = |key: &str| client.get(&url).call().key(key);
    let huge_key = format!("aura_pk_{}", "k".repeat(40 * 1024));
    let huge_origin = format!("https://{}.example", "o".repeat(20 * 1024));
    for round in 0..20 {
        // A key bigger than the region: extracted from the system allocator, then unknown.
        let r = object(&huge_key).read().await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "round {round}");
        let body = r.text();
        assert!(
            body.contains("\"invalid_api_key\""),
            "round {round}: {body}"
        );
        // An origin bigger than the region, with a valid key: the CORS stage answers for it.
        let r = object(&edge.fx.anon_key).origin(&huge_origin).read().await;
        assert_eq!(r.status, StatusCode::OK, "round {round}");
        let allowed = &r.headers["access-control-allow-origin"];
        assert_eq!(
            allowed, "*",
            "round {round}: the data plane allows any origin"
        );
        // And the same instances keep answering ordinary requests from their region.
        let r = object(&edge.fx.anon_key)
            .origin("https://app.example.com")
            .read()
            .await;
        assert_eq!(r.status, StatusCode::OK, "round {round}");
        assert_eq!(r.headers["access-control-allow-origin"], "*");
    }
    let forwarded = edge.storage.seen().len();
    assert_eq!(forwarded, 40, "every keyed request forwarded");
}
