//! Quota rules as the host enforces them, whatever a `quota` module answers.
//!
//! A module — the operator's or, worse, a project's own — names a bucket and its figures; every
//! one of them is bounded here before a bucket is touched:
//! - rate, burst and cost above the ceilings of the module's source (`rate_limit.operator_rules`
//!   or `rate_limit.tenant_rules`) are lowered to them, and counted; zero is raised to 1; a cost
//!   above the burst takes the whole burst;
//! - a bucket name that is empty or longer than `rate_limit.max_bucket_name_bytes` refuses the
//!   decision: the request fails closed, and it is counted;
//! - names are put in a namespace of their source, written so that no two sources can ever name
//!   the same bucket: `o:<bucket>` for the operator's modules, `t:<len>:<ref>:<bucket>` for a
//!   project's (the ref's length first: `t:1:a:b:c` and `t:3:a:b:c` cannot collide whatever the
//!   ref and bucket hold).

use crate::config::{RateLimitConfig, RuleCeilings};

use super::Rule;

/// Whose module answered the rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuleSource {
    /// The operator's module for the plane.
    Operator,
    /// A project's own module.
    Tenant,
}

impl RuleSource {
    /// Label value.
    pub fn as_str(self) -> &'static str {
        match self {
            RuleSource::Operator => "operator",
            RuleSource::Tenant => "tenant",
        }
    }
}

/// A rule field lowered to its ceiling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    Rate,
    Burst,
    Cost,
}

impl Field {
    /// Label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Field::Rate => "rate",
            Field::Burst => "burst",
            Field::Cost => "cost",
        }
    }
}

/// Why a decision was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RuleRefused {
    #[error("the bucket name is empty")]
    EmptyBucket,
    #[error("the bucket name is {0} bytes, over rate_limit.max_bucket_name_bytes")]
    BucketTooLong(usize),
}

impl RuleRefused {
    /// Label value.
    pub fn as_str(self) -> &'static str {
        match self {
            RuleRefused::EmptyBucket => "empty_bucket",
            RuleRefused::BucketTooLong(_) => "bucket_name_too_long",
        }
    }
}

/// A module's rule, as answered.
#[derive(Debug, Clone, Copy)]
pub struct Answered<'a> {
    pub bucket: &'a str,
    pub rate_per_second: u32,
    pub burst: u32,
    pub cost: u32,
}

/// The rule to enforce, and the fields that were lowered to a ceiling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bounded {
    pub rule: Rule,
    pub clamped: Vec<Field>,
}

