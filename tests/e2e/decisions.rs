//! Declared inputs and the decision cache (`aura:gateway@0.3.0`), and the inputs and decisions
//! that came with them — quota denials, claims and addresses, read replicas, configuration
//! schemas — through the gateway binary.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::support::builder::{Gateway, Started, offline};
use crate::support::call::Call;
use crate::support::fixture::{USER_SECRET, console_token, epoch, hs256};
use crate::support::metrics::metric;
use crate::support::policy::{Policies, testing_cors};
use crate::support::upstream::Recorder;

/// The fixture's admin on `gw`'s alpha, uploads given up after a minute.
fn admin(started: &Started) -> Policies {
    Policies::new(started.gw.mgmt_url(""), console_token(started.fx.admin))
        .timeout(Duration::from_secs(60))
}

/// The `cache` object of the health of alpha's module for `stage`, and its calls.
async fn cache_of(admin: &Policies, stage: &str) -> (Value, u64) {
    let body = admin.body(stage).await;
    let health = &body["health"];
    let calls = health["calls"].as_u64().expect("calls");
    (health["cache"].clone(), calls)
}

#[tokio::test]
async fn a_declared_module_is_called_once_for_identical_requests_and_again_when_an_input_changes() {
    let started = offline("decl-once", "");
    let (gw, fx) = (&started.gw, &started.fx);
    let admin = admin(&started);
    let config = json!({ "echo_all": true, "declare": ["origin"], "max_age_ms": 60_000 });
    admin.install_ok("cors", &testing_cors(), config).await;
    let (cache, calls_before) = cache_of(&admin, "cors").await;
    assert_eq!(cache["inputs"], json!(["origin"]), "{cache}");
    assert_eq!(cache["max_age_ms"], 60_000);

    let health = |origin: &str| {
        let call = Call::get(gw.data_url("/health")).key(&fx.anon_key);
        call.origin(origin).read()
    };
    for _ in 0..20 {
        let r = health("https://one.example").await;
        assert_eq!(
            r.header("access-control-allow-origin"),
            "https://one.example"
        );
    }
    let (cache, calls) = cache_of(&admin, "cors").await;
    assert_eq!(
        calls - calls_before,
        1,
        "one call for 20 identical requests"
    );
    assert_eq!(
        (cache["misses"].as_u64(), cache["hits"].as_u64()),
        (Some(1), Some(19))
    );

    // Another origin (a declared input) is decided again; the first is still kept.
    for origin in [
        "https://two.example",
        "https://one.example",
        "https://two.example",
    ] {
        let r = health(origin).await;
        assert_eq!(
            r.header("access-control-allow-origin"),
            origin,
            "each its own"
        );
    }
    let (cache, calls) = cache_of(&admin, "cors").await;
    assert_eq!(calls - calls_before, 2);
    assert_eq!(
        (cache["misses"].as_u64(), cache["hits"].as_u64()),
        (Some(2), Some(21))
    );
    assert_eq!(cache["entries"], 2);
    let text = gw.metrics().await;
    let labels = ["plane=\"data\"", "stage=\"cors\"", "owner=\"tenant\""];
    let hits = metric(
        &text,
        "aura_decision_cache_total",
        &[&labels[..], &["outcome=\"hit\""]].concat(),
    );
    assert_eq!(hits, 21.0, "counted in the metrics too");

    // A new configuration is a new module: its cache starts empty.
    admin
        .install_ok(
            "cors",
            &testing_cors(),
            json!({ "echo_all": true, "declare": ["origin"] }),
        )
        .await;
    let (cache, _) = cache_of(&admin, "cors").await;
    assert_eq!(
        (cache["hits"].as_u64(), cache["entries"].as_u64()),
        (Some(0), Some(0))
    );
    health("https://one.example").await;
    let (cache, _) = cache_of(&admin, "cors").await;
    assert_eq!(cache["misses"], 1, "decided again after the swap");
}

#[tokio::test]
async fn a_kept_decision_serves_the_requests_that_arrive_within_its_maximum_age_and_no_later() {
    let started = offline("decl-age", "");
    let (gw, fx) = (&started.gw, &started.fx);
    let admin = admin(&started);
    let config = json!({ "echo_all": true, "declare": ["origin"], "max_age_ms": 2_000 });
    admin.install_ok("cors", &testing_cors(), config).await;
    let (_, calls_before) = cache_of(&admin, "cors").await;
    let health = || {
        let call = Call::get(gw.data_url("/health")).key(&fx.anon_key);
        call.origin("https://one.example").read()
    };
    // The first request's decision is kept between `before` and `kept`.
    let before = std::time::Instant::now();
    let mut kept = before;
    for n in 0..5 {
        let r = health().await;
        assert_eq!(
            r.header("access-control-allow-origin"),
            "https://one.example"
        );
        if n == 0 {
            kept = std::time::Instant::now();
        }
    }
    assert!(
        before.elapsed() < Duration::from_millis(1_500),
        "the first requests took {:?}: too slow a host for this test's ages",
        before.elapsed()
    );
    let (cache, calls) = cache_of(&admin, "cors").await;
    assert_eq!(calls - calls_before, 1, "{cache}");
    assert_eq!(
        (cache["hits"].as_u64(), cache["expired"].as_u64()),
        (Some(4), Some(0))
    );

    // A request that arrives after the maximum age is decided again, and its decision kept.
    tokio::time::sleep(Duration::from_millis(2_200).saturating_sub(kept.elapsed())).await;
    for _ in 0..3 {
        let r = health().await;
        assert_eq!(
            r.header("access-control-allow-origin"),
            "https://one.example"
        );
    }
    let (cache, calls) = cache_of(&admin, "cors").await;
    assert_eq!(calls - calls_before, 2, "called again once: {cache}");
    assert_eq!(
        (
            cache["hits"].as_u64(),
            cache["misses"].as_u64(),
            cache["expired"].as_u64(),
            cache["entries"].as_u64()
        ),
        (Some(6), Some(2), Some(1), Some(1))
    );
}

