//! The per-actor quota rule, independent of the component glue.

use std::collections::BTreeMap;
use std::net::IpAddr;

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
    /// Client addresses refused (`403 address_denied`), as CIDR blocks or single addresses.
    #[serde(default)]
    pub deny_cidrs: Vec<String>,
    /// When not empty, only client addresses within these are served; the others are refused
    /// (`403 address_not_allowed`).
    #[serde(default)]
    pub allow_cidrs: Vec<String>,
    /// Rules keyed by a claim of the user's JWT, the first that matches applies: its limits
    /// replace the plan's, or it refuses the request (`403 claim_denied`).
    #[serde(default)]
    pub claim_rules: Vec<ClaimRule>,
}

/// A rule keyed by a claim of the user's JWT.
#[derive(Debug, Clone, Deserialize)]
#[cfg_attr(not(target_arch = "wasm32"), derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct ClaimRule {
    /// The claim's name (`tier`, `org_id`, …).
    pub claim: String,
    /// The value it must have: a string, number or boolean.
    pub equals: serde_json::Value,
    /// Refuse the request instead of limiting it.
    #[serde(default)]
    pub deny: bool,
    /// Sustained rate for such users (default: the plan's).
    pub rate_per_second: Option<u32>,
    /// Bucket capacity for such users (default: the plan's).
    pub burst: Option<u32>,
}

/// Actor roles, as the host passes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Anon,
    Authenticated,
    ServiceRole,
    Console,
}

/// The actor facts the rule depends on.
#[derive(Debug, Clone, Copy)]
pub struct Actor<'a> {
    pub role: Role,
    /// Whether the request carries an API key (`key-id`).
    pub has_key: bool,
    /// Whether the caller is a known user (`user-id`).
    pub has_user: bool,
    pub plan: Option<&'a str>,
}

/// Whose bucket a rule counts against; the host names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Key,
    User,
    ConsoleUser,
}

/// A token-bucket rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub scope: Scope,
    pub rate_per_second: u32,
    pub burst: u32,
    pub cost: u32,
}

/// Why a request is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denied {
    /// The address is in `deny_cidrs`.
    Address,
    /// `allow_cidrs` is set and the address is not in it.
    NotAllowed,
    /// A claim rule with `deny`.
    Claim,
}

/// The policy's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Exempt,
    Limit(Rule),
    Deny(Denied),
}

/// A claim rule, its value as the host passes claims (compact JSON text).
#[derive(Debug, Clone)]
struct CompiledClaimRule {
    /// The claim's position in [`Policy::claims`].
    claim: u8,
    equals: String,
    deny: bool,
    limits: Option<(Option<u32>, Option<u32>)>,
}

