//! JWT verification for user tokens (data plane) and console tokens (management plane).
//!
//! Algorithms come from configuration, never from the token: the token's `alg` must be one of
//! the configured ones, HS256 tokens are only checked against the shared secret and RS256/ES256
//! tokens only against JWKS keys of the matching type. `exp` is required, leeway is explicit,
//! and `aud` is checked for exactness here (a missing `aud`, another value, or an array holding
//! anything else is refused).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use tokio::time::Instant;

use crate::config::JwtConfig;

/// Longest token accepted; longer ones are refused before parsing.
pub const MAX_TOKEN_LEN: usize = 8 * 1024;

/// Why a token was refused. The message never contains the token.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct JwtError(pub String);

fn refuse(message: impl Into<String>) -> JwtError {
    JwtError(message.into())
}

/// The claims the gateway uses from a verified token.
#[derive(Debug, Clone)]
pub struct Verified {
    /// `sub`.
    pub subject: String,
    /// The `ref` claim, when present.
    pub project_ref: Option<String>,
    /// Every claim of the token.
    pub claims: std::sync::Arc<serde_json::Value>,
}

/// Verifies one kind of token.
#[derive(Debug)]
pub struct JwtVerifier {
    audience: &'static str,
    leeway: u64,
    algorithms: Vec<Algorithm>,
    hs256: Option<DecodingKey>,
    jwks: Option<Jwks>,
}

fn parse_algorithm(name: &str) -> Option<Algorithm> {
    match name {
        "HS256" => Some(Algorithm::HS256),
        "RS256" => Some(Algorithm::RS256),
        "ES256" => Some(Algorithm::ES256),
        _ => None,
    }
}

impl JwtVerifier {
    /// A verifier for tokens whose `aud` must be exactly `audience`. `None` when the
    /// configuration holds no key material (every token is then refused by the caller).
    pub fn new(config: &JwtConfig, audience: &'static str, leeway: Duration) -> Option<Self> {
        if !config.is_configured() {
            return None;
        }
        Some(Self {
            audience,
            leeway: leeway.as_secs(),
            algorithms: config
                .effective_algorithms()
                .iter()
                .filter_map(|a| parse_algorithm(a))
                .collect(),
            hs256: config
                .hs256_secret
                .as_ref()
                .and_then(|s| DecodingKey::from_secret(s.as_bytes()).ok()),
            jwks: config.jwks_url.as_ref().map(|url| {
                Jwks::new(
                    url.clone(),
                    Duration::from_secs(config.jwks_refresh_cooldown_secs.unwrap_or(30)),
                    Duration::from_secs(config.jwks_max_age_secs.unwrap_or(600)),
                    Duration::from_millis(config.jwks_unknown_kid_wait_ms.unwrap_or(500)),
                )
            }),
        })
    }

