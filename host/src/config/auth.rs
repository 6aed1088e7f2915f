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
        }
    }
}

impl AuthConfig {
    /// Checks the section, `key` naming it.
    pub(super) fn validate(&self, key: &str) -> Result<(), ConfigError> {
        if !(1..=30).contains(&self.key_cache_ttl_secs) {
            return Err(problem(
                &format!("{key}.key_cache_ttl_secs"),
                "must be between 1 and 30 (a revoked key must stop working within 30 s)",
            ));
        }
        if self.key_cache_capacity == 0 {
            return Err(problem(
                &format!("{key}.key_cache_capacity"),
                "must be at least 1",
            ));
        }
        if self.project_cache_ttl_secs == 0 {
            return Err(problem(
                &format!("{key}.project_cache_ttl_secs"),
                "must be at least 1",
            ));
        }
        if self.stale_if_error_secs > 30 {
            return Err(problem(
                &format!("{key}.stale_if_error_secs"),
                "must be at most 30 (a revoked key must stop working within 30 s, outages included)",
            ));
        }
        if self.leeway_secs > 60 {
            return Err(problem(&format!("{key}.leeway_secs"), "must be at most 60"));
        }
        self.user_jwt.validate(&format!("{key}.user_jwt"))?;
        self.console_jwt.validate(&format!("{key}.console_jwt"))
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
