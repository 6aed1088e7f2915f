//! Identity on both planes, end to end: API keys, user JWTs, console JWTs and org roles.

use std::sync::Arc;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use uuid::Uuid;

use crate::support::fixture::{
    CONSOLE_SECRET, Fixture, USER_SECRET, console_token, console_token_with, epoch, hs256,
    user_token,
};
use crate::support::gateway::{InProcess, test_config};
use crate::support::nats_server::shared;
use crate::support::postgres::TestDatabase;
use crate::support::responder::{Responder, reply};
use crate::support::unique_prefix;

/// A gateway over `store`, with responders on auth and control that pass each envelope on.
struct Setup {
    gw: InProcess,
    envelopes: mpsc::UnboundedReceiver<Value>,
    _responders: Vec<Responder>,
}

async fn setup(
    store: Arc<dyn aura_gateway::control::ControlStore>,
    tweak: impl FnOnce(&mut aura_gateway::config::Config),
) -> Setup {
    let nats = shared();
    let prefix = unique_prefix();
    let mut config = test_config(&nats.url(), &prefix);
    tweak(&mut config);
    let gw = InProcess::start_with_store(config, store).await;
    let (tx, envelopes) = mpsc::unbounded_channel();
    let mut responders = Vec::new();
    for service in ["auth", "control", "db", "provisioner"] {
        let tx = tx.clone();
        responders.push(
            Responder::start(
                &nats.url(),
                &format!("{prefix}.{service}.http"),
                Duration::ZERO,
                move |e| {
                    let _ = tx.send(e);
                    reply(200, &[("content-type", "application/json")], b"{}")
                },
            )
            .await,
        );
    }
    Setup {
        gw,
        envelopes,
        _responders: responders,
    }
}

async fn error_code(response: reqwest::Response) -> String {
    let body: Value = response.json().await.expect("JSON error");
    body["error"]["code"].as_str().expect("code").to_owned()
}

fn header_names(envelope: &Value) -> Vec<String> {
    envelope["headers"]
        .as_array()
        .expect("headers")
        .iter()
        .map(|p| p[0].as_str().expect("name").to_owned())
        .collect()
}

fn file_setup_store(
    fx: &Fixture,
    dir: &std::path::Path,
) -> Arc<dyn aura_gateway::control::ControlStore> {
    Arc::new(fx.file_store(dir))
}

#[tokio::test]
async fn data_plane_keys_reach_backends_as_actors_and_never_as_keys() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fx = Fixture::new();
    let mut s = setup(file_setup_store(&fx, dir.path()), |_| {}).await;
    let client = reqwest::Client::new();

    let r = client
        .get(s.gw.data_url("/v1/auth/user?x=1"))
        .header("apikey", &fx.anon_key)
        .header("x-aura-role", "service_role")
        .send()
        .await
        .expect("request");
    assert_eq!(r.status(), StatusCode::OK);
    let e = s.envelopes.recv().await.expect("envelope");
    assert_eq!(e["actor"]["role"], "anon");
    assert_eq!(e["actor"]["project"], "alpha");
    assert_eq!(e["actor"]["key_id"], fx.anon_key_id.to_string());
    assert!(e["actor"]["user_id"].is_null());
    let names = header_names(&e);
    assert!(
        !names
            .iter()
            .any(|n| n == "apikey" || n == "x-api-key" || n.starts_with("x-aura-")),
        "{names:?}"
    );
    assert!(
        !e.to_string().contains(&fx.anon_key),
        "the key never reaches a backend"
    );

    let r = client
        .post(s.gw.data_url("/v1/control/rotate"))
        .header("x-api-key", &fx.service_key)
        .send()
        .await
        .expect("request");
    assert_eq!(r.status(), StatusCode::OK);
    let e = s.envelopes.recv().await.expect("envelope");
    assert_eq!(e["actor"]["role"], "service_role");

    let r = client
        .get(s.gw.data_url("/v1/auth/user"))
        .send()
        .await
        .expect("request");
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(error_code(r).await, "missing_api_key");
    for bad in [
        "aura_pk_unknown_0123456789abcdef0123456789",
        &fx.revoked_key,
    ] {
        let r = client
            .get(s.gw.data_url("/v1/auth/user"))
            .header("apikey", bad)
            .send()
            .await
            .expect("request");
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(error_code(r).await, "invalid_api_key");
    }
}

