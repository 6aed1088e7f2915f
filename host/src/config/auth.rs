//! `[auth]`: credentials (the API key cache, user and console JWTs).

use serde::{Deserialize, Serialize};

use super::{ConfigError, problem};

/// Credentials.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// Lifetime of cached API key lookups, positive and negative, in seconds (1–30: a revoked
    /// key stops working within this time).
    pub key_cache_ttl_secs: u64,
    /// Entries kept in the API key cache.
    pub key_cache_capacity: u64,
    /// Lifetime of cached project records (data plane), in seconds.
    pub project_cache_ttl_secs: u64,
    /// While the control store is unavailable, how long after the store last confirmed a key
    /// (and its project) the data plane keeps accepting it, in seconds (0: never; at most 30,
    /// so that a key revoked just before an outage still stops within 30 s). It outlasts the
    /// key cache when `key_cache_ttl_secs` is set lower.
    pub stale_if_error_secs: u64,
    /// Clock skew tolerated on `exp` and `nbf`, in seconds (0–60).
    pub leeway_secs: u64,
    /// User JWTs on the data plane (`aud` = `authenticated`).
    pub user_jwt: JwtConfig,
    /// Console JWTs on the management plane (`aud` = `aurabase-control`).
    pub console_jwt: JwtConfig,
    /// Whether a `service_role` (secret) key is accepted on a request a browser made
    /// (`browser_signals`): `refuse` (the default: `401 secret_key_from_browser`, unless the
    /// key's project allows it through `PUT /v1/projects/{ref}/auth-settings`) or `allow`.
    pub secret_keys_from_browsers: SecretKeysFromBrowsers,
    /// What marks a request as a browser's: `origin` (an `Origin` header, any value),
    /// `sec-fetch-site` (present; a page's scripts cannot remove it, and server-side HTTP
    /// clients do not send it), `sec-fetch-mode` (`Sec-Fetch-Mode: cors`; off by default, since
    /// Node's built-in `fetch` sends it from servers too). Default `["origin", "sec-fetch-site"]`.
    pub browser_signals: Vec<BrowserSignal>,
    /// Projects' own JWT issuers (`GET`/`POST`/`DELETE /v1/projects/{ref}/issuers`): how their
    /// keys are fetched and bounded.
    pub issuers: IssuersConfig,
}

/// `[auth.issuers]`: fetching the keys of projects' trusted issuers. Each issuer's keys are
/// fetched off the request path (OIDC discovery or a JWKS URL, `https` only, no redirects, no
/// proxy), bounded in time, bytes and keys; a failed fetch keeps the last good keys.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct IssuersConfig {
    /// One fetch as a whole (a permit, connect, TLS, headers, body), in milliseconds
    /// (100–10000).
    pub fetch_timeout_ms: u64,
    /// Largest discovery document or JWKS, in bytes (1024–1048576); a larger one is refused.
    pub max_document_bytes: usize,
    /// Most keys in a JWKS (1–256); a set with more is refused whole, never cut.
    pub max_keys: usize,
    /// Age after which an issuer's keys are fetched again in the background, in seconds
    /// (1–86400).
    pub max_age_secs: u64,
    /// Least time between two fetches of one issuer's keys, in seconds (1–3600).
    pub refresh_cooldown_secs: u64,
    /// How long a token whose `kid` is unknown waits for the fetch it starts, in milliseconds
    /// (0–5000). No other token waits.
    pub unknown_kid_wait_ms: u64,
    /// How long a JWKS URL learned by OIDC discovery is used before discovery runs again, in
    /// seconds (at least `max_age_secs`).
    pub discovery_max_age_secs: u64,
    /// Fetches in flight, every issuer together (1–256).
    pub max_concurrent_fetches: usize,
    /// Checks of issuers being added (`POST …/issuers`: name resolution and the first fetch)
    /// in flight, every organization together (1–256); never the fetches' permits.
    pub max_concurrent_probes: usize,
    /// Of `max_concurrent_probes`, how many one organization may hold at once (at least 1, at
    /// most `max_concurrent_probes`); past it `429 too_many_issuer_checks`.
    pub max_probes_per_organization: usize,
    /// Key sets held in memory (at least 1); the least recently used go first.
    pub max_cached: u64,
    /// A key set nobody used for this long is dropped, in seconds (at least `max_age_secs`).
    pub idle_secs: u64,
    /// Hosts, networks and `.suffixes` an issuer may be at even inside `denied_networks`
    /// (the syntax of `upstreams.postgrest_allowed_targets`).
    pub allowed_targets: Vec<String>,
    /// Networks an issuer's address may not be in (checked on every resolved address, at
    /// every fetch); default: loopback, private, link-local, shared, multicast and reserved
    /// ranges.
    pub denied_networks: Vec<String>,
    /// Trust for issuers' certificates: a CA added to the public roots.
    pub tls: Option<super::ClientTlsConfig>,
    /// Distinct `issuer` label values in the metrics before the rest are counted as `other`
    /// (1–10000).
    pub metrics_issuer_labels: usize,
}