    /// Verifies `token`: signature, algorithm, `exp` (required), `nbf`, `aud` (exact), `sub`.
    pub async fn verify(&self, token: &str) -> Result<Verified, JwtError> {
        if token.len() > MAX_TOKEN_LEN {
            return Err(refuse("token too large"));
        }
        let header = jsonwebtoken::decode_header(token).map_err(|_| refuse("malformed token"))?;
        let alg = header.alg;
        if !self.algorithms.contains(&alg) {
            return Err(refuse(format!("algorithm {alg:?} is not accepted")));
        }
        let key = match alg {
            Algorithm::HS256 => self
                .hs256
                .clone()
                .ok_or_else(|| refuse("HS256 is not accepted"))?,
            Algorithm::RS256 | Algorithm::ES256 => {
                let jwks = self
                    .jwks
                    .as_ref()
                    .ok_or_else(|| refuse(format!("{alg:?} is not accepted")))?;
                jwks.key(header.kid.as_deref(), alg).await?
            }
            _ => return Err(refuse(format!("algorithm {alg:?} is not accepted"))),
        };
        let mut validation = Validation::new(alg);
        validation.algorithms = vec![alg];
        validation.leeway = self.leeway;
        validation.validate_exp = true;
        validation.validate_nbf = true;
        // `aud` is checked below, exactly; jsonwebtoken accepts an array with any match.
        validation.validate_aud = false;
        validation.set_required_spec_claims(&["exp", "sub"]);
        let data = jsonwebtoken::decode::<serde_json::Value>(token, &key, &validation)
            .map_err(|e| refuse(format!("invalid token: {}", describe(&e))))?;
        let claims = data.claims;
        self.check_audience(&claims)?;
        let subject = claims
            .get("sub")
            .and_then(|s| s.as_str())
            .filter(|s| !s.is_empty())
            .ok_or_else(|| refuse("the sub claim must be a non-empty string"))?
            .to_owned();
        let project_ref = match claims.get("ref") {
            None | Some(serde_json::Value::Null) => None,
            Some(serde_json::Value::String(r)) => Some(r.clone()),
            Some(_) => return Err(refuse("the ref claim must be a string")),
        };
        Ok(Verified {
            subject,
            project_ref,
            claims: std::sync::Arc::new(claims),
        })
    }

    fn check_audience(&self, claims: &serde_json::Value) -> Result<(), JwtError> {
        let ok = match claims.get("aud") {
            Some(serde_json::Value::String(aud)) => aud == self.audience,
            Some(serde_json::Value::Array(list)) => {
                !list.is_empty() && list.iter().all(|a| a.as_str() == Some(self.audience))
            }
            _ => false,
        };
        if ok {
            Ok(())
        } else {
            Err(refuse(format!(
                "the aud claim must be exactly {:?}",
                self.audience
            )))
        }
    }
}

fn describe(e: &jsonwebtoken::errors::Error) -> &'static str {
    use jsonwebtoken::errors::ErrorKind;
    match e.kind() {
        ErrorKind::ExpiredSignature => "expired",
        ErrorKind::ImmatureSignature => "not yet valid",
        ErrorKind::InvalidSignature => "bad signature",
        ErrorKind::InvalidAlgorithm => "algorithm mismatch",
        ErrorKind::MissingRequiredClaim(_) => "a required claim is missing",
        ErrorKind::Json(_) | ErrorKind::Base64(_) | ErrorKind::Utf8(_) => "malformed claims",
        _ => "rejected",
    }
}

/// Keys of a JWKS by `kid`.
#[derive(Default)]
struct KeySet {
    keys: HashMap<String, Vec<(Algorithm, DecodingKey)>>,
    unnamed: Vec<(Algorithm, DecodingKey)>,
    fetched_at: Option<Instant>,
}

/// A JWKS, fetched off the request path: first when the verifier is created, then in the
/// background when older than `max_age` or when a token names an unknown `kid` — at most once
/// per `cooldown` either way. Requests always verify against the last good set, and never wait
/// for a fetch, except a token whose `kid` is unknown (or any token before the first set
/// arrived): it waits for the fetch in progress at most `unknown_kid_wait`. A failed or slow
/// fetch leaves the last good set in force.
pub struct Jwks {
    inner: Arc<JwksInner>,
}

struct JwksInner {
    url: String,
    client: reqwest::Client,
    cooldown: Duration,
    max_age: Duration,
    unknown_kid_wait: Duration,
    keys: arc_swap::ArcSwap<KeySet>,
    /// When the last fetch started, and whether one is running.
    fetching: std::sync::Mutex<(Option<Instant>, bool)>,
    /// Bumped after every fetch, good or not.
    fetched: tokio::sync::watch::Sender<u64>,
}

impl std::fmt::Debug for Jwks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Jwks")
            .field("url", &self.inner.url)
            .finish_non_exhaustive()
    }
}

