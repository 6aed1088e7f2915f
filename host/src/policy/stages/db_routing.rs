//! The `db-routing` stage: where a `/v1/db/*` request goes (the db service over NATS, the
//! project's dedicated PostgREST, or nowhere: fail closed), on both planes.

use serde::Deserialize;
use wasmtime::component::{ComponentType, Lower};

use super::{Module, PolicyStage, stage_world};
use crate::actor::Actor;
use crate::policy::PluginError;
use crate::policy::conformance::{ConformanceError, Run, StageReport};
use crate::policy::engine::{StageModule, StageWorld};
use crate::policy::vectors::{decision_is, field, get, parse, sample_path};
use crate::stage::Stage;

/// The generated types of the `db-routing` world (`db-routing-stage` in `wit/gateway.wit`).
pub(crate) mod world {
    wasmtime::component::bindgen!({ path: "../wit", world: "db-routing-stage", additional_derives: [PartialEq, Eq] });
}

pub use world::exports::aura::gateway::db_routing::{DbEngine, DbRoute, ProjectDb, Topology};

/// The `db-routing` stage.
#[derive(Debug)]
pub struct DbRouting;

/// `project-db`, borrowed.
#[derive(Debug, Clone, Copy, ComponentType, Lower)]
#[component(record)]
pub struct ProjectDbRef<'a> {
    #[component(name = "engine")]
    engine: DbEngine,
    #[component(name = "topology")]
    topology: Topology,
    #[component(name = "postgrest-url")]
    postgrest_url: Option<&'a str>,
}

/// `db-request`, borrowed.
#[derive(Debug, Clone, Copy, ComponentType, Lower)]
#[component(record)]
pub struct DbRequestRef<'a> {
    #[component(name = "plane")]
    plane: world::aura::gateway::types::Plane,
    #[component(name = "method")]
    method: &'a str,
    #[component(name = "path")]
    path: &'a str,
    #[component(name = "project")]
    project: Option<ProjectDbRef<'a>>,
}

stage_world!(
    DbRouting,
    db_routing,
    Stage::DbRouting,
    "decide",
    (),
    'a,
    DbRequestRef<'a>,
    DbRoute
);

/// What the host knows of a `/v1/db/*` request for the db-routing stage.
#[derive(Debug, Clone, Copy)]
pub struct DbInput<'a> {
    pub method: &'a str,
    pub path: &'a str,
    /// The caller's project database, from the control store.
    pub project: Option<&'a ProjectDb>,
    /// The caller: a canary's subject.
    pub actor: Option<&'a Actor>,
}

/// [`DbInput`] with owned values, for a call run on another thread.
#[derive(Debug, Clone)]
pub struct DbQuery {
    method: String,
    path: String,
    project: Option<ProjectDb>,
    actor: Option<Actor>,
}

impl PolicyStage for DbRouting {
    type Input<'a> = DbInput<'a>;
    type Query = DbQuery;
    const BUILTIN: &'static [u8] = include_bytes!(concat!(env!("OUT_DIR"), "/db_routing.wasm"));
    type DefaultConfig = aura_plugin_db_routing::policy::Config;
    #[cfg(feature = "native-policies")]
    type Native = native::DbRouting;

    fn query(input: DbInput<'_>) -> DbQuery {
        DbQuery {
            method: input.method.to_owned(),
            path: input.path.to_owned(),
            project: input.project.cloned(),
            actor: input.actor.cloned(),
        }
    }

    fn input(query: &DbQuery) -> DbInput<'_> {
        DbInput {
            method: &query.method,
            path: &query.path,
            project: query.project.as_ref(),
            actor: query.actor.as_ref(),
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
            DbRoute::Unresolved => "unresolved".to_owned(),
        }
    }

    fn run(
        module: &StageModule<Self>,
        request_id: Option<&str>,
        input: DbInput<'_>,
    ) -> Result<DbRoute, PluginError> {
        let request = DbRequestRef {
            plane: Self::plane(module.plane()),
            method: input.method,
            path: input.path,
            project: input.project.map(|p| ProjectDbRef {
                engine: p.engine,
                topology: p.topology,
                postgrest_url: p.postgrest_url.as_deref(),
            }),
        };
        module.call(request_id, request)
    }

    fn conformance(module: &Module<Self>) -> Result<StageReport, ConformanceError> {
        let mut run = Run::new(module.plane(), Stage::DbRouting);
        let project = |engine, topology, url: Option<&str>| {
            Some(ProjectDb {
                engine,
                topology,
                postgrest_url: url.map(str::to_owned),
            })
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
        ];
        for _round in 0..4 {
            for (method, path, project) in &vectors {
                let name = format!("{method} {path} {project:?}");
                let input = DbInput {
                    method,
                    path,
                    project: project.as_ref(),
                    actor: None,
                };
                let route = run.call(&name, || module.decide(None, input))?;
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
            }),
        };
        let route = module
            .decide(
                None,
                DbInput {
                    method: &input.method,
                    path: &input.path,
                    project: project.as_ref(),
                    actor: None,
                },
            )
            .map_err(|e| format!("the plugin failed: {e}"))?;
        match route {
            DbRoute::Nats => decision_is(&expect.decision, "nats"),
            DbRoute::Unresolved => decision_is(&expect.decision, "unresolved"),
            DbRoute::Postgrest(url) => {
                decision_is(&expect.decision, "postgrest")?;
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
    fn native(native: &Self::Native, _module: &StageModule<Self>, input: DbInput<'_>) -> DbRoute {
        native.decide(input.method, input.path, input.project)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ProjectCase {
    engine: String,
    topology: String,
    postgrest_url: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DbCase {
    #[serde(default = "get")]
    method: String,
    #[serde(default = "sample_path")]
    path: String,
    project: Option<ProjectCase>,
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
    use crate::policy::native::native_policy;

    native_policy!(DbRouting(db::Policy), |_, config| db::Policy::configure(
        config
    ));

    impl DbRouting {
        pub(crate) fn decide(
            &self,
            method: &str,
            path: &str,
            project: Option<&ProjectDb>,
        ) -> DbRoute {
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
            });
            match self.0.decide(method, path, project) {
                db::Route::Nats => DbRoute::Nats,
                db::Route::Postgrest(url) => DbRoute::Postgrest(url),
                db::Route::Unresolved => DbRoute::Unresolved,
            }
        }
    }
}