/// Bounds `answered` for `source` (`project` is the actor's project, for tenant rules).
pub fn bound(
    config: &RateLimitConfig,
    source: RuleSource,
    project: Option<&str>,
    answered: Answered<'_>,
) -> Result<Bounded, RuleRefused> {
    if answered.bucket.is_empty() {
        return Err(RuleRefused::EmptyBucket);
    }
    if answered.bucket.len() > config.max_bucket_name_bytes {
        return Err(RuleRefused::BucketTooLong(answered.bucket.len()));
    }
    let ceilings: &RuleCeilings = match source {
        RuleSource::Operator => &config.operator_rules,
        RuleSource::Tenant => &config.tenant_rules,
    };
    let mut clamped = Vec::new();
    let mut cap = |value: u32, max: u32, field: Field| {
        if value > max {
            clamped.push(field);
            max
        } else {
            value.max(1)
        }
    };
    let rate_per_second = cap(
        answered.rate_per_second,
        ceilings.max_rate_per_second,
        Field::Rate,
    );
    let burst = cap(answered.burst, ceilings.max_burst, Field::Burst);
    let cost = cap(answered.cost, ceilings.max_cost, Field::Cost).min(burst);
    // Written by hand, not formatted: this runs on every request with a quota.
    let mut bucket = String::with_capacity(answered.bucket.len() + 32);
    match (source, project) {
        (RuleSource::Tenant, Some(project)) => {
            bucket.push_str("t:");
            bucket.push_str(itoa::Buffer::new().format(project.len()));
            bucket.push(':');
            bucket.push_str(project);
            bucket.push(':');
        }
        // A tenant module only ever runs for a request of its project; without one there is
        // nothing to name, and the rule still never reaches the operator's namespace.
        (RuleSource::Tenant, None) => bucket.push_str("t:0::"),
        (RuleSource::Operator, _) => bucket.push_str("o:"),
    }
    bucket.push_str(answered.bucket);
    Ok(Bounded {
        rule: Rule {
            bucket,
            rate_per_second,
            burst,
            cost,
        },
        clamped,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answered(bucket: &str, rate: u32, burst: u32, cost: u32) -> Answered<'_> {
        Answered {
            bucket,
            rate_per_second: rate,
            burst,
            cost,
        }
    }

    #[test]
    fn figures_are_lowered_to_the_ceilings_of_their_source() {
        let config = RateLimitConfig::default();
        let huge = answered("k", u32::MAX, u32::MAX, u32::MAX);
        let t = bound(&config, RuleSource::Tenant, Some("alpha"), huge).expect("bounded");
        assert_eq!(
            t.rule.rate_per_second,
            config.tenant_rules.max_rate_per_second
        );
        assert_eq!(t.rule.burst, config.tenant_rules.max_burst);
        assert_eq!(t.rule.cost, config.tenant_rules.max_cost);
        assert_eq!(t.clamped, vec![Field::Rate, Field::Burst, Field::Cost]);
        let o = bound(&config, RuleSource::Operator, None, huge).expect("bounded");
        assert_eq!(o.rule.burst, config.operator_rules.max_burst);
        let zero =
            bound(&config, RuleSource::Operator, None, answered("k", 0, 0, 0)).expect("bounded");
        assert_eq!(
            (zero.rule.rate_per_second, zero.rule.burst, zero.rule.cost),
            (1, 1, 1)
        );
        assert!(zero.clamped.is_empty());
        let over = bound(
            &config,
            RuleSource::Operator,
            None,
            answered("k", 5, 10, 50),
        )
        .expect("bounded");
        assert_eq!(over.rule.cost, 10, "a cost above the burst takes the burst");
    }

    #[test]
    fn long_or_empty_names_refuse_the_decision() {
        let config = RateLimitConfig::default();
        let long = "b".repeat(config.max_bucket_name_bytes + 1);
        assert_eq!(
            bound(
                &config,
                RuleSource::Tenant,
                Some("a"),
                answered(&long, 1, 1, 1)
            ),
            Err(RuleRefused::BucketTooLong(long.len()))
        );
        assert_eq!(
            bound(
                &config,
                RuleSource::Tenant,
                Some("a"),
                answered("", 1, 1, 1)
            ),
            Err(RuleRefused::EmptyBucket)
        );
    }

    #[test]
    fn no_two_sources_or_projects_share_a_bucket() {
        let config = RateLimitConfig::default();
        let name = |source, project, bucket| {
            bound(&config, source, project, answered(bucket, 1, 1, 1))
                .expect("bounded")
                .rule
                .bucket
        };
        let forged = "key:5f0c8a0e-9a55-4c0f-9d55-6f3c2d1b7e11";
        let operator = name(RuleSource::Operator, Some("alpha"), forged);
        assert_ne!(name(RuleSource::Tenant, Some("alpha"), forged), operator);
        assert_ne!(
            name(RuleSource::Tenant, Some("alpha"), forged),
            name(RuleSource::Tenant, Some("beta"), forged)
        );
        // A ref holding the separator cannot reach into another project's names.
        assert_ne!(
            name(RuleSource::Tenant, Some("a:b"), "c"),
            name(RuleSource::Tenant, Some("a"), "b:c")
        );
        // Nor can a tenant name an operator bucket by writing its namespace.
        assert_ne!(name(RuleSource::Tenant, Some("a"), &operator), operator);
    }

    #[test]
    fn bucket_names_carry_their_source_and_project() {
        let config = RateLimitConfig::default();
        let named = |source, project| {
            bound(&config, source, project, answered("k:1", 1, 1, 1))
                .expect("bounded")
                .rule
                .bucket
        };
        assert_eq!(named(RuleSource::Tenant, Some("alpha")), "t:5:alpha:k:1");
        // The project's length keeps `t:{len}:{project}:{bucket}` unambiguous.
        assert_eq!(
            named(RuleSource::Tenant, Some("abcdefghijkl")),
            "t:12:abcdefghijkl:k:1"
        );
        assert_eq!(named(RuleSource::Tenant, None), "t:0::k:1");
        assert_eq!(named(RuleSource::Operator, Some("alpha")), "o:k:1");
    }
}
