//! Configuration: a TOML file, environment overrides, defaults for everything, one validation.
//!
//! Sources, later ones winning: built-in defaults, the TOML file given with `--config`, then
//! environment variables `AURA_<KEY>`, with `__` between nested keys (`AURA_PORT`,
//! `AURA_MANAGEMENT_PORT`, `AURA_NATS__URL`, `AURA_TIMEOUTS__DEFAULT_MS`). Unknown keys are
//! rejected, from the file and from the environment alike. Every key is documented in
//! `docs/configuration.md`.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::{Deserialize, Serialize};

use crate::stage::Trial;

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
            rate_limit: RateLimitConfig::default(),
            data_plane: DataPlaneConfig::default(),
            management_plane: ManagementPlaneConfig::default(),
            admin: AdminConfig::default(),
        }
    }
}

/// Listener and HTTP settings, shared by both planes.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Largest request body accepted on the NATS routes, in bytes (413 above).
    pub max_body_bytes: usize,
    /// Time allowed to receive a request's headers, a new connection's first byte, and the next
    /// request on a keep-alive connection (slowloris and idle guard), in milliseconds.
    pub header_read_timeout_ms: u64,
    /// Open connections accepted per listener; further connections wait in the backlog.
    pub max_connections: usize,
    /// Requests processed at once per listener (up to their response head); past it a request
    /// is answered `503 overloaded` with `Retry-After` at once instead of queueing.
    pub max_in_flight: usize,
    /// On SIGINT/SIGTERM, how long in-flight requests may take to finish, in seconds.
    pub shutdown_grace_secs: u64,
    /// On SIGTERM, how long the instance keeps serving while `/ready` answers `503`, before
    /// the listeners stop accepting (so that load balancers stop sending first), in seconds.
    /// SIGINT does not wait.
    pub drain_delay_secs: u64,
    /// Serve HTTP/2 with prior knowledge (h2c) on the plain-text listeners, besides HTTP/1.1
    /// (for internal hops: load balancers and meshes speaking h2c). Off: HTTP/1.1 only.
    pub http2: bool,
    /// HTTP/2 streams one connection may have open at once (advertised in SETTINGS; a stream
    /// past it is refused by the protocol). Every stream is a request and counts against
    /// `max_in_flight` too.
    pub http2_max_concurrent_streams: u32,
    /// Largest request head accepted, in bytes: the HTTP/1.1 request line and headers
    /// (`431` above), the decoded HTTP/2 header list (the stream is refused above).
    pub max_header_bytes: u32,
    /// How often the listeners' certificate files are checked for a change, in milliseconds
    /// (SIGHUP reloads them at once).
    pub tls_watch_interval_ms: u64,
    /// An HTTP/2 connection with no stream open for this long is closed (GOAWAY), in
    /// milliseconds. Frames without a stream (PING) do not keep it open. Its first stream must
    /// start within `header_read_timeout_ms` of the accept, like an HTTP/1.1 request.
    pub http2_idle_timeout_ms: u64,
    /// How often the gateway PINGs an HTTP/2 client, in milliseconds; a client that does not
    /// answer within `http2_keep_alive_timeout_ms` is gone and its connection (with its
    /// streams) is closed. 0: no PINGs.
    pub http2_keep_alive_interval_ms: u64,
    /// How long an HTTP/2 client has to answer a PING, in milliseconds.
    pub http2_keep_alive_timeout_ms: u64,
    /// Long-lived exchanges open at once per listener, whatever the protocol: streamed bodies
    /// to and from HTTP backends (storage, realtime SSE and REST, PostgREST) and WebSocket
    /// tunnels. Past it, such a request is answered `503 too_many_streams` with `Retry-After`
    /// before any backend connection is made (an HTTP/2 connection multiplexes up to
    /// `http2_max_concurrent_streams` of them). None: `max_connections`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_streams: Option<usize>,
}

impl ServerConfig {
    /// `max_streams`, or `max_connections` when unset.
    pub fn stream_budget(&self) -> usize {
        self.max_streams.unwrap_or(self.max_connections)
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            max_body_bytes: 10 * 1024 * 1024,
            header_read_timeout_ms: 10_000,
            max_connections: 20_000,
            max_in_flight: 10_000,
            shutdown_grace_secs: 30,
            drain_delay_secs: 0,
            http2: true,
            http2_max_concurrent_streams: 100,
            max_header_bytes: 64 * 1024,
            tls_watch_interval_ms: 2_000,
            http2_idle_timeout_ms: 60_000,
            http2_keep_alive_interval_ms: 20_000,
            http2_keep_alive_timeout_ms: 10_000,
            max_streams: None,
        }
    }
}

/// Timeout budgets, one per route group. There is no global timeout.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct TimeoutConfig {
    /// Budget of every route outside the functions group, in milliseconds.
    pub default_ms: u64,
    /// Budget of `/v1/functions/*`, in milliseconds.
    pub functions_ms: u64,
}

impl Default for TimeoutConfig {
    fn default() -> Self {
        Self {
            default_ms: 30_000,
            functions_ms: 380_000,
        }
    }
}

impl TimeoutConfig {
    /// The default budget.
    pub fn default_budget(&self) -> Duration {
        Duration::from_millis(self.default_ms)
    }

    /// The functions budget.
    pub fn functions_budget(&self) -> Duration {
        Duration::from_millis(self.functions_ms)
    }
}

/// NATS settings.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct NatsConfig {
    /// Server URL(s), comma-separated (`nats://host:4222`).
    pub url: String,
    /// Subject prefix: requests go to `{prefix}.{service}.http`.
    pub subject_prefix: String,
    /// Time allowed for each connection attempt, in milliseconds.
    pub connect_timeout_ms: u64,
    /// Replays after a no-responders answer (proof of non-delivery), at most.
    pub no_responder_retries: u32,
    /// Wait before the first replay, in milliseconds; doubled for each further one.
    pub retry_backoff_ms: u64,
    /// TLS to NATS: when set, TLS is required (whatever the URL's scheme says); its CA bundle
    /// replaces the system roots, and its client certificate answers servers with `verify`.
    pub tls: Option<ClientTlsConfig>,
    /// User name (with `password`).
    pub user: Option<String>,
    /// Password of `user`.
    pub password: Option<String>,
    /// Authentication token.
    pub token: Option<String>,
    /// NKey seed (`SU…`) of the gateway's user.
    pub nkey_seed: Option<String>,
    /// A `.creds` file: the user JWT and its NKey seed (decentralised authentication).
    pub credentials_file: Option<String>,
    /// The fleet's shared secret (at least 32 characters, the same on every instance): change
    /// events on NATS are signed with it (HMAC-SHA256) and events that do not verify are
    /// refused. None: instances neither publish nor accept change events on NATS.
    pub fleet_secret: Option<String>,
}

impl Default for NatsConfig {
    fn default() -> Self {
        Self {
            url: "nats://127.0.0.1:4222".to_owned(),
            subject_prefix: "aura".to_owned(),
            connect_timeout_ms: 2_000,
            no_responder_retries: 3,
            retry_backoff_ms: 25,
            tls: None,
            user: None,
            password: None,
            token: None,
            nkey_seed: None,
            credentials_file: None,
            fleet_secret: None,
        }
    }
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Logging settings.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// `text` or `json`.
    pub format: LogFormat,
    /// A tracing filter (`info`, `aura_gateway=debug,info`).
    pub level: String,
    /// Log lines queued for the writer at most; when stderr cannot keep up, further lines are
    /// dropped (and counted) rather than making a request wait.
    pub buffer_lines: usize,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            format: LogFormat::Text,
            level: "info".to_owned(),
            buffer_lines: 65_536,
        }
    }
}

