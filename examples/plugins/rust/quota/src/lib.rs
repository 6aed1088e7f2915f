//! A quota by plan, with a cost per route group, one bucket per project and plan (all keys and
//! users of a project share it). Build: `cargo build --release --target wasm32-wasip2`.
//! Configuration:
//!
//! ```toml
//! [plans.free]
//! rate_per_second = 20
//! burst = 100
//! [plans.pro]
//! rate_per_second = 500
//! burst = 5000
//! [costs]
//! functions = 5
//! ai = 20
//! ```
//!
//! Projects on a plan that is not listed get the `free` limits; requests without a project are
//! exempt.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use serde::Deserialize;

wit_bindgen::generate!({ path: "../../../../wit", world: "quota-stage" });

use aura::gateway::types::Plane;
use exports::aura::gateway::quota::{Guest, QuotaDecision, QuotaRequest, QuotaRule};

#[derive(Deserialize, Clone, Copy)]
#[serde(deny_unknown_fields)]
struct Limits {
    rate_per_second: u32,
    burst: u32,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    plans: BTreeMap<String, Limits>,
    #[serde(default)]
    costs: BTreeMap<String, u32>,
}

static CONFIG: OnceLock<Config> = OnceLock::new();

struct Plugin;

impl Guest for Plugin {
    fn configure(_plane: Plane, config: String) -> Result<(), String> {
        let config: Config = serde_json::from_str(&config).map_err(|e| format!("config: {e}"))?;
        let free = config.plans.get("free").ok_or("plans.free is required")?;
        for (name, l) in &config.plans {
            if l.rate_per_second == 0 || l.burst == 0 {
                return Err(format!(
                    "plans.{name}: rate_per_second and burst must be at least 1"
                ));
            }
        }
        if let Some((group, cost)) = config
            .costs
            .iter()
            .find(|(_, c)| **c == 0 || **c > free.burst)
        {
            return Err(format!(
                "costs.{group}: {cost} must be between 1 and the free burst"
            ));
        }
        CONFIG
            .set(config)
            .map_err(|_| "configured twice".to_string())
    }

    fn decide(request: QuotaRequest) -> QuotaDecision {
        let Some(config) = CONFIG.get() else {
            return QuotaDecision::Exempt;
        };
        let Some(project) = request.actor.project.as_deref() else {
            return QuotaDecision::Exempt;
        };
        let plan = request.actor.plan.as_deref().unwrap_or("free");
        let limits = config
            .plans
            .get(plan)
            .or_else(|| config.plans.get("free"))
            .copied()
            .unwrap_or(Limits {
                rate_per_second: 1,
                burst: 1,
            });
        let cost = config.costs.get(&request.route_group).copied().unwrap_or(1);
        QuotaDecision::Limit(QuotaRule {
            bucket: format!("project:{project}:{plan}"),
            rate_per_second: limits.rate_per_second,
            burst: limits.burst,
            cost: cost.min(limits.burst),
        })
    }
}

export!(Plugin);