/// Networks issuers may not be in, unless `allowed_targets` lists them.
pub const DEFAULT_DENIED_NETWORKS: &[&str] = &[
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.0.0.0/24",
    "192.168.0.0/16",
    "198.18.0.0/15",
    "224.0.0.0/4",
    "240.0.0.0/4",
    "::/128",
    "::1/128",
    "fc00::/7",
    "fe80::/10",
    "ff00::/8",
    "64:ff9b::/96",
    "64:ff9b:1::/48",
    "2001::/32",
    "2002::/16",
];

impl Default for IssuersConfig {
    fn default() -> Self {
        Self {
            fetch_timeout_ms: 3000,
            max_document_bytes: 64 * 1024,
            max_keys: 32,
            max_age_secs: 600,
            refresh_cooldown_secs: 30,
            unknown_kid_wait_ms: 500,
            discovery_max_age_secs: 3600,
            max_concurrent_fetches: 16,
            max_concurrent_probes: 16,
            max_probes_per_organization: 2,
            max_cached: 10_000,
            idle_secs: 3600,
            allowed_targets: Vec::new(),
            denied_networks: DEFAULT_DENIED_NETWORKS
                .iter()
                .map(|n| (*n).to_owned())
                .collect(),
            tls: None,
            metrics_issuer_labels: 500,
        }
    }
}

impl IssuersConfig {
    /// Checks the section, `key` naming it.
    fn validate(&self, key: &str) -> Result<(), ConfigError> {
        let within = |field, value, low, high| super::within(key, field, value, low, high);
        within("fetch_timeout_ms", self.fetch_timeout_ms, 100, 10_000)?;
        within(
            "max_document_bytes",
            self.max_document_bytes as u64,
            1024,
            1024 * 1024,
        )?;
        within("max_keys", self.max_keys as u64, 1, 256)?;
        within("max_age_secs", self.max_age_secs, 1, 86_400)?;
        within("refresh_cooldown_secs", self.refresh_cooldown_secs, 1, 3600)?;
        within("unknown_kid_wait_ms", self.unknown_kid_wait_ms, 0, 5000)?;
        within(
            "max_concurrent_fetches",
            self.max_concurrent_fetches as u64,
            1,
            256,
        )?;
        within(
            "max_concurrent_probes",
            self.max_concurrent_probes as u64,
            1,
            256,
        )?;
        within(
            "max_probes_per_organization",
            self.max_probes_per_organization as u64,
            1,
            self.max_concurrent_probes as u64,
        )?;
        within(
            "metrics_issuer_labels",
            self.metrics_issuer_labels as u64,
            1,
            10_000,
        )?;
        super::at_least(key, "max_cached", self.max_cached, 1)?;
        for (field, value) in [
            ("discovery_max_age_secs", self.discovery_max_age_secs),
            ("idle_secs", self.idle_secs),
        ] {
            if value < self.max_age_secs {
                return Err(problem(
                    &format!("{key}.{field}"),
                    "must be at least max_age_secs",
                ));
            }
        }
        for entry in &self.allowed_targets {
            super::TargetEntry::parse(entry)
                .map_err(|e| problem(&format!("{key}.allowed_targets"), e))?;
        }
        for net in &self.denied_networks {
            net.parse::<ipnet::IpNet>().map_err(|_| {
                problem(
                    &format!("{key}.denied_networks"),
                    format!("{net:?} is not a CIDR"),
                )
            })?;
        }
        if let Some(tls) = &self.tls {
            tls.validate(&format!("{key}.tls"))?;
        }
        Ok(())
    }
}

