//! Hostile credentials: thousands of random, malformed or guessed keys and tokens. None is
//! accepted, the store sees each distinct key at most once per cache period, and no key or token
//! text reaches the logs, the real binary's at debug level included.

use std::sync::Arc;
use std::time::Duration;

use aura_gateway::planes::build_data_plane_router;
use aura_gateway::state::AppState;
use axum::body::Body;
use http::{Request, StatusCode};
use serde_json::json;
use tower::ServiceExt;

use crate::support::call::IntoCall;
use crate::support::config::{example, test_config, write_config};
use crate::support::fixture::{CountingStore, Fixture, USER_SECRET, epoch, hs256};
use crate::support::gateway::Process;

/// A small deterministic generator (xorshift64*), so failures can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn pick<'a>(&mut self, items: &'a [&'a str]) -> &'a str {
        items[(self.next() % items.len() as u64) as usize]
    }

    fn string(&mut self, len: usize, alphabet: &[u8]) -> String {
        (0..len)
            .map(|_| alphabet[(self.next() % alphabet.len() as u64) as usize] as char)
            .collect()
    }
}

const URL_SAFE: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

#[tokio::test]
async fn ten_thousand_bad_keys_and_tokens_are_all_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fx = Fixture::new();
    let counting = Arc::new(CountingStore::new(Arc::new(fx.file_store(dir.path()))));
    let state = AppState::build_with_store(
        test_config("nats://127.0.0.1:1", "hostile"),
        None,
        counting.clone(),
    )
    .await
    .expect("state");
    let router = build_data_plane_router(state);
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let send = |request: Request<Body>| router.clone().oneshot(request);

    // 10,000 key attempts over 5,000 distinct keys: guessed, malformed, near misses.
    let mut keys = Vec::new();
    for i in 0..5_000 {
        let key = match i % 6 {
            0 => format!("aura_pk_{}", rng.string(43, URL_SAFE)),
            1 => format!("aura_sk_{}", rng.string(43, URL_SAFE)),
            2 => {
                // One character off a real key.
                let mut k = fx.anon_key.clone().into_bytes();
                let at = 8 + (rng.next() as usize % (k.len() - 8));
                k[at] = if k[at] == b'a' { b'b' } else { b'a' };
                String::from_utf8(k).expect("ascii")
            }
            3 => {
                let len = 1 + (rng.next() % 200) as usize;
                rng.string(len, URL_SAFE)
            }
            4 => format!("{}{}", fx.anon_key, rng.string(3, URL_SAFE)),
            _ => rng
                .pick(&[
                    "",
                    " ",
                    "null",
                    "undefined",
                    "Bearer x",
                    "aura_pk_",
                    "%00",
                    "\u{7f}",
                ])
                .to_owned(),
        };
        keys.push(key);
    }
    let mut attempts = 0;
    for key in keys.iter().chain(keys.iter()) {
        let header = rng.pick(&["apikey", "x-api-key"]);
        let Ok(request) = Request::get("/v1/auth/user")
            .header(header, key.as_str())
            .body(Body::empty())
        else {
            continue; // not even a valid header value
        };
        let response = send(request).await.expect("infallible");
        assert_eq!(
            response.status(),
            StatusCode::UNAUTHORIZED,
            "key {key:?} was accepted"
        );
        attempts += 1;
    }
    assert!(attempts > 9_000, "{attempts}");
    assert!(
        counting.max_lookups_of_one_key() <= 1,
        "a distinct key reached the store {} times",
        counting.max_lookups_of_one_key()
    );

    // 10,000 token mutants with a valid key.
    let sub = uuid::Uuid::new_v4().to_string();
    let valid = hs256(
        USER_SECRET,
        json!({"sub": sub, "aud": "authenticated", "ref": "alpha", "exp": epoch() + 600}),
    );
    let mut tokens = Vec::new();
    for i in 0..10_000 {
        let token = match i % 10 {
            0 => {
                // Flip one character of a valid token (header, payload or signature).
                let mut t = valid.clone().into_bytes();
                let at = rng.next() as usize % t.len();
                let c = t[at];
                t[at] = if c == b'A' { b'B' } else { b'A' };
                String::from_utf8(t).expect("ascii")
            }
            1 => hs256(
                USER_SECRET,
                json!({"sub": sub, "aud": "authenticated", "ref": "other", "exp": epoch() + 600}),
            ),
            2 => hs256(
                USER_SECRET,
                json!({"sub": sub, "aud": "authenticated", "ref": "alpha", "exp": epoch() - 60 - (rng.next() % 100_000)}),
            ),
            3 => hs256(
                USER_SECRET,
                json!({"sub": sub, "aud": rng.pick(&["anon", "authenticatedx", "aurabase-control", ""]), "ref": "alpha", "exp": epoch() + 600}),
            ),
            4 => hs256(
                USER_SECRET,
                json!({"sub": sub, "aud": ["authenticated", "other"], "ref": "alpha", "exp": epoch() + 600}),
            ),
            5 => hs256(
                USER_SECRET,
                json!({"sub": 42, "aud": "authenticated", "ref": "alpha", "exp": "tomorrow"}),
            ),
            6 => format!(
                "{}.{}.{}",
                rng.string(20, URL_SAFE),
                rng.string(60, URL_SAFE),
                rng.string(43, URL_SAFE)
            ),
            7 => format!("eyJhbGciOiJub25lIn0.{}.", rng.string(80, URL_SAFE)),
            // Algorithm swap: properly signed with the secret, under an algorithm not accepted.
            8 => {
                let alg = *[
                    jsonwebtoken::Algorithm::HS384,
                    jsonwebtoken::Algorithm::HS512,
                ]
                .get(rng.next() as usize % 2)
                .expect("alg");
                jsonwebtoken::encode(
                    &jsonwebtoken::Header::new(alg),
                    &json!({"sub": sub, "aud": "authenticated", "ref": "alpha", "exp": epoch() + 600}),
                    &jsonwebtoken::EncodingKey::from_secret(USER_SECRET.as_bytes()).expect("key"),
                )
                .expect("token")
            }
            // Oversized but otherwise valid.
            _ => hs256(
                USER_SECRET,
                json!({"sub": sub, "aud": "authenticated", "ref": "alpha", "exp": epoch() + 600,
                       "pad": rng.string(9_000, URL_SAFE)}),
            ),
        };
        if token == valid {
            continue;
        }
        tokens.push(token);
    }
    tokens.push("x".repeat(20_000));
    assert!(tokens.len() > 9_900, "{}", tokens.len());
    for token in &tokens {
        let request = Request::get("/v1/auth/user")
            .header("apikey", fx.anon_key.as_str())
            .header("authorization", format!("Bearer {token}"))
            .body(Body::empty())
            .expect("request");
        let response = send(request).await.expect("infallible");
        assert_eq!(
            response.status(),
            StatusCode::UNAUTHORIZED,
            "token {token:?} was accepted"
        );
    }
}

