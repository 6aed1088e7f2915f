//! Verification keys from a JWKS, kept off the request path: the platform's user and console
//! keys (`auth.*_jwt.jwks_url`) and each trusted issuer's ([`super::issuers`]).
//!
//! A [`KeySource`] fetches its set first when it is created, then in the background when older
//! than its maximum age or when a token names an unknown `kid` — at most once per cooldown
//! either way. Requests verify against the last good set and never wait for a fetch, except a
//! token whose `kid` is unknown (or any token before the first set arrived): it waits for the
//! fetch in progress at most its unknown-`kid` wait. A failed, slow, oversized or refused fetch
//! leaves the last good set in force.
//!
//! Every fetch is bounded: one deadline over connect, TLS, headers and body; a body over
//! `max_bytes` is refused before or while it is read; a set with more than `max_keys` keys is
//! refused whole (never cut to its first keys); no redirects, no proxy. A source may also learn
//! its JWKS URL by OIDC discovery, whose document must name the issuer exactly.

use std::sync::Arc;
use std::time::Duration;

use jsonwebtoken::Algorithm;
use jsonwebtoken::DecodingKey;
use tokio::time::Instant;

pub use crate::jwks::{FetchFailure, KeySet, parse_set};

/// The bounds of one fetch.
#[derive(Debug, Clone, Copy)]
pub struct FetchLimits {
    /// The whole fetch: a permit, connect, TLS, headers and body.
    pub timeout: Duration,
    /// Largest document.
    pub max_bytes: usize,
    /// Most keys in a set.
    pub max_keys: usize,
}

/// How often a source fetches, and how long a token may wait.
#[derive(Debug, Clone, Copy)]
pub struct Freshness {
    pub cooldown: Duration,
    pub max_age: Duration,
    pub unknown_kid_wait: Duration,
    /// How long a JWKS URL learned by discovery is used.
    pub discovery_max_age: Duration,
}

/// Checks a URL before anything connects to it (an issuer's SSRF rule).
pub trait UrlGuard: Send + Sync + 'static {
    /// `not_allowed` when `url` may not be fetched.
    fn check(&self, url: &str) -> Result<(), FetchFailure>;
}

/// GETs `url` within `limits`: status 200, a body of at most `max_bytes` (a larger declared
/// length is refused before reading; a longer body is cut off where it crosses the bound).
/// The deadline is the caller's (one over the whole fetch).
pub async fn fetch_document(
    client: &reqwest::Client,
    url: &str,
    limits: &FetchLimits,
    guard: Option<&dyn UrlGuard>,
) -> Result<bytes::Bytes, FetchFailure> {
    if let Some(guard) = guard {
        guard.check(url)?;
    }
    let mut response = client
        .get(url)
        .header(http::header::ACCEPT, "application/json")
        .send()
        .await
        .map_err(|e| FetchFailure::new(send_outcome(&e), describe_send(&e)))?;
    if response.status() != reqwest::StatusCode::OK {
        return Err(FetchFailure::new(
            "status",
            format!("status {}", response.status().as_u16()),
        ));
    }
    if response
        .content_length()
        .is_some_and(|n| n > limits.max_bytes as u64)
    {
        return Err(FetchFailure::new(
            "too_large",
            format!("the document is over {} bytes", limits.max_bytes),
        ));
    }
    let mut body = bytes::BytesMut::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| FetchFailure::new("connect", format!("reading the body: {}", kind_of(&e))))?
    {
        if body.len() + chunk.len() > limits.max_bytes {
            return Err(FetchFailure::new(
                "too_large",
                format!("the document is over {} bytes", limits.max_bytes),
            ));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body.freeze())
}

fn send_outcome(e: &reqwest::Error) -> &'static str {
    if e.is_timeout() {
        "timeout"
    } else if is_refused_address(e) {
        "not_allowed"
    } else {
        "connect"
    }
}

/// Every address of a host is in a denied network: what a resolver that guards a fetch's
/// addresses ([`super::issuers`]) answers, told apart from a failed lookup.
#[derive(Debug, Clone, thiserror::Error)]
#[error("every address of {0} is in a denied network (auth.issuers.denied_networks)")]
pub struct AddressRefused(pub String);

/// Whether the error comes from the resolver refusing every address of the host.
fn is_refused_address(e: &reqwest::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if err.is::<AddressRefused>() {
            return true;
        }
        source = err.source();
    }
    false
}

fn describe_send(e: &reqwest::Error) -> String {
    if is_refused_address(e) {
        return "the issuer's address is in a denied network".to_owned();
    }
    kind_of(e)
}

