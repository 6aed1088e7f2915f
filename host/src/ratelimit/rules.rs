//! Quota rules as the host enforces them, whatever a `quota` module answers.
//!
//! A module — the operator's or, worse, a project's own — names a bucket's scope and its figures;
//! every one of them is bounded here before a bucket is touched:
//! - rate, burst and cost above the ceilings of the module's source (`rate_limit.operator_rules`
//!   or `rate_limit.tenant_rules`) are lowered to them, and counted; zero is raised to 1; a cost
//!   above the burst takes the whole burst;
//! - the bucket is named by the host from the scope and the request (`k:<key id>`,
//!   `u:<len>:<project>:<user>`, `c:<console user>`, `p:<project>`, `i:<address>` with an IPv6
//!   address by its /64, `n:<the module's name>`), so that a rule cannot name another caller's
//!   bucket; a scope the request has no value for (`key` without a key) refuses the decision;
//! - a module's own name that is empty or longer than `rate_limit.max_bucket_name_bytes` refuses
//!   the decision: the request fails closed, and it is counted;
//! - names are put in a namespace of their source, written so that no two sources can ever name
//!   the same bucket: `o:<bucket>` for the operator's modules, `t:<len>:<ref>:<bucket>` for a
//!   project's (the ref's length first: `t:1:a:b:c` and `t:3:a:b:c` cannot collide whatever the
//!   ref and bucket hold).

use crate::actor::Actor;
use crate::config::{RateLimitConfig, RuleCeilings};
use crate::metrics::Metrics;
use crate::plane::Plane;

use super::Rule;
use crate::stage::Owner;

/// A rule field lowered to its ceiling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    Rate = 0,
    Burst = 1,
    Cost = 2,
}

/// The fields of a rule lowered to their ceilings: a set of at most the three, kept without an
/// allocation (a module answering over the ceilings does it on every request).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Clamped(u8);

impl Clamped {
    fn add(&mut self, field: Field) {
        self.0 |= 1 << field as u8;
    }

    /// Whether no field was lowered.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The fields lowered, in the order rate, burst, cost.
    pub fn iter(self) -> impl Iterator<Item = Field> {
        [Field::Rate, Field::Burst, Field::Cost]
            .into_iter()
            .filter(move |field| self.0 & (1 << *field as u8) != 0)
    }
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
    #[error("the rule's scope is `{0}` but the request has none")]
    ScopeUnknown(&'static str),
}

impl RuleRefused {
    /// Label value.
    pub fn as_str(self) -> &'static str {
        match self {
            RuleRefused::EmptyBucket => "empty_bucket",
            RuleRefused::BucketTooLong(_) => "bucket_name_too_long",
            RuleRefused::ScopeUnknown(_) => "scope_unknown",
        }
    }
}

/// Whose bucket a rule counts against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope<'a> {
    /// The API key.
    Key,
    /// The user, within the project.
    User,
    /// The console user.
    ConsoleUser,
    /// The project.
    Project,
    /// The client's address (an IPv6 one by its /64).
    ClientIp,
    /// A bucket of the module's naming.
    Named(&'a str),
}

/// A module's rule, as answered.
#[derive(Debug, Clone, Copy)]
pub struct Answered<'a> {
    pub scope: Scope<'a>,
    pub rate_per_second: u32,
    pub burst: u32,
    pub cost: u32,
}

/// The rule to enforce, and the fields that were lowered to a ceiling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bounded {
    pub rule: Rule,
    pub clamped: Clamped,
}

