//! `[data_plane]` and `[management_plane]`: each plane's stage modules and listener TLS.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{ConfigError, DataPlaneStages, ManagementPlaneStages, problem};

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

impl DataPlaneConfig {
    /// Checks the section but its stages ([`super::Config::validate`] checks those), `key`
    /// naming it.
    pub(super) fn validate(&self, key: &str) -> Result<(), ConfigError> {
        match &self.tls {
            Some(tls) => tls.validate(&format!("{key}.tls")),
            None => Ok(()),
        }
    }
}

/// Management-plane settings.
#[derive(Debug, Clone, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ManagementPlaneConfig {
    pub plugins: ManagementPlaneStages,
    /// HTTPS on the management-plane listener (absent: plain HTTP).
    pub tls: Option<ListenerTlsConfig>,
}

impl ManagementPlaneConfig {
    /// Checks the section but its stages ([`super::Config::validate`] checks those), `key`
    /// naming it.
    pub(super) fn validate(&self, key: &str) -> Result<(), ConfigError> {
        match &self.tls {
            Some(tls) => tls.validate(&format!("{key}.tls")),
            None => Ok(()),
        }
    }
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

impl ListenerTlsConfig {
    /// Checks that every file named is a file, `key` naming the section.
    fn validate(&self, key: &str) -> Result<(), ConfigError> {
        for (field, path) in [
            ("cert_file", Some(&self.cert_file)),
            ("key_file", Some(&self.key_file)),
            ("client_ca_file", self.client_ca_file.as_ref()),
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
        Ok(())
    }
}