#[tokio::test]
async fn public_paths_need_no_key_but_an_invalid_key_is_still_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fx = Fixture::new();
    let mut s = setup(file_setup_store(&fx, dir.path()), |_| {}).await;
    let client = reqwest::Client::new();
    assert_eq!(
        client
            .get(s.gw.data_url("/health"))
            .send()
            .await
            .expect("r")
            .status(),
        StatusCode::OK
    );
    let r = client
        .post(s.gw.data_url("/v1/auth/signup"))
        .body("{}")
        .send()
        .await
        .expect("r");
    assert_eq!(r.status(), StatusCode::OK);
    let e = s.envelopes.recv().await.expect("envelope");
    assert_eq!(e["actor"]["role"], "anon");
    assert!(e["actor"]["project"].is_null());
    let r = client
        .get(s.gw.data_url("/.well-known/jwks.json"))
        .send()
        .await
        .expect("r");
    assert_eq!(r.status(), StatusCode::OK);
    let r = client
        .get(s.gw.data_url("/v1/auth/signup"))
        .send()
        .await
        .expect("r");
    assert_eq!(
        r.status(),
        StatusCode::UNAUTHORIZED,
        "only POST signup is public"
    );
    let r = client
        .post(s.gw.data_url("/v1/auth/signup"))
        .header("apikey", "aura_pk_wrong_0123456789abcdef0123456789")
        .send()
        .await
        .expect("r");
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn keys_in_the_query_only_on_streaming_routes_and_never_a_secret_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fx = Fixture::new();
    let s = setup(file_setup_store(&fx, dir.path()), |_| {}).await;
    let client = reqwest::Client::new();
    let r = client
        .get(s.gw.data_url(&format!("/v1/db/todos?apikey={}", fx.anon_key)))
        .send()
        .await
        .expect("r");
    assert_eq!(
        r.status(),
        StatusCode::UNAUTHORIZED,
        "a key in the query of a REST route"
    );
    assert_eq!(error_code(r).await, "invalid_api_key");
    let r = client
        .get(s.gw.data_url(&format!("/v1/realtime/websocket?apikey={}", fx.service_key)))
        .send()
        .await
        .expect("r");
    assert_eq!(
        r.status(),
        StatusCode::UNAUTHORIZED,
        "a service_role key in the URL"
    );
    let r = client
        .get(s.gw.data_url(&format!("/v1/realtime/sse?apikey={}", fx.anon_key)))
        .send()
        .await
        .expect("r");
    assert_ne!(
        r.status(),
        StatusCode::UNAUTHORIZED,
        "an anon key in the SSE URL is accepted"
    );
}

