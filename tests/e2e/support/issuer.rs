//! A test identity provider: an HTTPS server (certificate from the test's own CA) serving an
//! OIDC discovery document and a JWKS, counting fetches, whose behaviour a test changes while
//! the gateway runs — rotated keys, down, slow, huge, thousands of keys, keys elsewhere.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};

use super::pki::Pki;
use super::upstream::serve_https;

/// An ES256 signing key and its public JWK.
#[derive(Clone)]
pub struct TestKey {
    pub kid: String,
    encoding: EncodingKey,
    pub jwk: Value,
}

impl TestKey {
    /// A new P-256 key named `kid`.
    pub fn ec(kid: &str) -> Self {
        // rcgen's default: ECDSA on P-256.
        let pair = rcgen::KeyPair::generate().expect("key");
        let encoding = EncodingKey::from_ec_pem(pair.serialize_pem().as_bytes()).expect("pem");
        let public = jsonwebtoken::jwk::Jwk::from_encoding_key(&encoding, Algorithm::ES256)
            .expect("public key");
        let mut jwk = serde_json::to_value(&public).expect("jwk");
        jwk["kid"] = json!(kid);
        jwk["use"] = json!("sig");
        Self {
            kid: kid.to_owned(),
            encoding,
            jwk,
        }
    }

    /// `claims` signed with this key, its `kid` in the header.
    pub fn sign(&self, claims: &Value) -> String {
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some(self.kid.clone());
        jsonwebtoken::encode(&header, claims, &self.encoding).expect("sign")
    }

    /// The JWKS holding this key alone.
    pub fn jwks(&self) -> Value {
        json!({ "keys": [self.jwk] })
    }
}

/// How the issuer answers.
#[derive(Debug, Clone)]
pub enum Mode {
    Normal,
    /// `503` to everything.
    Down,
    /// Accepts, never answers.
    Hang,
    /// The JWKS trickles one byte every 100 ms.
    Slow,
    /// A JWKS of this many bytes, chunked, without a length.
    HugeChunked(usize),
    /// A `Content-Length` of this many bytes (and a few bytes sent).
    HugeDeclared(u64),
    /// A JWKS of this many keys.
    ManyKeys(usize),
    /// Discovery names this `jwks_uri`.
    JwksAt(String),
    /// Discovery names this `issuer`.
    DiscoveryIssuer(String),
    /// The JWKS answers a redirect to this URL.
    Redirect(String),
}

struct Inner {
    keys: Mutex<Vec<TestKey>>,
    mode: Mutex<Mode>,
    url: Mutex<String>,
    discovery: AtomicUsize,
    jwks: AtomicUsize,
}

/// The identity provider.
#[derive(Clone)]
pub struct TestIssuer {
    /// `https://127.0.0.1:{port}`: its `iss`, and where discovery starts.
    pub url: String,
    inner: Arc<Inner>,
}

impl TestIssuer {
    /// Starts it with `keys`, over `pki`'s server certificate.
    pub async fn start(pki: &Pki, keys: &[TestKey]) -> Self {
        let inner = Arc::new(Inner {
            keys: Mutex::new(keys.to_vec()),
            mode: Mutex::new(Mode::Normal),
            url: Mutex::new(String::new()),
            discovery: AtomicUsize::new(0),
            jwks: AtomicUsize::new(0),
        });
        let app = Router::new()
            .route(
                "/.well-known/openid-configuration",
                axum::routing::get(discovery),
            )
            .route("/jwks.json", axum::routing::get(jwks))
            .with_state(inner.clone());
        let port = serve_https(app, pki.rustls_server(false)).await;
        let url = format!("https://127.0.0.1:{port}");
        *inner.url.lock().expect("lock") = url.clone();
        Self { url, inner }
    }

    /// Its JWKS URL.
    pub fn jwks_url(&self) -> String {
        format!("{}/jwks.json", self.url)
    }

    pub fn set_mode(&self, mode: Mode) {
        *self.inner.mode.lock().expect("lock") = mode;
    }

    /// Publishes `keys` instead.
    pub fn rotate(&self, keys: &[TestKey]) {
        *self.inner.keys.lock().expect("lock") = keys.to_vec();
    }

    /// Discovery documents served.
    pub fn discovery_fetches(&self) -> usize {
        self.inner.discovery.load(Ordering::SeqCst)
    }

    /// JWKS served (or begun).
    pub fn jwks_fetches(&self) -> usize {
        self.inner.jwks.load(Ordering::SeqCst)
    }