#[tokio::test]
async fn a_false_declaration_is_refused_at_upload_naming_the_input_it_depends_on() {
    let started = offline("decl-false", "");
    let admin = admin(&started);
    // The decision exposes a header named after the path, and the module declares the origin
    // alone.
    let lying = json!({ "expose_path": true, "declare": ["origin"] });
    let (status, body) = admin.install("cors", &testing_cors(), lying).await.parts();
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["code"], "policy_refused");
    let message = body["error"]["message"].as_str().expect("message");
    assert!(message.contains("declared inputs are false"), "{message}");
    assert!(message.contains("`path`"), "names the input: {message}");
    assert!(
        !message.contains("`origin`"),
        "not a declared one: {message}"
    );
    // Declaring the path too is the truth, and is accepted.
    let honest = json!({ "expose_path": true, "declare": ["origin", "path"] });
    admin.install_ok("cors", &testing_cors(), honest).await;
    // The gateway kept serving throughout.
    let health = Call::get(started.gw.data_url("/health")).key(&started.fx.anon_key);
    assert_eq!(health.status().await, StatusCode::OK);
}

#[tokio::test]
async fn one_projects_flood_of_unique_inputs_leaves_another_projects_decisions_in_the_cache() {
    // A small cache: 8 decisions per project, 64 in all (8 per shard). The plane's quota module
    // reads the claim `tier`: each value is a decision of its own.
    let started = offline(
        "decl-flood",
        "[plugins.decision_cache]\nentries = 64\npartition_entries = 8\n\n\
         [data_plane.plugins.quota.config]\n\
         claim_rules = [{ claim = \"tier\", equals = \"blocked\", deny = true }]\n",
    );
    let (gw, fx) = (&started.gw, &started.fx);
    let other = |n: usize| {
        let call = Call::get(gw.data_url(&format!("/v1/storage/other-{n}")));
        call.key(&fx.other_project_key).status()
    };
    // The other project's key is decided once, then kept.
    for n in 0..3 {
        other(n).await;
    }
    let misses = |text: &str| {
        let labels = ["stage=\"quota\"", "owner=\"operator\"", "outcome=\"miss\""];
        metric(text, "aura_decision_cache_total", &labels)
    };
    let before = misses(&gw.metrics().await);
    // alpha's users flood the quota stage with 300 unique inputs (a tier each).
    for _ in 0..300 {
        let token = hs256(
            USER_SECRET,
            json!({ "sub": Uuid::new_v4().to_string(), "aud": "authenticated", "ref": "alpha",
                    "exp": epoch() + 600, "tier": Uuid::new_v4().to_string() }),
        );
        let call = Call::get(gw.data_url("/v1/storage/x")).key(&fx.anon_key);
        call.bearer(token).status().await;
    }
    let flooded = misses(&gw.metrics().await);
    assert!(
        flooded - before >= 300.0,
        "every flood request missed: {}",
        flooded - before
    );
    let text = gw.metrics().await;
    let evicted = metric(
        &text,
        "aura_decision_cache_total",
        &["stage=\"quota\"", "outcome=\"evicted\""],
    );
    assert!(evicted >= 250.0, "alpha's own entries made room: {evicted}");
    // The other project's decision is still kept: no miss for its requests.
    for n in 0..20 {
        other(n).await;
    }
    let after = misses(&gw.metrics().await);
    assert_eq!(after, flooded, "the other project's hit ratio is unchanged");
}

