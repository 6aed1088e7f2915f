//! Author test vectors: a plugin author's own cases (an input, the decision expected), run by
//! `aura-gateway plugin check --vectors cases.toml` on the loaded module, next to the gateway's
//! conformance vectors.
//!
//! The file is TOML, one `[[case]]` per case:
//!
//! ```toml
//! [[case]]
//! name = "listed origin is allowed"
//! plane = "data"                 # optional: data (default) or management
//! [case.input]                   # the stage's request record, WIT names in snake_case
//! origin = "https://app.example.com"
//! [case.expect]
//! decision = "allow"             # the decision's case, snake_case
//! allow_origin = "https://app.example.com"   # other fields: compared only when given
//! ```
//!
//! Inputs and expectations per stage (`method` defaults to `GET`, `path` to `/v1/db/x`):
//!
//! | stage | input | `decision` | optional expected fields |
//! |---|---|---|---|
//! | `api_key` | `method`, `path`, `query_keys`, `headers = [["name", "value"], …]` | `absent`, `present`, `refuse` | `key`, `source` (`header`, `query`), `allowed_roles`, `message_contains` |
//! | `cors` | `method`, `path`, `origin`, `request_method`, `request_headers` | `deny`, `allow` | `allow_origin`, `allow_methods`, `allow_headers`, `expose_headers`, `max_age` |
//! | `quota` | `method`, `path`, `route_group` (default `db`), `actor = { role, project, key_id, user_id, org_role, plan }` | `exempt`, `limit` | `bucket`, `rate_per_second`, `burst`, `cost` |
//! | `db_routing` | `method`, `path`, `project = { engine, topology, postgrest_url }` | `nats`, `postgrest`, `unresolved` | `url` |
//!
//! As in the gateway, an `api_key` module sees only the headers its `configure` asked for.
//! Unknown keys are refused with the case and key named, so a typo never passes silently.

use serde::Deserialize;
use serde::de::DeserializeOwned;

use super::stages::{
    CorsDecision, CorsInput, DbEngine, DbRoute, KeyDecision, KeyRequest, KeyRole, KeySource,
    ProjectDb, QuotaDecision, Topology,
};
use super::{Policies, Stage};
use crate::actor::{Actor, Role};
use crate::plane::Plane;

/// A vectors file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Vectors {
    #[serde(rename = "case", default)]
    cases: Vec<Case>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    name: String,
    #[serde(default)]
    plane: Option<String>,
    #[serde(default)]
    input: toml::Table,
    expect: toml::Table,
}

/// The outcome of one case.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub name: String,
    /// `None` when the case passed; otherwise what differed (or why it could not run).
    pub failure: Option<String>,
}

impl Vectors {
    /// Parses a vectors file; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Self, String> {
        let vectors: Vectors = toml::from_str(text).map_err(|e| format!("{origin}: {e}"))?;
        if vectors.cases.is_empty() {
            return Err(format!("{origin}: no [[case]]"));
        }
        Ok(vectors)
    }

    /// The planes the cases run on (`data` by default).
    pub fn planes(&self) -> Result<Vec<Plane>, String> {
        let mut planes = Vec::new();
        for case in &self.cases {
            let plane = case_plane(case)?;
            if !planes.contains(&plane) {
                planes.push(plane);
            }
        }
        Ok(planes)
    }

    /// Runs every case on the `stage` module loaded in `policies`.
    pub fn run(&self, stage: Stage, policies: &Policies) -> Vec<Outcome> {
        self.cases
            .iter()
            .map(|case| Outcome {
                name: case.name.clone(),
                failure: run_case(stage, policies, case).err(),
            })
            .collect()
    }
}

/// The outcomes as a table, one line per case, and whether all passed.
pub fn table(outcomes: &[Outcome]) -> (String, bool) {
    let width = outcomes
        .iter()
        .map(|o| o.name.chars().count())
        .max()
        .unwrap_or(4)
        .max(4);
    let mut out = format!("{:<width$}  result\n", "case");
    for o in outcomes {
        match &o.failure {
            None => out.push_str(&format!("{:<width$}  pass\n", o.name)),
            Some(why) => out.push_str(&format!("{:<width$}  FAIL: {why}\n", o.name)),
        }
    }
    let failed = outcomes.iter().filter(|o| o.failure.is_some()).count();
    out.push_str(&format!(
        "{} passed, {failed} failed\n",
        outcomes.len() - failed
    ));
    (out, failed == 0)
}

fn case_plane(case: &Case) -> Result<Plane, String> {
    match case.plane.as_deref() {
        None => Ok(Plane::Data),
        Some(name) => Plane::parse(name).ok_or_else(|| {
            format!(
                "case {:?}: plane {name:?} is not data or management",
                case.name
            )
        }),
    }
}

