//! Identity on both planes, end to end: API keys, user JWTs, console JWTs and org roles. Through
//! the real binary, an `Authorization` header is verified or refused, never forwarded
//! unverified; a `service_role` key in a URL is refused whatever the headers say; and a key in a
//! header is decided once for every path, a key in the query per path.

use std::sync::Arc;
use std::time::Duration;

use reqwest::Method as M;
use reqwest::StatusCode;
use serde_json::json;
use uuid::Uuid;

use crate::support::builder::Gateway;
use crate::support::call::Call;
use crate::support::edge::Edge;
use crate::support::fixture::{
    CONSOLE_SECRET, Fixture, USER_SECRET, console_token, console_token_with, epoch, hs256,
    user_token,
};
use crate::support::gateway::InProcess;
use crate::support::metrics::metric;
use crate::support::postgres::TestDatabase;
use crate::support::raw::{get, status_of};
use crate::support::responder::{Envelopes, header_names, json_ok};

/// A gateway over `store` (or `fx`'s records in a control file), with responders on auth,
/// control, db and the provisioner that keep each envelope.
struct Setup {
    gw: InProcess,
    envelopes: Envelopes,
}

async fn setup(gw: InProcess) -> Setup {
    let services = ["auth", "control", "db", "provisioner"];
    let envelopes = gw.bus.record(&services, json_ok).await;
    Setup { gw, envelopes }
}

/// [`setup`] over `fx`'s records in a control file.
async fn file_setup(fx: &Fixture) -> Setup {
    setup(Gateway::builder().fixture(fx).start().await).await
}

#[tokio::test]
async fn data_plane_keys_reach_backends_as_actors_and_never_as_keys() {
    let fx = Fixture::new();
    let mut s = file_setup(&fx).await;
    let user = Call::get(s.gw.data_url("/v1/auth/user?x=1")).key(&fx.anon_key);
    user.header("x-aura-role", "service_role").expect(200).await;
    let e = s.envelopes.next().await;
    assert_eq!(e["actor"]["role"], "anon");
    assert_eq!(e["actor"]["project"], "alpha");
    assert_eq!(e["actor"]["key_id"], fx.anon_key_id.to_string());
    assert!(e["actor"]["user_id"].is_null());
    let names = header_names(&e);
    let credential = |n: &String| n == "apikey" || n == "x-api-key" || n.starts_with("x-aura-");
    assert!(!names.iter().any(credential), "{names:?}");
    let leaked = e.to_string().contains(&fx.anon_key);
    assert!(!leaked, "the key never reaches a backend");

    let rotate = Call::post(s.gw.data_url("/v1/control/rotate"));
    rotate
        .header("x-api-key", &fx.service_key)
        .expect(200)
        .await;
    assert_eq!(s.envelopes.next().await["actor"]["role"], "service_role");

    let user = Call::get(s.gw.data_url("/v1/auth/user")).expect(401).await;
    assert_eq!(user.code(), "missing_api_key");
    let unknown = "aura_pk_unknown_0123456789abcdef0123456789";
    for bad in [unknown, &fx.revoked_key] {
        let r = Call::get(s.gw.data_url("/v1/auth/user")).key(bad);
        assert_eq!(r.expect(401).await.code(), "invalid_api_key");
    }
}