/// Bounds `answered` for `source` and names its bucket from `actor`.
pub fn bound(
    config: &RateLimitConfig,
    source: Owner,
    actor: &Actor,
    answered: Answered<'_>,
) -> Result<Bounded, RuleRefused> {
    if let Scope::Named(name) = answered.scope {
        if name.is_empty() {
            return Err(RuleRefused::EmptyBucket);
        }
        if name.len() > config.max_bucket_name_bytes {
            return Err(RuleRefused::BucketTooLong(name.len()));
        }
    }
    let project = actor.project.as_deref();
    fn known<'a>(value: Option<&'a str>, scope: &'static str) -> Result<&'a str, RuleRefused> {
        value.ok_or(RuleRefused::ScopeUnknown(scope))
    }
    let address;
    // A user of a project's own issuer: the issuer is part of the name, so two identity
    // providers handing out the same `sub` never share a bucket.
    let issuer = match (&answered.scope, &actor.issuer) {
        (Scope::User, Some(crate::actor::IssuerLabel::Project { id, .. })) => Some(*id),
        _ => None,
    };
    let (tag, first, second): (&str, &str, Option<&str>) = match answered.scope {
        Scope::Key => ("k:", known(actor.key_id.as_deref(), "key")?, None),
        Scope::User => (
            if issuer.is_some() { "v:" } else { "u:" },
            project.unwrap_or("-"),
            Some(known(actor.user_id.as_deref(), "user")?),
        ),
        Scope::ConsoleUser => ("c:", known(actor.user_id.as_deref(), "console_user")?, None),
        Scope::Project => ("p:", known(project, "project")?, None),
        Scope::ClientIp => {
            let ip = actor
                .client_ip
                .ok_or(RuleRefused::ScopeUnknown("client_ip"))?;
            address = crate::actor::client_prefix(Some(ip));
            ("i:", address.as_ref(), None)
        }
        Scope::Named(name) => ("n:", name, None),
    };
    let ceilings: &RuleCeilings = match source {
        Owner::Operator => &config.operator_rules,
        Owner::Tenant => &config.tenant_rules,
    };
    let mut clamped = Clamped::default();
    let mut cap = |value: u32, max: u32, field: Field| {
        if value > max {
            clamped.add(field);
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
    let mut bucket = String::with_capacity(first.len() + second.map_or(0, str::len) + 48);
    match (source, project) {
        (Owner::Tenant, Some(project)) => {
            bucket.push_str("t:");
            bucket.push_str(itoa::Buffer::new().format(project.len()));
            bucket.push(':');
            bucket.push_str(project);
            bucket.push(':');
        }
        // A tenant module only ever runs for a request of its project; without one there is
        // nothing to name, and the rule still never reaches the operator's namespace.
        (Owner::Tenant, None) => bucket.push_str("t:0::"),
        (Owner::Operator, _) => bucket.push_str("o:"),
    }
    bucket.push_str(tag);
    match second {
        // `u:<len>:<project>:<user>`: the length keeps a project and a user apart;
        // `v:<len>:<project>:<issuer id, 32 hex>:<user>` for a project issuer's user.
        Some(second) => {
            bucket.push_str(itoa::Buffer::new().format(first.len()));
            bucket.push(':');
            bucket.push_str(first);
            bucket.push(':');
            if let Some(id) = issuer {
                bucket.push_str(id.simple().encode_lower(&mut uuid::Uuid::encode_buffer()));
                bucket.push(':');
            }
            bucket.push_str(second);
        }
        None => bucket.push_str(first),
    }
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

/// The counter of a rule's field lowered to its ceiling (`aura_quota_rules_clamped_total` by
/// plane, source and field; a series appears when it is first counted).
pub fn clamped_counter(
    metrics: &Metrics,
    plane: Plane,
    source: Owner,
    field: Field,
) -> &prometheus::IntCounter {
    let at = usize::from(plane == Plane::Management) * 6
        + usize::from(source == Owner::Tenant) * 3
        + field as usize;
    metrics.clamped[at].get_or_init(|| {
        metrics.quota_rules_clamped.with_label_values(&[
            plane.as_str(),
            source.as_str(),
            field.as_str(),
        ])
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(project: Option<&str>) -> Actor {
        let mut actor = Actor::unauthenticated(Plane::Data);
        actor.project = project.map(str::to_owned);
        actor
    }

    fn answered(bucket: &str, rate: u32, burst: u32, cost: u32) -> Answered<'_> {
        Answered {
            scope: Scope::Named(bucket),
            rate_per_second: rate,
            burst,
            cost,
        }
    }

    #[test]
    fn figures_are_lowered_to_the_ceilings_of_their_source() {
        let config = RateLimitConfig::default();
        let huge = answered("k", u32::MAX, u32::MAX, u32::MAX);
        let t = bound(&config, Owner::Tenant, &of(Some("alpha")), huge).expect("bounded");
        assert_eq!(
            t.rule.rate_per_second,
            config.tenant_rules.max_rate_per_second
        );
        assert_eq!(t.rule.burst, config.tenant_rules.max_burst);
        assert_eq!(t.rule.cost, config.tenant_rules.max_cost);
        assert_eq!(
            t.clamped.iter().collect::<Vec<_>>(),
            vec![Field::Rate, Field::Burst, Field::Cost]
        );
        let o = bound(&config, Owner::Operator, &of(None), huge).expect("bounded");
        assert_eq!(o.rule.burst, config.operator_rules.max_burst);
        let zero =
            bound(&config, Owner::Operator, &of(None), answered("k", 0, 0, 0)).expect("bounded");
        assert_eq!(
            (zero.rule.rate_per_second, zero.rule.burst, zero.rule.cost),
            (1, 1, 1)
        );
        assert!(zero.clamped.is_empty());
        let burst_only = bound(
            &config,
            Owner::Tenant,
            &of(Some("alpha")),
            answered("k", 1, u32::MAX, 1),
        )
        .expect("bounded");
        assert_eq!(
            burst_only.clamped.iter().collect::<Vec<_>>(),
            [Field::Burst]
        );
        let over = bound(
            &config,
            Owner::Operator,
            &of(None),
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
                Owner::Tenant,
                &of(Some("a")),
                answered(&long, 1, 1, 1)
            ),
            Err(RuleRefused::BucketTooLong(long.len()))
        );
        assert_eq!(
            bound(
                &config,
                Owner::Tenant,
                &of(Some("a")),
                answered("", 1, 1, 1)
            ),
            Err(RuleRefused::EmptyBucket)
        );
    }

    #[test]
    fn no_two_sources_or_projects_share_a_bucket() {
        let config = RateLimitConfig::default();
        let name = |source, project, bucket| {
            bound(&config, source, &of(project), answered(bucket, 1, 1, 1))
                .expect("bounded")
                .rule
                .bucket
        };
        let forged = "key:5f0c8a0e-9a55-4c0f-9d55-6f3c2d1b7e11";
        let operator = name(Owner::Operator, Some("alpha"), forged);
        assert_ne!(name(Owner::Tenant, Some("alpha"), forged), operator);
        assert_ne!(
            name(Owner::Tenant, Some("alpha"), forged),
            name(Owner::Tenant, Some("beta"), forged)
        );
        // A ref holding the separator cannot reach into another project's names.
        assert_ne!(
            name(Owner::Tenant, Some("a:b"), "c"),
            name(Owner::Tenant, Some("a"), "b:c")
        );
        // Nor can a tenant name an operator bucket by writing its namespace.
        assert_ne!(name(Owner::Tenant, Some("a"), &operator), operator);
    }

    #[test]
    fn bucket_names_carry_their_source_and_project() {
        let config = RateLimitConfig::default();
        let named = |source, project| {
            bound(&config, source, &of(project), answered("k:1", 1, 1, 1))
                .expect("bounded")
                .rule
                .bucket
        };
        assert_eq!(named(Owner::Tenant, Some("alpha")), "t:5:alpha:n:k:1");
        // The project's length keeps `t:{len}:{project}:{bucket}` unambiguous.
        assert_eq!(
            named(Owner::Tenant, Some("abcdefghijkl")),
            "t:12:abcdefghijkl:n:k:1"
        );
        assert_eq!(named(Owner::Tenant, None), "t:0::n:k:1");
        assert_eq!(named(Owner::Operator, Some("alpha")), "o:n:k:1");
    }

    #[test]
    fn scopes_are_named_by_the_host_from_the_request() {
        let config = RateLimitConfig::default();
        let mut actor = of(Some("alpha"));
        actor.key_id = Some("key-1".into());
        actor.user_id = Some("user:1".into());
        actor.client_ip = Some("2001:db8:1:2:3:4:5:6".parse().expect("ip"));
        let name = |source, actor: &Actor, scope| {
            bound(
                &config,
                source,
                actor,
                Answered {
                    scope,
                    rate_per_second: 1,
                    burst: 1,
                    cost: 1,
                },
            )
            .map(|b| b.rule.bucket)
        };
        let o = Owner::Operator;
        assert_eq!(name(o, &actor, Scope::Key), Ok("o:k:key-1".into()));
        assert_eq!(
            name(o, &actor, Scope::User),
            Ok("o:u:5:alpha:user:1".into())
        );
        // The same sub from a project's own issuer: another bucket.
        let mut issued = actor.clone();
        let id = uuid::Uuid::from_u128(0xabc);
        issued.issuer = Some(crate::actor::IssuerLabel::Project {
            id,
            iss: "https://id.example".into(),
        });
        assert_eq!(
            name(o, &issued, Scope::User),
            Ok(format!("o:v:5:alpha:{}:user:1", id.simple()))
        );
        issued.issuer = Some(crate::actor::IssuerLabel::Platform);
        assert_eq!(
            name(o, &issued, Scope::User),
            Ok("o:u:5:alpha:user:1".into())
        );
        assert_eq!(name(o, &actor, Scope::ConsoleUser), Ok("o:c:user:1".into()));
        assert_eq!(name(o, &actor, Scope::Project), Ok("o:p:alpha".into()));
        assert_eq!(
            name(o, &actor, Scope::ClientIp),
            Ok("o:i:2001:db8:1:2::/64".into()),
            "an IPv6 client by its /64"
        );
        assert_eq!(
            name(Owner::Tenant, &actor, Scope::Key),
            Ok("t:5:alpha:k:key-1".into())
        );
        // A module's own name never meets a scope's: `n:` against `k:`.
        assert_ne!(
            name(o, &actor, Scope::Named("k:key-1")),
            name(o, &actor, Scope::Key)
        );
        let bare = of(None);
        for (scope, label) in [
            (Scope::Key, "key"),
            (Scope::User, "user"),
            (Scope::ConsoleUser, "console_user"),
            (Scope::Project, "project"),
            (Scope::ClientIp, "client_ip"),
        ] {
            assert_eq!(
                name(o, &bare, scope),
                Err(RuleRefused::ScopeUnknown(label)),
                "{label} without a value fails closed"
            );
        }
    }

    #[test]
    fn a_clamped_field_is_counted_under_its_own_labels() {
        let metrics = crate::metrics::Metrics::new();
        let mut expected = Vec::new();
        let mut times = 0;
        for plane in [Plane::Data, Plane::Management] {
            for source in [Owner::Operator, Owner::Tenant] {
                for field in [Field::Rate, Field::Burst, Field::Cost] {
                    times += 1;
                    for _ in 0..times {
                        clamped_counter(&metrics, plane, source, field).inc();
                    }
                    expected.push((plane.as_str(), source.as_str(), field.as_str(), times));
                }
            }
        }
        let text = metrics.render();
        for (plane, source, field, times) in expected {
            let labels = [
                format!("plane=\"{plane}\""),
                format!("source=\"{source}\""),
                format!("field=\"{field}\""),
            ];
            let line = text
                .lines()
                .find(|l| {
                    l.starts_with("aura_quota_rules_clamped_total{")
                        && labels.iter().all(|label| l.contains(label.as_str()))
                })
                .unwrap_or_else(|| panic!("no series for {labels:?}"));
            assert!(line.ends_with(&format!(" {times}")), "{line}: {times}");
        }
    }
}
