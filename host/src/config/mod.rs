//! Configuration: a TOML file, environment overrides, defaults for everything, one validation.
//!
//! Sources, later ones winning: built-in defaults, the TOML file given with `--config`, then
//! environment variables `AURA_<KEY>`, with `__` between nested keys (`AURA_PORT`,
//! `AURA_MANAGEMENT_PORT`, `AURA_NATS__URL`, `AURA_TIMEOUTS__DEFAULT_MS`). Unknown keys are
//! rejected, from the file and from the environment alike. Every key is documented in
//! `docs/configuration.md`.
//!
//! Each section is a module of its own: its struct beside its defaults and its `validate`,
//! which names every key it refuses in full (`server.max_connections`). This module holds the
//! whole: loading, the checks across sections, the stages of both planes, redaction.
//! Syntax only: nothing here depends on the modules that use the configuration.

mod admin;
mod auth;
mod breaker;
mod control;
mod dns;
mod nats;
mod planes;
mod plugins;
mod rate_limit;
mod server;
mod telemetry;
mod timeouts;
mod tls;
mod upstreams;

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::{Deserialize, Serialize};

pub use self::admin::AdminConfig;
pub use self::auth::{AuthConfig, BrowserSignal, IssuersConfig, JwtConfig, SecretKeysFromBrowsers};
pub use self::breaker::BreakerConfig;
pub use self::control::{ControlConfig, StoreKind};
pub use self::dns::{DnsConfig, parse_nameserver};
pub use self::nats::NatsConfig;
pub use self::planes::{DataPlaneConfig, ListenerTlsConfig, ManagementPlaneConfig};
pub use self::plugins::{
    BUILTIN, DataPlaneStages, DecisionCacheConfig, InstanceReuse, ManagementPlaneStages,
    PluginRuntimeConfig, STORE_PREFIX, StageConfig, is_sha256_hex,
};
pub use self::rate_limit::{BucketConfig, RateLimitConfig, RuleCeilings};
pub use self::server::ServerConfig;
pub use self::telemetry::{LogConfig, LogFormat, MetricsConfig, TracingConfig};
pub use self::timeouts::TimeoutConfig;
pub use self::tls::ClientTlsConfig;
pub use self::upstreams::{TargetEntry, UpstreamsConfig};
use crate::plane::Plane;
use crate::stage::Stage;

/// The whole gateway configuration.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Address both listeners bind to.
    pub host: String,
    /// Data-plane port.
    pub port: u16,
    /// Management-plane port.
    pub management_port: u16,
    /// Listener and HTTP settings.
    pub server: ServerConfig,
    /// Timeout budgets per route group.
    pub timeouts: TimeoutConfig,
    /// The NATS connection for envelope-over-NATS backends.
    pub nats: NatsConfig,
    /// Logging.
    pub log: LogConfig,
    /// The `/metrics` endpoint.
    pub metrics: MetricsConfig,
    /// OpenTelemetry trace export.
    pub tracing: TracingConfig,
    /// The WebAssembly policy runtime.
    pub plugins: PluginRuntimeConfig,
    /// The control store (projects, organizations, members, API keys).
    pub control: ControlConfig,
    /// Credentials: API key cache, user and console JWTs.
    pub auth: AuthConfig,
    /// Circuit breakers.
    pub breaker: BreakerConfig,
    /// HTTP backends: storage, realtime, dedicated PostgREST.
    pub upstreams: UpstreamsConfig,
    /// Name resolution: backends, issuers, the platform's JWKS.
    pub dns: DnsConfig,
    /// Rate limits: per IP before auth, per actor after auth, shared through Redis.
    pub rate_limit: RateLimitConfig,
    /// Data-plane settings.
    pub data_plane: DataPlaneConfig,
    /// Management-plane settings.
    pub management_plane: ManagementPlaneConfig,
    /// Introspection routes (`/v1/admin/*`).
    pub admin: AdminConfig,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            host: "0.0.0.0".to_owned(),
            port: 8000,
            management_port: 8001,
            server: ServerConfig::default(),
            timeouts: TimeoutConfig::default(),
            nats: NatsConfig::default(),
            log: LogConfig::default(),
            metrics: MetricsConfig::default(),
            tracing: TracingConfig::default(),
            plugins: PluginRuntimeConfig::default(),
            control: ControlConfig::default(),
            auth: AuthConfig::default(),
            breaker: BreakerConfig::default(),
            upstreams: UpstreamsConfig::default(),
            dns: DnsConfig::default(),
            rate_limit: RateLimitConfig::default(),
            data_plane: DataPlaneConfig::default(),
            management_plane: ManagementPlaneConfig::default(),
            admin: AdminConfig::default(),
        }
    }
}

