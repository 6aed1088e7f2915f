//! `[timeouts]`: the budget of each route group.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::ConfigError;

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

    /// Checks the section, `key` naming it.
    pub(super) fn validate(&self, key: &str) -> Result<(), ConfigError> {
        super::at_least(key, "default_ms", self.default_ms, 1)?;
        super::at_least(key, "functions_ms", self.functions_ms, 1)
    }
}
