//! Component glue of the hostile db-routing test plugin.

#![expect(
    unsafe_code,
    reason = "wit-bindgen generates the canonical ABI glue with unsafe code"
)]

wit_bindgen::generate!({ path: "../../wit", world: "db-routing-stage" });

use aura::gateway::types::Plane;
use exports::aura::gateway::db_routing::{DbCache, DbInputs, DbRequest, DbRoute, Guest};

struct Component;

impl Guest for Component {
    fn config_schema() -> Option<String> {
        None
    }

    fn configure(_plane: Plane, _config: String) -> Result<Option<DbCache>, String> {
        Ok(Some(DbCache {
            inputs: DbInputs::METHOD | DbInputs::PATH | DbInputs::PROJECT | DbInputs::CLIENT_REGION,
            max_age_ms: 60_000,
        }))
    }

    fn decide(request: DbRequest) -> DbRoute {
        match request.project.as_ref().and_then(|p| p.replicas.first()) {
            Some(replica) => DbRoute::Replica(replica.url.clone()),
            None => DbRoute::Nats,
        }
    }
}

export!(Component);