/// A configuration problem, naming the key.
#[derive(Debug, thiserror::Error)]
#[error("configuration error: {key}: {problem}")]
pub struct ConfigError {
    /// Dotted key (`nats.url`), or the file.
    pub key: String,
    /// What is wrong.
    pub problem: String,
}

/// The error of `key`.
fn problem(key: &str, problem: impl Into<String>) -> ConfigError {
    ConfigError {
        key: key.to_owned(),
        problem: problem.into(),
    }
}

/// `Ok` when `holds`, or the error of `section.field` saying what it must be (`bound`).
fn bounded(
    section: &str,
    field: &str,
    holds: bool,
    bound: std::fmt::Arguments<'_>,
) -> Result<(), ConfigError> {
    if holds {
        Ok(())
    } else {
        Err(problem(
            &format!("{section}.{field}"),
            format!("must be {bound}"),
        ))
    }
}

/// `section.field`'s value within `low..=high`, or the error naming it and the range.
fn within(section: &str, field: &str, value: u64, low: u64, high: u64) -> Result<(), ConfigError> {
    bounded(
        section,
        field,
        (low..=high).contains(&value),
        format_args!("between {low} and {high}"),
    )
}

/// `section.field`'s value at least `min`, or the error naming it and the bound.
fn at_least(section: &str, field: &str, value: u64, min: u64) -> Result<(), ConfigError> {
    bounded(section, field, value >= min, format_args!("at least {min}"))
}

/// `section.field`'s value at most `max`, or the error naming it and the bound.
fn at_most(section: &str, field: &str, value: u64, max: u64) -> Result<(), ConfigError> {
    bounded(section, field, value <= max, format_args!("at most {max}"))
}

/// Adds `note`, in parentheses, to a bound's error: `at_most(…, 3600).map_err(noted("an hour"))`
/// says `must be at most 3600 (an hour)`.
fn noted(note: &'static str) -> impl FnOnce(ConfigError) -> ConfigError {
    move |mut e| {
        e.problem = format!("{} ({note})", e.problem);
        e
    }
}

impl Config {
    /// Loads defaults, then `file` (when given), then `AURA_*` environment variables, and
    /// validates the result.
    pub fn load(file: Option<&Path>) -> Result<Self, ConfigError> {
        Self::load_from(file, Env::prefixed("AURA_").split("__"))
    }

    /// Like [`Config::load`] with an explicit environment provider (tests).
    pub fn load_from(file: Option<&Path>, env: Env) -> Result<Self, ConfigError> {
        let mut figment = Figment::from(Serialized::defaults(Config::default()));
        if let Some(path) = file {
            if !path.is_file() {
                return Err(problem(
                    &path.display().to_string(),
                    "config file not found or not a file",
                ));
            }
            figment = figment.merge(Toml::file(path));
        }
        let config: Config = figment.merge(env).extract().map_err(|e| {
            let key = if e.path.is_empty() {
                file.map(|p| p.display().to_string())
                    .unwrap_or_else(|| "config".to_owned())
            } else {
                e.path.join(".")
            };
            let source = e
                .metadata
                .as_ref()
                .map(|m| format!(" (from {})", m.name))
                .unwrap_or_default();
            problem(&key, format!("{}{source}", e.kind))
        })?;
        let mut config = config;
        config.resolve_relative_paths(file.and_then(Path::parent));
        config.validate(file.and_then(Path::parent))?;
        Ok(config)
    }

    /// SHA-256 of the effective configuration (hex): equal on two instances when they run the
    /// same configuration.
    pub fn digest(&self) -> String {
        use sha2::Digest as _;
        let bytes = serde_json::to_vec(self).unwrap_or_default();
        hex::encode(sha2::Sha256::digest(&bytes))
    }

    /// The effective configuration as JSON, every secret replaced by [`REDACTED`]: values under
    /// a key named like a secret (`*_secret`, `*token`, `*password`…, plugin configurations
    /// included) and passwords in URLs (`redis://user:pw@host`).
    pub fn redacted(&self) -> serde_json::Value {
        let mut value = serde_json::to_value(self).unwrap_or_default();
        redact(&mut value);
        value
    }

