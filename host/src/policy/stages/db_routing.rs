//! The `db-routing` stage: where a `/v1/db/*` request goes (the db service over NATS, the
//! project's dedicated PostgREST, or nowhere: fail closed), on both planes.

use serde::Deserialize;
use wasmtime::component::{ComponentType, Lower};

use super::conformance::{ConformanceError, Run, StageReport};
use super::vectors::{decision_is, field, get, parse, sample_path};
use super::{Declaration, Inputs, Module, PolicyStage, stage_world, wit_method};
use crate::actor::Actor;
use crate::policy::PluginError;
use crate::policy::runtime::decision_cache::KeyWriter;
use crate::policy::runtime::engine::{StageModule, StageWorld};
use crate::stage::Stage;

/// The generated types of the `db-routing` world (`db-routing-stage` in `wit/gateway.wit`).
pub(crate) mod world {
    wasmtime::component::bindgen!({ path: "../wit", world: "db-routing-stage", additional_derives: [PartialEq, Eq] });
}

/// The generated types of the `db-routing` world before `0.3.0` (`wit/0.2.0/gateway.wit`).
pub(crate) mod legacy {
    wasmtime::component::bindgen!({ path: "../wit/0.2.0", world: "db-routing-stage", additional_derives: [PartialEq, Eq] });
}

use world::aura::gateway::types::Method;
use world::exports::aura::gateway::db_routing::DbCache;
pub use world::exports::aura::gateway::db_routing::{
    DbEngine, DbRoute, ProjectDb, Replica, Topology,
};

/// The `db-routing` stage.
#[derive(Debug)]
pub struct DbRouting;

/// The `db-routing` stage's modules written against `0.2.0` or `0.1.0`.
#[derive(Debug)]
pub struct DbRoutingLegacy;

/// `replica`, borrowed.
#[derive(Debug, Clone, Copy, ComponentType, Lower)]
#[component(record)]
pub struct ReplicaRef<'a> {
    #[component(name = "url")]
    url: &'a str,
    #[component(name = "region")]
    region: Option<&'a str>,
}

/// `project-db`, borrowed.
#[derive(Debug, Clone, ComponentType, Lower)]
#[component(record)]
pub struct ProjectDbRef<'a> {
    #[component(name = "engine")]
    engine: DbEngine,
    #[component(name = "topology")]
    topology: Topology,
    #[component(name = "postgrest-url")]
    postgrest_url: Option<&'a str>,
    #[component(name = "replicas")]
    replicas: Vec<ReplicaRef<'a>>,
}

/// `db-request`, borrowed.
#[derive(Debug, Clone, ComponentType, Lower)]
#[component(record)]
pub struct DbRequestRef<'a> {
    #[component(name = "method")]
    method: Method,
    #[component(name = "path")]
    path: &'a str,
    #[component(name = "project")]
    project: Option<ProjectDbRef<'a>>,
    #[component(name = "client-region")]
    client_region: Option<&'a str>,
}

stage_world!(
    DbRouting,
    db_routing::world,
    Stage::DbRouting,
    "decide",
    Option<DbCache>,
    'a,
    DbRequestRef<'a>,
    DbRoute
);

/// The legacy `project-db`, borrowed.
#[derive(Debug, Clone, Copy, ComponentType, Lower)]
#[component(record)]
pub struct LegacyProjectRef<'a> {
    #[component(name = "engine")]
    engine: legacy::exports::aura::gateway::db_routing::DbEngine,
    #[component(name = "topology")]
    topology: legacy::exports::aura::gateway::db_routing::Topology,
    #[component(name = "postgrest-url")]
    postgrest_url: Option<&'a str>,
}

/// The legacy `db-request`, borrowed.
#[derive(Debug, Clone, Copy, ComponentType, Lower)]
#[component(record)]
pub struct LegacyRequestRef<'a> {
    #[component(name = "plane")]
    plane: legacy::aura::gateway::types::Plane,
    #[component(name = "method")]
    method: &'a str,
    #[component(name = "path")]
    path: &'a str,
    #[component(name = "project")]
    project: Option<LegacyProjectRef<'a>>,
}