#[tokio::test]
async fn cached_api_key_decisions_follow_the_header_that_carries_each_key() {
    // The `api-key` stage's decisions are kept by the headers it reads (`apikey`, `x-api-key`),
    // all from one client address here: a request with one of them, or with both (the same key:
    // that key; two keys: refused as conflicting) in either order, each twice so that the second
    // is a kept decision, must be decided as for its own headers.
    let fx = Fixture::new();
    let mut s = file_setup(&fx).await;
    let (anon, service) = (fx.anon_key.as_str(), fx.service_key.as_str());
    // (the headers in request order, the role decided; `None`: refused)
    type Case<'a> = (&'a [(&'a str, &'a str)], Option<&'a str>);
    let cases: [Case<'_>; 8] = [
        (&[("apikey", anon)], Some("anon")),
        (&[("x-api-key", service)], Some("service_role")),
        (&[("x-api-key", service), ("apikey", anon)], None),
        (
            &[("apikey", service), ("x-api-key", service)],
            Some("service_role"),
        ),
        (&[("apikey", anon), ("x-api-key", service)], None),
        (&[("x-api-key", anon), ("apikey", anon)], Some("anon")),
        (&[("apikey", service)], Some("service_role")),
        (&[("x-api-key", anon)], Some("anon")),
    ];
    for round in 0..2 {
        for (headers, role) in cases {
            let mut call = Call::get(s.gw.data_url("/v1/auth/user"));
            for (name, value) in headers {
                call = call.header(name, value);
            }
            match role {
                Some(role) => {
                    call.expect(200).await;
                    let e = s.envelopes.next().await;
                    assert_eq!(e["actor"]["role"], role, "round {round}: {headers:?}");
                }
                None => {
                    let r = call.expect(401).await;
                    assert_eq!(r.code(), "invalid_api_key", "round {round}: {headers:?}");
                }
            }
        }
    }
    let text = s.gw.metrics().await;
    let hits = crate::support::metrics::metric(
        &text,
        "aura_decision_cache_total",
        &["stage=\"api_key\"", "outcome=\"hit\""],
    );
    assert!(
        hits >= 8.0,
        "the second round's decisions were kept ones: {hits}"
    );
}

#[tokio::test]
async fn public_paths_need_no_key_but_an_invalid_key_is_still_refused() {
    let fx = Fixture::new();
    let mut s = file_setup(&fx).await;
    let url = |path: &str| s.gw.data_url(path);
    Call::get(url("/health")).expect(200).await;
    Call::post(url("/v1/auth/signup"))
        .body("{}")
        .expect(200)
        .await;
    let e = s.envelopes.next().await;
    assert_eq!(e["actor"]["role"], "anon");
    assert!(e["actor"]["project"].is_null());
    Call::get(url("/.well-known/jwks.json")).expect(200).await;
    let signup = Call::get(url("/v1/auth/signup")).status().await;
    assert_eq!(signup, 401, "only POST signup is public");
    let wrong = "aura_pk_wrong_0123456789abcdef0123456789";
    Call::post(url("/v1/auth/signup"))
        .key(wrong)
        .expect(401)
        .await;
}

#[tokio::test]
async fn keys_in_the_query_only_on_streaming_routes_and_never_a_secret_key() {
    let fx = Fixture::new();
    let s = file_setup(&fx).await;
    let with_key =
        |path: &str, key: &str| Call::get(s.gw.data_url(&format!("{path}?apikey={key}")));
    let r = with_key("/v1/db/todos", &fx.anon_key).read().await;
    assert_eq!(r.status, 401, "a key in the query of a REST route");
    assert_eq!(r.code(), "invalid_api_key");
    let r = with_key("/v1/realtime/websocket", &fx.service_key).status();
    assert_eq!(r.await, 401, "a service_role key in the URL");
    let r = with_key("/v1/realtime/sse", &fx.anon_key).status().await;
    assert_ne!(r, 401, "an anon key in the SSE URL is accepted");
}

