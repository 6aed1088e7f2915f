//! Component glue: exports `aura:gateway/quota` over [`crate::policy`].

#![expect(
    unsafe_code,
    reason = "wit-bindgen generates the canonical ABI glue with unsafe code"
)]

use std::net::IpAddr;
use std::sync::OnceLock;

use crate::policy::{Actor, Denied, Outcome, Policy, Role, Scope};

wit_bindgen::generate!({ path: "../../wit", world: "quota-stage" });

use aura::gateway::types::{ActorRole, IpAddress, Plane};
use exports::aura::gateway::quota::{
    BucketScope, DenyReason, DenyStatus, Guest, QuotaCache, QuotaDecision, QuotaDenial,
    QuotaInputs, QuotaRequest, QuotaRule, QuotaSetup,
};

static POLICY: OnceLock<Policy> = OnceLock::new();

/// Call-scoped blocks (the host's arguments, the decision's strings) from a fixed region; the
/// policy parsed by `configure` from the system allocator.
#[global_allocator]
static ALLOCATOR: aura_plugin_arena::Arena<16384> = aura_plugin_arena::Arena::new();

/// How long a decision holds: the policy is a function of its declared inputs, so as long as
/// the host keeps it (its own ceiling applies).
const MAX_AGE_MS: u32 = 300_000;

struct Component;

fn ip(address: IpAddress) -> IpAddr {
    match address {
        IpAddress::V4((a, b, c, d)) => IpAddr::from([a, b, c, d]),
        IpAddress::V6((a, b, c, d, e, f, g, h)) => IpAddr::from([a, b, c, d, e, f, g, h]),
    }
}

impl Guest for Component {
    fn config_schema() -> Option<String> {
        Some(crate::SCHEMA.to_owned())
    }

    fn configure(_plane: Plane, config: String) -> Result<QuotaSetup, String> {
        let policy = Policy::configure(&config)?;
        let mut inputs = QuotaInputs::ROUTE_GROUP
            | QuotaInputs::ROLE
            | QuotaInputs::HAS_KEY
            | QuotaInputs::HAS_USER
            | QuotaInputs::PLAN;
        if policy.reads_address() {
            inputs = inputs | QuotaInputs::CLIENT_IP;
        }
        if !policy.claims().is_empty() {
            inputs = inputs | QuotaInputs::CLAIMS;
        }
        let claims = policy.claims().to_vec();
        POLICY
            .set(policy)
            .map_err(|_| "quota plugin configured twice".to_owned())?;
        ALLOCATOR.serve_calls();
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
        let a = &request.actor;
        let actor = Actor {
            role: match a.role {
                ActorRole::Anon => Role::Anon,
                ActorRole::Authenticated => Role::Authenticated,
                ActorRole::ServiceRole => Role::ServiceRole,
                ActorRole::Console => Role::Console,
            },
            has_key: a.key_id.is_some(),
            has_user: a.user_id.is_some(),
            plan: a.plan.as_deref(),
        };
        let claims: Vec<(u8, &str)> = request
            .claims
            .iter()
            .map(|c| (c.name, c.value.as_str()))
            .collect();
        match policy.decide(
            &request.route_group,
            actor,
            request.client_ip.map(ip),
            &claims,
        ) {
            Outcome::Exempt => QuotaDecision::Exempt,
            Outcome::Limit(r) => QuotaDecision::Limit(QuotaRule {
                scope: match r.scope {
                    Scope::Key => BucketScope::Key,
                    Scope::User => BucketScope::User,
                    Scope::ConsoleUser => BucketScope::ConsoleUser,
                },
                rate_per_second: r.rate_per_second,
                burst: r.burst,
                cost: r.cost,
            }),
            Outcome::Deny(why) => QuotaDecision::Deny(QuotaDenial {
                status: DenyStatus::Forbidden,
                reason: match why {
                    Denied::Address => DenyReason::AddressDenied,
                    Denied::NotAllowed => DenyReason::AddressNotAllowed,
                    Denied::Claim => DenyReason::ClaimDenied,
                },
                retry_after_seconds: 0,
            }),
        }
    }
}

export!(Component);