stage_world!(
    DbRoutingLegacy,
    db_routing::legacy,
    Stage::DbRouting,
    "decide",
    (),
    'a,
    LegacyRequestRef<'a>,
    legacy::exports::aura::gateway::db_routing::DbRoute
);

/// The project's database as the stage reads it (`project-db`), from its control record.
pub fn project_db(record: &crate::control::ProjectRecord) -> ProjectDb {
    ProjectDb {
        engine: match record.db_engine {
            crate::control::DbEngine::Postgres => DbEngine::Postgres,
            crate::control::DbEngine::Mongodb => DbEngine::Mongodb,
        },
        topology: match record.topology {
            crate::control::Topology::Shared => Topology::Shared,
            crate::control::Topology::Dedicated => Topology::Dedicated,
        },
        postgrest_url: record.postgrest_url.clone(),
        replicas: record
            .replicas
            .iter()
            .map(|r| Replica {
                url: r.url.clone(),
                region: r.region.clone(),
            })
            .collect(),
    }
}

/// Why the host refuses a `replica` answer for a request of `method` (the request then fails
/// closed), or `None`: only `GET` and `HEAD` go to a replica, and only to one of the project's.
/// The reason is the label of `aura_db_routes_refused_total`, with the client's message.
pub fn refused_replica(
    url: &str,
    method: &http::Method,
    project: Option<&ProjectDb>,
) -> Option<(&'static str, &'static str)> {
    if !matches!(*method, http::Method::GET | http::Method::HEAD) {
        return Some((
            "write_to_replica",
            "only GET and HEAD may be sent to a read replica",
        ));
    }
    let known = project.is_some_and(|p| p.replicas.iter().any(|r| r.url == url));
    (!known).then_some((
        "unknown_replica",
        "the route's replica is not one of the project's",
    ))
}

/// What the host knows of a `/v1/db/*` request for the db-routing stage.
#[derive(Debug, Clone, Copy)]
pub struct DbInput<'a> {
    pub method: &'a str,
    pub path: &'a str,
    /// The caller's project database, from the control store.
    pub project: Option<&'a ProjectDb>,
    /// The client's region, from the trusted header (`upstreams.client_region_header`).
    pub client_region: Option<&'a str>,
    /// The caller: a canary's subject.
    pub actor: Option<&'a Actor>,
}

/// [`DbInput`] with owned values, for a call run on another thread.
#[derive(Debug, Clone)]
pub struct DbQuery {
    method: String,
    path: String,
    project: Option<ProjectDb>,
    client_region: Option<String>,
    actor: Option<Actor>,
}

#[cfg(test)]
impl super::ExportedSchema for DbRouting {
    const EXPORTED: &'static str = aura_plugin_db_routing::SCHEMA;
    const FILE: &'static str = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../plugins/db-routing/schema.json"
    );
}