fn kind_of(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        "timed out".to_owned()
    } else if e.is_connect() {
        "could not connect".to_owned()
    } else if e.is_redirect() {
        "redirects are not followed".to_owned()
    } else {
        let mut message = e.to_string();
        message.truncate(200);
        message
    }
}

/// What a fetch reports, for metrics.
pub trait FetchObserver: Send + Sync + 'static {
    /// A fetch ended: `ok`, or a [`FetchFailure`] outcome.
    fn fetched(&self, outcome: &'static str);
    /// The keys now in force.
    fn keys(&self, count: usize);
}

/// Where a source's keys come from.
#[derive(Debug)]
pub enum Origin {
    /// A JWKS URL.
    Url(String),
    /// OIDC discovery from an issuer URL: its `jwks_uri`, learned and kept for
    /// `discovery_max_age`.
    Discovery {
        issuer: String,
        learned: std::sync::Mutex<Option<(String, Instant)>>,
    },
    /// Keys given inline: never fetched.
    Inline,
}

impl Origin {
    /// OIDC discovery from `issuer`.
    pub fn discovery(issuer: String) -> Self {
        Origin::Discovery {
            issuer,
            learned: std::sync::Mutex::new(None),
        }
    }

    fn describe(&self) -> String {
        match self {
            Origin::Url(url) => url.clone(),
            Origin::Discovery { issuer, .. } => format!("discovery of {issuer}"),
            Origin::Inline => "inline keys".to_owned(),
        }
    }
}

/// The state of a source, for the management API.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SourceStatus {
    /// `ok`, `failing` (the last fetch failed; the last good keys, if any, stay in force) or
    /// `not_loaded`.
    pub status: &'static str,
    /// Keys in force.
    pub count: usize,
    /// Their key ids.
    pub kids: Vec<String>,
    /// Seconds since they were fetched.
    pub age_secs: Option<u64>,
    /// Why the last fetch failed.
    pub last_error: Option<String>,
    /// The JWKS URL in use (learned by discovery, or configured).
    pub jwks_url: Option<String>,
}

/// What a source's fetches share with others: permits, metrics, the URL rule.
#[derive(Default)]
pub struct Fetching {
    /// Fetches in flight, every source sharing it together.
    pub permits: Option<Arc<tokio::sync::Semaphore>>,
    pub observer: Option<Box<dyn FetchObserver>>,
    pub guard: Option<Arc<dyn UrlGuard>>,
}

impl std::fmt::Debug for Fetching {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fetching")
            .field("permits", &self.permits.is_some())
            .field("observer", &self.observer.is_some())
            .field("guard", &self.guard.is_some())
            .finish()
    }
}

/// A set of verification keys and how it stays fresh.
pub struct KeySource {
    inner: Arc<Inner>,
}

struct Inner {
    origin: Origin,
    client: reqwest::Client,
    limits: FetchLimits,
    freshness: Freshness,
    /// Fetches in flight, every source sharing it together.
    permits: Option<Arc<tokio::sync::Semaphore>>,
    observer: Option<Box<dyn FetchObserver>>,
    guard: Option<Arc<dyn UrlGuard>>,
    keys: arc_swap::ArcSwap<KeySet>,
    /// When the last fetch started, and whether one is running.
    fetching: std::sync::Mutex<(Option<Instant>, bool)>,
    /// Bumped after every fetch, good or not.
    fetched: tokio::sync::watch::Sender<u64>,
    last_error: std::sync::Mutex<Option<String>>,
}

impl std::fmt::Debug for KeySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeySource")
            .field("origin", &self.inner.origin.describe())
            .finish_non_exhaustive()
    }
}

/// Why no key was found for a token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoKey {
    /// No key with the token's `kid` and algorithm, even after a fetch.
    UnknownKid,
}

impl KeySource {
    /// Starts the source's first fetch (when a runtime is there to run it), and returns it.
    pub fn started(self) -> Self {
        self.start_fetch();
        self
    }

    /// A source that fetches only when asked ([`KeySource::probe`]).
    pub fn detached(
        origin: Origin,
        client: reqwest::Client,
        limits: FetchLimits,
        fetching: Fetching,
    ) -> Self {
        let once = Freshness {
            cooldown: Duration::MAX,
            max_age: Duration::MAX,
            unknown_kid_wait: Duration::ZERO,
            discovery_max_age: Duration::ZERO,
        };
        Self::new(origin, client, limits, once, fetching)
    }