    /// Warnings for hops that carry secrets in plain text to a host that is not loopback
    /// (allowed: internal networks may be trusted; `check-config` prints them and the gateway
    /// logs them at start).
    pub fn plaintext_warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut warn = |key: &str, url: &str, what: &str| {
            if let Some(host) = url_host(url)
                && !is_loopback_host(&host)
            {
                out.push(format!(
                    "{key}: {} is plain text to {host}, which is not loopback: {what}",
                    redact_url(url).unwrap_or_else(|| url.to_owned())
                ));
            }
        };
        if self.nats.tls.is_none() {
            for url in self.nats.url.split(',').map(str::trim) {
                if url.starts_with("nats://") || url.starts_with("ws://") {
                    warn(
                        "nats.url",
                        url,
                        "envelopes carry callers' credentials (set nats.tls, or use tls://)",
                    );
                }
            }
        }
        for (name, url) in self.upstreams.service_urls() {
            if let Some(url) = url.as_deref().filter(|u| u.starts_with("http://")) {
                warn(
                    &format!("upstreams.{name}_url"),
                    url,
                    "forwarded requests carry callers' credentials (use https://)",
                );
            }
        }
        for (key, jwt) in [
            ("auth.user_jwt.jwks_url", &self.auth.user_jwt),
            ("auth.console_jwt.jwks_url", &self.auth.console_jwt),
        ] {
            if let Some(url) = jwt.jwks_url.as_deref().filter(|u| u.starts_with("http://")) {
                warn(
                    key,
                    url,
                    "whoever can alter it can mint accepted tokens (use https://)",
                );
            }
        }
        if let Some(url) = &self.control.database_url
            && self.control.tls.is_none()
            && ![
                "sslmode=require",
                "sslmode=verify-ca",
                "sslmode=verify-full",
            ]
            .iter()
            .any(|m| url.contains(m))
        {
            warn(
                "control.database_url",
                url,
                "it carries the database password and key hashes (set control.tls or sslmode=verify-full)",
            );
        }
        if let Some(url) = self.rate_limit.redis_url.as_deref()
            && url.starts_with("redis://")
            && url.contains('@')
        {
            warn(
                "rate_limit.redis_url",
                url,
                "it carries the Redis password (use rediss://)",
            );
        }
        out
    }

    /// Every TLS section, by its dotted key.
    pub fn client_tls_sections(&self) -> Vec<(&'static str, &ClientTlsConfig)> {
        [
            ("nats.tls", &self.nats.tls),
            ("control.tls", &self.control.tls),
            ("rate_limit.redis_tls", &self.rate_limit.redis_tls),
            ("upstreams.tls", &self.upstreams.tls),
            ("tracing.otlp_tls", &self.tracing.otlp_tls),
            ("auth.issuers.tls", &self.auth.issuers.tls),
        ]
        .into_iter()
        .filter_map(|(key, tls)| tls.as_ref().map(|t| (key, t)))
        .collect()
    }

    /// Makes every relative TLS file path absolute, against `base` (the config file's
    /// directory), so that what is in force does not depend on the working directory.
    fn resolve_relative_paths(&mut self, base: Option<&Path>) {
        let Some(base) = base else { return };
        if let Some(dir) = &mut self.plugins.compile_cache_dir
            && Path::new(dir.as_str()).is_relative()
        {
            *dir = base.join(dir.as_str()).display().to_string();
        }
        let fix = |p: &mut String| {
            if Path::new(p.as_str()).is_relative() {
                *p = base.join(p.as_str()).display().to_string();
            }
        };
        for tls in [
            &mut self.nats.tls,
            &mut self.control.tls,
            &mut self.rate_limit.redis_tls,
            &mut self.upstreams.tls,
            &mut self.tracing.otlp_tls,
            &mut self.auth.issuers.tls,
        ]
        .into_iter()
        .flatten()
        {
            for p in [&mut tls.ca_file, &mut tls.cert_file, &mut tls.key_file]
                .into_iter()
                .flatten()
            {
                fix(p);
            }
        }
        for tls in [&mut self.data_plane.tls, &mut self.management_plane.tls]
            .into_iter()
            .flatten()
        {
            fix(&mut tls.cert_file);
            fix(&mut tls.key_file);
            if let Some(ca) = &mut tls.client_ca_file {
                fix(ca);
            }
        }
        if let Some(creds) = &mut self.nats.credentials_file {
            fix(creds);
        }
    }

    /// Checks every value that the types alone cannot, section by section, then the stages of
    /// both planes. `base` resolves relative module paths.
    pub fn validate(&self, base: Option<&Path>) -> Result<(), ConfigError> {
        if self.host.parse::<IpAddr>().is_err() {
            return Err(problem(
                "host",
                format!(
                    "{:?} is not an IP address (e.g. 0.0.0.0 or 127.0.0.1)",
                    self.host
                ),
            ));
        }
        if self.port == self.management_port && self.port != 0 {
            return Err(problem(
                "management_port",
                format!("must differ from port ({})", self.port),
            ));
        }
        self.server.validate("server")?;
        self.timeouts.validate("timeouts")?;
        self.nats.validate("nats")?;
        self.log.validate("log")?;
        self.metrics.validate("metrics")?;
        self.tracing.validate("tracing")?;
        self.plugins.validate("plugins")?;
        self.control.validate("control", base)?;
        self.auth.validate("auth")?;
        self.breaker.validate("breaker")?;
        self.upstreams.validate("upstreams")?;
        self.dns.validate("dns")?;
        self.rate_limit.validate("rate_limit")?;
        self.data_plane.validate(plane_key(Plane::Data))?;
        self.management_plane
            .validate(plane_key(Plane::Management))?;
        self.admin.validate("admin")?;
        for entry in self.stage_entries() {
            entry.config.validate(
                &entry.key,
                entry.stage,
                entry.candidate,
                self.plugins.max_config_bytes,
                base,
            )?;
        }
        Ok(())
    }

    /// The section of `stage` on `plane`; `None` when the stage does not run there.
    pub fn stage(&self, plane: Plane, stage: Stage) -> Option<&StageConfig> {
        match plane {
            Plane::Data => self.data_plane.plugins.get(stage),
            Plane::Management => self.management_plane.plugins.get(stage),
        }
    }

    /// The section of `stage` on `plane`, to change it; `None` when the stage does not run
    /// there.
    pub fn stage_mut(&mut self, plane: Plane, stage: Stage) -> Option<&mut StageConfig> {
        match plane {
            Plane::Data => self.data_plane.plugins.get_mut(stage),
            Plane::Management => self.management_plane.plugins.get_mut(stage),
        }
    }

    /// Every stage of both planes with its dotted key (`data_plane.plugins.cors`), in the order
    /// of [`crate::stage::STAGES`], then every candidate (`<stage key>.candidate`).
    pub fn stages(&self) -> Vec<(String, &StageConfig)> {
        self.stage_entries()
            .into_iter()
            .map(|entry| (entry.key, entry.config))
            .collect()
    }

    /// [`Config::stages`], each with its stage and whether it is a candidate.
    fn stage_entries(&self) -> Vec<StageEntry<'_>> {
        let in_force: Vec<StageEntry<'_>> = Plane::ALL
            .into_iter()
            .flat_map(|plane| {
                Stage::ALL.into_iter().filter_map(move |stage| {
                    Some(StageEntry {
                        key: format!("{}.plugins.{}", plane_key(plane), stage.key()),
                        stage,
                        candidate: false,
                        config: self.stage(plane, stage)?,
                    })
                })
            })
            .collect();
        let candidates: Vec<StageEntry<'_>> = in_force
            .iter()
            .filter_map(|entry| {
                Some(StageEntry {
                    key: format!("{}.candidate", entry.key),
                    stage: entry.stage,
                    candidate: true,
                    config: entry.config.candidate.as_deref()?,
                })
            })
            .collect();
        in_force.into_iter().chain(candidates).collect()
    }
}

