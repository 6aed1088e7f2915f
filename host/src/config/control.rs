//! `[control]`: the control store (projects, organizations, members, API keys).

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{ClientTlsConfig, ConfigError, problem, resolve};

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

impl ControlConfig {
    /// Checks the section, `key` naming it; `base` resolves a relative `file`.
    pub(super) fn validate(&self, key: &str, base: Option<&Path>) -> Result<(), ConfigError> {
        if let Some(tls) = &self.tls {
            tls.validate(&format!("{key}.tls"))?;
        }
        match self.store {
            StoreKind::Postgres => match &self.database_url {
                Some(url) if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
                }
                Some(_) => {
                    return Err(problem(
                        &format!("{key}.database_url"),
                        "must start with postgres:// or postgresql://",
                    ));
                }
                None => {
                    return Err(problem(
                        &format!("{key}.database_url"),
                        format!("is required when {key}.store = \"postgres\""),
                    ));
                }
            },
            StoreKind::File => {
                if let Some(file) = &self.file {
                    let resolved = resolve(base, Path::new(file));
                    if !resolved.is_file() {
                        return Err(problem(
                            &format!("{key}.file"),
                            format!("{} is not a file", resolved.display()),
                        ));
                    }
                }
            }
        }
        let at_least = |field, value, min| super::at_least(key, field, value, min);
        super::within(
            key,
            "change_min_interval_ms",
            self.change_min_interval_ms,
            10,
            60_000,
        )?;
        at_least("reload_interval_ms", self.reload_interval_ms, 1)?;
        at_least("max_connections", u64::from(self.max_connections), 1)?;
        Ok(())
    }
}
