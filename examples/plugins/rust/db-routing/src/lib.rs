//! Reads of dedicated projects straight to their PostgREST, everything else over NATS: schema,
//! policy and SQL routes always go to the db service; a dedicated project whose PostgREST is not
//! resolved gets `unresolved` for a read (the gateway answers 503, never a fallback).
//! Build: `cargo build --release --target wasm32-wasip2`. Configuration:
//!
//! ```toml
//! postgrest_methods = ["GET", "HEAD"]
//! ```

use std::sync::OnceLock;

use serde::Deserialize;

wit_bindgen::generate!({ path: "../../../../wit", world: "db-routing-stage" });

use aura::gateway::log::{Level, log};
use aura::gateway::types::Plane;
use exports::aura::gateway::db_routing::{DbEngine, DbRequest, DbRoute, Guest, Topology};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    #[serde(default = "default_methods")]
    postgrest_methods: Vec<String>,
}

fn default_methods() -> Vec<String> {
    vec!["GET".to_owned(), "HEAD".to_owned()]
}

static METHODS: OnceLock<Vec<String>> = OnceLock::new();

struct Plugin;

impl Guest for Plugin {
    fn configure(_plane: Plane, config: String) -> Result<(), String> {
        let config: Config = serde_json::from_str(&config).map_err(|e| format!("config: {e}"))?;
        if let Some(bad) = config
            .postgrest_methods
            .iter()
            .find(|m| {
                m.is_empty()
                    || !m
                        .bytes()
                        .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit())
            })
        {
            return Err(format!("postgrest_methods: {bad:?} is not an upper-case method"));
        }
        METHODS
            .set(config.postgrest_methods)
            .map_err(|_| "configured twice".to_string())
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
        let read = METHODS
            .get()
            .is_some_and(|m| m.iter().any(|m| *m == request.method));
        match (read, project.postgrest_url) {
            (true, Some(url)) => DbRoute::Postgrest(url),
            (true, None) => {
                log(Level::Warn, &format!("no PostgREST target for {path}"));
                DbRoute::Unresolved
            }
            (false, _) => DbRoute::Nats,
        }
    }
}

export!(Plugin);