/// Trace export.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct TracingConfig {
    /// OTLP/HTTP endpoint of a collector (`http://collector:4318`); spans go to
    /// `{endpoint}/v1/traces`. None: no export.
    pub otlp_endpoint: Option<String>,
    /// `service.name` of the exported spans.
    pub service_name: String,
    /// Trust for an `https://` endpoint: a CA bundle added to the public roots, a client
    /// certificate.
    pub otlp_tls: Option<ClientTlsConfig>,
}

/// TLS settings of a connection the gateway opens. Relative paths are resolved against the
/// config file's directory.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ClientTlsConfig {
    /// PEM bundle of the CAs that may sign the server's certificate.
    pub ca_file: Option<String>,
    /// PEM client certificate chain (with `key_file`), for servers that ask for one.
    pub cert_file: Option<String>,
    /// PEM private key of `cert_file`.
    pub key_file: Option<String>,
}

impl Default for TracingConfig {
    fn default() -> Self {
        Self {
            otlp_endpoint: None,
            service_name: "aura-gateway".to_owned(),
            otlp_tls: None,
        }
    }
}

/// `/metrics` settings.
#[derive(Debug, Clone, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// Bearer token required on `GET /metrics`. Without one, `/metrics` answers 404.
    pub token: Option<String>,
}

/// Which control store implementation to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    /// A declarative TOML file (DB-less mode).
    File,
    /// PostgreSQL, schema `aura_control`.
    Postgres,
}

/// The control store.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ControlConfig {
    /// `file` (default) or `postgres`.
    pub store: StoreKind,
    /// The control file (file store); relative to the config file. None: an empty store.
    pub file: Option<String>,
    /// How often the control file is checked for changes, in milliseconds.
    pub reload_interval_ms: u64,
    /// `postgres://…` (postgres store). TLS settings may go in the URL too
    /// (`?sslmode=verify-full&sslrootcert=/path/ca.pem`).
    pub database_url: Option<String>,
    /// TLS to PostgreSQL: when set, `sslmode=verify-full` (the server's certificate must be
    /// signed by `ca_file`, or a public CA without it, and name the URL's host), with an
    /// optional client certificate.
    pub tls: Option<ClientTlsConfig>,
    /// Listen to the tables' change notifications (postgres store; `migrate` installs the
    /// triggers): a change made by anyone applies on every instance at once.
    pub notifications: bool,
    /// Pool size (postgres store).
    pub max_connections: u32,
    /// Time allowed to get a pooled connection, in milliseconds (postgres store).
    pub acquire_timeout_ms: u64,
    /// Reloads and refreshes asked for by change events (another instance's, or PostgreSQL's
    /// change log) start at most once per this interval, in milliseconds; asks in between are
    /// folded into the next one.
    pub change_min_interval_ms: u64,
}

impl Default for ControlConfig {
    fn default() -> Self {
        Self {
            store: StoreKind::File,
            file: None,
            reload_interval_ms: 1_000,
            database_url: None,
            tls: None,
            notifications: true,
            max_connections: 10,
            acquire_timeout_ms: 2_000,
            change_min_interval_ms: 1_000,
        }
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

/// Circuit breakers: one per service, one per dedicated PostgREST target.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct BreakerConfig {
    /// Consecutive failures that open a breaker.
    pub failure_threshold: u32,
    /// How long an open breaker refuses calls, in milliseconds.
    pub open_ms: u64,
    /// Calls admitted at once while half-open.
    pub half_open_probes: u32,
    /// Dedicated PostgREST targets tracked at most.
    pub max_targets: usize,
    /// Period of the sweep of idle PostgREST target breakers, in seconds.
    pub sweep_secs: u64,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        Self {
            failure_threshold: 5,
            open_ms: 5_000,
            half_open_probes: 1,
            max_targets: 10_000,
            sweep_secs: 60,
        }
    }
}

/// HTTP backends.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct UpstreamsConfig {
    /// Base URL of the storage service (`http://host:port[/path]`); none: storage answers 503.
    pub storage_url: Option<String>,
    /// Base URL of the realtime service; none: realtime answers 503.
    pub realtime_url: Option<String>,
    /// Largest upload accepted on `/v1/storage/*`, in bytes (streamed, never buffered).
    pub storage_max_body_bytes: u64,
    /// Time allowed to open a connection to an HTTP backend, in milliseconds.
    pub connect_timeout_ms: u64,
    /// A stream (body, SSE, WebSocket) with no traffic either way for this long is closed, in
    /// seconds. Streams are not bounded by the route budget once established.
    pub stream_idle_timeout_secs: u64,
    /// Idle pooled connections kept per backend host.
    pub pool_max_idle_per_host: usize,
    /// Dedicated PostgREST targets the gateway may call: CIDRs (`10.0.0.0/8`), IP addresses,
    /// host names (`pg.internal`) or suffixes (`.pg.internal`). A project's `postgrest_url`
    /// outside the list is answered `503 db_target_not_allowed`. Empty: none allowed.
    pub postgrest_allowed_targets: Vec<String>,
    /// Trust for `https://` backends: a CA bundle added to the public roots, a client
    /// certificate. `http://` backends stay allowed (`check-config` warns when one that
    /// receives credentials is not on loopback).
    pub tls: Option<ClientTlsConfig>,
}

impl Default for UpstreamsConfig {
    fn default() -> Self {
        Self {
            storage_url: None,
            realtime_url: None,
            storage_max_body_bytes: 5 * 1024 * 1024 * 1024,
            connect_timeout_ms: 2_000,
            stream_idle_timeout_secs: 300,
            pool_max_idle_per_host: 64,
            postgrest_allowed_targets: Vec::new(),
            tls: None,
        }
    }
}

impl UpstreamsConfig {
    /// The entries of `postgrest_allowed_targets`; the error names the first that is none.
    pub fn postgrest_targets(&self) -> Result<Vec<TargetEntry>, String> {
        self.postgrest_allowed_targets
            .iter()
            .map(|entry| TargetEntry::parse(entry))
            .collect()
    }
}

/// An entry of `upstreams.postgrest_allowed_targets`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetEntry {
    /// A network (`10.0.0.0/8`); an IP address is a network of one.
    Net(ipnet::IpNet),
    /// A host name (`pg.internal`), lower case.
    Host(String),
    /// A suffix (`.pg.internal`), lower case, starting with `.`.
    Suffix(String),
}

impl TargetEntry {
    /// Parses an entry: a CIDR, an IP address, a host name or a `.suffix`. The error names the
    /// entry.
    pub fn parse(entry: &str) -> Result<Self, String> {
        let e = entry.trim().to_ascii_lowercase();
        if let Ok(net) = e.parse::<ipnet::IpNet>() {
            Ok(TargetEntry::Net(net))
        } else if let Ok(ip) = e.parse::<IpAddr>() {
            Ok(TargetEntry::Net(ipnet::IpNet::from(ip)))
        } else if let Some(rest) = e.strip_prefix('.')
            && is_host_name(rest)
        {
            Ok(TargetEntry::Suffix(e))
        } else if is_host_name(&e) {
            Ok(TargetEntry::Host(e))
        } else {
            Err(format!(
                "{entry:?} is neither a CIDR, an IP address, a host name nor a .suffix"
            ))
        }
    }
}

/// Whether `s` is a DNS host name: dot-separated labels of 1 to 63 letters, digits and `-`.
fn is_host_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
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
}

