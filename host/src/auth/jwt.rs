//! JWT verification for user tokens (data plane) and console tokens (management plane).
//!
//! Algorithms come from configuration, never from the token: the token's `alg` must be one of
//! the configured ones, HS256 tokens are only checked against the shared secret and RS256/ES256
//! tokens only against JWKS keys of the matching type. `exp` is required, leeway is explicit,
//! and `aud` is checked for exactness here (a missing `aud`, another value, or an array holding
//! anything else is refused).

use std::time::Duration;

use jsonwebtoken::{Algorithm, DecodingKey, Validation};

use super::keyset::{FetchLimits, Fetching, Freshness, KeySource, Origin};
use crate::config::JwtConfig;

/// Longest token accepted; longer ones are refused before parsing.
pub const MAX_TOKEN_LEN: usize = 8 * 1024;

/// Why a token was refused: an outcome label for the metrics and a message that never
/// contains the token.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct JwtError {
    /// `malformed`, `algorithm`, `unknown_kid`, `bad_signature`, `expired`, `audience`,
    /// `issuer`, `claims`, `role`, `wrong_project` or `untrusted_issuer`.
    pub outcome: &'static str,
    pub message: String,
}

pub(crate) fn refuse(outcome: &'static str, message: impl Into<String>) -> JwtError {
    JwtError {
        outcome,
        message: message.into(),
    }
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

/// Bounds of the platform's JWKS (operator-set, so larger than a project issuer's).
const PLATFORM_LIMITS: FetchLimits = FetchLimits {
    timeout: Duration::from_secs(5),
    max_bytes: 1024 * 1024,
    max_keys: 256,
};

/// Verifies one kind of token.
#[derive(Debug)]
pub struct JwtVerifier {
    audience: &'static str,
    leeway: u64,
    algorithms: Vec<Algorithm>,
    issuer: Option<String>,
    hs256: Option<DecodingKey>,
    jwks: Option<KeySource>,
}

pub(crate) fn parse_algorithm(name: &str) -> Option<Algorithm> {
    match name {
        "HS256" => Some(Algorithm::HS256),
        "RS256" => Some(Algorithm::RS256),
        "ES256" => Some(Algorithm::ES256),
        _ => None,
    }
}

/// An HTTP client for key fetches: no redirects, no proxy, `timeout` over each request. The
/// caller gives its resolver (`dns_resolver`): the system's would take a blocking thread per
/// lookup.
pub(crate) fn fetch_client(timeout: Duration) -> reqwest::ClientBuilder {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .timeout(timeout)
        .connect_timeout(timeout)
}

/// What a token's header and `iss` say, read before anything is verified (for selection only).
#[derive(Debug)]
pub struct Peeked {
    pub alg: Algorithm,
    pub kid: Option<String>,
    pub iss: Option<String>,
}

/// Reads a token's header and, when `with_iss`, its `iss`, without verifying anything: which
/// keys to verify it with.
pub fn peek(token: &str, with_iss: bool) -> Result<Peeked, JwtError> {
    if token.len() > MAX_TOKEN_LEN {
        return Err(refuse("malformed", "token too large"));
    }
    let header =
        jsonwebtoken::decode_header(token).map_err(|_| refuse("malformed", "malformed token"))?;
    if !with_iss {
        return Ok(Peeked {
            alg: header.alg,
            kid: header.kid,
            iss: None,
        });
    }
    #[derive(serde::Deserialize)]
    struct Iss {
        #[serde(default)]
        iss: Option<serde_json::Value>,
    }
    let claims: Iss = jsonwebtoken::dangerous::insecure_decode_claims(token)
        .map_err(|_| refuse("malformed", "malformed token"))?;
    let iss = match claims.iss {
        None | Some(serde_json::Value::Null) => None,
        Some(serde_json::Value::String(iss)) => Some(iss),
        Some(_) => return Err(refuse("malformed", "the iss claim must be a string")),
    };
    Ok(Peeked {
        alg: header.alg,
        kid: header.kid,
        iss,
    })
}

/// Checks the signature with `key` for `alg`, `exp` (required), `nbf`, `sub` (required, a
/// non-empty string) and, when given, `iss` (exactly); the audience is the caller's to check.
pub(crate) fn validate(
    token: &str,
    key: &DecodingKey,
    alg: Algorithm,
    leeway: u64,
    issuer: Option<&str>,
) -> Result<serde_json::Value, JwtError> {
    let mut validation = Validation::new(alg);
    validation.algorithms = vec![alg];
    validation.leeway = leeway;
    validation.validate_exp = true;
    validation.validate_nbf = true;
    // `aud` is checked by the caller; jsonwebtoken accepts an array with any match.
    validation.validate_aud = false;
    let mut required = vec!["exp", "sub"];
    if let Some(issuer) = issuer {
        validation.set_issuer(&[issuer]);
        required.push("iss");
    }
    validation.set_required_spec_claims(&required);
    let data = jsonwebtoken::decode::<serde_json::Value>(token, key, &validation).map_err(|e| {
        let (outcome, what) = describe(&e);
        refuse(outcome, format!("invalid token: {what}"))
    })?;
    let claims = data.claims;
    claims
        .get("sub")
        .and_then(|s| s.as_str())
        .filter(|s| !s.is_empty())
        .ok_or_else(|| refuse("claims", "the sub claim must be a non-empty string"))?;
    Ok(claims)
}

/// The `ref` claim: absent, null or a string.
pub(crate) fn project_ref_claim(claims: &serde_json::Value) -> Result<Option<String>, JwtError> {
    match claims.get("ref") {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(r)) => Ok(Some(r.clone())),
        Some(_) => Err(refuse("claims", "the ref claim must be a string")),
    }
}

