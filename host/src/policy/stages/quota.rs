//! The `quota` stage: the per-actor quota rule of a request, on both planes. Projects may install
//! their own module (data plane), and a candidate may be tried.

use serde::Deserialize;
use wasmtime::component::{ComponentType, Lower};

use super::{Module, PolicyStage, stage_world};
use crate::actor::{Actor, Role};
use crate::policy::PluginError;
use crate::policy::conformance::{ConformanceError, Run, StageReport};
use crate::policy::engine::{StageModule, StageWorld};
use crate::policy::vectors::{decision_is, field, get, parse, sample_path};
use crate::stage::Stage;

/// The generated types of the `quota` world (`quota-stage` in `wit/gateway.wit`).
pub(crate) mod world {
    wasmtime::component::bindgen!({ path: "../wit", world: "quota-stage", additional_derives: [PartialEq, Eq] });
}

pub use world::exports::aura::gateway::quota::{QuotaDecision, QuotaRule};

use world::aura::gateway::types::ActorRole;

/// The `quota` stage.
#[derive(Debug)]
pub struct Quota;

/// `actor` of the `quota` stage, borrowed from the request's [`Actor`].
#[derive(Debug, Clone, Copy, ComponentType, Lower)]
#[component(record)]
pub struct ActorRef<'a> {
    #[component(name = "role")]
    role: ActorRole,
    #[component(name = "project")]
    project: Option<&'a str>,
    #[component(name = "key-id")]
    key_id: Option<&'a str>,
    #[component(name = "user-id")]
    user_id: Option<&'a str>,
    #[component(name = "org-role")]
    org_role: Option<&'a str>,
    #[component(name = "plan")]
    plan: Option<&'a str>,
}

/// `quota-request`, borrowed: lowering copies the strings into the guest straight from the
/// request's facts (the record is checked against the plugin's WIT when an instance is made).
#[derive(Debug, Clone, Copy, ComponentType, Lower)]
#[component(record)]
pub struct QuotaRequestRef<'a> {
    #[component(name = "plane")]
    plane: world::aura::gateway::types::Plane,
    #[component(name = "method")]
    method: &'a str,
    #[component(name = "path")]
    path: &'a str,
    #[component(name = "route-group")]
    route_group: &'a str,
    #[component(name = "actor")]
    actor: ActorRef<'a>,
}

stage_world!(
    Quota,
    quota,
    Stage::Quota,
    "decide",
    (),
    'a,
    QuotaRequestRef<'a>,
    QuotaDecision
);

/// What the host knows of a request for the quota stage.
#[derive(Debug, Clone, Copy)]
pub struct QuotaInput<'a> {
    pub method: &'a str,
    pub path: &'a str,
    /// The request's route group (`db`, `functions`, …).
    pub route_group: &'a str,
    /// The caller, authenticated.
    pub actor: &'a Actor,
}

/// [`QuotaInput`] with owned values, for a call run on another thread.
#[derive(Debug, Clone)]
pub struct QuotaQuery {
    method: String,
    path: String,
    route_group: String,
    actor: Actor,
}

/// The canary subject of an actor: the user, else the API key, else the address.
pub(crate) fn actor_subject(actor: &Actor) -> String {
    actor
        .user_id
        .clone()
        .or_else(|| actor.key_id.clone())
        .unwrap_or_else(|| super::cors::client_subject(actor.client_ip))
}

impl PolicyStage for Quota {
    type Input<'a> = QuotaInput<'a>;
    type Query = QuotaQuery;
    const BUILTIN: &'static [u8] = include_bytes!(concat!(env!("OUT_DIR"), "/quota.wasm"));
    type DefaultConfig = aura_plugin_quota::policy::Config;
    #[cfg(feature = "native-policies")]
    type Native = native::Quota;

    fn query(input: QuotaInput<'_>) -> QuotaQuery {
        QuotaQuery {
            method: input.method.to_owned(),
            path: input.path.to_owned(),
            route_group: input.route_group.to_owned(),
            actor: input.actor.clone(),
        }
    }