impl Default for RuleCeilings {
    fn default() -> Self {
        Self::tenant()
    }
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

/// How plugin instances are used across calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum InstanceReuse {
    /// Configured instances are kept per module and reused, one call at a time; an instance
    /// that fails is discarded.
    Pooled,
    /// Every call gets a new store and instance (configured anew).
    Fresh,
}

/// The WebAssembly policy runtime.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct PluginRuntimeConfig {
    /// `pooled` (default, measured faster) or `fresh`.
    pub instance_reuse: InstanceReuse,
    /// Wall-clock deadline of one plugin call, in milliseconds.
    pub call_deadline_ms: u64,
    /// Linear memory cap of one plugin instance, in bytes.
    pub memory_limit_bytes: usize,
    /// Idle instances kept per loaded module (pooled mode).
    pub max_idle_instances: usize,
    /// Reload the plugin sections when the config file or a module file changes (SIGHUP always
    /// reloads).
    pub watch: bool,
    /// How often the config and module files are checked for changes, in milliseconds.
    pub watch_interval_ms: u64,
    /// A swapped-in module failing (trap, deadline, memory) on more than this share of its
    /// calls within `rollback_window_secs` is replaced by the previous modules.
    pub rollback_failure_ratio: f64,
    /// The window of `rollback_failure_ratio`, in seconds.
    pub rollback_window_secs: u64,
    /// Calls a window needs before the ratio is judged.
    pub rollback_min_calls: u64,
    /// Largest module a project may upload, in bytes.
    pub tenant_max_module_bytes: usize,
    /// Longest compile time of an uploaded module, in milliseconds.
    pub tenant_max_compile_ms: u64,
    /// How often every instance reloads the projects' modules from the control store, in
    /// seconds.
    pub tenant_refresh_secs: u64,
    /// Bearer token of `POST /v1/policies/reload` on the management plane; none: no such route.
    pub admin_token: Option<String>,
    /// Largest private memory (heap, anonymous maps, thread stacks) the process compiling an
    /// uploaded module may use, in bytes; past it the compilation is stopped and the module
    /// refused.
    pub tenant_max_compile_memory_bytes: u64,
    /// Uploaded modules compiled at once (each in a process of its own).
    pub tenant_compile_concurrency: usize,
    /// Module uploads in progress at once per instance; past it an upload is answered `503`.
    pub tenant_max_concurrent_uploads: usize,
    /// Of those, uploads one organization may have in progress at once (the others' share
    /// stays free); past it its upload is answered `503 uploads_busy`.
    pub tenant_max_concurrent_uploads_per_org: usize,
    /// Largest stage configuration accepted, in bytes of its JSON text: in a project's upload
    /// (`413 config_too_large`), in this file's `plugins.*.config`, and read back from the
    /// control store (a larger one is refused like a module that does not load). The policy
    /// history keeps each configuration once, bounded by it.
    pub max_config_bytes: usize,
    /// The executable run to compile uploaded modules (`<exe> compile-worker`). None: this
    /// executable.
    pub tenant_compile_worker: Option<String>,
    /// Memory kept for compiled modules (by digest), in bytes: a module installed again, or by
    /// several projects, is not compiled again.
    pub compiled_cache_bytes: u64,
    /// A folder where modules named in the configuration are kept compiled (by digest and engine
    /// settings), so that a restart or `check-config` loads them instead of compiling them
    /// again: seconds per module for a Python or JavaScript runtime. Relative to the config
    /// file; created with mode 0700; refused when another user owns it or it is writable by
    /// others (its files are native code). None: always compile.
    pub compile_cache_dir: Option<String>,
    /// How long a module refused when loaded is remembered (by digest and configuration) and
    /// refused again without being recompiled, in seconds.
    pub tenant_refused_retry_secs: u64,
    /// Threads running projects' module calls (off the request workers).
    pub tenant_threads: usize,
    /// Calls of one project's modules in progress at once (below `tenant_threads`).
    pub tenant_max_concurrent_calls: usize,
    /// How long a tenant module call may wait for a place before its request fails closed
    /// (`503 policy_busy`), in milliseconds.
    pub tenant_queue_timeout_ms: u64,
    /// How often stored modules no project uses are collected, in seconds.
    pub module_gc_interval_secs: u64,
    /// A stored module is collected once no project references it and no instance has used it
    /// for this long, in seconds.
    pub module_gc_grace_secs: u64,
}

impl Default for PluginRuntimeConfig {
    fn default() -> Self {
        Self {
            instance_reuse: InstanceReuse::Pooled,
            call_deadline_ms: 20,
            memory_limit_bytes: 16 * 1024 * 1024,
            max_idle_instances: 16,
            watch: true,
            watch_interval_ms: 1_000,
            rollback_failure_ratio: 0.5,
            rollback_window_secs: 10,
            rollback_min_calls: 20,
            tenant_max_module_bytes: 4 * 1024 * 1024,
            tenant_max_compile_ms: 10_000,
            tenant_refresh_secs: 5,
            admin_token: None,
            tenant_max_compile_memory_bytes: 512 << 20,
            tenant_compile_concurrency: 1,
            tenant_max_concurrent_uploads: 2,
            tenant_max_concurrent_uploads_per_org: 1,
            max_config_bytes: 64 * 1024,
            tenant_compile_worker: None,
            compiled_cache_bytes: 128 * 1024 * 1024,
            compile_cache_dir: None,
            tenant_refused_retry_secs: 3_600,
            tenant_threads: 4,
            tenant_max_concurrent_calls: 2,
            tenant_queue_timeout_ms: 100,
            module_gc_interval_secs: 3_600,
            module_gc_grace_secs: 7 * 24 * 3_600,
        }
    }
}

/// Which module runs a stage, and its configuration.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct StageConfig {
    /// `builtin` for the default plugin embedded in the binary, a path to a `.wasm` component,
    /// or `sha256:<digest>` for a module of the control store's module store.
    pub module: String,
    /// The stage's own configuration, passed to the plugin's `configure` as JSON.
    pub config: serde_json::Value,
    /// A module tried next to this one on live traffic (the `cors` and `quota` stages only): its
    /// own `module` and `config`, with `mode` = `shadow` (run and compared, never deciding) or
    /// `canary` with `percent` (deciding for that share of actors).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub candidate: Option<Box<StageConfig>>,
    /// In a candidate: `shadow` or `canary`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// In a canary: the share of actors it decides for, 1–100.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub percent: Option<u8>,
}

impl Default for StageConfig {
    fn default() -> Self {
        Self {
            module: BUILTIN.to_owned(),
            config: serde_json::Value::Object(serde_json::Map::new()),
            candidate: None,
            mode: None,
            percent: None,
        }
    }
}

/// The value of `module` naming the embedded default plugin.
pub const BUILTIN: &str = "builtin";

/// The prefix of `module` naming a module of the control store by digest.
pub const STORE_PREFIX: &str = "sha256:";

/// Whether `s` is a SHA-256 digest in lower-case hex.
pub fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

impl StageConfig {
    /// The module file, or `None` for the built-in plugin or a module of the store.
    pub fn module_path(&self) -> Option<&Path> {
        (self.module != BUILTIN && self.module_digest().is_none()).then(|| Path::new(&self.module))
    }

    /// The digest of a module in the control store's module store (`module = "sha256:<hex>"`).
    pub fn module_digest(&self) -> Option<&str> {
        self.module.strip_prefix(STORE_PREFIX)
    }

    /// How the candidate is tried (`None` for a stage's module in force, or a mode that
    /// validation refuses).
    pub fn trial(&self) -> Option<Trial> {
        Trial::parse(self.mode.as_deref()?, self.percent)
            .ok()
            .flatten()
    }
}

