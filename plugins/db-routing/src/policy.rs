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
    /// Which read replicas a `GET` or `HEAD` may be sent to (rule 5): `region` (default) one
    /// in the client's region, `any` one in the client's region or else the first, `off` none.
    pub replicas: Option<ReplicaChoice>,
}

/// Which read replicas reads may be sent to.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[cfg_attr(not(target_arch = "wasm32"), derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum ReplicaChoice {
    /// A replica in the client's region.
    #[default]
    Region,
    /// A replica in the client's region, else the project's first.
    Any,
    /// Never a replica.
    Off,
}

/// A read replica of a project's database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Replica<'a> {
    pub url: &'a str,
    pub region: Option<&'a str>,
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
    pub replicas: &'a [Replica<'a>],
}

/// Where the request goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    Nats,
    Postgrest(String),
    Replica(String),
    Unresolved,
}

/// A configured routing policy.
#[derive(Debug, Clone)]
pub struct Policy {
    nats_prefixes: Vec<String>,
    replicas: ReplicaChoice,
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
            replicas: config.replicas.unwrap_or_default(),
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

    /// The replica a read goes to, if any.
    fn replica(&self, project: &Project<'_>, client_region: Option<&str>) -> Option<String> {
        let local = client_region
            .and_then(|region| project.replicas.iter().find(|r| r.region == Some(region)));
        let chosen = match self.replicas {
            ReplicaChoice::Off => None,
            ReplicaChoice::Region => local,
            ReplicaChoice::Any => local.or(project.replicas.first()),
        };
        chosen.map(|r| r.url.to_owned())
    }

    /// Decides for one `/v1/db/*` request.
    pub fn decide(
        &self,
        method: &str,
        path: &str,
        project: Option<Project<'_>>,
        client_region: Option<&str>,
    ) -> Route {
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
        // Rule 5: reads of a dedicated database to a replica.
        let read = method == "GET" || method == "HEAD";
        if read
            && (project.engine, project.topology) == (Engine::Postgres, Topology::Dedicated)
            && let Some(url) = self.replica(&project, client_region)
        {
            return Route::Replica(url);
        }
        match (project.engine, project.topology, project.postgrest_url) {
            // Rule 3.
            (Engine::Mongodb, _, _) => Route::Nats,
            // Rule 4.
            (Engine::Postgres, Topology::Shared, _) => Route::Nats,
            // Rule 6.
            (Engine::Postgres, Topology::Dedicated, Some(url)) if !url.trim().is_empty() => {
                Route::Postgrest(url.to_owned())
            }
            // Rule 7: fail closed, never a fallback to a shared PostgREST.
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
        replicas: &[],
    };

    #[test]
    fn the_six_rules_in_order() {
        let p = Policy::configure("{}").expect("config");
        assert_eq!(
            p.decide("GET", "/v1/db/schema", Some(DEDICATED), None),
            Route::Nats
        );
        assert_eq!(
            p.decide("POST", "/v1/db/sql/run", Some(DEDICATED), None),
            Route::Nats
        );
        assert_eq!(
            p.decide("PUT", "/v1/db/todos", Some(DEDICATED), None),
            Route::Nats
        );
        let mongo = Project {
            engine: Engine::Mongodb,
            ..DEDICATED
        };
        assert_eq!(
            p.decide("GET", "/v1/db/todos", Some(mongo), None),
            Route::Nats
        );
        let shared = Project {
            topology: Topology::Shared,
            ..DEDICATED
        };
        assert_eq!(
            p.decide("GET", "/v1/db/todos", Some(shared), None),
            Route::Nats
        );
        assert_eq!(
            p.decide("GET", "/v1/db/todos", Some(DEDICATED), None),
            Route::Postgrest("http://pgrst.internal:3000".into())
        );
        let unresolved = Project {
            postgrest_url: None,
            ..DEDICATED
        };
        assert_eq!(
            p.decide("GET", "/v1/db/todos", Some(unresolved), None),
            Route::Unresolved
        );
    }

    #[test]
    fn reads_go_to_a_replica_of_the_clients_region() {
        let replicas = [
            Replica {
                url: "http://eu:3000",
                region: Some("eu-west"),
            },
            Replica {
                url: "http://us:3000",
                region: Some("us-east"),
            },
        ];
        let project = Project {
            replicas: &replicas,
            ..DEDICATED
        };
        let p = Policy::configure("{}").expect("config");
        let eu = Route::Replica("http://eu:3000".into());
        assert_eq!(
            p.decide("GET", "/v1/db/t", Some(project), Some("eu-west")),
            eu
        );
        assert_eq!(
            p.decide("HEAD", "/v1/db/t", Some(project), Some("eu-west")),
            eu
        );
        let primary = Route::Postgrest("http://pgrst.internal:3000".into());
        assert_eq!(
            p.decide("POST", "/v1/db/t", Some(project), Some("eu-west")),
            primary,
            "writes go to the primary"
        );
        assert_eq!(
            p.decide("GET", "/v1/db/t", Some(project), Some("ap")),
            primary
        );
        assert_eq!(p.decide("GET", "/v1/db/t", Some(project), None), primary);
        let any = Policy::configure(r#"{"replicas":"any"}"#).expect("config");
        assert_eq!(
            any.decide("GET", "/v1/db/t", Some(project), Some("ap")),
            Route::Replica("http://eu:3000".into())
        );
        let off = Policy::configure(r#"{"replicas":"off"}"#).expect("config");
        assert_eq!(
            off.decide("GET", "/v1/db/t", Some(project), Some("eu-west")),
            primary
        );
    }

    #[test]
    fn prefixes_match_whole_segments() {
        let p = Policy::configure("{}").expect("config");
        assert_eq!(
            p.decide("GET", "/v1/db/schemata", Some(DEDICATED), None),
            Route::Postgrest("http://pgrst.internal:3000".into())
        );
        assert!(Policy::configure(r#"{"nats_prefixes":["/v2"]}"#).is_err());
    }
}
