//! The db routing decision, independent of the component glue.

use serde::Deserialize;

/// The stage configuration (`[<plane>.plugins.db_routing.config]`).
#[derive(Debug, Default, Deserialize)]
#[cfg_attr(not(target_arch = "wasm32"), derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Path prefixes always sent over NATS (rule 1). Default: `/v1/db/schema`,
    /// `/v1/db/policies`, `/v1/db/sql`. A prefix matches the path itself and anything below it.
    pub nats_prefixes: Option<Vec<String>>,
}

/// Database engines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    Postgres,
    Mongodb,
}

/// Database topologies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Topology {
    Shared,
    Dedicated,
}

/// The project fields the decision depends on.
#[derive(Debug, Clone, Copy)]
pub struct Project<'a> {
    pub engine: Engine,
    pub topology: Topology,
    pub postgrest_url: Option<&'a str>,
}

/// Where the request goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    Nats,
    Postgrest(String),
    Unresolved,
}

/// A configured routing policy.
#[derive(Debug, Clone)]
pub struct Policy {
    nats_prefixes: Vec<String>,
}

impl Policy {
    /// Builds the policy from the stage configuration (JSON text).
    pub fn configure(json: &str) -> Result<Self, String> {
        let config: Config = if json.trim().is_empty() {
            Config::default()
        } else {
            serde_json::from_str(json).map_err(|e| format!("invalid db_routing config: {e}"))?
        };
        let nats_prefixes = config.nats_prefixes.unwrap_or_else(|| {
            ["/v1/db/schema", "/v1/db/policies", "/v1/db/sql"]
                .map(str::to_owned)
                .to_vec()
        });
        if let Some(bad) = nats_prefixes.iter().find(|p| !p.starts_with("/v1/db/")) {
            return Err(format!("nats_prefixes: {bad:?} must start with /v1/db/"));
        }
        Ok(Self {
            nats_prefixes: nats_prefixes
                .into_iter()
                .map(|p| p.trim_end_matches('/').to_owned())
                .collect(),
        })
    }

    fn is_management(&self, path: &str) -> bool {
        self.nats_prefixes.iter().any(|p| {
            path.strip_prefix(p.as_str())
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
        })
    }

    /// Decides for one `/v1/db/*` request.
    pub fn decide(&self, method: &str, path: &str, project: Option<Project<'_>>) -> Route {
        // Rule 1: schema, policies and raw SQL belong to the db service.
        if self.is_management(path) {
            return Route::Nats;
        }
        // Rule 2: PostgREST answers 405 to a whole-row replacement; the db service handles it.
        if method.eq_ignore_ascii_case("PUT") {
            return Route::Nats;
        }
        let Some(project) = project else {
            return Route::Nats;
        };
        match (project.engine, project.topology, project.postgrest_url) {
            // Rule 3.
            (Engine::Mongodb, _, _) => Route::Nats,
            // Rule 4.
            (Engine::Postgres, Topology::Shared, _) => Route::Nats,
            // Rule 5.
            (Engine::Postgres, Topology::Dedicated, Some(url)) if !url.trim().is_empty() => {
                Route::Postgrest(url.to_owned())
            }
            // Rule 6: fail closed, never a fallback to a shared PostgREST.
            (Engine::Postgres, Topology::Dedicated, _) => Route::Unresolved,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEDICATED: Project<'static> = Project {
        engine: Engine::Postgres,
        topology: Topology::Dedicated,
        postgrest_url: Some("http://pgrst.internal:3000"),
    };

    #[test]
    fn the_six_rules_in_order() {
        let p = Policy::configure("{}").expect("config");
        assert_eq!(
            p.decide("GET", "/v1/db/schema", Some(DEDICATED)),
            Route::Nats
        );
        assert_eq!(
            p.decide("POST", "/v1/db/sql/run", Some(DEDICATED)),
            Route::Nats
        );
        assert_eq!(
            p.decide("PUT", "/v1/db/todos", Some(DEDICATED)),
            Route::Nats
        );
        let mongo = Project {
            engine: Engine::Mongodb,
            ..DEDICATED
        };
        assert_eq!(p.decide("GET", "/v1/db/todos", Some(mongo)), Route::Nats);
        let shared = Project {
            topology: Topology::Shared,
            ..DEDICATED
        };
        assert_eq!(p.decide("GET", "/v1/db/todos", Some(shared)), Route::Nats);
        assert_eq!(
            p.decide("GET", "/v1/db/todos", Some(DEDICATED)),
            Route::Postgrest("http://pgrst.internal:3000".into())
        );
        let unresolved = Project {
            postgrest_url: None,
            ..DEDICATED
        };
        assert_eq!(
            p.decide("GET", "/v1/db/todos", Some(unresolved)),
            Route::Unresolved
        );
    }

    #[test]
    fn prefixes_match_whole_segments() {
        let p = Policy::configure("{}").expect("config");
        assert_eq!(
            p.decide("GET", "/v1/db/schemata", Some(DEDICATED)),
            Route::Postgrest("http://pgrst.internal:3000".into())
        );
        assert!(Policy::configure(r#"{"nats_prefixes":["/v2"]}"#).is_err());
    }
}