/// Data-plane stage modules.
#[derive(Debug, Clone, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct DataPlaneStages {
    pub api_key: StageConfig,
    pub cors: StageConfig,
    pub quota: StageConfig,
    pub db_routing: StageConfig,
}

/// Management-plane stage modules (there are no API keys on this plane).
#[derive(Debug, Clone, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ManagementPlaneStages {
    pub cors: StageConfig,
    pub quota: StageConfig,
    pub db_routing: StageConfig,
}

/// Data-plane settings.
#[derive(Debug, Clone, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct DataPlaneConfig {
    pub plugins: DataPlaneStages,
    /// When set (`.api.example.com`), a request whose `Host` is `<ref><suffix>` belongs to
    /// project `<ref>` before any key is seen: its preflights follow the project's CORS module.
    pub project_host_suffix: Option<String>,
    /// HTTPS on the data-plane listener (absent: plain HTTP).
    pub tls: Option<ListenerTlsConfig>,
}

/// Management-plane settings.
#[derive(Debug, Clone, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ManagementPlaneConfig {
    pub plugins: ManagementPlaneStages,
    /// HTTPS on the management-plane listener (absent: plain HTTP).
    pub tls: Option<ListenerTlsConfig>,
}

/// HTTPS on one listener: TLS 1.2 or 1.3, ALPN `h2` (with `server.http2`) and `http/1.1`.
/// The files are read again when they change and on SIGHUP; relative paths are resolved
/// against the config file's directory.
#[derive(Debug, Clone, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListenerTlsConfig {
    /// PEM certificate chain, the leaf first.
    pub cert_file: String,
    /// PEM private key of the leaf (PKCS#8, PKCS#1 or SEC1).
    pub key_file: String,
    /// PEM bundle of the CAs whose client certificates are accepted; when set, a client
    /// without such a certificate fails the handshake (mTLS).
    #[serde(default)]
    pub client_ca_file: Option<String>,
}

/// Introspection routes of the management plane (`/v1/admin/*`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    /// Bearer token of `/v1/admin/*` (at least 16 characters). Without it,
    /// `plugins.admin_token` guards them; without either, the routes do not exist.
    pub token: Option<String>,
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

/// A configuration problem, naming the key.
#[derive(Debug, thiserror::Error)]
#[error("configuration error: {key}: {problem}")]
pub struct ConfigError {
    /// Dotted key (`nats.url`), or the file.
    pub key: String,
    /// What is wrong.
    pub problem: String,
}