impl PolicyStage for DbRouting {
    type Earlier = Self;
    type Legacy = DbRoutingLegacy;
    type Configured = ();
    type Input<'a> = DbInput<'a>;
    type Query = DbQuery;
    const BUILTIN: &'static [u8] = include_bytes!(concat!(env!("OUT_DIR"), "/db_routing.wasm"));
    type DefaultConfig = aura_plugin_db_routing::policy::Config;
    #[cfg(feature = "native-policies")]
    type Native = native::DbRouting;
    const INPUTS: &'static [&'static str] = &["method", "path", "project", "client-region"];

    fn configured(setup: &Option<DbCache>) -> Result<((), Option<Declaration>), String> {
        Ok((
            (),
            setup
                .as_ref()
                .map(|c| Declaration::of(c.inputs.as_array(), c.max_age_ms)),
        ))
    }

    fn configured_legacy(_: &()) {}

    fn query(input: DbInput<'_>) -> DbQuery {
        DbQuery {
            method: input.method.to_owned(),
            path: input.path.to_owned(),
            project: input.project.cloned(),
            client_region: input.client_region.map(str::to_owned),
            actor: input.actor.cloned(),
        }
    }

    fn input(query: &DbQuery) -> DbInput<'_> {
        DbInput {
            method: &query.method,
            path: &query.path,
            project: query.project.as_ref(),
            client_region: query.client_region.as_deref(),
            actor: query.actor.as_ref(),
        }
    }

    fn partition(input: &DbInput<'_>, key: &mut KeyWriter) {
        match input.actor {
            Some(Actor {
                project: Some(project),
                ..
            }) => key.partition(project),
            Some(actor) => key.partition_address(actor.client_ip),
            None => key.partition_address(None),
        };
    }

    fn key(input: &DbInput<'_>, _: &(), inputs: Inputs, key: &mut KeyWriter) {
        if inputs.has(0) {
            key.tag(super::method_index(input.method));
        }
        if inputs.has(1) {
            key.str(input.path);
        }
        if inputs.has(2) {
            match input.project {
                None => {
                    key.tag(0);
                }
                Some(p) => {
                    key.tag(1)
                        .tag(p.engine as u8)
                        .tag(p.topology as u8)
                        .opt(p.postgrest_url.as_deref())
                        .tag(p.replicas.len().min(255) as u8);
                    for replica in &p.replicas {
                        key.str(&replica.url).opt(replica.region.as_deref());
                    }
                }
            }
        }
        if inputs.has(3) {
            key.opt(input.client_region);
        }
    }

    fn decision_bytes(decision: &DbRoute) -> usize {
        match decision {
            DbRoute::Postgrest(url) | DbRoute::Replica(url) => url.len(),
            DbRoute::Nats | DbRoute::Unresolved => 0,
        }
    }

    fn subject(input: &DbInput<'_>) -> String {
        input
            .actor
            .map_or_else(|| "-".to_owned(), super::quota::actor_subject)
    }

    fn request_line<'a>(input: &Self::Input<'a>) -> (&'a str, &'a str) {
        (input.method, input.path)
    }

    fn describe(decision: &DbRoute) -> String {
        match decision {
            DbRoute::Nats => "nats".to_owned(),
            DbRoute::Postgrest(url) => format!("postgrest {url}"),
            DbRoute::Replica(url) => format!("replica {url}"),
            DbRoute::Unresolved => "unresolved".to_owned(),
        }
    }

    fn run(
        module: &StageModule<Self>,
        _: &(),
        request_id: Option<&str>,
        input: DbInput<'_>,
        inputs: Inputs,
    ) -> Result<DbRoute, PluginError> {
        let request = DbRequestRef {
            method: if inputs.has(0) {
                wit_method!(Method, input.method)
            } else {
                Method::Other
            },
            path: if inputs.has(1) { input.path } else { "" },
            project: input
                .project
                .filter(|_| inputs.has(2))
                .map(|p| ProjectDbRef {
                    engine: p.engine,
                    topology: p.topology,
                    postgrest_url: p.postgrest_url.as_deref(),
                    replicas: p
                        .replicas
                        .iter()
                        .map(|r| ReplicaRef {
                            url: &r.url,
                            region: r.region.as_deref(),
                        })
                        .collect(),
                }),
            client_region: input.client_region.filter(|_| inputs.has(3)),
        };
        module.call(request_id, request)
    }

    fn run_legacy(
        module: &StageModule<DbRoutingLegacy>,
        _: &(),
        request_id: Option<&str>,
        input: DbInput<'_>,
    ) -> Result<DbRoute, PluginError> {
        use legacy::exports::aura::gateway::db_routing as v2;
        let request = LegacyRequestRef {
            plane: DbRoutingLegacy::plane(module.plane()),
            method: input.method,
            path: input.path,
            project: input.project.map(|p| LegacyProjectRef {
                engine: match p.engine {
                    DbEngine::Postgres => v2::DbEngine::Postgres,
                    DbEngine::Mongodb => v2::DbEngine::Mongodb,
                },
                topology: match p.topology {
                    Topology::Shared => v2::Topology::Shared,
                    Topology::Dedicated => v2::Topology::Dedicated,
                },
                postgrest_url: p.postgrest_url.as_deref(),
            }),
        };
        Ok(match module.call(request_id, request)? {
            v2::DbRoute::Nats => DbRoute::Nats,
            v2::DbRoute::Postgrest(url) => DbRoute::Postgrest(url),
            v2::DbRoute::Unresolved => DbRoute::Unresolved,
        })
    }

    fn conformance(module: &Module<Self>) -> Result<StageReport, ConformanceError> {
        let mut run = Run::new(module.plane(), Stage::DbRouting);
        let project = |engine, topology, url: Option<&str>| {
            Some(ProjectDb {
                engine,
                topology,
                postgrest_url: url.map(str::to_owned),
                replicas: Vec::new(),
            })
        };
        let replicated = || {
            let mut p = project(
                DbEngine::Postgres,
                Topology::Dedicated,
                Some("http://pg:3000"),
            );
            if let Some(p) = &mut p {
                p.replicas = vec![
                    Replica {
                        url: "http://pg-eu:3000".into(),
                        region: Some("eu-west".into()),
                    },
                    Replica {
                        url: "http://pg-us:3000".into(),
                        region: Some("us-east".into()),
                    },
                ];
            }
            p
        };
        let dedicated = || {
            project(
                DbEngine::Postgres,
                Topology::Dedicated,
                Some("http://pg:3000"),
            )
        };
        let vectors = [
            ("GET", "/v1/db/schema", dedicated()),
            ("PUT", "/v1/db/todos", dedicated()),
            (
                "GET",
                "/v1/db/todos",
                project(DbEngine::Mongodb, Topology::Shared, None),
            ),
            (
                "GET",
                "/v1/db/todos",
                project(DbEngine::Postgres, Topology::Shared, None),
            ),
            ("GET", "/v1/db/todos", dedicated()),
            (
                "GET",
                "/v1/db/todos",
                project(DbEngine::Postgres, Topology::Dedicated, None),
            ),
            ("GET", "/v1/db/todos", None),
            ("GET", "/v1/db/todos", replicated()),
            ("HEAD", "/v1/db/todos", replicated()),
            ("POST", "/v1/db/todos", replicated()),
        ];
        for round in 0..4 {
            for (method, path, project) in &vectors {
                let region = ["eu-west", "us-east", "ap-south", ""][round];
                let name = format!("{method} {path} {project:?} region={region}");
                let input = DbInput {
                    method,
                    path,
                    project: project.as_ref(),
                    client_region: (!region.is_empty()).then_some(region),
                    actor: None,
                };
                let route = run.call(&name, || module.vector(input))?;
                if let DbRoute::Replica(url) = &route
                    && !project
                        .as_ref()
                        .is_some_and(|p| p.replicas.iter().any(|r| r.url == *url))
                {
                    return Err(run.fail(
                        &name,
                        "a replica route must name one of the project's replicas",
                    ));
                }
                if let DbRoute::Postgrest(url) = route
                    && url
                        .parse::<http::Uri>()
                        .ok()
                        .and_then(|u| u.host().map(str::to_owned))
                        .is_none()
                {
                    return Err(run.fail(&name, "a PostgREST route needs an absolute URL"));
                }
            }
        }
        Ok(run.report(module))
    }

    fn run_case(
        module: &Module<Self>,
        input: &toml::Table,
        expect: &toml::Table,
    ) -> Result<(), String> {
        let input: DbCase = parse(input, "input")?;
        let expect: DbExpect = parse(expect, "expect")?;
        let project = match input.project {
            None => None,
            Some(p) => Some(ProjectDb {
                engine: match p.engine.as_str() {
                    "postgres" => DbEngine::Postgres,
                    "mongodb" => DbEngine::Mongodb,
                    other => {
                        return Err(format!("input.project.engine: unknown engine {other:?}"));
                    }
                },
                topology: match p.topology.as_str() {
                    "shared" => Topology::Shared,
                    "dedicated" => Topology::Dedicated,
                    other => {
                        return Err(format!(
                            "input.project.topology: unknown topology {other:?}"
                        ));
                    }
                },
                postgrest_url: p.postgrest_url,
                replicas: p
                    .replicas
                    .into_iter()
                    .map(|r| Replica {
                        url: r.url,
                        region: r.region,
                    })
                    .collect(),
            }),
        };
        let route = module
            .vector(DbInput {
                method: &input.method,
                path: &input.path,
                project: project.as_ref(),
                client_region: input.client_region.as_deref(),
                actor: None,
            })
            .map_err(|e| format!("the plugin failed: {e}"))?;
        match route {
            DbRoute::Nats => decision_is(&expect.decision, "nats"),
            DbRoute::Unresolved => decision_is(&expect.decision, "unresolved"),
            DbRoute::Postgrest(url) => {
                decision_is(&expect.decision, "postgrest")?;
                field("url", &expect.url, &url)
            }
            DbRoute::Replica(url) => {
                decision_is(&expect.decision, "replica")?;
                field("url", &expect.url, &url)
            }
        }
    }

    fn config_schema() -> serde_json::Value {
        serde_json::to_value(schemars::schema_for!(
            aura_plugin_db_routing::policy::Config
        ))
        .unwrap_or_default()
    }

    #[cfg(feature = "native-policies")]
    fn native(native: &Self::Native, _: &(), input: DbInput<'_>) -> DbRoute {
        native.decide(input.method, input.path, input.project, input.client_region)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ProjectCase {
    engine: String,
    topology: String,
    postgrest_url: Option<String>,
    #[serde(default)]
    replicas: Vec<ReplicaCase>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DbCase {
    #[serde(default = "get")]
    method: String,
    #[serde(default = "sample_path")]
    path: String,
    project: Option<ProjectCase>,
    client_region: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplicaCase {
    url: String,
    region: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DbExpect {
    decision: String,
    url: Option<String>,
}

/// The default policy compiled into the host (`--features native-policies`, benchmarks only).
#[cfg(feature = "native-policies")]
pub mod native {
    use aura_plugin_db_routing::policy as db;

    use super::{DbEngine, DbRoute, ProjectDb, Topology};
    use crate::policy::stages::native::native_policy;

    native_policy!(DbRouting(db::Policy), |_, config| db::Policy::configure(
        config
    ));

    impl DbRouting {
        pub(crate) fn decide(
            &self,
            method: &str,
            path: &str,
            project: Option<&ProjectDb>,
            client_region: Option<&str>,
        ) -> DbRoute {
            let replicas: Vec<db::Replica<'_>> = project
                .map(|p| {
                    p.replicas
                        .iter()
                        .map(|r| db::Replica {
                            url: &r.url,
                            region: r.region.as_deref(),
                        })
                        .collect()
                })
                .unwrap_or_default();
            let project = project.map(|p| db::Project {
                engine: match p.engine {
                    DbEngine::Postgres => db::Engine::Postgres,
                    DbEngine::Mongodb => db::Engine::Mongodb,
                },
                topology: match p.topology {
                    Topology::Shared => db::Topology::Shared,
                    Topology::Dedicated => db::Topology::Dedicated,
                },
                postgrest_url: p.postgrest_url.as_deref(),
                replicas: &replicas,
            });
            match self.0.decide(method, path, project, client_region) {
                db::Route::Nats => DbRoute::Nats,
                db::Route::Postgrest(url) => DbRoute::Postgrest(url),
                db::Route::Replica(url) => DbRoute::Replica(url),
                db::Route::Unresolved => DbRoute::Unresolved,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replica_serves_reads_of_its_own_project_only() {
        let project = ProjectDb {
            engine: DbEngine::Postgres,
            topology: Topology::Dedicated,
            postgrest_url: Some("https://db.example".into()),
            replicas: vec![Replica {
                url: "https://replica.example".into(),
                region: Some("eu".into()),
            }],
        };
        let own = "https://replica.example";
        for method in [http::Method::GET, http::Method::HEAD] {
            assert_eq!(refused_replica(own, &method, Some(&project)), None);
            let other = refused_replica("https://elsewhere.example", &method, Some(&project));
            assert_eq!(other.map(|r| r.0), Some("unknown_replica"));
            let none = refused_replica(own, &method, None);
            assert_eq!(none.map(|r| r.0), Some("unknown_replica"));
        }
        for method in [
            http::Method::POST,
            http::Method::PATCH,
            http::Method::DELETE,
        ] {
            let write = refused_replica(own, &method, Some(&project));
            assert_eq!(write.map(|r| r.0), Some("write_to_replica"), "{method}");
        }
    }
}
