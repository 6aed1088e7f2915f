//! Component glue: exports `aura:gateway/db-routing` over [`crate::policy`].

#![expect(
    unsafe_code,
    reason = "wit-bindgen generates the canonical ABI glue with unsafe code"
)]

use std::sync::OnceLock;

use crate::policy::{Engine, Policy, Project, Replica, Route, Topology};

wit_bindgen::generate!({ path: "../../wit", world: "db-routing-stage" });

use aura::gateway::types::{Method, Plane};
use exports::aura::gateway::db_routing::{
    DbCache, DbEngine, DbInputs, DbRequest, DbRoute, Guest, Topology as WitTopology,
};

static POLICY: OnceLock<Policy> = OnceLock::new();

/// Call-scoped blocks (the host's arguments, the decision's strings) from a fixed region; the
/// policy parsed by `configure` from the system allocator.
#[global_allocator]
static ALLOCATOR: aura_plugin_arena::Arena<16384> = aura_plugin_arena::Arena::new();

/// How long a decision holds: a function of its declared inputs (the project's record changes
/// reach the host's project cache first), as long as the host keeps it.
const MAX_AGE_MS: u32 = 300_000;

struct Component;

fn method(method: Method) -> &'static str {
    match method {
        Method::Get => "GET",
        Method::Head => "HEAD",
        Method::Post => "POST",
        Method::Put => "PUT",
        Method::Patch => "PATCH",
        Method::Delete => "DELETE",
        Method::Options => "OPTIONS",
        Method::Other => "OTHER",
    }
}

impl Guest for Component {
    fn config_schema() -> Option<String> {
        Some(crate::SCHEMA.to_owned())
    }

    fn configure(_plane: Plane, config: String) -> Result<Option<DbCache>, String> {
        let policy = Policy::configure(&config)?;
        POLICY
            .set(policy)
            .map_err(|_| "db-routing plugin configured twice".to_owned())?;
        ALLOCATOR.serve_calls();
        Ok(Some(DbCache {
            inputs: DbInputs::METHOD | DbInputs::PATH | DbInputs::PROJECT | DbInputs::CLIENT_REGION,
            max_age_ms: MAX_AGE_MS,
        }))
    }

    fn decide(request: DbRequest) -> DbRoute {
        let Some(policy) = POLICY.get() else {
            return DbRoute::Unresolved;
        };
        let replicas: Vec<Replica<'_>> = request
            .project
            .as_ref()
            .map(|p| {
                p.replicas
                    .iter()
                    .map(|r| Replica {
                        url: &r.url,
                        region: r.region.as_deref(),
                    })
                    .collect()
            })
            .unwrap_or_default();
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
            replicas: &replicas,
        });
        let region = request.client_region.as_deref();
        match policy.decide(method(request.method), &request.path, project, region) {
            Route::Nats => DbRoute::Nats,
            Route::Postgrest(url) => DbRoute::Postgrest(url),
            Route::Replica(url) => DbRoute::Replica(url),
            Route::Unresolved => DbRoute::Unresolved,
        }
    }
}

export!(Component);