fn problem(key: &str, problem: impl Into<String>) -> ConfigError {
    ConfigError {
        key: key.to_owned(),
        problem: problem.into(),
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
        for (key, url) in [
            ("upstreams.storage_url", &self.upstreams.storage_url),
            ("upstreams.realtime_url", &self.upstreams.realtime_url),
        ] {
            if let Some(url) = url.as_deref().filter(|u| u.starts_with("http://")) {
                warn(
                    key,
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

    fn validate_tls(&self) -> Result<(), ConfigError> {
        for (key, tls) in self.client_tls_sections() {
            if tls.cert_file.is_some() != tls.key_file.is_some() {
                return Err(problem(
                    key,
                    "cert_file and key_file go together (a client certificate and its key)",
                ));
            }
            for (field, path) in [
                ("ca_file", &tls.ca_file),
                ("cert_file", &tls.cert_file),
                ("key_file", &tls.key_file),
            ] {
                if let Some(path) = path
                    && !Path::new(path).is_file()
                {
                    return Err(problem(
                        &format!("{key}.{field}"),
                        format!("{path} is not a file"),
                    ));
                }
            }
        }
        for (key, tls) in [
            ("data_plane.tls", &self.data_plane.tls),
            ("management_plane.tls", &self.management_plane.tls),
        ] {
            let Some(tls) = tls else { continue };
            for (field, path) in [
                ("cert_file", Some(&tls.cert_file)),
                ("key_file", Some(&tls.key_file)),
                ("client_ca_file", tls.client_ca_file.as_ref()),
            ] {
                if let Some(path) = path
                    && !Path::new(path).is_file()
                {
                    return Err(problem(
                        &format!("{key}.{field}"),
                        format!("{path:?} is not a file"),
                    ));
                }
            }
        }
        if !(100..=3_600_000).contains(&self.server.tls_watch_interval_ms) {
            return Err(problem(
                "server.tls_watch_interval_ms",
                "must be between 100 and 3600000",
            ));
        }
        let n = &self.nats;
        let methods = [
            n.user.is_some(),
            n.token.is_some(),
            n.nkey_seed.is_some(),
            n.credentials_file.is_some(),
        ]
        .iter()
        .filter(|m| **m)
        .count();
        if methods > 1 {
            return Err(problem(
                "nats",
                "user/password, token, nkey_seed and credentials_file are alternatives: set one",
            ));
        }
        if let Some(secret) = &n.fleet_secret
            && secret.len() < 32
        {
            return Err(problem(
                "nats.fleet_secret",
                "must be at least 32 characters (it signs the fleet's change events)",
            ));
        }
        if n.password.is_some() && n.user.is_none() {
            return Err(problem("nats.password", "needs nats.user"));
        }
        if let Some(seed) = &n.nkey_seed
            && !seed.starts_with("SU")
        {
            return Err(problem(
                "nats.nkey_seed",
                "is not a user NKey seed (it starts with SU)",
            ));
        }
        if let Some(creds) = &n.credentials_file
            && !Path::new(creds).is_file()
        {
            return Err(problem(
                "nats.credentials_file",
                format!("{creds} is not a file"),
            ));
        }
        Ok(())
    }

    /// Checks every value that the types alone cannot. `base` resolves relative module paths.
    pub fn validate(&self, base: Option<&Path>) -> Result<(), ConfigError> {
        self.validate_tls()?;
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
        let s = &self.server;
        if s.max_body_bytes == 0 {
            return Err(problem("server.max_body_bytes", "must be at least 1"));
        }
        if s.header_read_timeout_ms == 0 {
            return Err(problem(
                "server.header_read_timeout_ms",
                "must be at least 1",
            ));
        }
        if s.max_connections == 0 {
            return Err(problem("server.max_connections", "must be at least 1"));
        }
        if s.max_in_flight == 0 {
            return Err(problem("server.max_in_flight", "must be at least 1"));
        }
        if !(1..=10_000).contains(&s.http2_max_concurrent_streams) {
            return Err(problem(
                "server.http2_max_concurrent_streams",
                "must be between 1 and 10000",
            ));
        }
        if !(8192..=1 << 20).contains(&s.max_header_bytes) {
            return Err(problem(
                "server.max_header_bytes",
                "must be between 8192 and 1048576",
            ));
        }
        if s.http2_idle_timeout_ms == 0 {
            return Err(problem(
                "server.http2_idle_timeout_ms",
                "must be at least 1",
            ));
        }
        if s.http2_keep_alive_interval_ms > 0 && s.http2_keep_alive_timeout_ms == 0 {
            return Err(problem(
                "server.http2_keep_alive_timeout_ms",
                "must be at least 1 while http2_keep_alive_interval_ms is on",
            ));
        }
        if s.max_streams == Some(0) {
            return Err(problem("server.max_streams", "must be at least 1"));
        }
        if s.drain_delay_secs > 3_600 {
            return Err(problem(
                "server.drain_delay_secs",
                "must be at most 3600 (an hour)",
            ));
        }
        if self.timeouts.default_ms == 0 {
            return Err(problem("timeouts.default_ms", "must be at least 1"));
        }
        if self.timeouts.functions_ms == 0 {
            return Err(problem("timeouts.functions_ms", "must be at least 1"));
        }
        for url in self.nats.url.split(',') {
            let url = url.trim();
            let ok = ["nats://", "tls://", "ws://", "wss://"]
                .iter()
                .any(|scheme| url.len() > scheme.len() && url.starts_with(scheme));
            if !ok {
                return Err(problem(
                    "nats.url",
                    format!("{url:?} is not a NATS URL (nats://host:port)"),
                ));
            }
        }
        let prefix = &self.nats.subject_prefix;
        if prefix.is_empty()
            || prefix.starts_with('.')
            || prefix.ends_with('.')
            || prefix.contains("..")
            || prefix
                .chars()
                .any(|c| c.is_whitespace() || c == '*' || c == '>')
        {
            return Err(problem(
                "nats.subject_prefix",
                format!(
                    "{prefix:?} is not a valid subject prefix (tokens separated by dots, no wildcards)"
                ),
            ));
        }
        if let Err(e) = tracing_subscriber::EnvFilter::builder().parse(&self.log.level) {
            return Err(problem("log.level", format!("not a valid filter: {e}")));
        }
        if self.log.buffer_lines == 0 {
            return Err(problem("log.buffer_lines", "must be at least 1"));
        }
        if let Some(endpoint) = &self.tracing.otlp_endpoint
            && !(endpoint.starts_with("http://") || endpoint.starts_with("https://"))
        {
            return Err(problem("tracing.otlp_endpoint", "must be an http(s) URL"));
        }
        if let Some(token) = &self.metrics.token
            && token.len() < 16
        {
            return Err(problem("metrics.token", "must be at least 16 characters"));
        }
        if let Some(token) = &self.admin.token
            && token.len() < 16
        {
            return Err(problem("admin.token", "must be at least 16 characters"));
        }
        // All are presented as `Authorization: Bearer <token>`, which only carries a token68.
        for (key, token) in [
            ("metrics.token", &self.metrics.token),
            ("plugins.admin_token", &self.plugins.admin_token),
            ("admin.token", &self.admin.token),
        ] {
            if let Some(token) = token
                && !is_token68(token)
            {
                return Err(problem(
                    key,
                    "may only hold letters, digits and - . _ ~ + / (then = padding): it is sent as a bearer token",
                ));
            }
        }
        let p = &self.plugins;
        if !(1..=10_000).contains(&p.call_deadline_ms) {
            return Err(problem(
                "plugins.call_deadline_ms",
                "must be between 1 and 10000",
            ));
        }
        if !(1 << 20..=1 << 30).contains(&p.memory_limit_bytes) {
            return Err(problem(
                "plugins.memory_limit_bytes",
                "must be between 1 MiB (1048576) and 1 GiB (1073741824)",
            ));
        }
        if !(p.rollback_failure_ratio > 0.0 && p.rollback_failure_ratio <= 1.0) {
            return Err(problem(
                "plugins.rollback_failure_ratio",
                "must be in (0, 1]",
            ));
        }
        if p.rollback_window_secs == 0 || p.rollback_min_calls == 0 || p.watch_interval_ms == 0 {
            return Err(problem(
                "plugins",
                "rollback_window_secs, rollback_min_calls and watch_interval_ms must be at least 1",
            ));
        }
        if p.admin_token.as_ref().is_some_and(|t| t.len() < 16) {
            return Err(problem(
                "plugins.admin_token",
                "must be at least 16 characters",
            ));
        }
        if p.max_idle_instances == 0 {
            return Err(problem("plugins.max_idle_instances", "must be at least 1"));
        }
        if p.tenant_max_compile_memory_bytes < 256 << 20 {
            return Err(problem(
                "plugins.tenant_max_compile_memory_bytes",
                "must be at least 256 MiB (268435456): the compiler's own threads need about 100",
            ));
        }
        for (key, value) in [
            (
                "plugins.tenant_compile_concurrency",
                p.tenant_compile_concurrency,
            ),
            (
                "plugins.tenant_max_concurrent_uploads",
                p.tenant_max_concurrent_uploads,
            ),
            ("plugins.tenant_threads", p.tenant_threads),
            (
                "plugins.tenant_max_concurrent_calls",
                p.tenant_max_concurrent_calls,
            ),
        ] {
            if value == 0 {
                return Err(problem(key, "must be at least 1"));
            }
        }
        if p.tenant_max_concurrent_uploads_per_org == 0
            || p.tenant_max_concurrent_uploads_per_org > p.tenant_max_concurrent_uploads
        {
            return Err(problem(
                "plugins.tenant_max_concurrent_uploads_per_org",
                format!(
                    "must be between 1 and plugins.tenant_max_concurrent_uploads ({})",
                    p.tenant_max_concurrent_uploads
                ),
            ));
        }
        if !(2..=1 << 20).contains(&p.max_config_bytes) {
            return Err(problem(
                "plugins.max_config_bytes",
                "must be between 2 and 1048576 (1 MiB)",
            ));
        }
        if p.tenant_threads > 1 && p.tenant_max_concurrent_calls >= p.tenant_threads {
            return Err(problem(
                "plugins.tenant_max_concurrent_calls",
                format!(
                    "must be below plugins.tenant_threads ({}), so that one project can never take every tenant thread",
                    p.tenant_threads
                ),
            ));
        }
        if let Some(worker) = &p.tenant_compile_worker
            && !Path::new(worker).is_file()
        {
            return Err(problem(
                "plugins.tenant_compile_worker",
                format!("{worker} is not a file"),
            ));
        }
        if p.module_gc_interval_secs == 0 || p.tenant_refused_retry_secs == 0 {
            return Err(problem(
                "plugins",
                "module_gc_interval_secs and tenant_refused_retry_secs must be at least 1",
            ));
        }
        let c = &self.control;
        match c.store {
            StoreKind::Postgres => match &c.database_url {
                Some(url) if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
                }
                Some(_) => {
                    return Err(problem(
                        "control.database_url",
                        "must start with postgres:// or postgresql://",
                    ));
                }
                None => {
                    return Err(problem(
                        "control.database_url",
                        "is required when control.store = \"postgres\"",
                    ));
                }
            },
            StoreKind::File => {
                if let Some(file) = &c.file {
                    let resolved = resolve(base, Path::new(file));
                    if !resolved.is_file() {
                        return Err(problem(
                            "control.file",
                            format!("{} is not a file", resolved.display()),
                        ));
                    }
                }
            }
        }
        if !(10..=60_000).contains(&c.change_min_interval_ms) {
            return Err(problem(
                "control.change_min_interval_ms",
                "must be between 10 and 60000",
            ));
        }
        if c.reload_interval_ms == 0 {
            return Err(problem("control.reload_interval_ms", "must be at least 1"));
        }
        if c.max_connections == 0 {
            return Err(problem("control.max_connections", "must be at least 1"));
        }
        let a = &self.auth;
        if !(1..=30).contains(&a.key_cache_ttl_secs) {
            return Err(problem(
                "auth.key_cache_ttl_secs",
                "must be between 1 and 30 (a revoked key must stop working within 30 s)",
            ));
        }
        if a.key_cache_capacity == 0 {
            return Err(problem("auth.key_cache_capacity", "must be at least 1"));
        }
        if a.project_cache_ttl_secs == 0 {
            return Err(problem("auth.project_cache_ttl_secs", "must be at least 1"));
        }
        if a.stale_if_error_secs > 30 {
            return Err(problem(
                "auth.stale_if_error_secs",
                "must be at most 30 (a revoked key must stop working within 30 s, outages included)",
            ));
        }
        if a.leeway_secs > 60 {
            return Err(problem("auth.leeway_secs", "must be at most 60"));
        }
        a.user_jwt.validate("auth.user_jwt")?;
        a.console_jwt.validate("auth.console_jwt")?;
        let b = &self.breaker;
        if b.failure_threshold == 0 {
            return Err(problem("breaker.failure_threshold", "must be at least 1"));
        }
        if b.open_ms == 0 {
            return Err(problem("breaker.open_ms", "must be at least 1"));
        }
        if b.half_open_probes == 0 {
            return Err(problem("breaker.half_open_probes", "must be at least 1"));
        }
        if b.max_targets == 0 {
            return Err(problem("breaker.max_targets", "must be at least 1"));
        }
        if b.sweep_secs == 0 {
            return Err(problem("breaker.sweep_secs", "must be at least 1"));
        }
        let u = &self.upstreams;
        for (key, url) in [
            ("upstreams.storage_url", &u.storage_url),
            ("upstreams.realtime_url", &u.realtime_url),
        ] {
            if let Some(url) = url
                && url
                    .parse::<http::Uri>()
                    .ok()
                    .filter(|uri| {
                        matches!(uri.scheme_str(), Some("http" | "https")) && uri.host().is_some()
                    })
                    .is_none()
            {
                return Err(problem(
                    key,
                    format!("{url:?} is not an http(s)://host[:port][/path] URL"),
                ));
            }
        }
        if let Err(e) = u.postgrest_targets() {
            return Err(problem("upstreams.postgrest_allowed_targets", e));
        }
        if u.storage_max_body_bytes == 0 {
            return Err(problem(
                "upstreams.storage_max_body_bytes",
                "must be at least 1",
            ));
        }
        if u.connect_timeout_ms == 0 {
            return Err(problem(
                "upstreams.connect_timeout_ms",
                "must be at least 1",
            ));
        }
        if u.stream_idle_timeout_secs == 0 {
            return Err(problem(
                "upstreams.stream_idle_timeout_secs",
                "must be at least 1",
            ));
        }
        let r = &self.rate_limit;
        for (key, b) in [
            ("rate_limit.data_plane_per_ip", &r.data_plane_per_ip),
            (
                "rate_limit.management_plane_per_ip",
                &r.management_plane_per_ip,
            ),
        ] {
            if b.rate_per_second == 0 {
                return Err(problem(
                    &format!("{key}.rate_per_second"),
                    "must be at least 1",
                ));
            }
            if b.burst == 0 {
                return Err(problem(&format!("{key}.burst"), "must be at least 1"));
            }
        }
        if let Some(url) = &r.redis_url
            && !(url.starts_with("redis://") || url.starts_with("rediss://"))
        {
            return Err(problem(
                "rate_limit.redis_url",
                "must start with redis:// or rediss://",
            ));
        }
        if let Some(url) = &r.redis_url
            && url.split_once('#').is_some_and(|(_, fragment)| {
                fragment
                    .split(['&', ','])
                    .any(|f| f.eq_ignore_ascii_case("insecure"))
            })
        {
            return Err(problem(
                "rate_limit.redis_url",
                "#insecure turns off the verification of Redis's certificate; trust its CA with rate_limit.redis_tls.ca_file instead",
            ));
        }
        if r.redis_tls.is_some()
            && !r
                .redis_url
                .as_deref()
                .is_some_and(|u| u.starts_with("rediss://"))
        {
            return Err(problem(
                "rate_limit.redis_tls",
                "applies to a rediss:// redis_url only",
            ));
        }
        if r.redis_timeout_ms == 0 {
            return Err(problem("rate_limit.redis_timeout_ms", "must be at least 1"));
        }
        if r.redis_failure_threshold == 0 {
            return Err(problem(
                "rate_limit.redis_failure_threshold",
                "must be at least 1",
            ));
        }
        if r.redis_retry_ms == 0 {
            return Err(problem("rate_limit.redis_retry_ms", "must be at least 1"));
        }
        if r.retain_interval_secs == 0 {
            return Err(problem(
                "rate_limit.retain_interval_secs",
                "must be at least 1",
            ));
        }
        if !(1..=1024).contains(&r.max_bucket_name_bytes) {
            return Err(problem(
                "rate_limit.max_bucket_name_bytes",
                "must be between 1 and 1024",
            ));
        }
        if r.local_buckets_max_bytes < 1 << 20 {
            return Err(problem(
                "rate_limit.local_buckets_max_bytes",
                "must be at least 1 MiB (1048576)",
            ));
        }
        if r.max_bucket_ttl_secs == 0 {
            return Err(problem(
                "rate_limit.max_bucket_ttl_secs",
                "must be at least 1",
            ));
        }
        for (key, c) in [
            ("rate_limit.operator_rules", &r.operator_rules),
            ("rate_limit.tenant_rules", &r.tenant_rules),
        ] {
            for (field, value) in [
                ("max_rate_per_second", c.max_rate_per_second),
                ("max_burst", c.max_burst),
                ("max_cost", c.max_cost),
            ] {
                if value == 0 {
                    return Err(problem(&format!("{key}.{field}"), "must be at least 1"));
                }
            }
        }
        for (key, stage) in self.stages() {
            let is_candidate = key.ends_with(".candidate");
            if !is_candidate && (stage.mode.is_some() || stage.percent.is_some()) {
                return Err(problem(
                    &format!("{key}.mode"),
                    "only a candidate has a mode and a percent",
                ));
            }
            if stage.candidate.is_some()
                && (is_candidate || !(key.ends_with(".cors") || key.ends_with(".quota")))
            {
                return Err(problem(
                    &format!("{key}.candidate"),
                    "only the cors and quota stages take a candidate (one, not nested)",
                ));
            }
            if is_candidate {
                let Some(mode) = stage.mode.as_deref() else {
                    return Err(problem(&format!("{key}.mode"), "shadow or canary"));
                };
                match Trial::parse(mode, stage.percent) {
                    Ok(Some(_)) => {}
                    Ok(None) => {
                        return Err(problem(
                            &format!("{key}.mode"),
                            "a candidate is tried as shadow or canary",
                        ));
                    }
                    Err(e) => {
                        let (field, reason) = e.split_once(": ").unwrap_or(("mode", &e));
                        return Err(problem(&format!("{key}.{field}"), reason));
                    }
                }
            }
            if !stage.config.is_object() {
                return Err(problem(&format!("{key}.config"), "must be a table"));
            }
            let size = stage.config.to_string().len();
            if size > p.max_config_bytes {
                return Err(problem(
                    &format!("{key}.config"),
                    format!(
                        "is {size} bytes as JSON; at most plugins.max_config_bytes ({}) are accepted",
                        p.max_config_bytes
                    ),
                ));
            }
            if let Some(digest) = stage.module_digest()
                && !is_sha256_hex(digest)
            {
                return Err(problem(
                    &format!("{key}.module"),
                    "sha256: must be followed by 64 lower-case hex digits",
                ));
            }
            if let Some(path) = stage.module_path() {
                let resolved = resolve(base, path);
                if !resolved.is_file() {
                    return Err(problem(
                        &format!("{key}.module"),
                        format!(
                            "{} is not a file (use \"builtin\" or a path to a .wasm component)",
                            resolved.display()
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Every stage of both planes with its dotted key, then every candidate
    /// (`<stage key>.candidate`).
    pub fn stages(&self) -> Vec<(&'static str, &StageConfig)> {
        let d = &self.data_plane.plugins;
        let m = &self.management_plane.plugins;
        let stages = [
            ("data_plane.plugins.api_key", &d.api_key),
            ("data_plane.plugins.cors", &d.cors),
            ("data_plane.plugins.quota", &d.quota),
            ("data_plane.plugins.db_routing", &d.db_routing),
            ("management_plane.plugins.cors", &m.cors),
            ("management_plane.plugins.quota", &m.quota),
            ("management_plane.plugins.db_routing", &m.db_routing),
        ];
        let candidates = [
            "data_plane.plugins.api_key.candidate",
            "data_plane.plugins.cors.candidate",
            "data_plane.plugins.quota.candidate",
            "data_plane.plugins.db_routing.candidate",
            "management_plane.plugins.cors.candidate",
            "management_plane.plugins.quota.candidate",
            "management_plane.plugins.db_routing.candidate",
        ];
        let tried: Vec<(&'static str, &StageConfig)> = stages
            .iter()
            .zip(candidates)
            .filter_map(|((_, stage), key)| Some((key, stage.candidate.as_deref()?)))
            .collect();
        stages.into_iter().chain(tried).collect()
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[expect(
        clippy::result_large_err,
        reason = "figment's Jail fixes the closure's error type"
    )]
    fn load(toml: &str, env: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("gateway.toml");
        std::fs::write(&path, toml).expect("write");
        let vars: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        // figment's Jail serialises tests that touch the process environment.
        let mut result = None;
        figment::Jail::expect_with(|jail| {
            for (k, v) in &vars {
                jail.set_env(k, v);
            }
            result = Some(Config::load(Some(&path)));
            Ok(())
        });
        result.expect("jail ran")
    }

    #[test]
    fn a_candidate_is_named_by_its_key_when_it_is_wrong() {
        let ok = load(
            "[data_plane.plugins.cors.candidate]\nmode = \"shadow\"\n\
             [management_plane.plugins.quota.candidate]\nmode = \"canary\"\npercent = 5\n",
            &[],
        )
        .expect("a shadow and a canary");
        let keys: Vec<&str> = ok.stages().iter().map(|(k, _)| *k).collect();
        assert!(
            keys.contains(&"data_plane.plugins.cors.candidate"),
            "{keys:?}"
        );
        assert!(keys.contains(&"management_plane.plugins.quota.candidate"));
        for (toml, key) in [
            (
                "[data_plane.plugins.api_key.candidate]\nmode = \"shadow\"\n",
                "data_plane.plugins.api_key.candidate",
            ),
            (
                "[data_plane.plugins.cors.candidate]\nmode = \"canary\"\n",
                "data_plane.plugins.cors.candidate.percent",
            ),
            (
                "[data_plane.plugins.cors.candidate]\nmode = \"shadow\"\npercent = 3\n",
                "data_plane.plugins.cors.candidate.percent",
            ),
            (
                "[data_plane.plugins.quota.candidate]\nmode = \"enforce\"\n",
                "data_plane.plugins.quota.candidate.mode",
            ),
            (
                "[data_plane.plugins.quota.candidate]\nmodule = \"builtin\"\n",
                "data_plane.plugins.quota.candidate.mode",
            ),
            (
                "[data_plane.plugins.quota]\nmode = \"shadow\"\n",
                "data_plane.plugins.quota.mode",
            ),
            (
                "[data_plane.plugins.cors.candidate]\nmode = \"shadow\"\n\
                 [data_plane.plugins.cors.candidate.candidate]\nmode = \"shadow\"\n",
                "data_plane.plugins.cors.candidate.candidate",
            ),
        ] {
            let e = load(toml, &[]).expect_err(toml);
            assert_eq!(e.key, key, "{toml}: {e}");
        }
    }

    #[test]
    fn defaults_match_the_contract() {
        let c = load("", &[]).expect("defaults");
        assert_eq!((c.port, c.management_port), (8000, 8001));
        assert_eq!(c.timeouts.default_ms, 30_000);
        assert_eq!(c.timeouts.functions_ms, 380_000);
        assert_eq!(c.nats.subject_prefix, "aura");
    }

    #[test]
    fn environment_overrides_the_file() {
        let c = load(
            "port = 9000\n[nats]\nurl = \"nats://a:1\"\n",
            &[
                ("AURA_PORT", "9100"),
                ("AURA_MANAGEMENT_PORT", "9101"),
                ("AURA_NATS__URL", "nats://b:2"),
            ],
        )
        .expect("loads");
        assert_eq!((c.port, c.management_port), (9100, 9101));
        assert_eq!(c.nats.url, "nats://b:2");
    }

    #[test]
    fn unknown_keys_are_rejected_with_their_name() {
        let e = load("[nats]\nurll = \"x\"\n", &[]).expect_err("unknown key");
        assert!(e.to_string().contains("nats"), "{e}");
        assert!(e.to_string().contains("urll"), "{e}");
        let e = load("", &[("AURA_PROT", "1")]).expect_err("unknown env key");
        assert!(e.to_string().contains("prot"), "{e}");
    }

    #[test]
    fn validation_names_the_key() {
        let e = load("port = 7000\nmanagement_port = 7000\n", &[]).expect_err("same ports");
        assert_eq!(e.key, "management_port");
        let e = load("[nats]\nurl = \"http://x\"\n", &[]).expect_err("bad url");
        assert_eq!(e.key, "nats.url");
        let e = load("[data_plane.plugins.cors]\nmodule = \"nope.wasm\"\n", &[])
            .expect_err("missing module");
        assert_eq!(e.key, "data_plane.plugins.cors.module");
        let e = load("port = \"abc\"\n", &[]).expect_err("bad type");
        assert_eq!(e.key, "port");
        let e = load("[management_plane.plugins.api_key]\n", &[]).expect_err("no api keys there");
        assert!(e.to_string().contains("api_key"), "{e}");
        let e =
            load("[metrics]\ntoken = \"a token with spaces!\"\n", &[]).expect_err("not a bearer");
        assert_eq!(e.key, "metrics.token");
        let e = load(
            "[upstreams]\npostgrest_allowed_targets = [\"10.0.0.0/33\"]\n",
            &[],
        )
        .expect_err("bad target");
        assert_eq!(e.key, "upstreams.postgrest_allowed_targets");
        assert!(e.problem.contains("10.0.0.0/33"), "{e}");
        let e = load(
            "[plugins]\ntenant_threads = 2\ntenant_max_concurrent_calls = 2\n",
            &[],
        )
        .expect_err("one project could take every thread");
        assert_eq!(e.key, "plugins.tenant_max_concurrent_calls");
        let e = load("[rate_limit.tenant_rules]\nmax_burst = 0\n", &[]).expect_err("zero");
        assert_eq!(e.key, "rate_limit.tenant_rules.max_burst");
        let c = load("[rate_limit.operator_rules]\nmax_cost = 5\n", &[]).expect("partial table");
        assert_eq!(c.rate_limit.operator_rules.max_cost, 5);
        assert_eq!(
            c.rate_limit.operator_rules.max_burst,
            RuleCeilings::operator().max_burst,
            "the other fields keep the operator's defaults"
        );
        let e = load("[server]\nmax_in_flight = 0\n", &[]).expect_err("no capacity");
        assert_eq!(e.key, "server.max_in_flight");
        // Answering keys from memory past 30 s would break the revocation bound.
        let e = load("[auth]\nstale_if_error_secs = 31\n", &[]).expect_err("past 30 s");
        assert_eq!(e.key, "auth.stale_if_error_secs");
        assert!(load("[auth]\nstale_if_error_secs = 30\n", &[]).is_ok());
    }

    #[test]
    fn tls_settings_are_checked_and_name_their_key() {
        let exists = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
        let cases = [
            (format!("[nats.tls]\ncert_file = {exists:?}\n"), "nats.tls"),
            (
                "[control.tls]\nca_file = \"missing-ca.pem\"\n".to_owned(),
                "control.tls.ca_file",
            ),
            (
                format!(
                    "[rate_limit]\nredis_url = \"redis://cache:6379\"\n[rate_limit.redis_tls]\nca_file = {exists:?}\n"
                ),
                "rate_limit.redis_tls",
            ),
            (
                "[data_plane.tls]\ncert_file = \"missing.pem\"\nkey_file = \"missing.key\"\n"
                    .to_owned(),
                "data_plane.tls.cert_file",
            ),
            (
                "[nats]\nuser = \"gw\"\npassword = \"pw\"\ntoken = \"t\"\n".to_owned(),
                "nats",
            ),
            ("[nats]\npassword = \"pw\"\n".to_owned(), "nats.password"),
            (
                "[nats]\nnkey_seed = \"not-a-seed\"\n".to_owned(),
                "nats.nkey_seed",
            ),
            (
                "[server]\ntls_watch_interval_ms = 10\n".to_owned(),
                "server.tls_watch_interval_ms",
            ),
        ];
        for (toml, key) in cases {
            let e = load(&toml, &[]).expect_err(&toml);
            assert_eq!(e.key, key, "{toml}: {e}");
        }
        // Relative paths are resolved against the config file's directory.
        let e = load("[control.tls]\nca_file = \"missing-ca.pem\"\n", &[]).expect_err("missing");
        assert!(e.problem.starts_with('/'), "{e}");
        assert!(
            load(
                &format!("[upstreams.tls]\nca_file = {exists:?}\ncert_file = {exists:?}\nkey_file = {exists:?}\n"),
                &[]
            )
            .is_ok()
        );
    }

    #[test]
    fn secrets_are_redacted_wherever_they_are() {
        let mut config = Config::default();
        config.metrics.token = Some("metrics-token-0123456789".into());
        config.admin.token = Some("admin-token-0123456789".into());
        config.auth.user_jwt.hs256_secret = Some("user-secret-0123456789abcdef0123456789".into());
        config.control.database_url = Some("postgres://aura:pg-password@db:5432/aura".into());
        config.rate_limit.redis_url = Some("redis://:redis-password@cache:6379/0".into());
        config.nats.url = "nats://a:4222, nats://user:nats-password@b:4222".into();
        config.nats.password = Some("nats-field-password".into());
        config.nats.token = Some("nats-field-token".into());
        config.nats.nkey_seed = Some("SUAFIELDSEED".into());
        config.data_plane.plugins.cors.config =
            serde_json::json!({ "allow": ["*"], "upstream_token": "plugin-token" });
        let text = serde_json::to_string(&config.redacted()).expect("json");
        for secret in [
            "metrics-token-0123456789",
            "admin-token-0123456789",
            "user-secret-0123456789",
            "pg-password",
            "redis-password",
            "nats-password",
            "nats-field-password",
            "nats-field-token",
            "SUAFIELDSEED",
            "plugin-token",
        ] {
            assert!(!text.contains(secret), "{secret} in {text}");
        }
        let value = config.redacted();
        assert_eq!(
            value["control"]["database_url"],
            "postgres://aura:[redacted]@db:5432/aura"
        );
        assert_eq!(
            value["rate_limit"]["redis_url"],
            "redis://:[redacted]@cache:6379/0"
        );
        assert_eq!(
            value["nats"]["url"],
            "nats://a:4222,nats://user:[redacted]@b:4222"
        );
        assert_eq!(
            value["data_plane"]["plugins"]["cors"]["config"]["allow"][0],
            "*"
        );
        // Not secrets: names that merely contain a secret word.
        assert_eq!(value["auth"]["key_cache_ttl_secs"], 30);
        assert!(value["nats"]["fleet_secret"].is_null());
        assert_eq!(value["metrics"]["token"], REDACTED);
        // Unset secrets stay null.
        assert!(value["plugins"]["admin_token"].is_null());
        assert_eq!(config.digest(), Config { ..config.clone() }.digest());
        let mut other = config.clone();
        other.port += 1;
        assert_ne!(config.digest(), other.digest());
    }

    #[test]
    fn secrets_in_url_queries_are_redacted() {
        let mut config = Config::default();
        config.control.database_url = Some(
            "postgres://db:5432/aura?user=aura&password=pg-query-password&sslmode=verify-full"
                .into(),
        );
        config.rate_limit.redis_url = Some("rediss://cache:6380/0?pwd=redis-query#x".into());
        config.nats.fleet_secret = Some("fleet-secret-0123456789abcdef0123456789".into());
        config.tracing.otlp_endpoint = Some("https://otlp:4318?api_key=otlp-key".into());
        let text = serde_json::to_string(&config.redacted()).expect("json");
        for secret in [
            "pg-query-password",
            "redis-query",
            "fleet-secret-0123456789",
            "otlp-key",
        ] {
            assert!(!text.contains(secret), "{secret} in {text}");
        }
        let value = config.redacted();
        assert_eq!(
            value["control"]["database_url"],
            "postgres://db:5432/aura?user=aura&password=[redacted]&sslmode=verify-full"
        );
        assert_eq!(
            value["rate_limit"]["redis_url"],
            "rediss://cache:6380/0?pwd=[redacted]#x"
        );
        assert_eq!(
            value["nats"]["url"], "nats://127.0.0.1:4222",
            "a URL with nothing secret is kept as it is"
        );
    }

    #[test]
    fn the_hardening_keys_are_validated_naming_the_key() {
        let refused = |edit: &dyn Fn(&mut Config), key: &str| {
            let mut config = Config::default();
            edit(&mut config);
            let err = config.validate(None).expect_err(key);
            assert_eq!(err.key, key, "{}", err.problem);
        };
        refused(
            &|c| c.nats.fleet_secret = Some("short".into()),
            "nats.fleet_secret",
        );
        refused(
            &|c| c.control.change_min_interval_ms = 0,
            "control.change_min_interval_ms",
        );
        refused(&|c| c.server.max_streams = Some(0), "server.max_streams");
        refused(
            &|c| c.server.http2_idle_timeout_ms = 0,
            "server.http2_idle_timeout_ms",
        );
        refused(
            &|c| c.server.http2_keep_alive_timeout_ms = 0,
            "server.http2_keep_alive_timeout_ms",
        );
        refused(
            &|c| c.plugins.max_config_bytes = 1,
            "plugins.max_config_bytes",
        );
        refused(
            &|c| c.plugins.tenant_max_concurrent_uploads_per_org = 3,
            "plugins.tenant_max_concurrent_uploads_per_org",
        );
        refused(
            &|c| {
                c.data_plane.plugins.cors.config = serde_json::json!({ "pad": "x".repeat(70_000) });
            },
            "data_plane.plugins.cors.config",
        );
        let mut config = Config::default();
        config.nats.fleet_secret = Some("0123456789abcdef0123456789abcdef".into());
        assert!(config.validate(None).is_ok());
        assert_eq!(config.server.stream_budget(), config.server.max_connections);
    }

    #[test]
    fn a_redis_url_turning_off_certificate_checks_is_refused() {
        let mut config = Config::default();
        config.rate_limit.redis_url = Some("rediss://cache:6380/#insecure".into());
        let err = config.validate(None).expect_err("refused");
        assert_eq!(err.key, "rate_limit.redis_url");
        assert!(err.problem.contains("#insecure"), "{}", err.problem);
        config.rate_limit.redis_url = Some("rediss://cache:6380/".into());
        assert!(config.validate(None).is_ok());
    }
}