impl JwtVerifier {
    /// A verifier for tokens whose `aud` must be exactly `audience`, its JWKS host resolved
    /// with `resolver`. `None` when the configuration holds no key material (every token is
    /// then refused by the caller).
    pub fn new(
        config: &JwtConfig,
        audience: &'static str,
        leeway: Duration,
        resolver: &crate::dns::Resolver,
    ) -> Option<Self> {
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
            issuer: config.issuer.clone(),
            hs256: config
                .hs256_secret
                .as_ref()
                .and_then(|s| DecodingKey::from_secret(s.as_bytes()).ok()),
            jwks: config.jwks_url.as_ref().map(|url| {
                KeySource::new(
                    Origin::Url(url.clone()),
                    fetch_client(PLATFORM_LIMITS.timeout)
                        .dns_resolver(std::sync::Arc::new(
                            resolver.for_fetches(crate::dns::Purpose::Platform),
                        ))
                        .build()
                        .unwrap_or_default(),
                    PLATFORM_LIMITS,
                    Freshness {
                        cooldown: Duration::from_secs(
                            config.jwks_refresh_cooldown_secs.unwrap_or(30),
                        ),
                        max_age: Duration::from_secs(config.jwks_max_age_secs.unwrap_or(600)),
                        unknown_kid_wait: Duration::from_millis(
                            config.jwks_unknown_kid_wait_ms.unwrap_or(500),
                        ),
                        discovery_max_age: Duration::MAX,
                    },
                    Fetching::default(),
                )
                .started()
            }),
        })
    }

    /// The `iss` these tokens must carry, when configured.
    pub fn issuer(&self) -> Option<&str> {
        self.issuer.as_deref()
    }

    /// Verifies `token`: signature, algorithm, `exp` (required), `nbf`, `aud` (exact), `sub`,
    /// and `iss` when configured.
    pub async fn verify(&self, token: &str) -> Result<Verified, JwtError> {
        let peeked = peek(token, false)?;
        self.verify_peeked(token, &peeked).await
    }

    /// [`JwtVerifier::verify`] of a token already peeked.
    pub async fn verify_peeked(&self, token: &str, peeked: &Peeked) -> Result<Verified, JwtError> {
        let alg = peeked.alg;
        if !self.algorithms.contains(&alg) {
            return Err(refuse(
                "algorithm",
                format!("algorithm {alg:?} is not accepted"),
            ));
        }
        let key = match alg {
            Algorithm::HS256 => self
                .hs256
                .clone()
                .ok_or_else(|| refuse("algorithm", "HS256 is not accepted"))?,
            Algorithm::RS256 | Algorithm::ES256 => {
                let jwks = self
                    .jwks
                    .as_ref()
                    .ok_or_else(|| refuse("algorithm", format!("{alg:?} is not accepted")))?;
                jwks.key(peeked.kid.as_deref(), alg)
                    .await
                    .map_err(|_| refuse("unknown_kid", "no matching signing key"))?
            }
            _ => {
                return Err(refuse(
                    "algorithm",
                    format!("algorithm {alg:?} is not accepted"),
                ));
            }
        };
        let claims = validate(token, &key, alg, self.leeway, self.issuer.as_deref())?;
        self.check_audience(&claims)?;
        let subject = claims
            .get("sub")
            .and_then(|s| s.as_str())
            .unwrap_or_default()
            .to_owned();
        let project_ref = project_ref_claim(&claims)?;
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
            Err(refuse(
                "audience",
                format!("the aud claim must be exactly {:?}", self.audience),
            ))
        }
    }
}

fn describe(e: &jsonwebtoken::errors::Error) -> (&'static str, &'static str) {
    use jsonwebtoken::errors::ErrorKind;
    match e.kind() {
        ErrorKind::ExpiredSignature => ("expired", "expired"),
        ErrorKind::ImmatureSignature => ("expired", "not yet valid"),
        ErrorKind::InvalidSignature => ("bad_signature", "bad signature"),
        ErrorKind::InvalidAlgorithm => ("algorithm", "algorithm mismatch"),
        ErrorKind::InvalidIssuer => ("issuer", "another issuer"),
        ErrorKind::MissingRequiredClaim(_) => ("claims", "a required claim is missing"),
        ErrorKind::Json(_) | ErrorKind::Base64(_) | ErrorKind::Utf8(_) => {
            ("malformed", "malformed claims")
        }
        _ => ("bad_signature", "rejected"),
    }
}