#[tokio::test]
async fn user_jwts_make_the_caller_authenticated_and_invalid_ones_are_refused() {
    let fx = Fixture::new();
    let mut s = file_setup(&fx).await;
    let user = Uuid::new_v4();
    let call = |token: String| {
        Call::get(s.gw.data_url("/v1/auth/user"))
            .key(&fx.anon_key)
            .bearer(token)
    };
    call(user_token("alpha", user)).expect(200).await;
    let e = s.envelopes.next().await;
    assert_eq!(e["actor"]["role"], "authenticated");
    assert_eq!(e["actor"]["user_id"], user.to_string());
    let kept = header_names(&e).contains(&"authorization".to_owned());
    assert!(kept, "the original Authorization is kept");

    let exp = epoch() + 600;
    let sub = user.to_string();
    let user_signed = |claims| hs256(USER_SECRET, claims);
    let refused = [
        ("another project", user_token("other", user)),
        (
            "no ref",
            user_signed(json!({"sub": sub, "aud": "authenticated", "exp": exp})),
        ),
        (
            "expired",
            user_signed(
                json!({"sub": sub, "aud": "authenticated", "ref": "alpha", "exp": epoch() - 120}),
            ),
        ),
        (
            "no exp",
            user_signed(json!({"sub": sub, "aud": "authenticated", "ref": "alpha"})),
        ),
        (
            "wrong aud",
            user_signed(json!({"sub": sub, "aud": "anon", "ref": "alpha", "exp": exp})),
        ),
        (
            "no aud",
            user_signed(json!({"sub": sub, "ref": "alpha", "exp": exp})),
        ),
        (
            "aud array with extra",
            user_signed(
                json!({"sub": sub, "aud": ["authenticated", "x"], "ref": "alpha", "exp": exp}),
            ),
        ),
        (
            "wrong secret",
            hs256(
                "another-secret-0123456789abcdef0123",
                json!({"sub": sub, "aud": "authenticated", "ref": "alpha", "exp": exp}),
            ),
        ),
        (
            "console secret",
            hs256(
                CONSOLE_SECRET,
                json!({"sub": sub, "aud": "authenticated", "ref": "alpha", "exp": exp}),
            ),
        ),
        ("garbage", "not.a.token".to_owned()),
    ];
    for (what, token) in refused {
        let r = call(token).read().await;
        assert_eq!(r.status, 401, "{what}");
        assert_eq!(r.code(), "invalid_jwt", "{what}");
    }

    let r = call(fx.anon_key.clone()).status().await;
    assert_eq!(r, 200, "a bearer equal to the key is no JWT");
    let e = s.envelopes.next().await;
    assert_eq!(e["actor"]["role"], "anon");
    let forwarded = header_names(&e).contains(&"authorization".to_owned());
    assert!(!forwarded, "and is not forwarded");
}

#[tokio::test]
async fn a_revoked_key_stops_working_within_the_cache_lifetime() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fx = Fixture::new();
    let store: Arc<dyn aura_gateway::control::ControlStore> = Arc::new(fx.file_store(dir.path()));
    let gw = Gateway::with(|c| c.auth.key_cache_ttl_secs = 1).store(store.clone());
    let s = setup(gw.start().await).await;
    let call = || {
        Call::get(s.gw.data_url("/v1/auth/user"))
            .key(&fx.anon_key)
            .status()
    };
    assert_eq!(call().await, StatusCode::OK);
    assert!(store.revoke_api_key(fx.anon_key_id).await.expect("revoke"));
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    assert_eq!(call().await, StatusCode::UNAUTHORIZED);
}

/// Management plane on the Postgres store.
async fn management() -> (TestDatabase, Fixture, Setup) {
    let db = TestDatabase::create().await;
    let store = db.store().await;
    let fx = Fixture::new();
    fx.seed(&db).await;
    let s = setup(Gateway::builder().store(Arc::new(store)).start().await).await;
    (db, fx, s)
}

