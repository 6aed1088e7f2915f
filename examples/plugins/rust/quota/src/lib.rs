//! A quota by plan, with a cost per route group, one bucket per project (all keys and users of
//! a project share it); users whose token carries a denied claim value are refused (403
//! `claim_denied`). Build: `cargo build --release --target wasm32-wasip2`. Configuration:
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
//! [deny_claims]            # optional: claim = the string value refused
//! tier = "suspended"
//! ```
//!
//! Projects on a plan that is not listed get the `free` limits; requests without a project are
//! exempt. The decision depends on the route group, the project, its plan and (with
//! `deny_claims`) the claims: that is what it declares.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use serde::Deserialize;

wit_bindgen::generate!({ path: "../../../../wit", world: "quota-stage" });

use aura::gateway::types::Plane;
use exports::aura::gateway::quota::{
    BucketScope, DenyReason, DenyStatus, Guest, QuotaCache, QuotaDecision, QuotaDenial,
    QuotaInputs, QuotaRequest, QuotaRule, QuotaSetup,
};

/// The JSON Schema of the configuration, checked by the gateway before `configure` runs.
const SCHEMA: &str = r#"{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "title": "quota: by plan",
  "type": "object",
  "properties": {
    "plans": {
      "description": "Limits by plan; free is required and applies to unlisted plans.",
      "type": "object",
      "required": ["free"],
      "additionalProperties": {
        "type": "object",
        "properties": {
          "rate_per_second": { "type": "integer", "minimum": 1, "maximum": 4294967295 },
          "burst": { "type": "integer", "minimum": 1, "maximum": 4294967295 }
        },
        "required": ["rate_per_second", "burst"],
        "additionalProperties": false
      }
    },
    "costs": {
      "description": "Tokens one request of a route group takes (default 1).",
      "type": "object",
      "propertyNames": {
        "enum": ["auth", "db", "storage", "functions", "realtime", "notifications", "ai",
                 "provisioner", "control", "management", "gateway"]
      },
      "additionalProperties": { "type": "integer", "minimum": 1, "maximum": 4294967295 }
    },
    "deny_claims": {
      "description": "Users whose token has one of these claims with this value are refused.",
      "type": "object",
      "maxProperties": 8,
      "propertyNames": { "minLength": 1, "maxLength": 64 },
      "additionalProperties": { "type": "string" }
    }
  },
  "required": ["plans"],
  "additionalProperties": false
}"#;

/// How long a decision holds: a function of its declared inputs and the configuration, so as
/// long as the gateway keeps it (it lowers this to its own ceiling).
const MAX_AGE_MS: u32 = 300_000;

/// The route groups the configuration may give a cost, by the names the gateway passes in
/// `route-group` (the schema's `propertyNames` lists the same).
const ROUTE_GROUPS: [&str; 11] = [
    "auth",
    "db",
    "storage",
    "functions",
    "realtime",
    "notifications",
    "ai",
    "provisioner",
    "control",
    "management",
    "gateway",
];

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
    #[serde(default)]
    deny_claims: BTreeMap<String, String>,
}

/// The configuration, ready for `decide`.
struct Policy {
    plans: BTreeMap<String, Limits>,
    /// Cost by route group name.
    costs: BTreeMap<String, u32>,
    /// (claim, value refused); the gateway passes a claim by its position in this list.
    deny_claims: Vec<(String, String)>,
}

static POLICY: OnceLock<Policy> = OnceLock::new();

struct Plugin;

impl Guest for Plugin {
    fn config_schema() -> Option<String> {
        Some(SCHEMA.to_owned())
    }

    fn configure(_plane: Plane, config: String) -> Result<QuotaSetup, String> {
        let config: Config = serde_json::from_str(&config).map_err(|e| format!("config: {e}"))?;
        let free = config.plans.get("free").ok_or("plans.free is required")?;
        for (name, l) in &config.plans {
            if l.rate_per_second == 0 || l.burst == 0 {
                return Err(format!(
                    "plans.{name}: rate_per_second and burst must be at least 1"
                ));
            }
        }
        let mut costs = BTreeMap::new();
        for (group, cost) in &config.costs {
            if !ROUTE_GROUPS.contains(&group.as_str()) {
                return Err(format!("costs.{group}: not a route group"));
            }
            if *cost == 0 || *cost > free.burst {
                return Err(format!(
                    "costs.{group}: {cost} must be between 1 and the free burst"
                ));
            }
            costs.insert(group.clone(), *cost);
        }
        if config.deny_claims.len() > 8 {
            return Err("deny_claims: at most 8 claims".into());
        }
        let claims: Vec<String> = config.deny_claims.keys().cloned().collect();
        let mut inputs = QuotaInputs::ROUTE_GROUP | QuotaInputs::PROJECT | QuotaInputs::PLAN;
        if !claims.is_empty() {
            inputs = inputs | QuotaInputs::CLAIMS;
        }
        let policy = Policy {
            plans: config.plans,
            costs,
            deny_claims: config.deny_claims.into_iter().collect(),
        };
        POLICY
            .set(policy)
            .map_err(|_| "configured twice".to_string())?;
        Ok(QuotaSetup {
            claims,
            headers: Vec::new(),
            cache: Some(QuotaCache {
                inputs,
                max_age_ms: MAX_AGE_MS,
            }),
        })
    }

    fn decide(request: QuotaRequest) -> QuotaDecision {
        let Some(policy) = POLICY.get() else {
            return QuotaDecision::Exempt;
        };
        // Each claim comes as JSON text, named by its position in the list `configure` answered.
        for claim in &request.claims {
            let Some((_, refused)) = policy.deny_claims.get(usize::from(claim.name)) else {
                continue;
            };
            if serde_json::from_str::<String>(&claim.value).is_ok_and(|v| v == *refused) {
                return QuotaDecision::Deny(QuotaDenial {
                    status: DenyStatus::Forbidden,
                    reason: DenyReason::ClaimDenied,
                    retry_after_seconds: 0,
                });
            }
        }
        if request.actor.project.is_none() {
            return QuotaDecision::Exempt;
        }
        let plan = request.actor.plan.as_deref().unwrap_or("free");
        let limits = policy
            .plans
            .get(plan)
            .or_else(|| policy.plans.get("free"))
            .copied()
            .unwrap_or(Limits {
                rate_per_second: 1,
                burst: 1,
            });
        let cost = policy.costs.get(&request.route_group).copied().unwrap_or(1);
        // The gateway names the bucket from the request: one per project.
        QuotaDecision::Limit(QuotaRule {
            scope: BucketScope::Project,
            rate_per_second: limits.rate_per_second,
            burst: limits.burst,
            cost: cost.min(limits.burst),
        })
    }
}

export!(Plugin);
