//! Component glue: exports `aura:gateway/cors` over [`crate::policy`].

#![expect(
    unsafe_code,
    reason = "wit-bindgen generates the canonical ABI glue with unsafe code"
)]

use std::sync::OnceLock;

use crate::policy::{Plane, Policy};

wit_bindgen::generate!({ path: "../../wit", world: "cors-stage" });

use aura::gateway::types::Plane as WitPlane;
use exports::aura::gateway::cors::{
    CorsAllow, CorsCache, CorsDecision, CorsInputs, CorsRequest, Guest,
};

static POLICY: OnceLock<Policy> = OnceLock::new();

/// Call-scoped blocks (the host's arguments, the decision's strings) from a fixed region; the
/// policy parsed by `configure` from the system allocator.
#[global_allocator]
static ALLOCATOR: aura_plugin_arena::Arena<16384> = aura_plugin_arena::Arena::new();

/// How long a decision holds: a function of its declared inputs, as long as the host keeps it.
const MAX_AGE_MS: u32 = 300_000;

struct Component;

impl Guest for Component {
    fn config_schema() -> Option<String> {
        Some(crate::SCHEMA.to_owned())
    }

    fn configure(plane: WitPlane, config: String) -> Result<Option<CorsCache>, String> {
        let plane = match plane {
            WitPlane::Data => Plane::Data,
            WitPlane::Management => Plane::Management,
        };
        let policy = Policy::configure(plane, &config)?;
        // A preflight is told by its request method; the origin matters only to a list.
        let mut inputs = CorsInputs::REQUEST_METHOD;
        if policy.reads_origin() {
            inputs = inputs | CorsInputs::ORIGIN;
        }
        POLICY
            .set(policy)
            .map_err(|_| "cors plugin configured twice".to_owned())?;
        ALLOCATOR.serve_calls();
        Ok(Some(CorsCache {
            inputs,
            max_age_ms: MAX_AGE_MS,
        }))
    }

    fn decide(request: CorsRequest) -> CorsDecision {
        let Some(policy) = POLICY.get() else {
            return CorsDecision::Deny;
        };
        match policy.decide(&request.origin, request.request_method.is_some()) {
            None => CorsDecision::Deny,
            Some(a) => CorsDecision::Allow(CorsAllow {
                allow_origin: a.allow_origin,
                allow_methods: a.allow_methods,
                allow_headers: a.allow_headers,
                expose_headers: a.expose_headers,
                max_age: a.max_age,
            }),
        }
    }
}

export!(Component);