/// A stage section of a plane, or its candidate.
struct StageEntry<'a> {
    /// Its dotted key.
    key: String,
    stage: Stage,
    candidate: bool,
    config: &'a StageConfig,
}

/// The key of `plane`'s section (`data_plane`, `management_plane`).
pub fn plane_key(plane: Plane) -> &'static str {
    match plane {
        Plane::Data => "data_plane",
        Plane::Management => "management_plane",
    }
}

/// Checks a bearer token of `key`: at least 16 characters, and a token68, since it is presented
/// as `Authorization: Bearer <token>`.
fn bearer_token(key: &str, token: &str) -> Result<(), ConfigError> {
    if token.len() < 16 {
        return Err(problem(key, "must be at least 16 characters"));
    }
    if !is_token68(token) {
        return Err(problem(
            key,
            "may only hold letters, digits and - . _ ~ + / (then = padding): it is sent as a bearer token",
        ));
    }
    Ok(())
}

/// Whether `s` is a token68 (RFC 9110 §11.2), the form of a bearer token.
fn is_token68(s: &str) -> bool {
    let body = s.trim_end_matches('=');
    !body.is_empty()
        && body.bytes().all(|b| {
            b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b'+' | b'/')
        })
}

/// Resolves a module path relative to the config file's folder.
pub fn resolve(base: Option<&Path>, path: &Path) -> PathBuf {
    match base {
        Some(base) if path.is_relative() => base.join(path),
        _ => path.to_path_buf(),
    }
}