#[tokio::test]
async fn user_jwts_make_the_caller_authenticated_and_invalid_ones_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fx = Fixture::new();
    let mut s = setup(file_setup_store(&fx, dir.path()), |_| {}).await;
    let client = reqwest::Client::new();
    let user = Uuid::new_v4();
    let call = |token: String| {
        client
            .get(s.gw.data_url("/v1/auth/user"))
            .header("apikey", &fx.anon_key)
            .header("authorization", format!("Bearer {token}"))
            .send()
    };
    let r = call(user_token("alpha", user)).await.expect("r");
    assert_eq!(r.status(), StatusCode::OK);
    let e = s.envelopes.recv().await.expect("envelope");
    assert_eq!(e["actor"]["role"], "authenticated");
    assert_eq!(e["actor"]["user_id"], user.to_string());
    assert!(
        header_names(&e).contains(&"authorization".to_owned()),
        "the original Authorization is kept"
    );

    let exp = epoch() + 600;
    let sub = user.to_string();
    let refused = [
        ("another project", user_token("other", user)),
        (
            "no ref",
            hs256(
                USER_SECRET,
                json!({"sub": sub, "aud": "authenticated", "exp": exp}),
            ),
        ),
        (
            "expired",
            hs256(
                USER_SECRET,
                json!({"sub": sub, "aud": "authenticated", "ref": "alpha", "exp": epoch() - 120}),
            ),
        ),
        (
            "no exp",
            hs256(
                USER_SECRET,
                json!({"sub": sub, "aud": "authenticated", "ref": "alpha"}),
            ),
        ),
        (
            "wrong aud",
            hs256(
                USER_SECRET,
                json!({"sub": sub, "aud": "anon", "ref": "alpha", "exp": exp}),
            ),
        ),
        (
            "no aud",
            hs256(USER_SECRET, json!({"sub": sub, "ref": "alpha", "exp": exp})),
        ),
        (
            "aud array with extra",
            hs256(
                USER_SECRET,
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
        let r = call(token).await.expect("r");
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{what}");
        assert_eq!(error_code(r).await, "invalid_token", "{what}");
    }

    let r = client
        .get(s.gw.data_url("/v1/auth/user"))
        .header("apikey", &fx.anon_key)
        .header("authorization", format!("Bearer {}", fx.anon_key))
        .send()
        .await
        .expect("r");
    assert_eq!(
        r.status(),
        StatusCode::OK,
        "a bearer equal to the key is no JWT"
    );
    let e = s.envelopes.recv().await.expect("envelope");
    assert_eq!(e["actor"]["role"], "anon");
    assert!(
        !header_names(&e).contains(&"authorization".to_owned()),
        "and is not forwarded"
    );
}

#[tokio::test]
async fn a_revoked_key_stops_working_within_the_cache_lifetime() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fx = Fixture::new();
    let store: Arc<dyn aura_gateway::control::ControlStore> = Arc::new(fx.file_store(dir.path()));
    let s = setup(store.clone(), |c| c.auth.key_cache_ttl_secs = 1).await;
    let client = reqwest::Client::new();
    let call = || {
        client
            .get(s.gw.data_url("/v1/auth/user"))
            .header("apikey", &fx.anon_key)
            .send()
    };
    assert_eq!(call().await.expect("r").status(), StatusCode::OK);
    assert!(store.revoke_api_key(fx.anon_key_id).await.expect("revoke"));
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    assert_eq!(call().await.expect("r").status(), StatusCode::UNAUTHORIZED);
}

/// Management plane on the Postgres store.
async fn management() -> (TestDatabase, Fixture, Setup) {
    let db = TestDatabase::create().await;
    let store = db.store().await;
    let fx = Fixture::new();
    fx.seed(&db).await;
    let s = setup(Arc::new(store), |_| {}).await;
    (db, fx, s)
}

#[tokio::test]
async fn console_roles_are_recomputed_from_the_database_on_every_request() {
    let (db, fx, mut s) = management().await;
    let client = reqwest::Client::new();
    let token = console_token(fx.developer);
    let get = || {
        client
            .get(s.gw.mgmt_url("/v1/projects/alpha"))
            .header("authorization", format!("Bearer {token}"))
            .header("apikey", &fx.anon_key)
            .send()
    };
    let r = get().await.expect("r");
    assert_eq!(r.status(), StatusCode::OK);
    let e = s.envelopes.recv().await.expect("envelope");
    assert_eq!(e["plane"], "management");
    assert_eq!(e["actor"]["role"], "console");
    assert_eq!(e["actor"]["org_role"], "developer");
    assert_eq!(e["actor"]["project"], "alpha");
    assert_eq!(e["actor"]["user_id"], fx.developer.to_string());
    assert!(e["actor"]["key_id"].is_null());
    assert!(
        !header_names(&e).contains(&"apikey".to_owned()),
        "API keys are stripped here"
    );

    db.execute(&format!(
        "UPDATE aura_control.organization_members SET role = 'admin' WHERE user_id = '{}'",
        fx.developer
    ))
    .await;
    assert_eq!(get().await.expect("r").status(), StatusCode::OK);
    let e = s.envelopes.recv().await.expect("envelope");
    assert_eq!(
        e["actor"]["org_role"], "admin",
        "the new role applies at once"
    );

    db.execute(&format!(
        "DELETE FROM aura_control.organization_members WHERE user_id = '{}'",
        fx.developer
    ))
    .await;
    let r = get().await.expect("r");
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    assert_eq!(error_code(r).await, "not_a_member");
}