impl Jwks {
    fn new(url: String, cooldown: Duration, max_age: Duration, unknown_kid_wait: Duration) -> Self {
        let this = Self {
            inner: Arc::new(JwksInner {
                url,
                client: reqwest::Client::builder()
                    .timeout(Duration::from_secs(5))
                    .build()
                    .unwrap_or_default(),
                cooldown,
                max_age,
                unknown_kid_wait,
                keys: arc_swap::ArcSwap::from_pointee(KeySet::default()),
                fetching: std::sync::Mutex::new((None, false)),
                fetched: tokio::sync::watch::channel(0).0,
            }),
        };
        // Fetched ahead of the first token when a runtime is there to run the fetch.
        this.start_fetch();
        this
    }

    /// Starts a background fetch unless one runs or the last started within the cooldown.
    /// Returns whether a fetch is running now.
    fn start_fetch(&self) -> bool {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return false;
        };
        {
            let mut fetching = self
                .inner
                .fetching
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if fetching.1 {
                return true;
            }
            if fetching
                .0
                .is_some_and(|at| at.elapsed() < self.inner.cooldown)
            {
                return false;
            }
            *fetching = (Some(Instant::now()), true);
        }
        let inner = self.inner.clone();
        runtime.spawn(async move {
            match inner.fetch().await {
                Ok(set) => inner.keys.store(Arc::new(set)),
                Err(e) => {
                    tracing::warn!(url = %inner.url, error = %e, "JWKS fetch failed; keeping the last good keys");
                }
            }
            inner
                .fetching
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .1 = false;
            inner.fetched.send_modify(|n| *n += 1);
        });
        true
    }

    async fn key(&self, kid: Option<&str>, alg: Algorithm) -> Result<DecodingKey, JwtError> {
        // Subscribed before looking, so that a fetch ending meanwhile is not missed.
        let mut fetched = self.inner.fetched.subscribe();
        let set = self.inner.keys.load_full();
        let stale = set
            .fetched_at
            .is_none_or(|at| at.elapsed() >= self.inner.max_age);
        if stale {
            self.start_fetch();
        }
        if let Some(key) = Self::find(&set, kid, alg) {
            return Ok(key);
        }
        // An unknown kid may be a rotated key: fetch (at most once per cooldown) and wait a
        // little for it; every other request keeps verifying meanwhile.
        if self.start_fetch() {
            let _ = tokio::time::timeout(self.inner.unknown_kid_wait, fetched.changed()).await;
        }
        let set = self.inner.keys.load_full();
        Self::find(&set, kid, alg).ok_or_else(|| refuse("no matching signing key"))
    }

    fn find(set: &KeySet, kid: Option<&str>, alg: Algorithm) -> Option<DecodingKey> {
        let candidates = match kid {
            Some(kid) => set.keys.get(kid)?,
            None => &set.unnamed,
        };
        candidates
            .iter()
            .find(|(a, _)| *a == alg)
            .map(|(_, k)| k.clone())
    }
}

impl JwksInner {
    async fn fetch(&self) -> Result<KeySet, String> {
        let response = self
            .client
            .get(&self.url)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        if !response.status().is_success() {
            return Err(format!("status {}", response.status()));
        }
        let set: JwkSet = response.json().await.map_err(|e| e.to_string())?;
        let mut keys = KeySet {
            fetched_at: Some(Instant::now()),
            ..KeySet::default()
        };
        for jwk in &set.keys {
            let alg = match &jwk.algorithm {
                AlgorithmParameters::RSA(_) => Algorithm::RS256,
                AlgorithmParameters::EllipticCurve(p) if p.curve == EllipticCurve::P256 => {
                    Algorithm::ES256
                }
                // Symmetric keys never come from a JWKS: HS256 uses the configured secret only.
                _ => continue,
            };
            let Ok(key) = DecodingKey::from_jwk(jwk) else {
                continue;
            };
            match &jwk.common.key_id {
                Some(kid) => keys.keys.entry(kid.clone()).or_default().push((alg, key)),
                None => keys.unnamed.push((alg, key)),
            }
        }
        Ok(keys)
    }
}