/// A configured quota policy.
#[derive(Debug, Clone)]
pub struct Policy {
    default: Limits,
    plans: BTreeMap<String, Limits>,
    costs: BTreeMap<String, u32>,
    deny: Vec<ipnet::IpNet>,
    allow: Vec<ipnet::IpNet>,
    claims: Vec<String>,
    claim_rules: Vec<CompiledClaimRule>,
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

fn networks(key: &str, list: &[String]) -> Result<Vec<ipnet::IpNet>, String> {
    list.iter()
        .enumerate()
        .map(|(i, entry)| {
            entry
                .parse::<ipnet::IpNet>()
                .or_else(|_| entry.parse::<IpAddr>().map(ipnet::IpNet::from))
                .map_err(|_| format!("{key}[{i}]: {entry:?} is not an address or CIDR block"))
        })
        .collect()
}

/// At most this many distinct claims the rules may read (the host passes at most 8).
pub const MAX_CLAIMS: usize = 8;

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
        let mut claims: Vec<String> = Vec::new();
        let mut claim_rules = Vec::new();
        for (i, rule) in config.claim_rules.iter().enumerate() {
            let key = format!("claim_rules[{i}]");
            if rule.claim.is_empty() || rule.claim.len() > 64 {
                return Err(format!("{key}.claim: must be 1 to 64 bytes"));
            }
            if !(rule.equals.is_string() || rule.equals.is_number() || rule.equals.is_boolean()) {
                return Err(format!(
                    "{key}.equals: must be a string, a number or a boolean"
                ));
            }
            if rule.deny && (rule.rate_per_second.is_some() || rule.burst.is_some()) {
                return Err(format!(
                    "{key}: a rule that denies takes no rate_per_second or burst"
                ));
            }
            if rule.rate_per_second == Some(0) || rule.burst == Some(0) {
                return Err(format!(
                    "{key}: rate_per_second and burst must be at least 1"
                ));
            }
            let index = match claims.iter().position(|c| *c == rule.claim) {
                Some(index) => index,
                None => {
                    if claims.len() == MAX_CLAIMS {
                        return Err(format!(
                            "{key}.claim: the rules may read at most {MAX_CLAIMS} claims"
                        ));
                    }
                    claims.push(rule.claim.clone());
                    claims.len() - 1
                }
            };
            claim_rules.push(CompiledClaimRule {
                claim: index as u8,
                equals: rule.equals.to_string(),
                deny: rule.deny,
                limits: (!rule.deny).then_some((rule.rate_per_second, rule.burst)),
            });
        }
        Ok(Self {
            default,
            plans: config.plans,
            costs: config.costs,
            deny: networks("deny_cidrs", &config.deny_cidrs)?,
            allow: networks("allow_cidrs", &config.allow_cidrs)?,
            claims,
            claim_rules,
        })
    }

    /// The claims the rules read, in the order the host passes them by.
    pub fn claims(&self) -> &[String] {
        &self.claims
    }

    /// Whether decisions depend on the client's address.
    pub fn reads_address(&self) -> bool {
        !self.deny.is_empty() || !self.allow.is_empty()
    }

    /// The decision for one request: `claims` are the claims of [`Self::claims`] the user's
    /// token carries, by position, as compact JSON text.
    pub fn decide(
        &self,
        route_group: &str,
        actor: Actor<'_>,
        client_ip: Option<IpAddr>,
        claims: &[(u8, &str)],
    ) -> Outcome {
        if let Some(ip) = client_ip
            && self.deny.iter().any(|net| net.contains(&ip))
        {
            return Outcome::Deny(Denied::Address);
        }
        if !self.allow.is_empty()
            && !client_ip.is_some_and(|ip| self.allow.iter().any(|net| net.contains(&ip)))
        {
            return Outcome::Deny(Denied::NotAllowed);
        }
        let matched = self.claim_rules.iter().find(|rule| {
            claims
                .iter()
                .any(|(name, value)| *name == rule.claim && *value == rule.equals)
        });
        if matched.is_some_and(|rule| rule.deny) {
            return Outcome::Deny(Denied::Claim);
        }
        let scope = match (actor.role, actor.has_user, actor.has_key) {
            (Role::Console, true, _) => Scope::ConsoleUser,
            (Role::Authenticated, true, _) => Scope::User,
            (_, _, true) => Scope::Key,
            _ => return Outcome::Exempt,
        };
        let mut limits = actor
            .plan
            .and_then(|plan| self.plans.get(plan))
            .copied()
            .unwrap_or(self.default);
        if let Some((rate, burst)) = matched.and_then(|rule| rule.limits) {
            limits.rate_per_second = rate.unwrap_or(limits.rate_per_second);
            limits.burst = burst.unwrap_or(limits.burst);
        }
        let cost = self.costs.get(route_group).copied().unwrap_or(1);
        Outcome::Limit(Rule {
            scope,
            rate_per_second: limits.rate_per_second,
            burst: limits.burst,
            cost: cost.min(limits.burst),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn actor(role: Role) -> Actor<'static> {
        Actor {
            role,
            has_key: true,
            has_user: false,
            plan: None,
        }
    }

    fn limit(outcome: Outcome) -> Rule {
        match outcome {
            Outcome::Limit(rule) => rule,
            other => panic!("expected a limit, got {other:?}"),
        }
    }

    #[test]
    fn defaults_are_100_rps_burst_1000_per_key() {
        let p = Policy::configure("{}").expect("config");
        let r = limit(p.decide("db", actor(Role::Anon), None, &[]));
        assert_eq!(
            r,
            Rule {
                scope: Scope::Key,
                rate_per_second: 100,
                burst: 1000,
                cost: 1
            }
        );
        assert!(!p.reads_address());
        assert!(p.claims().is_empty());
    }

    #[test]
    fn users_get_their_own_bucket_and_keyless_callers_are_exempt() {
        let p = Policy::configure("{}").expect("config");
        let mut a = actor(Role::Authenticated);
        a.has_user = true;
        assert_eq!(limit(p.decide("db", a, None, &[])).scope, Scope::User);
        let mut console = actor(Role::Console);
        console.has_user = true;
        console.has_key = false;
        assert_eq!(
            limit(p.decide("management", console, None, &[])).scope,
            Scope::ConsoleUser
        );
        let anon = Actor {
            role: Role::Anon,
            has_key: false,
            has_user: false,
            plan: None,
        };
        assert_eq!(p.decide("gateway", anon, None, &[]), Outcome::Exempt);
    }

    #[test]
    fn plans_and_costs_apply() {
        let p = Policy::configure(
            r#"{"plans":{"pro":{"rate_per_second":500,"burst":5000}},"costs":{"functions":10}}"#,
        )
        .expect("config");
        let mut a = actor(Role::ServiceRole);
        a.plan = Some("pro");
        let r = limit(p.decide("functions", a, None, &[]));
        assert_eq!((r.rate_per_second, r.burst, r.cost), (500, 5000, 10));
    }

    #[test]
    fn address_lists_deny_before_anything_else() {
        let p = Policy::configure(
            r#"{"deny_cidrs":["203.0.113.0/24","2001:db8::1"],"allow_cidrs":["203.0.113.0/16","10.0.0.0/8","2001:db8::/32"]}"#,
        )
        .expect("config");
        assert!(p.reads_address());
        let ip = |s: &str| Some(s.parse::<IpAddr>().expect("ip"));
        let a = actor(Role::Anon);
        assert_eq!(
            p.decide("db", a, ip("203.0.113.9"), &[]),
            Outcome::Deny(Denied::Address)
        );
        assert_eq!(
            p.decide("db", a, ip("2001:db8::1"), &[]),
            Outcome::Deny(Denied::Address)
        );
        assert_eq!(
            p.decide("db", a, ip("192.0.2.1"), &[]),
            Outcome::Deny(Denied::NotAllowed)
        );
        assert_eq!(
            p.decide("db", a, None, &[]),
            Outcome::Deny(Denied::NotAllowed),
            "an unknown address is not on the allow list"
        );
        assert_eq!(
            limit(p.decide("db", a, ip("10.1.2.3"), &[])).scope,
            Scope::Key
        );
        assert!(
            Policy::configure(r#"{"deny_cidrs":["nope"]}"#)
                .expect_err("refused")
                .contains("deny_cidrs[0]")
        );
    }

    #[test]
    fn claim_rules_limit_or_deny_by_a_claim_of_the_token() {
        let p = Policy::configure(
            r#"{"claim_rules":[
                {"claim":"blocked","equals":true,"deny":true},
                {"claim":"tier","equals":"gold","rate_per_second":1000,"burst":9000}
            ]}"#,
        )
        .expect("config");
        assert_eq!(p.claims(), ["blocked", "tier"]);
        let mut a = actor(Role::Authenticated);
        a.has_user = true;
        assert_eq!(
            p.decide("db", a, None, &[(0, "true")]),
            Outcome::Deny(Denied::Claim)
        );
        let gold = limit(p.decide("db", a, None, &[(0, "false"), (1, "\"gold\"")]));
        assert_eq!((gold.rate_per_second, gold.burst), (1000, 9000));
        let plain = limit(p.decide("db", a, None, &[(1, "\"silver\"")]));
        assert_eq!((plain.rate_per_second, plain.burst), (100, 1000));
        assert!(
            Policy::configure(r#"{"claim_rules":[{"claim":"x","equals":[1]}]}"#).is_err(),
            "only scalars"
        );
        assert!(
            Policy::configure(
                r#"{"claim_rules":[{"claim":"x","equals":1,"deny":true,"burst":2}]}"#
            )
            .is_err()
        );
    }

    #[test]
    fn bad_figures_are_refused() {
        assert!(Policy::configure(r#"{"rate_per_second":0}"#).is_err());
        assert!(Policy::configure(r#"{"burst":5,"costs":{"ai":6}}"#).is_err());
        assert!(Policy::configure(r#"{"costs":{"ai":0}}"#).is_err());
        assert!(Policy::configure(r#"{"rate":1}"#).is_err());
    }
}
