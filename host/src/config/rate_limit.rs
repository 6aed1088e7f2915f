//! `[rate_limit]`: per IP before auth, per actor after auth, shared through Redis.

use serde::{Deserialize, Serialize};

use super::{ClientTlsConfig, ConfigError, problem};

/// Rate limits.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RateLimitConfig {
    /// Per client IP on the data plane, before authentication.
    pub data_plane_per_ip: BucketConfig,
    /// Per client IP on the management plane, before authentication.
    pub management_plane_per_ip: BucketConfig,
    /// Peers (CIDR) whose `X-Forwarded-For` is believed: the client IP is then the rightmost
    /// address of the header that is not itself a trusted proxy.
    #[schemars(with = "Vec<String>")]
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// `redis://host:port/db`: per-actor quotas shared by every instance. None: local only.
    pub redis_url: Option<String>,
    /// Trust for a `rediss://` URL: a CA bundle replacing the system roots, a client
    /// certificate (for `tls-auth-clients yes`).
    pub redis_tls: Option<ClientTlsConfig>,
    /// Time allowed for one Redis call, in milliseconds; slower calls fall back to local.
    pub redis_timeout_ms: u64,
    /// Prefix of the Redis keys.
    pub redis_key_prefix: String,
    /// Failed Redis calls in a row after which the limiter stays local for `redis_retry_ms`.
    pub redis_failure_threshold: u32,
    /// How long the limiter stays local before trying Redis again, in milliseconds.
    pub redis_retry_ms: u64,
    /// Period of the cleanup of idle per-IP buckets, in seconds.
    pub retain_interval_secs: u64,
    /// Longest bucket name a `quota` module may answer, in bytes; a longer one refuses the
    /// decision (the request fails closed).
    pub max_bucket_name_bytes: usize,
    /// Memory the local quota buckets may take, in bytes (names included); past it the least
    /// recently used buckets are forgotten. The table of the buckets in use adds at most an
    /// eighth of this.
    pub local_buckets_max_bytes: u64,
    /// Longest time a bucket's state is kept, in Redis and locally, in seconds. Only rules whose
    /// burst takes longer than this to refill are affected: their bucket is forgotten (full
    /// again) after this time.
    pub max_bucket_ttl_secs: u64,
    /// Ceilings of the rules answered by the operator's `quota` modules.
    pub operator_rules: RuleCeilings,
    /// Ceilings of the rules answered by projects' own `quota` modules.
    pub tenant_rules: RuleCeilings,
}

impl Default for RateLimitConfig {
    fn default() -> Self {
        Self {
            data_plane_per_ip: BucketConfig::default(),
            management_plane_per_ip: BucketConfig::default(),
            trusted_proxies: Vec::new(),
            redis_url: None,
            redis_tls: None,
            redis_timeout_ms: 50,
            redis_key_prefix: "aura:rl:".to_owned(),
            redis_failure_threshold: 3,
            redis_retry_ms: 2_000,
            retain_interval_secs: 60,
            max_bucket_name_bytes: 128,
            local_buckets_max_bytes: 64 * 1024 * 1024,
            max_bucket_ttl_secs: 3_600,
            operator_rules: RuleCeilings::operator(),
            tenant_rules: RuleCeilings::tenant(),
        }
    }
}