#[tokio::test]
async fn console_roles_are_recomputed_from_the_database_on_every_request() {
    let (db, fx, mut s) = management().await;
    let get = || {
        Call::get(s.gw.mgmt_url("/v1/projects/alpha"))
            .console(fx.developer)
            .key(&fx.anon_key)
    };
    get().expect(200).await;
    let e = s.envelopes.next().await;
    assert_eq!(e["plane"], "management");
    assert_eq!(e["actor"]["role"], "console");
    assert_eq!(e["actor"]["org_role"], "developer");
    assert_eq!(e["actor"]["project"], "alpha");
    assert_eq!(e["actor"]["user_id"], fx.developer.to_string());
    assert!(e["actor"]["key_id"].is_null());
    let stripped = !header_names(&e).contains(&"apikey".to_owned());
    assert!(stripped, "API keys are stripped here");

    let member = format!("WHERE user_id = '{}'", fx.developer);
    let members = "aura_control.organization_members";
    db.execute(&format!("UPDATE {members} SET role = 'admin' {member}"))
        .await;
    get().expect(200).await;
    let role = &s.envelopes.next().await["actor"]["org_role"];
    assert_eq!(role, "admin", "the new role applies at once");

    db.execute(&format!("DELETE FROM {members} {member}")).await;
    assert_eq!(get().expect(403).await.code(), "not_a_member");
}

#[tokio::test]
async fn console_tokens_need_exactly_the_control_audience() {
    let (_db, fx, s) = management().await;
    let sub = fx.owner.to_string();
    let exp = epoch() + 600;
    let call = |token: String| {
        Call::get(s.gw.mgmt_url("/v1/projects/alpha"))
            .bearer(token)
            .status()
    };
    let ok = console_token_with(json!({"sub": sub, "aud": ["aurabase-control"], "exp": exp}));
    assert_eq!(call(ok).await, StatusCode::OK);
    for (what, claims) in [
        (
            "aud array with another value",
            json!({"sub": sub, "aud": ["aurabase-control", "x"], "exp": exp}),
        ),
        ("no aud", json!({"sub": sub, "exp": exp})),
        (
            "user audience",
            json!({"sub": sub, "aud": "authenticated", "exp": exp}),
        ),
        ("no exp", json!({"sub": sub, "aud": "aurabase-control"})),
        (
            "sub not a uuid",
            json!({"sub": "root", "aud": "aurabase-control", "exp": exp}),
        ),
    ] {
        assert_eq!(call(console_token_with(claims)).await, 401, "{what}");
    }
    let user_signed = hs256(
        USER_SECRET,
        json!({"sub": sub, "aud": "aurabase-control", "exp": exp}),
    );
    assert_eq!(call(user_signed).await, 401, "user key material");
    let r = Call::get(s.gw.mgmt_url("/v1/projects/alpha"))
        .key(&fx.service_key)
        .read()
        .await;
    assert_eq!(r.status, 401, "API keys mean nothing here");
    assert_eq!(r.code(), "missing_token");
}

#[tokio::test]
async fn management_statuses_follow_the_contract() {
    let (_db, fx, s) = management().await;
    let (a, org) = (Some("alpha"), |o: &dyn std::fmt::Display| {
        format!("/v1/organizations/{o}/projects")
    });
    let rotate = "/v1/projects/alpha/api-keys/rotate";
    type Case<'a> = (M, String, Uuid, Option<&'a str>, u16, &'a str);
    let cases: Vec<Case> = vec![
        (
            M::GET,
            "/v1/projects/missing".into(),
            fx.owner,
            None,
            404,
            "unknown project",
        ),
        (
            M::GET,
            "/v1/projects/other".into(),
            fx.owner,
            None,
            403,
            "not a member of B",
        ),
        (
            M::POST,
            org(&Uuid::new_v4()),
            fx.owner,
            None,
            404,
            "unknown org",
        ),
        (
            M::POST,
            org(&"not-a-uuid"),
            fx.owner,
            None,
            404,
            "malformed org",
        ),
        (
            M::POST,
            org(&fx.org_a),
            fx.developer,
            None,
            403,
            "developer creates",
        ),
        (
            M::POST,
            org(&fx.org_a),
            fx.admin,
            None,
            200,
            "admin creates",
        ),
        (
            M::POST,
            rotate.into(),
            fx.developer,
            None,
            403,
            "developer rotates",
        ),
        (M::POST, rotate.into(), fx.owner, None, 200, "owner rotates"),
        (
            M::GET,
            "/v1/projects/alpha/logs".into(),
            fx.reader,
            None,
            200,
            "reader reads",
        ),
        (
            M::POST,
            "/v1/db/sql".into(),
            fx.reader,
            a,
            403,
            "reader writes",
        ),
        (
            M::GET,
            "/v1/db/todos".into(),
            fx.developer,
            None,
            400,
            "service route without project",
        ),
        (
            M::GET,
            "/v1/db/todos".into(),
            fx.developer,
            a,
            200,
            "service route with project",
        ),
        (
            M::GET,
            "/v1/db/todos".into(),
            fx.developer,
            Some("nope"),
            404,
            "service route, unknown project",
        ),
    ];
    for (method, path, user, project, status, what) in cases {
        let mut call = Call::new(method, s.gw.mgmt_url(&path)).console(user);
        if let Some(p) = project {
            call = call.header("x-aura-project", p);
        }
        assert_eq!(call.status().await, status, "{what}");
    }
}