#[tokio::test]
async fn no_key_or_token_text_reaches_the_log_even_at_debug_level() {
    let dir = tempfile::tempdir().expect("tempdir");
    let example_control = example("control/local.toml");
    std::fs::copy(example_control, dir.path().join("control.toml"))
        .expect("copy the example control file");
    let nats = crate::support::nats_server::shared().url();
    let path = write_config(
        dir.path(),
        &format!(
            "[nats]\nurl = {nats:?}\n[control]\nfile = \"control.toml\"\n\
             [auth.user_jwt]\nhs256_secret = \"binary-user-jwt-secret-0123456789abcdef\"\n\
             [log]\nlevel = \"debug\"\nformat = \"json\"\n",
        ),
    );
    let gw = Process::serve(&path, dir.path());
    let client = reqwest::Client::new();
    let f = || client.get(gw.data_url("/v1/functions/f")).call();
    let demo = "aura_pk_localdemo_0123456789abcdefghijklmnopqrstuv";
    let mut secrets = Vec::new();
    for i in 0..200 {
        let guess = format!("aura_sk_guess{i:04}_{}", uuid::Uuid::new_v4().simple());
        let header = if i % 2 == 0 { "apikey" } else { "x-api-key" };
        assert_eq!(
            f().header(header, &guess).status().await,
            StatusCode::UNAUTHORIZED
        );
        let id = uuid::Uuid::new_v4().simple();
        let token = format!("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ{i:04}{id}.c2lnbmF0dXJl");
        let with_token = f().key(demo).bearer(&token);
        assert_eq!(with_token.status().await, StatusCode::UNAUTHORIZED);
        secrets.push(guess);
        secrets.push(token);
    }
    // A real key, used: still never logged.
    let health = client.get(gw.data_url("/health")).call().key(demo);
    assert_eq!(health.status().await, StatusCode::OK);
    secrets.push(demo.to_owned());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let log = gw.log_text();
    let lines = log.lines().count();
    assert!(lines > 400, "the debug log was written ({lines} lines)");
    for secret in &secrets {
        assert!(!log.contains(secret.as_str()), "{secret} is in the log");
        let body = &secret[8..];
        assert!(!log.contains(body), "part of {secret} is in the log");
    }
}