impl RateLimitConfig {
    /// Checks the section, `key` naming it.
    pub(super) fn validate(&self, key: &str) -> Result<(), ConfigError> {
        if let Some(tls) = &self.redis_tls {
            tls.validate(&format!("{key}.redis_tls"))?;
        }
        self.data_plane_per_ip
            .validate(&format!("{key}.data_plane_per_ip"))?;
        self.management_plane_per_ip
            .validate(&format!("{key}.management_plane_per_ip"))?;
        if let Some(url) = &self.redis_url
            && !(url.starts_with("redis://") || url.starts_with("rediss://"))
        {
            return Err(problem(
                &format!("{key}.redis_url"),
                "must start with redis:// or rediss://",
            ));
        }
        if let Some(url) = &self.redis_url
            && url.split_once('#').is_some_and(|(_, fragment)| {
                fragment
                    .split(['&', ','])
                    .any(|f| f.eq_ignore_ascii_case("insecure"))
            })
        {
            return Err(problem(
                &format!("{key}.redis_url"),
                format!(
                    "#insecure turns off the verification of Redis's certificate; trust its CA with {key}.redis_tls.ca_file instead"
                ),
            ));
        }
        if self.redis_tls.is_some()
            && !self
                .redis_url
                .as_deref()
                .is_some_and(|u| u.starts_with("rediss://"))
        {
            return Err(problem(
                &format!("{key}.redis_tls"),
                "applies to a rediss:// redis_url only",
            ));
        }
        let at_least = |field, value, min| super::at_least(key, field, value, min);
        at_least("redis_timeout_ms", self.redis_timeout_ms, 1)?;
        at_least(
            "redis_failure_threshold",
            u64::from(self.redis_failure_threshold),
            1,
        )?;
        at_least("redis_retry_ms", self.redis_retry_ms, 1)?;
        at_least("retain_interval_secs", self.retain_interval_secs, 1)?;
        super::within(
            key,
            "max_bucket_name_bytes",
            self.max_bucket_name_bytes as u64,
            1,
            1024,
        )?;
        if self.local_buckets_max_bytes < 1 << 20 {
            return Err(problem(
                &format!("{key}.local_buckets_max_bytes"),
                "must be at least 1 MiB (1048576)",
            ));
        }
        at_least("max_bucket_ttl_secs", self.max_bucket_ttl_secs, 1)?;
        self.operator_rules
            .validate(&format!("{key}.operator_rules"))?;
        self.tenant_rules.validate(&format!("{key}.tenant_rules"))
    }
}

/// A token bucket: sustained rate and burst.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct BucketConfig {
    /// Off: no limit of this kind on this plane.
    pub enabled: bool,
    /// Sustained requests per second.
    pub rate_per_second: u32,
    /// Requests allowed at once.
    pub burst: u32,
}

impl Default for BucketConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            rate_per_second: 100,
            burst: 1000,
        }
    }
}

impl BucketConfig {
    /// Checks the bucket, `key` naming it.
    fn validate(&self, key: &str) -> Result<(), ConfigError> {
        super::at_least(key, "rate_per_second", u64::from(self.rate_per_second), 1)?;
        super::at_least(key, "burst", u64::from(self.burst), 1)
    }
}

/// The largest figures a `quota` module's rule may have; larger ones are lowered to these.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RuleCeilings {
    /// Largest sustained rate, per second.
    pub max_rate_per_second: u32,
    /// Largest burst.
    pub max_burst: u32,
    /// Largest cost of one request.
    pub max_cost: u32,
}

impl RuleCeilings {
    /// The operator's defaults: far above any real rule, still finite.
    pub fn operator() -> Self {
        Self {
            max_rate_per_second: 1_000_000,
            max_burst: 10_000_000,
            max_cost: 10_000_000,
        }
    }

    /// A project's defaults.
    pub fn tenant() -> Self {
        Self {
            max_rate_per_second: 10_000,
            max_burst: 100_000,
            max_cost: 1_000,
        }
    }

    /// Checks the ceilings, `key` naming them.
    fn validate(&self, key: &str) -> Result<(), ConfigError> {
        for (field, value) in [
            ("max_rate_per_second", self.max_rate_per_second),
            ("max_burst", self.max_burst),
            ("max_cost", self.max_cost),
        ] {
            super::at_least(key, field, u64::from(value), 1)?;
        }
        Ok(())
    }
}

impl Default for RuleCeilings {
    fn default() -> Self {
        Self::tenant()
    }
}
