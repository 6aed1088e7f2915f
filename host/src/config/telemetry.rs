//! `[log]`, `[tracing]` and `[metrics]`: what the gateway tells about itself.

use serde::{Deserialize, Serialize};

use super::{ClientTlsConfig, ConfigError, bearer_token, problem};

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
    /// The longest a line waits before it is written, in milliseconds (lines are written in
    /// batches: sooner when many wait).
    pub flush_ms: u64,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            format: LogFormat::Text,
            level: "info".to_owned(),
            buffer_lines: 65_536,
            flush_ms: 10,
        }
    }
}

impl LogConfig {
    /// Checks the section, `key` naming it.
    pub(super) fn validate(&self, key: &str) -> Result<(), ConfigError> {
        if let Err(e) = tracing_subscriber::EnvFilter::builder().parse(&self.level) {
            return Err(problem(
                &format!("{key}.level"),
                format!("not a valid filter: {e}"),
            ));
        }
        super::at_least(key, "buffer_lines", self.buffer_lines as u64, 1)?;
        super::within(key, "flush_ms", self.flush_ms, 1, 10_000)
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

impl Default for TracingConfig {
    fn default() -> Self {
        Self {
            otlp_endpoint: None,
            service_name: "aura-gateway".to_owned(),
            otlp_tls: None,
        }
    }
}

impl TracingConfig {
    /// Checks the section, `key` naming it.
    pub(super) fn validate(&self, key: &str) -> Result<(), ConfigError> {
        if let Some(tls) = &self.otlp_tls {
            tls.validate(&format!("{key}.otlp_tls"))?;
        }
        if let Some(endpoint) = &self.otlp_endpoint
            && !(endpoint.starts_with("http://") || endpoint.starts_with("https://"))
        {
            return Err(problem(
                &format!("{key}.otlp_endpoint"),
                "must be an http(s) URL",
            ));
        }
        Ok(())
    }
}

/// `/metrics` settings.
#[derive(Debug, Clone, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// Bearer token required on `GET /metrics`. Without one, `/metrics` answers 404.
    pub token: Option<String>,
}

impl MetricsConfig {
    /// Checks the section, `key` naming it.
    pub(super) fn validate(&self, key: &str) -> Result<(), ConfigError> {
        match &self.token {
            Some(token) => bearer_token(&format!("{key}.token"), token),
            None => Ok(()),
        }
    }
}
