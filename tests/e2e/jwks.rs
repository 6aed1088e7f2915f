//! User JWTs signed with RS256 and ES256 keys from a JWKS, algorithm confusion, and a JWKS
//! fetch that hangs without holding a request.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use reqwest::StatusCode;
use serde_json::json;
use uuid::Uuid;

use crate::support::builder::Gateway;
use crate::support::call::{Call, IntoCall};
use crate::support::fixture::{Fixture, epoch};
use crate::support::responder::reply;
use crate::support::upstream::Recorder;

fn fixture(name: &str) -> Vec<u8> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Serves the fixture JWKS, counting fetches.
async fn jwks_server() -> (String, Arc<AtomicUsize>) {
    let fetches = Arc::new(AtomicUsize::new(0));
    let count = fetches.clone();
    let body = fixture("jwks.json");
    let jwks = axum::routing::get(move || {
        count.fetch_add(1, Ordering::SeqCst);
        let body = body.clone();
        async move { ([("content-type", "application/json")], body) }
    });
    let app = axum::Router::new().route("/jwks.json", jwks);
    let addr = crate::support::upstream::serve_http(app).await;
    (format!("http://{addr}/jwks.json"), fetches)
}

fn sign(alg: Algorithm, kid: &str, key: &EncodingKey, claims: serde_json::Value) -> String {
    let mut header = Header::new(alg);
    header.kid = Some(kid.to_owned());
    jsonwebtoken::encode(&header, &claims, key).expect("sign")
}

#[tokio::test]
async fn rs256_and_es256_tokens_verify_against_the_jwks_and_confusion_is_refused() {
    let (jwks_url, fetches) = jwks_server().await;
    let fx = Fixture::new();
    let gw = Gateway::with(|c| {
        let jwt = &mut c.auth.user_jwt;
        (jwt.hs256_secret, jwt.jwks_url) = (None, Some(jwks_url));
        jwt.jwks_refresh_cooldown_secs = Some(3);
    });
    let gw = gw.fixture(&fx).start().await;
    let role = |e: serde_json::Value| {
        let role = e["actor"]["role"].as_str().unwrap_or_default().to_owned();
        reply(200, &[], role.as_bytes())
    };
    let _auth = gw.bus.respond("auth", role).await;
    let client = reqwest::Client::new();
    let call = |token: String| {
        let user = client
            .get(gw.data_url("/v1/auth/user"))
            .call()
            .key(&fx.anon_key);
        user.bearer(token).read()
    };
    let claims = json!({ "sub": Uuid::new_v4().to_string(), "aud": "authenticated", "ref": "alpha", "exp": epoch() + 600 });
    let rsa = EncodingKey::from_rsa_pem(&fixture("rsa_private.pem")).expect("rsa key");
    let ec = EncodingKey::from_ec_pem(&fixture("ec_private.pem")).expect("ec key");

    let r = call(sign(Algorithm::RS256, "rsa-1", &rsa, claims.clone())).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.text(), "authenticated");
    let r = call(sign(Algorithm::ES256, "ec-1", &ec, claims.clone())).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(fetches.load(Ordering::SeqCst), 1, "the JWKS is cached");

    // The classic confusion: HS256 with the RSA public key as the shared secret.
    let public_as_secret = EncodingKey::from_secret(&fixture("rsa_public.pem")).expect("secret");
    let forged = sign(Algorithm::HS256, "rsa-1", &public_as_secret, claims.clone());
    assert_eq!(call(forged).await.status, StatusCode::UNAUTHORIZED);
    // A key of one type named for the other algorithm.
    let swapped = sign(Algorithm::ES256, "rsa-1", &ec, claims.clone());
    assert_eq!(call(swapped).await.status, StatusCode::UNAUTHORIZED);
    // alg none.
    let header = base64_url(br#"{"alg":"none","typ":"JWT"}"#);
    let none = format!("{header}.{}.", base64_url(claims.to_string().as_bytes()));
    assert_eq!(call(none).await.status, StatusCode::UNAUTHORIZED);

    // Unknown kids refetch the set at most once per cooldown (3 s here). The first fetch was
    // made when the gateway started: past its cooldown, the first unknown kid refetches, and the
    // ones right after it may not. (Without the wait, the cooldown could end between the first
    // unknown kid and the next, on a loaded machine.)
    tokio::time::sleep(std::time::Duration::from_millis(3_100)).await;
    let unknown_kid = async || {
        let rotated = sign(Algorithm::RS256, "rsa-rotated", &rsa, claims.clone());
        assert_eq!(call(rotated).await.status, StatusCode::UNAUTHORIZED);
    };
    let fetched = || fetches.load(Ordering::SeqCst);
    let before = fetched();
    unknown_kid().await;
    let after_first = fetched();
    assert_eq!(
        after_first,
        before + 1,
        "an unknown kid past the cooldown refetches"
    );
    for _ in 0..3 {
        unknown_kid().await;
    }
    assert_eq!(
        fetched(),
        after_first,
        "within the cooldown of the last fetch"
    );
    tokio::time::sleep(std::time::Duration::from_millis(3_100)).await;
    for _ in 0..5 {
        unknown_kid().await;
    }
    let refetched = fetched();
    assert_eq!(
        refetched,
        after_first + 1,
        "one refetch for the unknown kid, then the cooldown"
    );
    let r = call(sign(Algorithm::RS256, "rsa-1", &rsa, claims.clone())).await;
    assert_eq!(r.status, StatusCode::OK, "known keys keep working");
}

