//! Component glue: exports `aura:gateway/quota` over [`crate::policy`].

#![expect(
    unsafe_code,
    reason = "wit-bindgen generates the canonical ABI glue with unsafe code"
)]

use std::sync::OnceLock;

use crate::policy::{Actor, Policy, Role};

wit_bindgen::generate!({ path: "../../wit", world: "quota-stage" });

use aura::gateway::types::{ActorRole, Plane};
use exports::aura::gateway::quota::{Guest, QuotaDecision, QuotaRequest, QuotaRule};

static POLICY: OnceLock<Policy> = OnceLock::new();

/// Call-scoped blocks (the host's arguments, the decision's strings) from a fixed region; the
/// policy parsed by `configure` from the system allocator.
#[global_allocator]
static ALLOCATOR: aura_plugin_arena::Arena<16384> = aura_plugin_arena::Arena::new();

struct Component;

impl Guest for Component {
    fn configure(_plane: Plane, config: String) -> Result<(), String> {
        let policy = Policy::configure(&config)?;
        POLICY
            .set(policy)
            .map_err(|_| "quota plugin configured twice".to_owned())?;
        ALLOCATOR.serve_calls();
        Ok(())
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
            project: a.project.as_deref(),
            key_id: a.key_id.as_deref(),
            user_id: a.user_id.as_deref(),
            plan: a.plan.as_deref(),
        };
        match policy.decide(&request.route_group, actor) {
            None => QuotaDecision::Exempt,
            Some(r) => QuotaDecision::Limit(QuotaRule {
                bucket: r.bucket,
                rate_per_second: r.rate_per_second,
                burst: r.burst,
                cost: r.cost,
            }),
        }
    }
}

export!(Component);