#[tokio::test]
async fn authorization_is_verified_or_refused_never_forwarded_unverified() {
    let edge = Edge::start("").await;
    let fx = &edge.fx;
    let token = user_token("alpha", Uuid::new_v4());
    let other_token = user_token("other", Uuid::new_v4());
    let send = async |authorizations: &[String]| {
        let mut headers = vec![("apikey", fx.anon_key.as_str())];
        headers.extend(authorizations.iter().map(|v| ("authorization", v.as_str())));
        edge.data(get("/v1/storage/object/x", &headers)).await
    };

    // A tab after the scheme, any case: parsed and verified.
    let answer = send(&[format!("bEaReR\t{token}")]).await;
    assert_eq!(status_of(&answer), 200, "{answer}");
    let seen = edge.storage.last().expect("forwarded");
    assert_eq!(seen.one("x-aura-role").as_deref(), Some("authenticated"));
    assert_eq!(seen.all("authorization"), vec![format!("bEaReR\t{token}")]);
    edge.storage.clear();

    for (what, authorizations) in [
        (
            "another project's token after a tab",
            vec![format!("Bearer\t{other_token}")],
        ),
        (
            "two Authorization headers",
            vec![format!("Bearer {token}"), format!("Bearer {other_token}")],
        ),
        ("another scheme", vec!["Basic dXNlcjpwYXNz".to_owned()]),
        ("a malformed bearer", vec!["Bearer a b".to_owned()]),
        ("an empty bearer", vec!["Bearer".to_owned()]),
    ] {
        let answer = send(&authorizations).await;
        assert_eq!(status_of(&answer), 401, "{what}: {answer}");
        // A readable bearer is verified (`invalid_jwt` when refused); an unreadable header is
        // `invalid_token`.
        let code = if what.starts_with("another project") {
            "\"invalid_jwt\""
        } else {
            "\"invalid_token\""
        };
        assert!(answer.contains(code), "{what}: {answer}");
    }
    let forwarded = edge.storage.seen();
    assert!(forwarded.is_empty(), "nothing forwarded: {forwarded:?}");
    // A public path needs no key, but a token there has no project to be checked against.
    let signup = || Call::post(edge.gw.data_url("/v1/auth/signup"));
    assert_eq!(
        signup().bearer(&token).status().await,
        StatusCode::UNAUTHORIZED
    );
    let before = edge.envelopes().len();
    let served = signup().status().await;
    assert_eq!(served, StatusCode::OK, "without a token it is served");
    assert_eq!(edge.envelopes().len(), before + 1);

    // The same parser on the management plane.
    let console = format!("Bearer {}", console_token(fx.admin));
    let two = [
        ("authorization", console.as_str()),
        ("authorization", "Bearer x"),
    ];
    let answer = edge.mgmt(get("/v1/projects/alpha", &two)).await;
    assert_eq!(status_of(&answer), 401, "{answer}");
}

