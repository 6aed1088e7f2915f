//! Component glue: exports `aura:gateway/api-key` over [`crate::policy`].

#![expect(
    unsafe_code,
    reason = "wit-bindgen generates the canonical ABI glue with unsafe code"
)]

use std::sync::OnceLock;

use crate::policy::{Decision, Policy, Role, Source};

wit_bindgen::generate!({ path: "../../wit", world: "api-key-stage" });

use aura::gateway::types::Plane;
use exports::aura::gateway::api_key::{
    Credential, Guest, KeyCache, KeyDecision, KeyInputs, KeyRequest, KeyRole, KeySetup, KeySource,
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

    fn configure(plane: Plane, config: String) -> Result<KeySetup, String> {
        if plane != Plane::Data {
            return Err("the api-key stage exists on the data plane only".to_owned());
        }
        let policy = Policy::configure(&config)?;
        let headers = policy.headers().to_vec();
        POLICY
            .set(policy)
            .map_err(|_| "api-key plugin configured twice".to_owned())?;
        ALLOCATOR.serve_calls();
        Ok(KeySetup {
            headers,
            cache: Some(KeyCache {
                inputs: KeyInputs::PATH_WITH_QUERY_KEYS
                    | KeyInputs::QUERY_KEYS
                    | KeyInputs::HEADERS,
                max_age_ms: MAX_AGE_MS,
            }),
        })
    }

    fn extract(request: KeyRequest) -> KeyDecision {
        let Some(policy) = POLICY.get() else {
            return KeyDecision::Refuse("api-key plugin not configured".to_owned());
        };
        let names = policy.headers();
        let headers: Vec<(&str, &str)> = request
            .headers
            .iter()
            .filter_map(|h| Some((names.get(usize::from(h.name))?.as_str(), h.value.as_str())))
            .collect();
        let query_keys = request.query_keys.unwrap_or_default();
        match policy.extract(&request.path, &query_keys, &headers) {
            Decision::Absent => KeyDecision::Absent,
            Decision::Refuse(why) => KeyDecision::Refuse(why),
            Decision::Present {
                key,
                source,
                allowed_roles,
            } => KeyDecision::Present(Credential {
                key,
                source: match source {
                    Source::Header => KeySource::Header,
                    Source::Query => KeySource::Query,
                },
                allowed_roles: allowed_roles
                    .into_iter()
                    .map(|r| match r {
                        Role::Anon => KeyRole::Anon,
                        Role::ServiceRole => KeyRole::ServiceRole,
                    })
                    .collect(),
            }),
        }
    }
}

export!(Component);