/// What replaces a secret in [`Config::redacted`].
pub const REDACTED: &str = "[redacted]";

/// Whether a configuration key holds a secret (by its name, wherever it is: plugin
/// configurations included).
fn is_secret_key(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    [
        "secret",
        "token",
        "password",
        "passwd",
        "credentials",
        "private_key",
        "seed",
    ]
    .iter()
    .any(|s| key == *s || key.ends_with(&format!("_{s}")) || key.starts_with(&format!("{s}_")))
}

/// The host of a URL (`scheme://[user@]host[:port]/…`), without brackets or port.
fn url_host(url: &str) -> Option<String> {
    let (_, rest) = url.split_once("://")?;
    let authority = rest.split(['/', '?', '#']).next()?;
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let host = if let Some(v6) = host_port.strip_prefix('[') {
        v6.split(']').next()?
    } else {
        host_port.split(':').next()?
    };
    (!host.is_empty()).then(|| host.to_ascii_lowercase())
}

/// `localhost` or a loopback address.
pub fn is_loopback_host(host: &str) -> bool {
    host == "localhost"
        || host.ends_with(".localhost")
        || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// Query parameters that carry a secret in connection URLs (besides the names
/// [`is_secret_key`] takes: `password`, `token`, `*_secret`…).
const SECRET_PARAMETERS: &[&str] = &[
    "pass",
    "pwd",
    "passphrase",
    "sslpassword",
    "auth",
    "authtoken",
    "apikey",
    "api_key",
    "key",
    "access_key",
    "sig",
    "signature",
    "jwt",
    "nkey",
];

/// Whether a URL query parameter named `name` carries a secret.
fn is_secret_parameter(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    is_secret_key(&name) || SECRET_PARAMETERS.contains(&name.as_str())
}

/// A URL with its password (or a user that is a token) and its secret query parameters
/// (`?password=…`, `?token=…`) replaced; `None` when it holds neither.
fn redact_url(value: &str) -> Option<String> {
    let (scheme, rest) = value.split_once("://")?;
    let (authority, path) = match rest.find(['/', '?', '#']) {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let authority = match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = match userinfo.split_once(':') {
                Some((user, _)) => format!("{user}:{REDACTED}"),
                None => REDACTED.to_owned(),
            };
            format!("{user}@{host}")
        }
        None => authority.to_owned(),
    };
    let (path, fragment) = match path.split_once('#') {
        Some((p, f)) => (p, Some(f)),
        None => (path, None),
    };
    let path = match path.split_once('?') {
        Some((p, query)) => {
            let query: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((name, _)) if is_secret_parameter(name) => format!("{name}={REDACTED}"),
                    _ => pair.to_owned(),
                })
                .collect();
            format!("{p}?{}", query.join("&"))
        }
        None => path.to_owned(),
    };
    let out = match fragment {
        Some(f) => format!("{scheme}://{authority}{path}#{f}"),
        None => format!("{scheme}://{authority}{path}"),
    };
    (out != value).then_some(out)
}

fn redact(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, v) in map.iter_mut() {
                if is_secret_key(key) && !v.is_null() {
                    *v = serde_json::Value::String(REDACTED.to_owned());
                } else {
                    redact(v);
                }
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(redact),
        // Comma-separated URL lists (`nats.url`) too.
        serde_json::Value::String(s) if s.contains("://") && s.contains(['@', '?']) => {
            *s = s
                .split(',')
                .map(|part| redact_url(part.trim()).unwrap_or_else(|| part.trim().to_owned()))
                .collect::<Vec<_>>()
                .join(",");
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests;