    fn input(query: &QuotaQuery) -> QuotaInput<'_> {
        QuotaInput {
            method: &query.method,
            path: &query.path,
            route_group: &query.route_group,
            actor: &query.actor,
        }
    }

    fn subject(input: &QuotaInput<'_>) -> String {
        actor_subject(input.actor)
    }

    fn request_line<'a>(input: &Self::Input<'a>) -> (&'a str, &'a str) {
        (input.method, input.path)
    }

    fn describe(decision: &QuotaDecision) -> String {
        match decision {
            QuotaDecision::Exempt => "exempt".to_owned(),
            QuotaDecision::Limit(r) => format!(
                "limit bucket={} rate={} burst={} cost={}",
                r.bucket, r.rate_per_second, r.burst, r.cost
            ),
        }
    }

    fn run(
        module: &StageModule<Self>,
        request_id: Option<&str>,
        input: QuotaInput<'_>,
    ) -> Result<QuotaDecision, PluginError> {
        let actor = input.actor;
        let request = QuotaRequestRef {
            plane: Self::plane(actor.plane),
            method: input.method,
            path: input.path,
            route_group: input.route_group,
            actor: ActorRef {
                role: match actor.role {
                    Role::Anon => ActorRole::Anon,
                    Role::Authenticated => ActorRole::Authenticated,
                    Role::ServiceRole => ActorRole::ServiceRole,
                    Role::Console => ActorRole::Console,
                },
                project: actor.project.as_deref(),
                key_id: actor.key_id.as_deref(),
                user_id: actor.user_id.as_deref(),
                org_role: actor.org_role.as_deref(),
                plan: actor.plan.as_deref(),
            },
        };
        module.call(request_id, request)
    }

    fn conformance(module: &Module<Self>) -> Result<StageReport, ConformanceError> {
        let plane = module.plane();
        let mut run = Run::new(plane, Stage::Quota);
        let mut actors = Vec::new();
        for role in [
            Role::Anon,
            Role::Authenticated,
            Role::ServiceRole,
            Role::Console,
        ] {
            let mut a = Actor::unauthenticated(plane);
            a.role = role;
            a.project = Some("vector".into());
            a.key_id = Some("00000000-0000-4000-8000-000000000001".into());
            a.user_id = (role != Role::Anon).then(|| "00000000-0000-4000-8000-000000000002".into());
            a.plan = Some("free".into());
            actors.push(a);
        }
        actors.push(Actor::unauthenticated(plane));
        for _round in 0..4 {
            for actor in &actors {
                for group in ["db", "functions", "storage", "gateway"] {
                    let name = format!("{:?} on {group}", actor.role);
                    let input = QuotaInput {
                        method: "GET",
                        path: "/v1/x",
                        route_group: group,
                        actor,
                    };
                    let decision = run.call(&name, || module.decide(None, input))?;
                    if let QuotaDecision::Limit(r) = decision
                        && (r.bucket.is_empty()
                            || r.rate_per_second == 0
                            || r.burst == 0
                            || r.cost == 0
                            || r.cost > r.burst)
                    {
                        return Err(run.fail(
                            &name,
                            "a rule needs a bucket, rate ≥ 1, burst ≥ 1 and 1 ≤ cost ≤ burst",
                        ));
                    }
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
        let input: QuotaCase = parse(input, "input")?;
        let expect: QuotaExpect = parse(expect, "expect")?;
        let mut actor = Actor::unauthenticated(module.plane());
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
        let decision = module
            .decide(
                None,
                QuotaInput {
                    method: &input.method,
                    path: &input.path,
                    route_group: &input.route_group,
                    actor: &actor,
                },
            )
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

    #[cfg(feature = "native-policies")]
    fn native(
        native: &Self::Native,
        _module: &StageModule<Self>,
        input: QuotaInput<'_>,
    ) -> QuotaDecision {
        native.decide(input.route_group, input.actor)
    }
}

fn db_group() -> String {
    "db".to_owned()
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
struct QuotaCase {
    #[serde(default = "get")]
    method: String,
    #[serde(default = "sample_path")]
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

/// The default policy compiled into the host (`--features native-policies`, benchmarks only).
#[cfg(feature = "native-policies")]
pub mod native {
    use aura_plugin_quota::policy as quota;

    use super::{QuotaDecision, QuotaRule};
    use crate::actor::{Actor, Role};
    use crate::policy::native::native_policy;

    native_policy!(Quota(quota::Policy), |_, config| quota::Policy::configure(
        config
    ));

    impl Quota {
        pub(crate) fn decide(&self, route_group: &str, actor: &Actor) -> QuotaDecision {
            let a = quota::Actor {
                role: match actor.role {
                    Role::Anon => quota::Role::Anon,
                    Role::Authenticated => quota::Role::Authenticated,
                    Role::ServiceRole => quota::Role::ServiceRole,
                    Role::Console => quota::Role::Console,
                },
                project: actor.project.as_deref(),
                key_id: actor.key_id.as_deref(),
                user_id: actor.user_id.as_deref(),
                plan: actor.plan.as_deref(),
            };
            match self.0.decide(route_group, a) {
                None => QuotaDecision::Exempt,
                Some(r) => QuotaDecision::Limit(QuotaRule {
                    bucket: r.bucket,
                    rate_per_second: r.rate_per_second,
                    burst: r.burst,
                    cost: r.cost,
                }),
            }
        }
    }
}