#[tokio::test]
async fn a_projects_quota_module_denies_by_address_and_by_claim_and_others_are_unaffected() {
    let started = offline("decl-deny", "");
    let (gw, fx) = (&started.gw, &started.fx);
    let admin = admin(&started);
    let quota = aura_gateway::policy::stages::builtin::QUOTA;
    // `/health` with a key: the quota stage decides, and nothing else answers but 200.
    let storage = |key: &str| Call::get(gw.data_url("/health")).key(key);

    // Every address of loopback denied for alpha.
    admin
        .install_ok("quota", quota, json!({ "deny_cidrs": ["127.0.0.0/8"] }))
        .await;
    let r = storage(&fx.anon_key).expect(StatusCode::FORBIDDEN).await;
    assert_eq!(r.code(), "address_denied");
    assert_eq!(
        storage(&fx.other_project_key).status().await,
        StatusCode::OK
    );
    // An allow list that leaves loopback out.
    admin
        .install_ok("quota", quota, json!({ "allow_cidrs": ["10.0.0.0/8"] }))
        .await;
    let r = storage(&fx.anon_key).expect(StatusCode::FORBIDDEN).await;
    assert_eq!(r.code(), "address_not_allowed");

    // Rules on a claim of the user's token: `tier`.
    let rules = json!({ "claim_rules": [
        { "claim": "tier", "equals": "blocked", "deny": true },
        { "claim": "tier", "equals": "trial", "rate_per_second": 1, "burst": 1 },
    ]});
    admin.install_ok("quota", quota, rules).await;
    let token = |tier: Option<&str>| {
        let mut claims = json!({
            "sub": Uuid::new_v4().to_string(), "aud": "authenticated", "ref": "alpha",
            "exp": epoch() + 600,
        });
        if let Some(tier) = tier {
            claims["tier"] = json!(tier);
        }
        hs256(USER_SECRET, claims)
    };
    let as_user = |token: &str| storage(&fx.anon_key).bearer(token);
    let r = as_user(&token(Some("blocked")))
        .expect(StatusCode::FORBIDDEN)
        .await;
    assert_eq!(r.code(), "claim_denied");
    let trial = token(Some("trial"));
    assert_eq!(as_user(&trial).status().await, StatusCode::OK);
    let r = as_user(&trial).expect(StatusCode::TOO_MANY_REQUESTS).await;
    assert!(
        r.headers.contains_key("retry-after"),
        "the trial tier's bucket of 1"
    );
    for _ in 0..3 {
        let plain = token(None);
        assert_eq!(
            as_user(&plain).status().await,
            StatusCode::OK,
            "no tier: the plan's"
        );
    }
    let text = gw.metrics().await;
    for code in ["address_denied", "address_not_allowed", "claim_denied"] {
        let code = format!("code=\"{code}\"");
        let denied = metric(
            &text,
            "aura_quota_denials_total",
            &["source=\"tenant\"", &code],
        );
        assert!(denied >= 1.0, "{code} counted");
    }
    // A claim too large to pass is not passed: no rule matches it.
    let huge = token(Some(&"b".repeat(300)));
    assert_eq!(as_user(&huge).status().await, StatusCode::OK);
}

/// The records of project `delta` (organization A): a dedicated database at `primary` with read
/// replicas `replicas` (url, region), and an anon key `key`.
fn replicated_project(fx_org: Uuid, primary: &str, replicas: &[(&str, &str)], key: &str) -> String {
    let replicas: Vec<String> = replicas
        .iter()
        .map(|(url, region)| format!("{{ url = \"{url}\", region = \"{region}\" }}"))
        .collect();
    format!(
        "[[projects]]\nref = \"delta\"\norganization_id = \"{fx_org}\"\ndb_engine = \"postgres\"\ntopology = \"dedicated\"\npostgrest_url = \"{primary}\"\nreplicas = [{}]\n\n[[api_keys]]\nid = \"{}\"\nproject_ref = \"delta\"\nrole = \"anon\"\nkey_sha256 = \"{}\"\n",
        replicas.join(", "),
        Uuid::new_v4(),
        aura_gateway::auth::keys::hash_key(key)
    )
}

#[tokio::test]
async fn reads_go_to_the_clients_replica_and_a_replica_for_a_write_is_refused() {
    let (primary, eu, us) = (
        Recorder::start().await,
        Recorder::start().await,
        Recorder::start().await,
    );
    let fx = crate::support::fixture::Fixture::new();
    let key = format!("aura_pk_delta_{}", Uuid::new_v4().simple());
    let records = replicated_project(
        fx.org_a,
        &primary.url,
        &[(&eu.url, "eu-west"), (&us.url, "us-east")],
        &key,
    );
    let toml = "[upstreams]\nclient_region_header = \"x-client-region\"\npostgrest_allowed_targets = [\"127.0.0.1\"]\n";
    let gw = Gateway::builder()
        .nats("nats://127.0.0.1:1")
        .prefix("decl-replica");
    let started = gw.fixture(&fx).records(&records).toml(toml).binary();
    let gw = &started.gw;
    let db = |method: reqwest::Method, region: &str| {
        let call = Call::new(method, gw.data_url("/v1/db/todos?select=*")).key(&key);
        call.header("x-client-region", region)
    };
    // Reads: the client's region's replica; an unknown region: the primary.
    db(reqwest::Method::GET, "eu-west")
        .expect(StatusCode::OK)
        .await;
    assert_eq!(eu.seen().len(), 1, "eu-west read from its replica");
    db(reqwest::Method::HEAD, "us-east")
        .expect(StatusCode::OK)
        .await;
    assert_eq!(us.seen().len(), 1);
    db(reqwest::Method::GET, "ap-south")
        .expect(StatusCode::OK)
        .await;
    // A write: the primary, whatever the region.
    db(reqwest::Method::POST, "eu-west")
        .expect(StatusCode::OK)
        .await;
    assert_eq!(primary.seen().len(), 2);
    assert_eq!((eu.seen().len(), us.seen().len()), (1, 1));
    // A region header out of bounds is ignored (the primary).
    db(reqwest::Method::GET, &"e".repeat(65))
        .expect(StatusCode::OK)
        .await;
    assert_eq!(primary.seen().len(), 3);
    drop(started);

    // A module that answers a replica for every request: the host refuses it for a write,
    // fails closed (no target reached) and counts it.
    let hostile = aura_gateway::policy::stages::builtin::TESTING_DB_PLUGIN_PATH;
    let toml = format!("{toml}\n[data_plane.plugins.db_routing]\nmodule = \"{hostile}\"\n");
    let gw = Gateway::builder()
        .nats("nats://127.0.0.1:1")
        .prefix("decl-replica2");
    let started = gw.fixture(&fx).records(&records).toml(&toml).binary();
    let gw = &started.gw;
    let db = |method: reqwest::Method| Call::new(method, gw.data_url("/v1/db/todos")).key(&key);
    primary.clear();
    eu.clear();
    db(reqwest::Method::GET).expect(StatusCode::OK).await;
    assert_eq!(eu.seen().len(), 1, "a read to the replica it named");
    for method in [
        reqwest::Method::POST,
        reqwest::Method::PATCH,
        reqwest::Method::DELETE,
    ] {
        let r = db(method).expect(StatusCode::SERVICE_UNAVAILABLE).await;
        assert_eq!(r.code(), "db_route_refused");
    }
    assert_eq!(
        (primary.seen().len(), eu.seen().len()),
        (0, 1),
        "nothing reached"
    );
    let text = gw.metrics().await;
    let refused = metric(
        &text,
        "aura_db_routes_refused_total",
        &["reason=\"write_to_replica\""],
    );
    assert_eq!(refused, 3.0);
    assert_eq!(
        db(reqwest::Method::GET).status().await,
        StatusCode::OK,
        "still serving"
    );
}

