//! `[breaker]`: the circuit breakers.

use serde::{Deserialize, Serialize};

use super::ConfigError;

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

impl BreakerConfig {
    /// Checks the section, `key` naming it.
    pub(super) fn validate(&self, key: &str) -> Result<(), ConfigError> {
        let at_least = |field, value, min| super::at_least(key, field, value, min);
        at_least("failure_threshold", u64::from(self.failure_threshold), 1)?;
        at_least("open_ms", self.open_ms, 1)?;
        at_least("half_open_probes", u64::from(self.half_open_probes), 1)?;
        at_least("max_targets", self.max_targets as u64, 1)?;
        at_least("sweep_secs", self.sweep_secs, 1)?;
        Ok(())
    }
}