#[tokio::test]
async fn console_tokens_need_exactly_the_control_audience() {
    let (_db, fx, s) = management().await;
    let client = reqwest::Client::new();
    let sub = fx.owner.to_string();
    let exp = epoch() + 600;
    let call = |token: String| {
        client
            .get(s.gw.mgmt_url("/v1/projects/alpha"))
            .header("authorization", format!("Bearer {token}"))
            .send()
    };
    assert_eq!(
        call(console_token_with(
            json!({"sub": sub, "aud": ["aurabase-control"], "exp": exp})
        ))
        .await
        .expect("r")
        .status(),
        StatusCode::OK
    );
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
        let r = call(console_token_with(claims)).await.expect("r");
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{what}");
    }
    let user_signed = hs256(
        USER_SECRET,
        json!({"sub": sub, "aud": "aurabase-control", "exp": exp}),
    );
    assert_eq!(
        call(user_signed).await.expect("r").status(),
        StatusCode::UNAUTHORIZED,
        "user key material"
    );
    let r = client
        .get(s.gw.mgmt_url("/v1/projects/alpha"))
        .header("apikey", &fx.service_key)
        .send()
        .await
        .expect("r");
    assert_eq!(
        r.status(),
        StatusCode::UNAUTHORIZED,
        "API keys mean nothing here"
    );
    assert_eq!(error_code(r).await, "missing_token");
}

#[tokio::test]
async fn management_statuses_follow_the_contract() {
    let (_db, fx, s) = management().await;
    let client = reqwest::Client::new();
    let send = |method: reqwest::Method, path: &str, user: Uuid, project: Option<&str>| {
        let mut r = client
            .request(method, s.gw.mgmt_url(path))
            .header("authorization", format!("Bearer {}", console_token(user)));
        if let Some(p) = project {
            r = r.header("x-aura-project", p);
        }
        r.send()
    };
    use reqwest::Method as M;
    type Case<'a> = (M, String, Uuid, Option<&'a str>, StatusCode, &'a str);
    let cases: Vec<Case> = vec![
        (
            M::GET,
            "/v1/projects/missing".into(),
            fx.owner,
            None,
            StatusCode::NOT_FOUND,
            "unknown project",
        ),
        (
            M::GET,
            "/v1/projects/other".into(),
            fx.owner,
            None,
            StatusCode::FORBIDDEN,
            "not a member of B",
        ),
        (
            M::POST,
            format!("/v1/organizations/{}/projects", Uuid::new_v4()),
            fx.owner,
            None,
            StatusCode::NOT_FOUND,
            "unknown org",
        ),
        (
            M::POST,
            "/v1/organizations/not-a-uuid/projects".into(),
            fx.owner,
            None,
            StatusCode::NOT_FOUND,
            "malformed org",
        ),
        (
            M::POST,
            format!("/v1/organizations/{}/projects", fx.org_a),
            fx.developer,
            None,
            StatusCode::FORBIDDEN,
            "developer creates",
        ),
        (
            M::POST,
            format!("/v1/organizations/{}/projects", fx.org_a),
            fx.admin,
            None,
            StatusCode::OK,
            "admin creates",
        ),
        (
            M::POST,
            "/v1/projects/alpha/api-keys/rotate".into(),
            fx.developer,
            None,
            StatusCode::FORBIDDEN,
            "developer rotates",
        ),
        (
            M::POST,
            "/v1/projects/alpha/api-keys/rotate".into(),
            fx.owner,
            None,
            StatusCode::OK,
            "owner rotates",
        ),
        (
            M::GET,
            "/v1/projects/alpha/logs".into(),
            fx.reader,
            None,
            StatusCode::OK,
            "reader reads",
        ),
        (
            M::POST,
            "/v1/db/sql".into(),
            fx.reader,
            Some("alpha"),
            StatusCode::FORBIDDEN,
            "reader writes",
        ),
        (
            M::GET,
            "/v1/db/todos".into(),
            fx.developer,
            None,
            StatusCode::BAD_REQUEST,
            "service route without project",
        ),
        (
            M::GET,
            "/v1/db/todos".into(),
            fx.developer,
            Some("alpha"),
            StatusCode::OK,
            "service route with project",
        ),
        (
            M::GET,
            "/v1/db/todos".into(),
            fx.developer,
            Some("nope"),
            StatusCode::NOT_FOUND,
            "service route, unknown project",
        ),
    ];
    for (method, path, user, project, status, what) in cases {
        let r = send(method, &path, user, project).await.expect("r");
        assert_eq!(r.status(), status, "{what}");
    }
}
