//! Component glue: exports `aura:gateway/db-routing` over [`crate::policy`].

#![expect(
    unsafe_code,
    reason = "wit-bindgen generates the canonical ABI glue with unsafe code"
)]

use std::sync::OnceLock;

use crate::policy::{Engine, Policy, Project, Route, Topology};

wit_bindgen::generate!({ path: "../../wit", world: "db-routing-stage" });

use aura::gateway::types::Plane;
use exports::aura::gateway::db_routing::{
    DbEngine, DbRequest, DbRoute, Guest, Topology as WitTopology,
};

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
            .map_err(|_| "db-routing plugin configured twice".to_owned())?;
        ALLOCATOR.serve_calls();
        Ok(())
    }

    fn decide(request: DbRequest) -> DbRoute {
        let Some(policy) = POLICY.get() else {
            return DbRoute::Unresolved;
        };
        let project = request.project.as_ref().map(|p| Project {
            engine: match p.engine {
                DbEngine::Postgres => Engine::Postgres,
                DbEngine::Mongodb => Engine::Mongodb,
            },
            topology: match p.topology {
                WitTopology::Shared => Topology::Shared,
                WitTopology::Dedicated => Topology::Dedicated,
            },
            postgrest_url: p.postgrest_url.as_deref(),
        });
        match policy.decide(&request.method, &request.path, project) {
            Route::Nats => DbRoute::Nats,
            Route::Postgrest(url) => DbRoute::Postgrest(url),
            Route::Unresolved => DbRoute::Unresolved,
        }
    }
}

export!(Component);
