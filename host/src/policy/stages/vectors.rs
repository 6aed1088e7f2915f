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
//! | `quota` | `method`, `path`, `route_group` (default `db`), `actor = { role, project, key_id, user_id, org_role, plan }`, `client_ip = "203.0.113.7"`, `claims = { tier = "gold" }`, `headers = [["name", "value"], …]` | `exempt`, `limit`, `deny` | `limit`: `scope` (`key`, `user`, `console_user`, `project`, `client_ip`, `named:<name>`), `rate_per_second`, `burst`, `cost`; `deny`: `status` (403, 429), `code` (`address_denied`, `address_not_allowed`, `claim_denied`, `quota_exceeded`, `policy_denied`) |
//! | `db_routing` | `method`, `path`, `project = { engine, topology, postgrest_url, replicas = [{ url, region }, …] }`, `client_region` | `nats`, `postgrest`, `replica`, `unresolved` | `url` (`postgrest`, `replica`) |
//!
//! As in the gateway, an `api_key` module sees only the headers its `configure` asked for, and a
//! `quota` module only the claims and headers its `configure` named (a claim as JSON text). A
//! module that declares its inputs (`aura:gateway@0.3.0` and later) is called with only the declared inputs
//! and again with every input: a decision that differs fails the case, naming the input.
//! Unknown keys are refused with the case and key named, so a typo never passes silently.

use serde::Deserialize;
use serde::de::DeserializeOwned;

use super::{PolicyStage, StageFn, for_stage};
use crate::plane::Plane;
use crate::policy::{Policies, Stage};

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

/// A case's `input` or `expect` table as `T`; `what` names it in errors.
pub(crate) fn parse<T: DeserializeOwned>(table: &toml::Table, what: &str) -> Result<T, String> {
    toml::Value::Table(table.clone())
        .try_into()
        .map_err(|e| format!("{what}: {}", e.message()))
}

/// Compares one expected field when the case gives it.
pub(crate) fn field<T: PartialEq + std::fmt::Debug>(
    name: &str,
    expected: &Option<T>,
    actual: &T,
) -> Result<(), String> {
    match expected {
        Some(e) if e != actual => Err(format!("{name}: expected {e:?}, got {actual:?}")),
        _ => Ok(()),
    }
}

/// Compares the decision's case with the expected one.
pub(crate) fn decision_is(expected: &str, actual: &str) -> Result<(), String> {
    if expected == actual {
        Ok(())
    } else {
        Err(format!("expected {expected}, got {actual}"))
    }
}

fn run_case(stage: Stage, policies: &Policies, case: &Case) -> Result<(), String> {
    struct RunCase<'a> {
        policies: &'a Policies,
        plane: Plane,
        case: &'a Case,
    }
    impl StageFn for RunCase<'_> {
        type Out = Result<(), String>;
        fn call<S: PolicyStage>(self) -> Self::Out {
            let module = self
                .policies
                .plane(self.plane)
                .module::<S>()
                .ok_or_else(|| format!("the {} plane has no {} stage", self.plane, S::STAGE))?;
            S::run_case(module, &self.case.input, &self.case.expect)
        }
    }
    let plane = case_plane(case)?;
    for_stage(
        stage,
        RunCase {
            policies,
            plane,
            case,
        },
    )
}

/// The default `method` of a case.
pub(crate) fn get() -> String {
    "GET".to_owned()
}

/// The default `path` of a case.
pub(crate) fn sample_path() -> String {
    "/v1/db/x".to_owned()
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
        let err =
            parse::<crate::policy::stages::cors::CorsExpect>(&vectors.cases[0].expect, "expect")
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