    /// A token of this issuer signed by `key`: `iss` set, `sub`, `aud` and `exp` unless given.
    pub fn token(&self, key: &TestKey, claims: Value) -> String {
        let mut all = json!({
            "iss": self.url,
            "sub": uuid::Uuid::new_v4().to_string(),
            "aud": "my-api",
            "exp": super::fixture::epoch() + 600,
        });
        for (name, value) in claims.as_object().expect("an object") {
            all[name] = value.clone();
        }
        key.sign(&all)
    }
}

fn json_response(value: &Value) -> Response {
    ([("content-type", "application/json")], value.to_string()).into_response()
}

async fn discovery(State(inner): State<Arc<Inner>>) -> Response {
    inner.discovery.fetch_add(1, Ordering::SeqCst);
    let mode = inner.mode.lock().expect("lock").clone();
    let url = inner.url.lock().expect("lock").clone();
    let (issuer, jwks_uri) = match mode {
        Mode::Down => return http::StatusCode::SERVICE_UNAVAILABLE.into_response(),
        Mode::Hang => return std::future::pending().await,
        Mode::JwksAt(at) => (url.clone(), at),
        Mode::DiscoveryIssuer(issuer) => (issuer, format!("{url}/jwks.json")),
        _ => (url.clone(), format!("{url}/jwks.json")),
    };
    json_response(
        &json!({ "issuer": issuer, "jwks_uri": jwks_uri, "id_token_signing_alg_values_supported": ["ES256"] }),
    )
}

async fn jwks(State(inner): State<Arc<Inner>>) -> Response {
    inner.jwks.fetch_add(1, Ordering::SeqCst);
    let mode = inner.mode.lock().expect("lock").clone();
    let keys: Vec<Value> = inner
        .keys
        .lock()
        .expect("lock")
        .iter()
        .map(|k| k.jwk.clone())
        .collect();
    match mode {
        Mode::Down => http::StatusCode::SERVICE_UNAVAILABLE.into_response(),
        Mode::Hang => std::future::pending().await,
        Mode::Slow => {
            let body = json!({ "keys": keys }).to_string().into_bytes();
            let stream = futures::stream::unfold(0usize, move |at| {
                let body = body.clone();
                async move {
                    if at >= body.len() {
                        return None;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    Some((Ok::<_, std::io::Error>(vec![body[at]]), at + 1))
                }
            });
            (
                [("content-type", "application/json")],
                Body::from_stream(stream),
            )
                .into_response()
        }
        Mode::HugeChunked(bytes) => {
            let chunk = vec![b' '; 64 * 1024];
            let chunks = bytes.div_ceil(chunk.len());
            let stream = futures::stream::iter(
                (0..chunks).map(move |_| Ok::<_, std::io::Error>(chunk.clone())),
            );
            (
                [("content-type", "application/json")],
                Body::from_stream(stream),
            )
                .into_response()
        }
        Mode::HugeDeclared(bytes) => Response::builder()
            .header("content-type", "application/json")
            .header("content-length", bytes.to_string())
            // The head and a few bytes, then nothing: whoever waits for the rest waits forever.
            .body(Body::from_stream(futures::StreamExt::chain(
                futures::stream::once(async { Ok::<_, std::io::Error>(b"{\"keys\":[".to_vec()) }),
                futures::stream::pending(),
            )))
            .expect("response"),
        Mode::ManyKeys(n) => {
            let one = keys.first().cloned().unwrap_or(Value::Null);
            let many: Vec<Value> = (0..n)
                .map(|i| {
                    let mut key = one.clone();
                    key["kid"] = json!(format!("k{i}"));
                    key
                })
                .collect();
            json_response(&json!({ "keys": many }))
        }
        Mode::Redirect(to) => Response::builder()
            .status(http::StatusCode::FOUND)
            .header("location", to)
            .body(Body::empty())
            .expect("response"),
        _ => json_response(&json!({ "keys": keys })),
    }
}

/// A listener on `ip` that accepts and counts connections and never answers: where the
/// gateway must never connect.
pub struct CountingListener {
    pub port: u16,
    accepted: Arc<AtomicUsize>,
}

impl CountingListener {
    pub async fn start(ip: &str) -> Self {
        let listener = tokio::net::TcpListener::bind((ip, 0)).await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                held.push(socket);
            }
        });
        Self { port, accepted }
    }

    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}