#[tokio::test]
async fn a_modules_configuration_schema_is_served_and_enforced_before_configure() {
    let started = offline("decl-schema", "");
    let admin = admin(&started);
    // The data plane's default quota module exports its schema.
    let schema = admin
        .call(reqwest::Method::GET, "quota", "/schema")
        .read()
        .await;
    let (status, body) = schema.parts();
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["source"], "plane");
    let properties = &body["schema"]["properties"];
    assert!(properties["deny_cidrs"].is_object(), "{body}");
    assert!(properties["claim_rules"].is_object(), "{body}");

    // A configuration the module's schema refuses never reaches `configure`: named.
    let wrong = json!({ "echo_all": true, "max_age_ms": "soon" });
    let (status, body) = admin.install("cors", &testing_cors(), wrong).await.parts();
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let message = body["error"]["message"].as_str().expect("message");
    assert!(message.contains("schema"), "{message}");
    assert!(message.contains("/max_age_ms"), "names the key: {message}");
    // So is the default quota module's, for a figure of the wrong type.
    let quota = aura_gateway::policy::stages::builtin::QUOTA;
    let (status, body) = admin
        .install("quota", quota, json!({ "burst": "lots" }))
        .await
        .parts();
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .expect("message")
            .contains("/burst")
    );

    // Once alpha installs its own module, its schema is the one served.
    admin
        .install_ok("cors", &testing_cors(), json!({ "echo_all": true }))
        .await;
    let body = admin
        .call(reqwest::Method::GET, "cors", "/schema")
        .read()
        .await
        .json();
    assert_eq!(body["source"], "project");
    assert!(
        body["schema"]["properties"]["declare"].is_object(),
        "{body}"
    );
    // Any member may read it; a project of another organization is not found.
    let reader = Policies::new(started.gw.mgmt_url(""), console_token(started.fx.reader));
    let r = reader
        .call(reqwest::Method::GET, "cors", "/schema")
        .read()
        .await;
    assert_eq!(r.status, StatusCode::OK);
    let other = reader
        .of("other")
        .call(reqwest::Method::GET, "cors", "/schema");
    assert_ne!(other.read().await.status, StatusCode::OK);
}

/// The hostile `0.4.0` quota module (`plugins/testing-quota-inputs`), its marker rewritten so
/// that `config-schema` answers schema `choice` (with `port` for a remote reference): what an
/// uploader who edits a built module sends.
fn quota_inputs_module(choice: u8, port: u16) -> Vec<u8> {
    let path = aura_gateway::policy::stages::builtin::TESTING_QUOTA_INPUTS_PLUGIN_PATH;
    let mut module = std::fs::read(path).expect("the 0.4.0 quota test module");
    let marker = b"aura-hostile-schema:0:port=00000";
    let edit = format!("aura-hostile-schema:{}:port={port:05}", char::from(choice));
    let found: Vec<usize> = (0..module.len().saturating_sub(marker.len()))
        .filter(|at| module[*at..].starts_with(marker))
        .collect();
    assert!(!found.is_empty(), "the module carries its marker");
    for at in found {
        module[at..at + marker.len()].copy_from_slice(edit.as_bytes());
    }
    module
}