fn base64_url(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

#[tokio::test]
async fn a_slow_jwks_fetch_never_holds_a_request() {
    use jsonwebtoken::{Algorithm, EncodingKey, Header};
    let fixture = |name: &str| {
        let path = format!("{}/../tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
        std::fs::read(path).expect("fixture")
    };
    let jwks: serde_json::Value =
        serde_json::from_slice(&fixture("jwks.json")).expect("jwks fixture");
    let fetches = Arc::new(AtomicUsize::new(0));
    let count = fetches.clone();
    let serve_jwks = axum::routing::get(move || {
        let n = count.fetch_add(1, Ordering::SeqCst);
        let jwks = jwks.clone();
        async move {
            if n > 0 {
                // Every fetch after the first hangs.
                tokio::time::sleep(Duration::from_secs(30)).await;
            }
            axum::Json(jwks)
        }
    });
    let app = axum::Router::new().route("/jwks.json", serve_jwks);
    let addr = crate::support::upstream::serve_http(app).await;
    let fx = Fixture::new();
    let storage = Recorder::start().await;
    let gw = Gateway::with(|c| c.upstreams.storage_url = Some(storage.url.clone()))
        .with(|c| {
            let jwt = &mut c.auth.user_jwt;
            jwt.jwks_url = Some(format!("http://{addr}/jwks.json"));
            (jwt.jwks_max_age_secs, jwt.jwks_refresh_cooldown_secs) = (Some(1), Some(1));
        })
        .fixture(&fx)
        .start()
        .await;
    let rsa = EncodingKey::from_rsa_pem(&fixture("rsa_private.pem")).expect("rsa key");
    let mut header = Header::new(Algorithm::RS256);
    header.kid = Some("rsa-1".into());
    let token = jsonwebtoken::encode(
        &header,
        &json!({ "sub": Uuid::new_v4().to_string(), "aud": "authenticated", "ref": "alpha", "exp": crate::support::fixture::epoch() + 600 }),
        &rsa,
    )
    .expect("token");
    let call = || {
        let object = Call::get(gw.data_url("/v1/storage/object/x")).key(&fx.anon_key);
        object.bearer(&token).status()
    };
    assert_eq!(call().await, StatusCode::OK);
    // The set is now stale: the next fetch starts and hangs; requests keep the last good keys.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let mut slowest = Duration::ZERO;
    for _ in 0..5 {
        let started = Instant::now();
        assert_eq!(call().await, StatusCode::OK);
        slowest = slowest.max(started.elapsed());
    }
    println!("slowest request while the JWKS fetch hangs: {slowest:?}");
    assert!(fetches.load(Ordering::SeqCst) >= 2, "a refresh was started");
    let waited = slowest >= Duration::from_secs(1);
    assert!(!waited, "a request waited for the fetch: {slowest:?}");
}
