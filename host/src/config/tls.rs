//! Client TLS sections: the trust settings of a connection the gateway opens (`nats.tls`,
//! `control.tls`, `rate_limit.redis_tls`, `upstreams.tls`, `tracing.otlp_tls`).

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{ConfigError, problem};

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

impl ClientTlsConfig {
    /// Checks the section, `key` naming it: a client certificate comes with its key, and every
    /// file named is a file.
    pub(super) fn validate(&self, key: &str) -> Result<(), ConfigError> {
        if self.cert_file.is_some() != self.key_file.is_some() {
            return Err(problem(
                key,
                "cert_file and key_file go together (a client certificate and its key)",
            ));
        }
        for (field, path) in [
            ("ca_file", &self.ca_file),
            ("cert_file", &self.cert_file),
            ("key_file", &self.key_file),
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
        Ok(())
    }
}
