//! Reads of dedicated projects straight to their database, everything else over NATS: schema,
//! policy and SQL routes always go to the db service; a `GET` or `HEAD` goes to a read replica
//! in the client's region when the project has one, else to the project's PostgREST; a dedicated
//! project whose PostgREST is not resolved gets `unresolved` for a read (the gateway answers 503,
//! never a fallback). The decision depends on the method, the path, the project and the
//! client's region: that is what it declares.
//! Build: `cargo build --release --target wasm32-wasip2`. Configuration:
//!
//! ```toml
//! postgrest_methods = ["GET", "HEAD"]
//! ```

use std::sync::OnceLock;

use serde::Deserialize;

wit_bindgen::generate!({ path: "../../../../wit", world: "db-routing-stage" });

use aura::gateway::log::{Level, log};
use aura::gateway::types::{Method, Plane};
use exports::aura::gateway::db_routing::{
    DbCache, DbEngine, DbInputs, DbRequest, DbRoute, Guest, Topology,
};

/// The JSON Schema of the configuration, checked by the gateway before `configure` runs.
const SCHEMA: &str = r#"{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "title": "db-routing: reads to PostgREST",
  "type": "object",
  "properties": {
    "postgrest_methods": {
      "description": "Methods sent to PostgREST (a GET or HEAD may go to a replica instead).",
      "type": "array",
      "items": { "enum": ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"] },
      "uniqueItems": true,
      "default": ["GET", "HEAD"]
    }
  },
  "additionalProperties": false
}"#;

/// How long a decision holds: a function of its declared inputs (the project's record, its
/// replicas included, comes from the gateway's project cache), so as long as the gateway keeps
/// it (it lowers this to its own ceiling).
const MAX_AGE_MS: u32 = 300_000;

/// Methods by the names the configuration uses.
const METHODS: [(&str, Method); 7] = [
    ("GET", Method::Get),
    ("HEAD", Method::Head),
    ("POST", Method::Post),
    ("PUT", Method::Put),
    ("PATCH", Method::Patch),
    ("DELETE", Method::Delete),
    ("OPTIONS", Method::Options),
];

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    #[serde(default = "default_methods")]
    postgrest_methods: Vec<String>,
}

fn default_methods() -> Vec<String> {
    vec!["GET".to_owned(), "HEAD".to_owned()]
}

static POSTGREST_METHODS: OnceLock<Vec<Method>> = OnceLock::new();

struct Plugin;

impl Guest for Plugin {
    fn config_schema() -> Option<String> {
        Some(SCHEMA.to_owned())
    }

    fn configure(_plane: Plane, config: String) -> Result<Option<DbCache>, String> {
        let config: Config = serde_json::from_str(&config).map_err(|e| format!("config: {e}"))?;
        let mut methods = Vec::new();
        for name in &config.postgrest_methods {
            let Some((_, method)) = METHODS.iter().find(|(m, _)| *m == name) else {
                return Err(format!("postgrest_methods: {name:?} is not a known method"));
            };
            methods.push(*method);
        }
        POSTGREST_METHODS
            .set(methods)
            .map_err(|_| "configured twice".to_string())?;
        Ok(Some(DbCache {
            inputs: DbInputs::METHOD
                | DbInputs::PATH
                | DbInputs::PROJECT
                | DbInputs::CLIENT_REGION,
            max_age_ms: MAX_AGE_MS,
        }))
    }

    fn decide(request: DbRequest) -> DbRoute {
        let path = request.path.as_str();
        if ["/v1/db/schema", "/v1/db/policies", "/v1/db/sql"]
            .iter()
            .any(|p| path.starts_with(p))
        {
            return DbRoute::Nats;
        }
        let Some(project) = request.project else {
            return DbRoute::Nats;
        };
        if project.engine == DbEngine::Mongodb || project.topology == Topology::Shared {
            return DbRoute::Nats;
        }
        let to_postgrest = POSTGREST_METHODS
            .get()
            .is_some_and(|m| m.contains(&request.method));
        if !to_postgrest {
            return DbRoute::Nats;
        }
        // The gateway sends only `GET` and `HEAD` to a replica, and only to one of the project's.
        if matches!(request.method, Method::Get | Method::Head)
            && let Some(region) = request.client_region
            && let Some(replica) = project
                .replicas
                .into_iter()
                .find(|r| r.region.as_ref() == Some(&region))
        {
            return DbRoute::Replica(replica.url);
        }
        match project.postgrest_url {
            Some(url) => DbRoute::Postgrest(url),
            None => {
                log(Level::Warn, &format!("no PostgREST target for {path}"));
                DbRoute::Unresolved
            }
        }
    }
}

export!(Plugin);
