//! `[breaker]`: the circuit breakers.

use serde::{Deserialize, Serialize};

use super::{ConfigError, problem};

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
        if self.failure_threshold == 0 {
            return Err(problem(
                &format!("{key}.failure_threshold"),
                "must be at least 1",
            ));
        }
        if self.open_ms == 0 {
            return Err(problem(&format!("{key}.open_ms"), "must be at least 1"));
        }
        if self.half_open_probes == 0 {
            return Err(problem(
                &format!("{key}.half_open_probes"),
                "must be at least 1",
            ));
        }
        if self.max_targets == 0 {
            return Err(problem(&format!("{key}.max_targets"), "must be at least 1"));
        }
        if self.sweep_secs == 0 {
            return Err(problem(&format!("{key}.sweep_secs"), "must be at least 1"));
        }
        Ok(())
    }
}