    /// A source over keys given inline (already parsed); never fetched.
    pub fn inline(set: KeySet) -> Self {
        let mut set = set;
        set.fetched_at = Some(Instant::now());
        let none = FetchLimits {
            timeout: Duration::ZERO,
            max_bytes: 0,
            max_keys: 0,
        };
        let this = Self::detached(
            Origin::Inline,
            reqwest::Client::new(),
            none,
            Fetching::default(),
        );
        this.inner.keys.store(Arc::new(set));
        this
    }

    /// A source fetching from `origin` with `client` (which must follow no redirects and use
    /// no proxy) within `limits`, kept fresh by `freshness`; nothing is fetched before
    /// [`KeySource::started`] or a token asks.
    pub fn new(
        origin: Origin,
        client: reqwest::Client,
        limits: FetchLimits,
        freshness: Freshness,
        fetching: Fetching,
    ) -> Self {
        let Fetching {
            permits,
            observer,
            guard,
        } = fetching;
        Self {
            inner: Arc::new(Inner {
                origin,
                client,
                limits,
                freshness,
                permits,
                observer,
                guard,
                keys: arc_swap::ArcSwap::from_pointee(KeySet::default()),
                fetching: std::sync::Mutex::new((None, false)),
                fetched: tokio::sync::watch::channel(0).0,
                last_error: std::sync::Mutex::new(None),
            }),
        }
    }

