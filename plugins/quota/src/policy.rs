//! The per-actor quota rule, independent of the component glue.

use std::collections::BTreeMap;

use serde::Deserialize;

/// Figures of one bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[cfg_attr(not(target_arch = "wasm32"), derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct Limits {
    pub rate_per_second: u32,
    pub burst: u32,
}

/// The stage configuration (`[<plane>.plugins.quota.config]`).
#[derive(Debug, Default, Deserialize)]
#[cfg_attr(not(target_arch = "wasm32"), derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Sustained rate for every actor. Default 100.
    pub rate_per_second: Option<u32>,
    /// Bucket capacity for every actor. Default 1000.
    pub burst: Option<u32>,
    /// Limits by project plan (`free`, `pro`, …), replacing the defaults for that plan.
    #[serde(default)]
    pub plans: BTreeMap<String, Limits>,
    /// Tokens taken by one request of a route group (default 1).
    #[serde(default)]
    pub costs: BTreeMap<String, u32>,
}

/// Actor roles, as the host passes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Anon,
    Authenticated,
    ServiceRole,
    Console,
}

/// The actor fields the rule depends on.
#[derive(Debug, Clone, Copy)]
pub struct Actor<'a> {
    pub role: Role,
    pub project: Option<&'a str>,
    pub key_id: Option<&'a str>,
    pub user_id: Option<&'a str>,
    pub plan: Option<&'a str>,
}

/// A token-bucket rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub bucket: String,
    pub rate_per_second: u32,
    pub burst: u32,
    pub cost: u32,
}

/// A configured quota policy.
#[derive(Debug, Clone)]
pub struct Policy {
    default: Limits,
    plans: BTreeMap<String, Limits>,
    costs: BTreeMap<String, u32>,
}

fn check(what: &str, limits: Limits, costs: &BTreeMap<String, u32>) -> Result<(), String> {
    if limits.rate_per_second == 0 {
        return Err(format!("{what}rate_per_second: must be at least 1"));
    }
    if limits.burst == 0 {
        return Err(format!("{what}burst: must be at least 1"));
    }
    if let Some((group, cost)) = costs.iter().find(|(_, c)| **c > limits.burst) {
        return Err(format!(
            "costs.{group}: {cost} exceeds {what}burst {}, such requests could never pass",
            limits.burst
        ));
    }
    Ok(())
}

impl Policy {
    /// Builds the policy from the stage configuration (JSON text).
    pub fn configure(json: &str) -> Result<Self, String> {
        let config: Config = if json.trim().is_empty() {
            Config::default()
        } else {
            serde_json::from_str(json).map_err(|e| format!("invalid quota config: {e}"))?
        };
        if let Some((group, _)) = config.costs.iter().find(|(_, c)| **c == 0) {
            return Err(format!(
                "costs.{group}: must be at least 1 (use a larger rate instead)"
            ));
        }
        let default = Limits {
            rate_per_second: config.rate_per_second.unwrap_or(100),
            burst: config.burst.unwrap_or(1000),
        };
        check("", default, &config.costs)?;
        for (plan, limits) in &config.plans {
            check(&format!("plans.{plan}."), *limits, &config.costs)?;
        }
        Ok(Self {
            default,
            plans: config.plans,
            costs: config.costs,
        })
    }

    /// The rule for one request, or `None` when it is exempt.
    pub fn decide(&self, route_group: &str, actor: Actor<'_>) -> Option<Rule> {
        // Concatenated, not formatted: `format!` costs a plugin about a thousand instructions
        // per call (the formatting machinery, compiled to wasm), `concat` a few dozen.
        let bucket = match (actor.role, actor.user_id, actor.key_id) {
            (Role::Console, Some(user), _) => ["console:", user].concat(),
            (Role::Authenticated, Some(user), _) => {
                ["user:", actor.project.unwrap_or("-"), ":", user].concat()
            }
            (_, _, Some(key)) => ["key:", key].concat(),
            _ => return None,
        };
        let limits = actor
            .plan
            .and_then(|plan| self.plans.get(plan))
            .copied()
            .unwrap_or(self.default);
        Some(Rule {
            bucket,
            rate_per_second: limits.rate_per_second,
            burst: limits.burst,
            cost: self.costs.get(route_group).copied().unwrap_or(1),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn actor(role: Role) -> Actor<'static> {
        Actor {
            role,
            project: Some("proj"),
            key_id: Some("k1"),
            user_id: None,
            plan: None,
        }
    }

    #[test]
    fn defaults_are_100_rps_burst_1000_per_key() {
        let p = Policy::configure("{}").expect("config");
        let r = p.decide("db", actor(Role::Anon)).expect("limited");
        assert_eq!(
            r,
            Rule {
                bucket: "key:k1".into(),
                rate_per_second: 100,
                burst: 1000,
                cost: 1
            }
        );
    }

    #[test]
    fn users_get_their_own_bucket_and_keyless_callers_are_exempt() {
        let p = Policy::configure("{}").expect("config");
        let mut a = actor(Role::Authenticated);
        a.user_id = Some("u1");
        assert_eq!(p.decide("db", a).expect("limited").bucket, "user:proj:u1");
        a.project = None;
        assert_eq!(p.decide("db", a).expect("limited").bucket, "user:-:u1");
        let mut console = actor(Role::Console);
        console.user_id = Some("c1");
        assert_eq!(
            p.decide("management", console).expect("limited").bucket,
            "console:c1"
        );
        let anon = Actor {
            role: Role::Anon,
            project: None,
            key_id: None,
            user_id: None,
            plan: None,
        };
        assert_eq!(p.decide("gateway", anon), None);
    }

    #[test]
    fn plans_and_costs_apply() {
        let p = Policy::configure(
            r#"{"plans":{"pro":{"rate_per_second":500,"burst":5000}},"costs":{"functions":10}}"#,
        )
        .expect("config");
        let mut a = actor(Role::ServiceRole);
        a.plan = Some("pro");
        let r = p.decide("functions", a).expect("limited");
        assert_eq!((r.rate_per_second, r.burst, r.cost), (500, 5000, 10));
    }

    #[test]
    fn bad_figures_are_refused() {
        assert!(Policy::configure(r#"{"rate_per_second":0}"#).is_err());
        assert!(Policy::configure(r#"{"burst":5,"costs":{"ai":6}}"#).is_err());
        assert!(Policy::configure(r#"{"costs":{"ai":0}}"#).is_err());
        assert!(Policy::configure(r#"{"rate":1}"#).is_err());
    }
}