fn parse<T: DeserializeOwned>(table: &toml::Table, what: &str) -> Result<T, String> {
    toml::Value::Table(table.clone())
        .try_into()
        .map_err(|e| format!("{what}: {}", e.message()))
}

/// Compares one expected field when the case gives it.
fn field<T: PartialEq + std::fmt::Debug>(
    name: &str,
    expected: &Option<T>,
    actual: &T,
) -> Result<(), String> {
    match expected {
        Some(e) if e != actual => Err(format!("{name}: expected {e:?}, got {actual:?}")),
        _ => Ok(()),
    }
}

fn decision_is(expected: &str, actual: &str) -> Result<(), String> {
    if expected == actual {
        Ok(())
    } else {
        Err(format!("expected {expected}, got {actual}"))
    }
}

fn run_case(stage: Stage, policies: &Policies, case: &Case) -> Result<(), String> {
    let plane = case_plane(case)?;
    let p = policies.plane(plane);
    match stage {
        Stage::ApiKey => {
            let module = p
                .api_key
                .as_ref()
                .ok_or_else(|| format!("the {plane} plane has no api_key stage"))?;
            let input: ApiKeyInput = parse(&case.input, "input")?;
            let expect: ApiKeyExpect = parse(&case.expect, "expect")?;
            let wanted = module.headers();
            let request = KeyRequest {
                method: input.method,
                path: input.path,
                query_keys: input.query_keys,
                headers: input
                    .headers
                    .into_iter()
                    .map(|(n, v)| (n.to_ascii_lowercase(), v))
                    .filter(|(n, _)| wanted.iter().any(|w| w == n))
                    .collect(),
            };
            let decision = module
                .extract(None, request)
                .map_err(|e| format!("the plugin failed: {e}"))?;
            match decision {
                KeyDecision::Absent => decision_is(&expect.decision, "absent"),
                KeyDecision::Refuse(message) => {
                    decision_is(&expect.decision, "refuse")?;
                    match &expect.message_contains {
                        Some(part) if !message.contains(part.as_str()) => Err(format!(
                            "message: expected it to contain {part:?}, got {message:?}"
                        )),
                        _ => Ok(()),
                    }
                }
                KeyDecision::Present(c) => {
                    decision_is(&expect.decision, "present")?;
                    field("key", &expect.key, &c.key)?;
                    let source = match c.source {
                        KeySource::Header => "header",
                        KeySource::Query => "query",
                    };
                    field("source", &expect.source.as_deref(), &source)?;
                    let roles: Vec<&str> = c
                        .allowed_roles
                        .iter()
                        .map(|r| match r {
                            KeyRole::Anon => "anon",
                            KeyRole::ServiceRole => "service_role",
                        })
                        .collect();
                    let expected: Option<Vec<&str>> = expect
                        .allowed_roles
                        .as_ref()
                        .map(|r| r.iter().map(String::as_str).collect());
                    field("allowed_roles", &expected, &roles)
                }
            }
        }
        Stage::Cors => {
            let input: CorsInputCase = parse(&case.input, "input")?;
            let expect: CorsExpect = parse(&case.expect, "expect")?;
            let decision = p
                .cors
                .decide(
                    None,
                    plane,
                    CorsInput {
                        method: &input.method,
                        path: &input.path,
                        origin: &input.origin,
                        request_method: input.request_method.as_deref(),
                        request_headers: input.request_headers.as_deref(),
                    },
                )
                .map_err(|e| format!("the plugin failed: {e}"))?;
            match decision {
                CorsDecision::Deny => decision_is(&expect.decision, "deny"),
                CorsDecision::Allow(a) => {
                    decision_is(&expect.decision, "allow")?;
                    field("allow_origin", &expect.allow_origin, &a.allow_origin)?;
                    field("allow_methods", &expect.allow_methods, &a.allow_methods)?;
                    field("allow_headers", &expect.allow_headers, &a.allow_headers)?;
                    field("expose_headers", &expect.expose_headers, &a.expose_headers)?;
                    field("max_age", &expect.max_age.map(Some), &a.max_age)
                }
            }
        }
        Stage::Quota => {
            let input: QuotaInputCase = parse(&case.input, "input")?;
            let expect: QuotaExpect = parse(&case.expect, "expect")?;
            let mut actor = Actor::unauthenticated(plane);
            actor.role = match input.actor.role.as_str() {
                "anon" => Role::Anon,
                "authenticated" => Role::Authenticated,
                "service_role" => Role::ServiceRole,
                "console" => Role::Console,
                other => return Err(format!("input.actor.role: unknown role {other:?}")),
            };
            actor.project = input.actor.project;
            actor.key_id = input.actor.key_id;
            actor.user_id = input.actor.user_id;
            actor.org_role = input.actor.org_role;
            actor.plan = input.actor.plan;
            let decision = p
                .quota
                .decide(None, &input.method, &input.path, &input.route_group, &actor)
                .map_err(|e| format!("the plugin failed: {e}"))?;
            match decision {
                QuotaDecision::Exempt => decision_is(&expect.decision, "exempt"),
                QuotaDecision::Limit(rule) => {
                    decision_is(&expect.decision, "limit")?;
                    field("bucket", &expect.bucket, &rule.bucket)?;
                    field(
                        "rate_per_second",
                        &expect.rate_per_second,
                        &rule.rate_per_second,
                    )?;
                    field("burst", &expect.burst, &rule.burst)?;
                    field("cost", &expect.cost, &rule.cost)
                }
            }
        }
        Stage::DbRouting => {
            let input: DbInputCase = parse(&case.input, "input")?;
            let expect: DbExpect = parse(&case.expect, "expect")?;
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
            let route = p
                .db_routing
                .decide(None, plane, &input.method, &input.path, project)
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
    }
}

fn get() -> String {
    "GET".to_owned()
}

fn db_path() -> String {
    "/v1/db/x".to_owned()
}

fn db_group() -> String {
    "db".to_owned()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ApiKeyInput {
    #[serde(default = "get")]
    method: String,
    #[serde(default = "db_path")]
    path: String,
    #[serde(default)]
    query_keys: Vec<String>,
    #[serde(default)]
    headers: Vec<(String, String)>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ApiKeyExpect {
    decision: String,
    key: Option<String>,
    source: Option<String>,
    allowed_roles: Option<Vec<String>>,
    message_contains: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CorsInputCase {
    #[serde(default = "get")]
    method: String,
    #[serde(default = "db_path")]
    path: String,
    origin: String,
    request_method: Option<String>,
    request_headers: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CorsExpect {
    decision: String,
    allow_origin: Option<String>,
    allow_methods: Option<Vec<String>>,
    allow_headers: Option<Vec<String>>,
    expose_headers: Option<Vec<String>>,
    max_age: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ActorCase {
    role: String,
    project: Option<String>,
    key_id: Option<String>,
    user_id: Option<String>,
    org_role: Option<String>,
    plan: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct QuotaInputCase {
    #[serde(default = "get")]
    method: String,
    #[serde(default = "db_path")]
    path: String,
    #[serde(default = "db_group")]
    route_group: String,
    actor: ActorCase,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct QuotaExpect {
    decision: String,
    bucket: Option<String>,
    rate_per_second: Option<u32>,
    burst: Option<u32>,
    cost: Option<u32>,
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
struct DbInputCase {
    #[serde(default = "get")]
    method: String,
    #[serde(default = "db_path")]
    path: String,
    project: Option<ProjectCase>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DbExpect {
    decision: String,
    url: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_typo_in_a_case_is_refused_with_its_name() {
        let vectors = Vectors::parse(
            "[[case]]\nname = \"x\"\n[case.input]\norigin = \"https://a\"\n[case.expect]\ndecision = \"allow\"\nallow_orign = \"https://a\"\n",
            "cases.toml",
        )
        .expect("parses");
        let err = parse::<CorsExpect>(&vectors.cases[0].expect, "expect")
            .err()
            .expect("refused");
        assert!(err.contains("allow_orign"), "{err}");
        assert!(
            Vectors::parse("", "cases.toml")
                .err()
                .is_some_and(|e| e.contains("no [[case]]"))
        );
        assert!(
            Vectors::parse(
                "[[case]]\nname = \"x\"\nplane = \"edge\"\n[case.expect]\ndecision = \"deny\"\n",
                "f"
            )
            .expect("parses")
            .planes()
            .err()
            .is_some_and(|e| e.contains("edge"))
        );
    }

    #[test]
    fn the_table_names_each_failing_case() {
        let (table, ok) = table(&[
            Outcome {
                name: "good".into(),
                failure: None,
            },
            Outcome {
                name: "bad one".into(),
                failure: Some("expected allow, got deny".into()),
            },
        ]);
        assert!(!ok);
        assert!(table.contains("good     pass"), "{table}");
        assert!(
            table.contains("bad one  FAIL: expected allow, got deny"),
            "{table}"
        );
        assert!(table.ends_with("1 passed, 1 failed\n"));
    }
}