#[tokio::test]
async fn a_service_role_key_in_the_url_is_refused_whatever_the_headers_say() {
    let edge = Edge::start(
        "[data_plane.plugins.api_key.config]\nheaders = [\"apikey\", \"x-api-key\", \"x-client-key\"]\n",
    )
    .await;
    let fx = &edge.fx;
    let (anon, service) = (&fx.anon_key, &fx.service_key);
    let sse = "/v1/realtime/sse";
    for (path, header_key) in [
        (format!("{sse}?apikey={service}"), service),
        (format!("{sse}?apikey={service}"), anon),
        (format!("{sse}?apikey={anon}&apikey={service}"), anon),
        (format!("/v1/storage/object/x?apikey={service}"), service),
    ] {
        let r = Call::get(edge.gw.data_url(&path))
            .key(header_key)
            .read()
            .await;
        let body = r.json_or_null();
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{path}: {body}");
        assert_eq!(body["error"]["code"], "invalid_api_key", "{path}");
    }
    assert!(edge.realtime.seen().is_empty() && edge.storage.seen().is_empty());
    // An anon key in the URL of a streaming route is still fine.
    let anon_sse = Call::get(edge.gw.data_url(&format!("{sse}?apikey={anon}")));
    assert_eq!(anon_sse.status().await, StatusCode::OK);
    // Every header the api-key stage reads is a credential, never forwarded.
    let object = Call::get(edge.gw.data_url("/v1/storage/object/x"));
    let client_key = object.header("x-client-key", anon).status().await;
    assert_eq!(client_key, StatusCode::OK);
    let seen = edge.storage.last().expect("forwarded");
    let reached = seen.one("x-client-key").is_some();
    assert!(!reached, "the key reached storage");
}

/// The default api-key module declares the path only for a request with a key in the query
/// (`path-with-query-keys`): a key sent in a header is decided once for every path, a key in the
/// query per path. A decision kept for a header key never answers a request that carries a key
/// in the query too, and a query key stays refused on every path that does not accept one.
#[tokio::test]
async fn a_header_keys_decision_serves_every_path_and_query_keys_are_decided_per_path() {
    let edge = Edge::start("").await;
    let anon = &edge.fx.anon_key;
    let stage = |text: &str, outcome: &str| {
        let outcome = format!("outcome=\"{outcome}\"");
        let labels = ["plane=\"data\"", "stage=\"api_key\"", outcome.as_str()];
        metric(text, "aura_decision_cache_total", &labels)
    };
    let before = edge.gw.metrics().await;
    let (misses, hits) = (stage(&before, "miss"), stage(&before, "hit"));
    for n in 0..10 {
        let object = Call::get(edge.gw.data_url(&format!("/v1/storage/object/b/{n}")));
        object.key(anon).expect(StatusCode::OK).await;
    }
    let text = edge.gw.metrics().await;
    assert_eq!(
        stage(&text, "miss") - misses,
        1.0,
        "one decision, ten paths"
    );
    assert!(stage(&text, "hit") - hits >= 9.0, "{text}");
    assert_eq!(edge.storage.seen().len(), 10);

    let (storage_a, storage_b) = ("/v1/storage/object/b/1", "/v1/storage/object/b/2");
    for path in [storage_a, storage_a, storage_b] {
        // The header key's kept decision is not this request's: its query key is refused.
        let with_query = Call::get(edge.gw.data_url(&format!("{path}?apikey={anon}")));
        let r = with_query.key(anon).read().await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{path}");
        assert_eq!(r.json_or_null()["error"]["code"], "invalid_api_key");
    }
    let sse = Call::get(edge.gw.data_url(&format!("/v1/realtime/sse?apikey={anon}")));
    assert_eq!(sse.status().await, StatusCode::OK, "accepted where it is");
    let text = edge.gw.metrics().await;
    let decided = stage(&text, "miss") - misses;
    assert_eq!(decided, 4.0, "one decision per path with a query key");
    assert_eq!(
        edge.storage.seen().len(),
        10,
        "no refused request reached storage"
    );
}
