//! User JWTs signed with RS256 and ES256 keys from a JWKS, and algorithm confusion.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use reqwest::StatusCode;
use serde_json::json;
use uuid::Uuid;

use crate::support::fixture::{Fixture, epoch};
use crate::support::gateway::{InProcess, test_config};
use crate::support::nats_server::shared;
use crate::support::responder::{Responder, reply};
use crate::support::unique_prefix;

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
    let app = axum::Router::new().route(
        "/jwks.json",
        axum::routing::get(move || {
            count.fetch_add(1, Ordering::SeqCst);
            let body = body.clone();
            async move { ([("content-type", "application/json")], body) }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
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
    let dir = tempfile::tempdir().expect("tempdir");
    let fx = Fixture::new();
    let nats = shared();
    let prefix = unique_prefix();
    let mut config = test_config(&nats.url(), &prefix);
    config.auth.user_jwt.hs256_secret = None;
    config.auth.user_jwt.jwks_url = Some(jwks_url);
    config.auth.user_jwt.jwks_refresh_cooldown_secs = Some(3);
    let gw = InProcess::start_with_store(config, Arc::new(fx.file_store(dir.path()))).await;
    let _auth = Responder::start(
        &nats.url(),
        &format!("{prefix}.auth.http"),
        std::time::Duration::ZERO,
        |e| {
            reply(
                200,
                &[],
                e["actor"]["role"].as_str().unwrap_or_default().as_bytes(),
            )
        },
    )
    .await;
    let client = reqwest::Client::new();
    let call = |token: String| {
        client
            .get(gw.data_url("/v1/auth/user"))
            .header("apikey", &fx.anon_key)
            .header("authorization", format!("Bearer {token}"))
            .send()
    };
    let claims = json!({ "sub": Uuid::new_v4().to_string(), "aud": "authenticated", "ref": "alpha", "exp": epoch() + 600 });
    let rsa = EncodingKey::from_rsa_pem(&fixture("rsa_private.pem")).expect("rsa key");
    let ec = EncodingKey::from_ec_pem(&fixture("ec_private.pem")).expect("ec key");

    let r = call(sign(Algorithm::RS256, "rsa-1", &rsa, claims.clone()))
        .await
        .expect("r");
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.text().await.expect("body"), "authenticated");
    let r = call(sign(Algorithm::ES256, "ec-1", &ec, claims.clone()))
        .await
        .expect("r");
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(fetches.load(Ordering::SeqCst), 1, "the JWKS is cached");

    // The classic confusion: HS256 with the RSA public key as the shared secret.
    let public_as_secret = EncodingKey::from_secret(&fixture("rsa_public.pem")).expect("secret");
    let forged = sign(Algorithm::HS256, "rsa-1", &public_as_secret, claims.clone());
    assert_eq!(
        call(forged).await.expect("r").status(),
        StatusCode::UNAUTHORIZED
    );
    // A key of one type named for the other algorithm.
    let swapped = sign(Algorithm::ES256, "rsa-1", &ec, claims.clone());
    assert_eq!(
        call(swapped).await.expect("r").status(),
        StatusCode::UNAUTHORIZED
    );
    // alg none.
    let none = format!(
        "{}.{}.",
        base64_url(br#"{"alg":"none","typ":"JWT"}"#),
        base64_url(claims.to_string().as_bytes())
    );
    assert_eq!(
        call(none).await.expect("r").status(),
        StatusCode::UNAUTHORIZED
    );

    // Unknown kids refetch the set at most once per cooldown (3 s here). The first fetch was
    // made when the gateway started: past its cooldown, the first unknown kid refetches, and the
    // ones right after it may not. (Without the wait, the cooldown could end between the first
    // unknown kid and the next, on a loaded machine.)
    tokio::time::sleep(std::time::Duration::from_millis(3_100)).await;
    let unknown_kid = || call(sign(Algorithm::RS256, "rsa-rotated", &rsa, claims.clone()));
    let before = fetches.load(Ordering::SeqCst);
    assert_eq!(
        unknown_kid().await.expect("r").status(),
        StatusCode::UNAUTHORIZED
    );
    let after_first = fetches.load(Ordering::SeqCst);
    assert_eq!(
        after_first,
        before + 1,
        "an unknown kid past the cooldown refetches"
    );
    for _ in 0..3 {
        assert_eq!(
            unknown_kid().await.expect("r").status(),
            StatusCode::UNAUTHORIZED
        );
    }
    assert_eq!(
        fetches.load(Ordering::SeqCst),
        after_first,
        "within the cooldown of the last fetch"
    );
    tokio::time::sleep(std::time::Duration::from_millis(3_100)).await;
    for _ in 0..5 {
        assert_eq!(
            unknown_kid().await.expect("r").status(),
            StatusCode::UNAUTHORIZED
        );
    }
    assert_eq!(
        fetches.load(Ordering::SeqCst),
        after_first + 1,
        "one refetch for the unknown kid, then the cooldown"
    );
    let r = call(sign(Algorithm::RS256, "rsa-1", &rsa, claims.clone()))
        .await
        .expect("r");
    assert_eq!(r.status(), StatusCode::OK, "known keys keep working");
}

fn base64_url(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}