/// `auth.secret_keys_from_browsers`.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum SecretKeysFromBrowsers {
    /// Refused unless the key's project allows it.
    #[default]
    Refuse,
    /// Accepted everywhere.
    Allow,
}

/// A request header that shows a browser made the request (`auth.browser_signals`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum BrowserSignal {
    /// An `Origin` header, whatever its value (`null` included).
    Origin,
    /// A `Sec-Fetch-Site` header, whatever its value.
    SecFetchSite,
    /// `Sec-Fetch-Mode: cors`.
    SecFetchMode,
}

impl BrowserSignal {
    /// Whether `headers` carry this signal.
    pub fn seen_in(self, headers: &http::HeaderMap) -> bool {
        match self {
            BrowserSignal::Origin => headers.contains_key(http::header::ORIGIN),
            BrowserSignal::SecFetchSite => headers.contains_key("sec-fetch-site"),
            BrowserSignal::SecFetchMode => headers
                .get_all("sec-fetch-mode")
                .iter()
                .any(|v| v.as_bytes().eq_ignore_ascii_case(b"cors")),
        }
    }

    /// The header's name.
    pub fn header(self) -> &'static str {
        match self {
            BrowserSignal::Origin => "origin",
            BrowserSignal::SecFetchSite => "sec-fetch-site",
            BrowserSignal::SecFetchMode => "sec-fetch-mode",
        }
    }
}

fn default_browser_signals() -> Vec<BrowserSignal> {
    vec![BrowserSignal::Origin, BrowserSignal::SecFetchSite]
}

impl Default for AuthConfig {
    fn default() -> Self {
        Self {
            key_cache_ttl_secs: 30,
            key_cache_capacity: 100_000,
            project_cache_ttl_secs: 30,
            stale_if_error_secs: 30,
            leeway_secs: 5,
            user_jwt: JwtConfig::default(),
            console_jwt: JwtConfig::default(),
            secret_keys_from_browsers: SecretKeysFromBrowsers::Refuse,
            browser_signals: default_browser_signals(),
            issuers: IssuersConfig::default(),
        }
    }
}

impl AuthConfig {
    /// Checks the section, `key` naming it.
    pub(super) fn validate(&self, key: &str) -> Result<(), ConfigError> {
        let at_least = |field, value, min| super::at_least(key, field, value, min);
        let at_most = |field, value, max| super::at_most(key, field, value, max);
        super::within(key, "key_cache_ttl_secs", self.key_cache_ttl_secs, 1, 30)
            .map_err(super::noted("a revoked key must stop working within 30 s"))?;
        at_least("key_cache_capacity", self.key_cache_capacity, 1)?;
        at_least("project_cache_ttl_secs", self.project_cache_ttl_secs, 1)?;
        at_most("stale_if_error_secs", self.stale_if_error_secs, 30).map_err(super::noted(
            "a revoked key must stop working within 30 s, outages included",
        ))?;
        at_most("leeway_secs", self.leeway_secs, 60)?;
        if self.browser_signals.is_empty() {
            return Err(problem(
                &format!("{key}.browser_signals"),
                "must name at least one of origin, sec-fetch-site, sec-fetch-mode (to accept \
                 secret keys from browsers, set secret_keys_from_browsers = \"allow\")",
            ));
        }
        self.user_jwt.validate(&format!("{key}.user_jwt"))?;
        self.console_jwt.validate(&format!("{key}.console_jwt"))?;
        self.issuers.validate(&format!("{key}.issuers"))
    }
}

