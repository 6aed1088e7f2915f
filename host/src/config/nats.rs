//! `[nats]`: the connection to NATS, for envelope-over-NATS backends and the fleet's change
//! events.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{ClientTlsConfig, ConfigError, problem};

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

impl NatsConfig {
    /// Checks the section, `key` naming it.
    pub(super) fn validate(&self, key: &str) -> Result<(), ConfigError> {
        if let Some(tls) = &self.tls {
            tls.validate(&format!("{key}.tls"))?;
        }
        let methods = [
            self.user.is_some(),
            self.token.is_some(),
            self.nkey_seed.is_some(),
            self.credentials_file.is_some(),
        ]
        .iter()
        .filter(|m| **m)
        .count();
        if methods > 1 {
            return Err(problem(
                key,
                "user/password, token, nkey_seed and credentials_file are alternatives: set one",
            ));
        }
        if let Some(secret) = &self.fleet_secret
            && secret.len() < 32
        {
            return Err(problem(
                &format!("{key}.fleet_secret"),
                "must be at least 32 characters (it signs the fleet's change events)",
            ));
        }
        if self.password.is_some() && self.user.is_none() {
            return Err(problem(
                &format!("{key}.password"),
                format!("needs {key}.user"),
            ));
        }
        if let Some(seed) = &self.nkey_seed
            && !seed.starts_with("SU")
        {
            return Err(problem(
                &format!("{key}.nkey_seed"),
                "is not a user NKey seed (it starts with SU)",
            ));
        }
        if let Some(creds) = &self.credentials_file
            && !Path::new(creds).is_file()
        {
            return Err(problem(
                &format!("{key}.credentials_file"),
                format!("{creds} is not a file"),
            ));
        }
        for url in self.url.split(',') {
            let url = url.trim();
            let ok = ["nats://", "tls://", "ws://", "wss://"]
                .iter()
                .any(|scheme| url.len() > scheme.len() && url.starts_with(scheme));
            if !ok {
                return Err(problem(
                    &format!("{key}.url"),
                    format!("{url:?} is not a NATS URL (nats://host:port)"),
                ));
            }
        }
        let prefix = &self.subject_prefix;
        if prefix.is_empty()
            || prefix.starts_with('.')
            || prefix.ends_with('.')
            || prefix.contains("..")
            || prefix
                .chars()
                .any(|c| c.is_whitespace() || c == '*' || c == '>')
        {
            return Err(problem(
                &format!("{key}.subject_prefix"),
                format!(
                    "{prefix:?} is not a valid subject prefix (tokens separated by dots, no wildcards)"
                ),
            ));
        }
        Ok(())
    }
}