    /// Starts a background fetch unless one runs or the last started within the cooldown.
    /// Returns whether a fetch is running now.
    pub fn start_fetch(&self) -> bool {
        if matches!(self.inner.origin, Origin::Inline) {
            return false;
        }
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
                .is_some_and(|at| at.elapsed() < self.inner.freshness.cooldown)
            {
                return false;
            }
            *fetching = (Some(Instant::now()), true);
        }
        let inner = self.inner.clone();
        runtime.spawn(async move {
            let result = tokio::time::timeout(inner.limits.timeout, inner.fetch())
                .await
                .unwrap_or_else(|_| {
                    Err(FetchFailure::new(
                        "timeout",
                        format!("no keys within {} ms", inner.limits.timeout.as_millis()),
                    ))
                });
            let outcome = match result {
                Ok(set) => {
                    if let Some(observer) = &inner.observer {
                        observer.keys(set.len());
                    }
                    inner.keys.store(Arc::new(set));
                    *inner.last_error.lock().unwrap_or_else(|p| p.into_inner()) = None;
                    "ok"
                }
                Err(e) => {
                    tracing::warn!(origin = %inner.origin.describe(), error = %e, "JWKS fetch failed; keeping the last good keys");
                    if e.outcome != "not_allowed" {
                        // Discovery is run again after a failure: the JWKS may have moved.
                        inner.forget_learned();
                    }
                    let outcome = e.outcome;
                    *inner.last_error.lock().unwrap_or_else(|p| p.into_inner()) =
                        Some(e.to_string());
                    outcome
                }
            };
            if let Some(observer) = &inner.observer {
                observer.fetched(outcome);
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

    /// The key for a token's `kid` and `alg`. Starts a background fetch when the set is older
    /// than its maximum age; waits (at most the unknown-`kid` wait) only when the `kid` is
    /// unknown.
    pub async fn key(&self, kid: Option<&str>, alg: Algorithm) -> Result<DecodingKey, NoKey> {
        // Subscribed before looking, so that a fetch ending meanwhile is not missed.
        let mut fetched = self.inner.fetched.subscribe();
        let set = self.inner.keys.load_full();
        let stale = set
            .fetched_at
            .is_none_or(|at| at.elapsed() >= self.inner.freshness.max_age);
        if stale {
            self.start_fetch();
        }
        if let Some(key) = set.find(kid, alg) {
            return Ok(key);
        }
        // An unknown kid may be a rotated key: fetch (at most once per cooldown) and wait a
        // little for it; every other request keeps verifying meanwhile.
        if self.start_fetch() {
            let wait = self.inner.freshness.unknown_kid_wait;
            let _ = tokio::time::timeout(wait, fetched.changed()).await;
        }
        let set = self.inner.keys.load_full();
        set.find(kid, alg).ok_or(NoKey::UnknownKid)
    }

    /// Whether a set was ever loaded.
    pub fn is_loaded(&self) -> bool {
        self.inner.keys.load().fetched_at.is_some()
    }

    /// The state of the source.
    pub fn status(&self) -> SourceStatus {
        let set = self.inner.keys.load_full();
        let last_error = self
            .inner
            .last_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let status = match (&last_error, set.fetched_at) {
            (Some(_), _) => "failing",
            (None, Some(_)) => "ok",
            (None, None) => "not_loaded",
        };
        let jwks_url = match &self.inner.origin {
            Origin::Url(url) => Some(url.clone()),
            Origin::Discovery { learned, .. } => learned
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .as_ref()
                .map(|(url, _)| url.clone()),
            Origin::Inline => None,
        };
        SourceStatus {
            status,
            count: set.len(),
            kids: set.kids(),
            age_secs: set.fetched_at.map(|at| at.elapsed().as_secs()),
            last_error,
            jwks_url,
        }
    }

    /// Fetches once, now, within the limits (a permit included), and returns the set without
    /// putting it in force: the check of an issuer being added.
    pub async fn probe(&self) -> Result<KeySet, FetchFailure> {
        match tokio::time::timeout(self.inner.limits.timeout, self.inner.fetch()).await {
            Ok(result) => result,
            Err(_) => Err(FetchFailure::new(
                "timeout",
                format!(
                    "no keys within {} ms",
                    self.inner.limits.timeout.as_millis()
                ),
            )),
        }
    }
}

impl Inner {
    async fn fetch(&self) -> Result<KeySet, FetchFailure> {
        let _permit = match &self.permits {
            Some(permits) => Some(
                permits
                    .clone()
                    .acquire_owned()
                    .await
                    .map_err(|_| FetchFailure::new("busy", "no fetch permit"))?,
            ),
            None => None,
        };
        let url = self.jwks_url().await?;
        let body = fetch_document(&self.client, &url, &self.limits, self.guard.as_deref()).await?;
        let mut set = parse_set(&body, self.limits.max_keys)?;
        set.fetched_at = Some(Instant::now());
        Ok(set)
    }

    /// The JWKS URL: configured, or learned by discovery (again once older than
    /// `discovery_max_age`).
    async fn jwks_url(&self) -> Result<String, FetchFailure> {
        let (issuer, learned) = match &self.origin {
            Origin::Url(url) => return Ok(url.clone()),
            Origin::Inline => return Err(FetchFailure::new("invalid", "inline keys")),
            Origin::Discovery { issuer, learned } => (issuer, learned),
        };
        if let Some((url, at)) = learned.lock().unwrap_or_else(|p| p.into_inner()).as_ref()
            && at.elapsed() < self.freshness.discovery_max_age
        {
            return Ok(url.clone());
        }
        let url = discover(&self.client, issuer, &self.limits, self.guard.as_deref()).await?;
        *learned.lock().unwrap_or_else(|p| p.into_inner()) = Some((url.clone(), Instant::now()));
        Ok(url)
    }

    fn forget_learned(&self) {
        if let Origin::Discovery { learned, .. } = &self.origin {
            *learned.lock().unwrap_or_else(|p| p.into_inner()) = None;
        }
    }
}

/// The discovery document's URL of `issuer` (OIDC Discovery §4).
pub fn discovery_url(issuer: &str) -> String {
    format!(
        "{}/.well-known/openid-configuration",
        issuer.trim_end_matches('/')
    )
}

/// OIDC discovery: the `jwks_uri` of `issuer`'s document, whose `issuer` must be `issuer`
/// exactly (OIDC Discovery §4.3) and whose `jwks_uri` must be `https`.
pub async fn discover(
    client: &reqwest::Client,
    issuer: &str,
    limits: &FetchLimits,
    guard: Option<&dyn UrlGuard>,
) -> Result<String, FetchFailure> {
    let body = fetch_document(client, &discovery_url(issuer), limits, guard).await?;
    let document: serde_json::Value = serde_json::from_slice(&body)
        .map_err(|_| FetchFailure::new("invalid", "the discovery document is not JSON"))?;
    if document.get("issuer").and_then(|i| i.as_str()) != Some(issuer) {
        return Err(FetchFailure::new(
            "discovery_mismatch",
            "the discovery document names another issuer",
        ));
    }
    let jwks_uri = document
        .get("jwks_uri")
        .and_then(|u| u.as_str())
        .ok_or_else(|| FetchFailure::new("invalid", "the discovery document has no jwks_uri"))?;
    if !jwks_uri.starts_with("https://") || jwks_uri.len() > 2048 {
        return Err(FetchFailure::new(
            "invalid",
            "the discovery document's jwks_uri is not an https URL",
        ));
    }
    Ok(jwks_uri.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discovery_urls_drop_one_trailing_slash() {
        assert_eq!(
            discovery_url("https://id.example/"),
            "https://id.example/.well-known/openid-configuration"
        );
        assert_eq!(
            discovery_url("https://id.example/tenant"),
            "https://id.example/tenant/.well-known/openid-configuration"
        );
    }
}