#[tokio::test]
async fn a_hostile_quota_modules_inputs_and_answers_are_bounded_by_the_host() {
    let storage = Recorder::start().await;
    let toml = format!("[upstreams]\nstorage_url = \"{}\"\n", storage.url);
    let started = offline("decl-hostile-quota", &toml);
    let (gw, fx) = (&started.gw, &started.fx);
    let admin = admin(&started);
    let module = quota_inputs_module(b'0', 0);

    // A quota module never reads credentials: naming a credential header refuses it.
    for credential in [
        "authorization",
        "proxy-authorization",
        "cookie",
        "apikey",
        "x-api-key",
        "x-aura-role",
    ] {
        let config = json!({ "headers": [credential] });
        let (status, body) = admin.install("quota", &module, config).await.parts();
        assert_eq!(status, StatusCode::BAD_REQUEST, "{credential}: {body}");
        assert_eq!(body["error"]["code"], "policy_refused");
        let message = body["error"]["message"].as_str().expect("message");
        assert!(message.contains(credential), "{message}");
    }
    // Too many names, a name that is not a lower-case header name: refused, named.
    let many: Vec<String> = (0..9).map(|i| format!("x-h{i}")).collect();
    for config in [
        json!({ "headers": many }),
        json!({ "headers": ["X-Tier"] }),
        json!({ "claims": ["c".repeat(65)] }),
    ] {
        let (status, body) = admin.install("quota", &module, config).await.parts();
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(body["error"]["code"], "policy_refused");
    }

    let config = json!({ "headers": ["x-tier", "x-team"], "claims": ["tier"] });
    admin.install_ok("quota", &module, config).await;
    let forwarded = || storage.seen().len();
    let object = |path: &str| Call::get(gw.data_url(&format!("/v1/storage/object/b/{path}")));
    let call = |path: &str| object(path).key(&fx.anon_key);

    // The named headers are passed: the module denies on its value.
    let r = call("f")
        .header("x-tier", "deny-me")
        .expect(StatusCode::FORBIDDEN)
        .await;
    assert_eq!(r.code(), "policy_denied");
    assert_eq!(forwarded(), 0, "a denial forwards nothing");
    // Anything else is not: an unnamed header, a value over 256 bytes, a value past the 16th.
    // The module traps on a value out of the WIT's bounds, so a 200 is the host's bound.
    call("f")
        .header("x-other", "deny-me")
        .expect(StatusCode::OK)
        .await;
    call("f")
        .header("x-tier", "v".repeat(300))
        .expect(StatusCode::OK)
        .await;
    let mut flood = call("f");
    for n in 0..40 {
        flood = flood.header("x-team", format!("t{n}"));
    }
    flood
        .header("x-team", "deny-me")
        .expect(StatusCode::OK)
        .await;
    assert_eq!(forwarded(), 3);

    // Claims: the named one, within bounds.
    let token = |tier: &str| {
        hs256(
            USER_SECRET,
            json!({ "sub": Uuid::new_v4().to_string(), "aud": "authenticated", "ref": "alpha",
                    "exp": epoch() + 600, "tier": tier }),
        )
    };
    let r = call("f")
        .bearer(token("deny-me"))
        .expect(StatusCode::FORBIDDEN)
        .await;
    assert_eq!(r.code(), "policy_denied");
    call("f")
        .bearer(token(&"d".repeat(300)))
        .expect(StatusCode::OK)
        .await;

    // A 429's Retry-After within 1 and 3600 s whatever the module answers; the contract's error.
    for (answered, sent) in [
        ("0", "1"),
        ("7", "7"),
        ("4294967295", "3600"),
        ("x", "3600"),
    ] {
        let r = call(&format!("retry/{answered}"))
            .expect(StatusCode::TOO_MANY_REQUESTS)
            .await;
        assert_eq!(r.code(), "quota_exceeded");
        assert_eq!(r.header("retry-after"), sent, "answered {answered}");
        assert!(r.json()["error"]["message"].is_string());
    }
    let r = call("forbid").expect(StatusCode::FORBIDDEN).await;
    assert_eq!(r.code(), "policy_denied");
    assert!(r.headers.get("retry-after").is_none(), "a 403 has none");

    // Written against `0.4.0`, the module is passed the route group as that version's enum
    // (it answers the case's index plus one): `storage` is its third case, `functions` its
    // fourth.
    let r = call("route-group")
        .expect(StatusCode::TOO_MANY_REQUESTS)
        .await;
    assert_eq!(r.header("retry-after"), "3", "storage");
    let r = Call::get(gw.data_url("/v1/functions/v1/route-group"))
        .key(&fx.anon_key)
        .expect(StatusCode::TOO_MANY_REQUESTS)
        .await;
    assert_eq!(r.header("retry-after"), "4", "functions");

    // A rule whose scope the request has no value for fails closed, counted.
    let r = call("scope-user")
        .expect(StatusCode::INTERNAL_SERVER_ERROR)
        .await;
    assert_eq!(r.code(), "policy_failed");
    call("scope-user")
        .bearer(token("gold"))
        .expect(StatusCode::OK)
        .await;
    call("scope-client-ip").expect(StatusCode::OK).await;
    assert_eq!(forwarded(), 6);
    let text = gw.metrics().await;
    let refused = metric(
        &text,
        "aura_quota_rules_refused_total",
        &["source=\"tenant\"", "reason=\"scope_unknown\""],
    );
    assert_eq!(refused, 1.0);
    let denials = |code: &str| {
        let code = format!("code=\"{code}\"");
        metric(
            &text,
            "aura_quota_denials_total",
            &["source=\"tenant\"", &code],
        )
    };
    // The four Retry-After answers and the two route groups.
    assert_eq!(denials("quota_exceeded"), 6.0);
    assert_eq!(denials("policy_denied"), 3.0);
    // Another project is not the module's: it keeps the plane's quota.
    object("f")
        .key(&fx.other_project_key)
        .header("x-tier", "deny-me")
        .expect(StatusCode::OK)
        .await;
}