/// Verification of one kind of JWT.
#[derive(Debug, Clone, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct JwtConfig {
    /// HS256 shared secret (at least 32 bytes).
    pub hs256_secret: Option<String>,
    /// JWKS URL for RS256 / ES256 keys.
    pub jwks_url: Option<String>,
    /// Accepted algorithms (`HS256`, `RS256`, `ES256`). Default: HS256 when a secret is set,
    /// RS256 and ES256 when a JWKS URL is set. Never taken from the token.
    pub algorithms: Option<Vec<String>>,
    /// Least time between two JWKS fetches caused by an unknown `kid`, in seconds.
    pub jwks_refresh_cooldown_secs: Option<u64>,
    /// Age after which the JWKS is fetched again (in the background), in seconds.
    pub jwks_max_age_secs: Option<u64>,
    /// How long a token whose `kid` is not in the current key set waits for the fetch it
    /// starts, in milliseconds (default 500; 0: never waits). Other tokens never wait.
    pub jwks_unknown_kid_wait_ms: Option<u64>,
    /// The `iss` these tokens carry. Set: a token with another `iss` is not verified against
    /// these keys (on the data plane it is a project's trusted issuer's, or refused at once as
    /// `untrusted_issuer`), and no project may add this issuer as its own. Unset: `iss` is not
    /// checked, and a user token of no trusted issuer is verified against these keys.
    pub issuer: Option<String>,
}

impl JwtConfig {
    /// Whether any verification key is configured.
    pub fn is_configured(&self) -> bool {
        self.hs256_secret.is_some() || self.jwks_url.is_some()
    }

    /// The accepted algorithms, explicit or derived from the key material.
    pub fn effective_algorithms(&self) -> Vec<String> {
        match &self.algorithms {
            Some(list) => list.clone(),
            None => {
                let mut list = Vec::new();
                if self.hs256_secret.is_some() {
                    list.push("HS256".to_owned());
                }
                if self.jwks_url.is_some() {
                    list.push("RS256".to_owned());
                    list.push("ES256".to_owned());
                }
                list
            }
        }
    }

    /// Checks the section, `key` naming it.
    fn validate(&self, key: &str) -> Result<(), ConfigError> {
        if let Some(secret) = &self.hs256_secret
            && secret.len() < 32
        {
            return Err(problem(
                &format!("{key}.hs256_secret"),
                "must be at least 32 bytes",
            ));
        }
        if let Some(url) = &self.jwks_url
            && !(url.starts_with("https://") || url.starts_with("http://"))
        {
            return Err(problem(
                &format!("{key}.jwks_url"),
                "must be an http(s) URL",
            ));
        }
        for alg in self.effective_algorithms() {
            match alg.as_str() {
                "HS256" if self.hs256_secret.is_none() => {
                    return Err(problem(
                        &format!("{key}.algorithms"),
                        "HS256 needs hs256_secret",
                    ));
                }
                "RS256" | "ES256" if self.jwks_url.is_none() => {
                    return Err(problem(
                        &format!("{key}.algorithms"),
                        format!("{alg} needs jwks_url"),
                    ));
                }
                "HS256" | "RS256" | "ES256" => {}
                other => {
                    return Err(problem(
                        &format!("{key}.algorithms"),
                        format!("{other:?} is not supported (HS256, RS256, ES256)"),
                    ));
                }
            }
        }
        Ok(())
    }
}
