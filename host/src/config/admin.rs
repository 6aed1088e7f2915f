//! `[admin]`: the introspection routes of the management plane (`/v1/admin/*`).

use serde::{Deserialize, Serialize};

use super::{ConfigError, bearer_token};

/// Introspection routes of the management plane (`/v1/admin/*`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    /// Bearer token of `/v1/admin/*` (at least 16 characters). Without it,
    /// `plugins.admin_token` guards them; without either, the routes do not exist.
    pub token: Option<String>,
}

impl AdminConfig {
    /// Checks the section, `key` naming it.
    pub(super) fn validate(&self, key: &str) -> Result<(), ConfigError> {
        match &self.token {
            Some(token) => bearer_token(&format!("{key}.token"), token),
            None => Ok(()),
        }
    }
}