#[tokio::test]
async fn a_hostile_configuration_schema_is_refused_at_upload_and_never_fetched() {
    // A listener where the remote reference points: nothing may connect to it.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let connections = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = connections.clone();
    let accept = tokio::spawn(async move {
        while listener.accept().await.is_ok() {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    });
    let started = offline("decl-hostile-schema", "");
    let admin = admin(&started);
    for (choice, says) in [
        (b'1', "invalid JSON"),
        (b'2', "invalid schema"),
        (b'3', "bytes, over the"),
        (b'6', "invalid JSON"),
    ] {
        let module = quota_inputs_module(choice, port);
        let (status, body) = admin.install("quota", &module, json!({})).await.parts();
        assert_eq!(status, StatusCode::BAD_REQUEST, "schema {choice}: {body}");
        assert_eq!(body["error"]["code"], "policy_refused");
        let message = body["error"]["message"].as_str().expect("message");
        assert!(message.contains(says), "schema {choice}: {message}");
    }
    // A schema that refers to itself: refused or checked, but answered.
    let module = quota_inputs_module(b'5', port);
    let (status, body) = admin.install("quota", &module, json!({})).await.parts();
    assert!(
        status == StatusCode::BAD_REQUEST || status == StatusCode::OK,
        "{status}: {body}"
    );
    // A pattern that backtracks catastrophically on other engines: the upload is answered
    // (2^10000 paths would never be), the value refused by its key, and a matching one taken.
    let module = quota_inputs_module(b'4', port);
    let evil = json!({ "name": format!("{}!", "a".repeat(10_000)) });
    let (status, body) = admin.install("quota", &module, evil).await.parts();
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let message = body["error"]["message"].as_str().expect("message");
    assert!(message.contains("/name"), "{message}");
    admin
        .install_ok("quota", &module, json!({ "name": "aaaa" }))
        .await;
    assert_eq!(
        connections.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "a schema's reference is never fetched"
    );
    accept.abort();
    // The gateway kept serving throughout.
    let health = Call::get(started.gw.data_url("/health")).key(&started.fx.anon_key);
    assert_eq!(health.status().await, StatusCode::OK);
}

#[tokio::test]
async fn a_cache_whose_inputs_never_repeat_steps_aside_and_decisions_stay_right() {
    let started = offline("decl-thrash", "");
    let (gw, fx) = (&started.gw, &started.fx);
    let admin = admin(&started);
    let config = json!({ "echo_all": true, "declare": ["origin"], "max_age_ms": 60_000 });
    admin.install_ok("cors", &testing_cors(), config).await;
    // 1,100 requests, each from an origin of its own: no lookup can hit. Every decision is
    // right; on a loaded machine a call may miss its deadline, and that request alone fails
    // closed with the contract's error.
    let mut failed_closed = 0;
    for n in 0..1_100 {
        let origin = format!("https://o{n}.example");
        let call = Call::get(gw.data_url("/health")).key(&fx.anon_key);
        let r = call.origin(&origin).read().await;
        if r.status != StatusCode::OK {
            let code = r.code();
            assert!(
                code.starts_with("policy_"),
                "request {n}: {} {code}",
                r.status
            );
            failed_closed += 1;
            continue;
        }
        assert_eq!(
            r.header("access-control-allow-origin"),
            origin,
            "request {n}"
        );
    }
    assert!(
        failed_closed <= 10,
        "{failed_closed} requests failed closed"
    );
    let (cache, _) = cache_of(&admin, "cors").await;
    assert_eq!(cache["thrashing"], true, "{cache}");
    let declined = cache["declined"].as_u64().expect("declined");
    // After the first window of 1,024 lookups, 15 requests in 16 skip the cache.
    assert!((60..=76).contains(&declined), "{cache}");
    let text = gw.metrics().await;
    let counted = metric(
        &text,
        "aura_decision_cache_total",
        &["stage=\"cors\"", "owner=\"tenant\"", "outcome=\"declined\""],
    );
    assert_eq!(counted, declined as f64);
}

#[tokio::test]
async fn one_callers_flood_of_unique_inputs_leaves_the_other_callers_lookups_alone() {
    // Loopback is a trusted proxy: a request's address, the CORS stage's partition, is the one
    // `X-Forwarded-For` names. Every request is the same key's: its quota is lifted above the
    // test's 1,372 requests.
    let started = offline(
        "decl-shard",
        "[rate_limit]\ntrusted_proxies = [\"127.0.0.1/32\"]\n\n\
         [data_plane.plugins.quota.config]\nrate_per_second = 100000\nburst = 100000\n",
    );
    let (gw, fx) = (&started.gw, &started.fx);
    let admin = admin(&started);
    let config = json!({ "echo_all": true, "declare": ["origin"], "max_age_ms": 60_000 });
    admin.install_ok("cors", &testing_cors(), config).await;
    let health = |from: &str, origin: &str| {
        let call = Call::get(gw.data_url("/health")).key(&fx.anon_key);
        call.header("x-forwarded-for", from).origin(origin).read()
    };
    // One caller sends 1,100 requests, each from an origin of its own: its shard of the cache
    // finds nothing in a window of 1,024 lookups and steps aside. As in the test above, a call
    // that misses its deadline on a loaded machine fails that request alone, closed.
    let mut failed_closed = 0;
    for n in 0..1_100 {
        let r = health("192.0.2.7", &format!("https://o{n}.example")).await;
        if r.status != StatusCode::OK {
            assert!(r.code().starts_with("policy_"), "request {n}: {}", r.status);
            failed_closed += 1;
        }
    }
    assert!(
        failed_closed <= 10,
        "{failed_closed} requests failed closed"
    );
    let (cache, _) = cache_of(&admin, "cors").await;
    assert_eq!(
        (&cache["thrashing"], &cache["thrashing_shards"]),
        (&json!(true), &json!(1)),
        "{cache}"
    );
    let hits_before = cache["hits"].as_u64().expect("hits");
    // Sixteen other callers, the same origin 17 times each. Their addresses fall in the
    // cache's eight shards at random: those outside the flood's shard (all but two, as a rule)
    // look every request up and hit after their first; before, the whole module stepped aside
    // and 15 of their requests in 16 called the module.
    for caller in 0..16 {
        let from = format!("198.51.100.{caller}");
        for _ in 0..17 {
            let r = health(&from, "https://quiet.example").await;
            assert_eq!(r.status, StatusCode::OK, "{from}");
            assert_eq!(
                r.header("access-control-allow-origin"),
                "https://quiet.example"
            );
        }
    }
    let (cache, _) = cache_of(&admin, "cors").await;
    let hits = cache["hits"].as_u64().expect("hits") - hits_before;
    // Fails only when nine of the sixteen addresses share the flood's shard (p < 1e-4).
    assert!(hits >= 8 * 16, "the other callers' hits: {hits} ({cache})");
    assert_eq!(cache["thrashing_shards"], 1, "{cache}");
}

/// Anon keys of `beta` and `gamma` (organization A) as control records, and the keys.
fn keys_of_beta_and_gamma() -> (String, String, String) {
    let mut records = String::new();
    let mut keys = Vec::new();
    for project in ["beta", "gamma"] {
        let key = format!("aura_pk_{project}_{}", Uuid::new_v4().simple());
        records += &format!(
            "[[api_keys]]\nid = \"{}\"\nproject_ref = \"{project}\"\nrole = \"anon\"\nkey_sha256 = \"{}\"\n\n",
            Uuid::new_v4(),
            aura_gateway::auth::keys::hash_key(&key)
        );
        keys.push(key);
    }
    let gamma = keys.pop().expect("gamma");
    let beta = keys.pop().expect("beta");
    (records, beta, gamma)
}

#[tokio::test]
async fn projects_flooding_their_modules_stay_under_the_instances_ceiling_and_a_quiet_projects_decisions_stay()
 {
    use futures::StreamExt as _;
    // Every decision cache of the instance shares 4 MiB; a module's own bound is as large, so
    // each flooding project could fill the ceiling alone. Loopback is a trusted proxy: the CORS
    // stage's partition is the address `X-Forwarded-For` names. The floods' calls wait for a
    // tenant thread as long as a machine loaded by other tests makes them (this test is about
    // the decisions kept, not the queue's timeout).
    const CEILING: usize = 4 << 20;
    let (records, beta_key, gamma_key) = keys_of_beta_and_gamma();
    let toml = format!(
        "[rate_limit]\ntrusted_proxies = [\"127.0.0.1/32\"]\n\n\
         [plugins]\ntenant_queue_timeout_ms = 10000\n\n\
         [plugins.decision_cache]\nbytes = {CEILING}\ntotal_bytes = {CEILING}\n\n\
         [data_plane.plugins.quota.config]\nrate_per_second = 1000000\nburst = 1000000\n"
    );
    let gw = Gateway::builder()
        .nats("nats://127.0.0.1:1")
        .prefix("decl-ceiling");
    let started = gw.records(&records).toml(&toml).binary();
    let (gw, fx) = (&started.gw, &started.fx);
    let admin = admin(&started);
    let config = json!({ "echo_all": true, "declare": ["origin"], "max_age_ms": 300_000 });
    for project in ["alpha", "beta", "gamma"] {
        admin
            .of(project)
            .install_ok("cors", &testing_cors(), config.clone())
            .await;
    }
    // The quiet project, of another organization, keeps ten decisions of its own module.
    let quiet = Policies::new(gw.mgmt_url(""), console_token(fx.outsider))
        .of("other")
        .timeout(Duration::from_secs(60));
    quiet
        .install_ok("cors", &testing_cors(), config.clone())
        .await;
    let quiet_calls = async || cache_of(&quiet, "cors").await.1;
    let health = |key: &str, from: &str, origin: &str| {
        let call = Call::get(gw.data_url("/health")).key(key);
        call.header("x-forwarded-for", from).origin(origin).read()
    };
    let quiet_round = async || {
        for n in 0..10 {
            let origin = format!("https://quiet-{n}.example");
            let r = health(&fx.other_project_key, "198.51.100.1", &origin).await;
            assert_eq!(r.status, StatusCode::OK);
            assert_eq!(r.header("access-control-allow-origin"), origin);
        }
    };
    let calls_before = quiet_calls().await;
    quiet_round().await;
    let calls_kept = quiet_calls().await;
    assert_eq!(calls_kept - calls_before, 10, "each origin decided once");
    quiet_round().await;
    assert_eq!(quiet_calls().await, calls_kept, "then kept");

    let total = |text: &str| metric(text, "aura_decision_cache_bytes", &[]);
    let rss_before = gw.rss_mib();
    let bytes_before = total(&gw.metrics().await);
    // Three projects flood their modules with unique origins of 2 KB, from 16 addresses each:
    // 12 MiB of decisions wanted, three times the ceiling.
    let pad = "a".repeat(2_000);
    let floods = [
        ("alpha", fx.anon_key.as_str()),
        ("beta", beta_key.as_str()),
        ("gamma", gamma_key.as_str()),
    ];
    let (mut served, mut refused, mut highest) = (0, Vec::new(), 0.0f64);
    for round in 0..12 {
        let requests = (0..300).map(|i| {
            let n = round * 300 + i;
            let (project, key) = floods[n % 3];
            let from = format!("203.0.113.{}", (n / 3) % 16 + 16 * (n % 3));
            let origin = format!("https://{pad}-{project}-{n}.example");
            async move { health(key, &from, &origin).await.status }
        });
        let statuses: Vec<StatusCode> = futures::stream::iter(requests)
            .buffer_unordered(6)
            .collect()
            .await;
        served += statuses.iter().filter(|s| **s == StatusCode::OK).count();
        refused.extend(statuses.into_iter().filter(|s| *s != StatusCode::OK));
        let now = total(&gw.metrics().await);
        highest = highest.max(now);
        assert!(now <= CEILING as f64, "round {round}: {now} bytes kept");
    }
    let text = gw.metrics().await;
    let (bytes_after, reclaimed) = (
        total(&text),
        metric(
            &text,
            "aura_decision_cache_reclaimed_total",
            &["reason=\"ceiling\""],
        ),
    );
    let rss_after = gw.rss_mib();
    let mut sizes = Vec::new();
    for (project, _) in floods {
        let (cache, _) = cache_of(&admin.of(project), "cors").await;
        sizes.push(cache["bytes"].as_u64().expect("bytes"));
    }
    println!(
        "decision caches: {bytes_before} → {bytes_after} bytes (highest {highest}, ceiling \
         {CEILING}); {reclaimed} entries evicted by the ceiling; flooded modules {sizes:?} bytes; \
         {served} requests served, {} refused; RSS {rss_before:.1} → {rss_after:.1} MiB",
        refused.len()
    );
    let mut by_status = std::collections::BTreeMap::<u16, usize>::new();
    for status in &refused {
        *by_status.entry(status.as_u16()).or_default() += 1;
    }
    assert!(
        refused.len() * 10 <= served,
        "{} refused of {} (by status {by_status:?})",
        refused.len(),
        served + refused.len()
    );
    assert_eq!(
        metric(&text, "aura_decision_cache_ceiling_bytes", &[]),
        CEILING as f64
    );
    assert!(reclaimed > 1_000.0, "{reclaimed}");
    assert!(
        bytes_after > (CEILING / 2) as f64,
        "the floods filled the ceiling: {bytes_after}"
    );
    // RSS grows by the ceiling and the tables' room, not by the 12 MiB wanted.
    assert!(
        rss_after - rss_before < 12.0,
        "RSS {rss_before:.1} → {rss_after:.1} MiB"
    );
    // The quiet project's decisions were all kept: no call of its module.
    quiet_round().await;
    assert_eq!(quiet_calls().await, calls_kept, "the quiet project's hits");
    let (cache, _) = cache_of(&quiet, "cors").await;
    assert_eq!(cache["evicted"], 0, "{cache}");

    // A module removed gives its bytes back to the ceiling.
    let alpha = sizes[0] as f64;
    assert_eq!(admin.delete("cors").await.status, StatusCode::NO_CONTENT);
    // The module goes when the last request holding it does.
    let mut after_removal = total(&gw.metrics().await);
    for _ in 0..20 {
        if after_removal <= bytes_after - alpha + 64.0 * 1024.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        after_removal = total(&gw.metrics().await);
    }
    println!("alpha's module removed: {bytes_after} → {after_removal} bytes");
    assert!(
        after_removal <= bytes_after - alpha + 64.0 * 1024.0,
        "{bytes_after} → {after_removal} (alpha kept {alpha})"
    );
}
