//! The `quota` stage: the per-actor rule of a request, on both planes — a bucket's scope and
//! figures, an exemption, or a denial. Projects may install their own module (data plane), and a
//! candidate may be tried.

use std::net::IpAddr;

use serde::Deserialize;
use wasmtime::component::{ComponentType, Lower};

use super::conformance::{ConformanceError, Run, StageReport};
use super::vectors::{decision_is, field, get, parse, sample_path};
use super::{
    Declaration, Inputs, Module, NamedRef, PolicyStage, method_index, stage_world, wit_method,
};
use crate::actor::{Actor, Role};
use crate::policy::PluginError;
use crate::policy::runtime::decision_cache::KeyWriter;
use crate::policy::runtime::engine::{StageModule, StageWorld};
use crate::routes::RouteGroup;
use crate::stage::Stage;

/// The generated types of the `quota` world (`quota-stage` in `wit/gateway.wit`).
pub(crate) mod world {
    wasmtime::component::bindgen!({ path: "../wit", world: "quota-stage", additional_derives: [PartialEq, Eq] });
}

/// The generated types of the `quota` world of `0.4.0` and `0.3.0` (`wit/0.4.0/gateway.wit`):
/// only its `route-group` enum is used, the rest being the current world's.
pub(crate) mod earlier {
    wasmtime::component::bindgen!({ path: "../wit/0.4.0", world: "quota-stage" });
}

/// The generated types of the `quota` world before `0.3.0` (`wit/0.2.0/gateway.wit`).
pub(crate) mod legacy {
    wasmtime::component::bindgen!({ path: "../wit/0.2.0", world: "quota-stage", additional_derives: [PartialEq, Eq] });
}

use earlier::aura::gateway::types::RouteGroup as EarlierGroup;
use world::aura::gateway::types::{ActorRole, IpAddress, Method};
use world::exports::aura::gateway::quota::QuotaSetup;
pub use world::exports::aura::gateway::quota::{
    BucketScope, DenyReason, DenyStatus, QuotaDecision, QuotaDenial, QuotaRule,
};

/// The `quota` stage.
#[derive(Debug)]
pub struct Quota;

/// The `quota` stage's modules written against `0.4.0` or `0.3.0`: passed the route group as
/// the enum those versions had.
#[derive(Debug)]
pub struct QuotaEarlier;

/// The `quota` stage's modules written against `0.2.0` or `0.1.0`.
#[derive(Debug)]
pub struct QuotaLegacy;

/// At most this many claims or headers a `quota` module may ask for, each.
pub const MAX_NAMED: usize = 8;
/// The longest claim or header name a `quota` module may ask for, in bytes.
pub const MAX_NAME_BYTES: usize = 64;
/// The longest claim (as JSON text) or header value passed to a `quota` module, in bytes: a
/// longer one is not passed.
pub const MAX_VALUE_BYTES: usize = 256;
/// At most this many header values passed in one call.
pub const MAX_HEADER_VALUES: usize = 16;

/// `actor`, borrowed from the request's [`Actor`].
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
/// The route group `G` is its name since `0.5.0`, an [`EarlierGroup`] before.
#[derive(Debug, Clone, ComponentType, Lower)]
#[component(record)]
pub struct QuotaRequestRef<'a, G> {
    #[component(name = "method")]
    method: Method,
    #[component(name = "path")]
    path: &'a str,
    #[component(name = "route-group")]
    route_group: G,
    #[component(name = "actor")]
    actor: ActorRef<'a>,
    #[component(name = "client-ip")]
    client_ip: Option<IpAddress>,
    #[component(name = "claims")]
    claims: &'a [NamedRef<'a>],
    #[component(name = "headers")]
    headers: &'a [NamedRef<'a>],
}

impl<'a, G> QuotaRequestRef<'a, G> {
    /// The same request with its route group as `to` makes it.
    fn with_group<H>(self, to: impl FnOnce(G) -> H) -> QuotaRequestRef<'a, H> {
        QuotaRequestRef {
            method: self.method,
            path: self.path,
            route_group: to(self.route_group),
            actor: self.actor,
            client_ip: self.client_ip,
            claims: self.claims,
            headers: self.headers,
        }
    }
}

stage_world!(
    @impl Quota,
    quota,
    world,
    &["0.5.0"],
    true,
    Stage::Quota,
    "decide",
    QuotaSetup,
    'a,
    QuotaRequestRef<'a, &'a str>,
    QuotaDecision
);

stage_world!(
    @impl QuotaEarlier,
    quota,
    world,
    &["0.4.0", "0.3.0"],
    true,
    Stage::Quota,
    "decide",
    QuotaSetup,
    'a,
    QuotaRequestRef<'a, EarlierGroup>,
    QuotaDecision
);

/// `actor` of the legacy `quota-request`.
#[derive(Debug, Clone, Copy, ComponentType, Lower)]
#[component(record)]
pub struct LegacyActorRef<'a> {
    #[component(name = "role")]
    role: legacy::aura::gateway::types::ActorRole,
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

/// The legacy `quota-request`, borrowed.
#[derive(Debug, Clone, Copy, ComponentType, Lower)]
#[component(record)]
pub struct LegacyRequestRef<'a> {
    #[component(name = "plane")]
    plane: legacy::aura::gateway::types::Plane,
    #[component(name = "method")]
    method: &'a str,
    #[component(name = "path")]
    path: &'a str,
    #[component(name = "route-group")]
    route_group: &'a str,
    #[component(name = "actor")]
    actor: LegacyActorRef<'a>,
}

stage_world!(
    QuotaLegacy,
    quota::legacy,
    Stage::Quota,
    "decide",
    (),
    'a,
    LegacyRequestRef<'a>,
    legacy::exports::aura::gateway::quota::QuotaDecision
);

/// What the host knows of a request for the quota stage.
#[derive(Debug, Clone, Copy)]
pub struct QuotaInput<'a> {
    pub method: &'a str,
    pub path: &'a str,
    /// The request's route group.
    pub route_group: RouteGroup,
    /// The caller, authenticated (its `client_ip` and its user token's claims included).
    pub actor: &'a Actor,
    /// The request's headers, when known (a module sees only those it named).
    pub headers: Option<&'a http::HeaderMap>,
}

/// [`QuotaInput`] with owned values, for a call run on another thread.
#[derive(Debug, Clone)]
pub struct QuotaQuery {
    method: String,
    path: String,
    route_group: RouteGroup,
    actor: Actor,
    headers: Option<http::HeaderMap>,
}

/// What the host keeps of a `quota` module's `configure` answer: the claims and headers it
/// reads.
#[derive(Debug, Clone, Default)]
pub struct QuotaConfigured {
    pub claims: Vec<String>,
    pub headers: Vec<http::HeaderName>,
}

/// The canary subject of an actor: the user, else the API key, else the address.
pub(crate) fn actor_subject(actor: &Actor) -> String {
    actor
        .user_id
        .clone()
        .or_else(|| actor.key_id.clone())
        .unwrap_or_else(|| super::cors::client_subject(actor.client_ip))
}

/// Headers a `quota` module may never read: credentials (a project's module never sees an API
/// key or a token) and the gateway's own identity headers.
const CREDENTIAL_HEADERS: [&str; 6] = [
    "authorization",
    "proxy-authorization",
    "cookie",
    "apikey",
    "x-api-key",
    "x-aura-",
];

/// Bounds the claim or header names a module asks for.
fn check_names(what: &str, names: &[String], header: bool) -> Result<(), String> {
    if header
        && let Some(name) = names.iter().find(|n| {
            CREDENTIAL_HEADERS
                .iter()
                .any(|c| n.as_str() == *c || (c.ends_with('-') && n.starts_with(*c)))
        })
    {
        return Err(format!(
            "{name:?} as a header to read: credentials and the gateway's identity headers are \
             never passed to a module"
        ));
    }
    if names.len() > MAX_NAMED {
        return Err(format!(
            "{} {what} names, more than {MAX_NAMED}",
            names.len()
        ));
    }
    let bad = |name: &String| {
        name.is_empty()
            || name.len() > MAX_NAME_BYTES
            || (header
                && http::HeaderName::from_bytes(name.as_bytes())
                    .map_or(true, |n| n.as_str() != name.as_str()))
    };
    match names.iter().find(|n| bad(n)) {
        Some(name) => Err(format!(
            "{:?} as a {what} name: not {} of 1 to {MAX_NAME_BYTES} bytes",
            name.chars().take(MAX_NAME_BYTES).collect::<String>(),
            if header {
                "a lower-case header name"
            } else {
                "a name"
            }
        )),
        None => Ok(()),
    }
}

/// The claims `configured` names that `actor`'s token carries, as JSON text within
/// [`MAX_VALUE_BYTES`].
fn selected_claims(configured: &QuotaConfigured, actor: &Actor) -> Vec<(u8, String)> {
    let Some(claims) = actor.claims.as_deref() else {
        return Vec::new();
    };
    configured
        .claims
        .iter()
        .enumerate()
        .filter_map(|(i, name)| {
            let text = serde_json::to_string(claims.get(name)?).ok()?;
            (text.len() <= MAX_VALUE_BYTES).then_some((i as u8, text))
        })
        .collect()
}

/// The values of the headers `configured` names, in request order, within the bounds.
fn selected_headers<'a>(
    configured: &QuotaConfigured,
    headers: Option<&'a http::HeaderMap>,
) -> Vec<(u8, &'a str)> {
    let Some(headers) = headers else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (i, name) in configured.headers.iter().enumerate() {
        for value in headers.get_all(name) {
            if out.len() == MAX_HEADER_VALUES {
                return out;
            }
            if let Ok(value) = value.to_str()
                && value.len() <= MAX_VALUE_BYTES
            {
                out.push((i as u8, value));
            }
        }
    }
    out
}

fn wit_ip(ip: IpAddr) -> IpAddress {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, c, d] = v4.octets();
            IpAddress::V4((a, b, c, d))
        }
        IpAddr::V6(v6) => {
            let s = v6.segments();
            IpAddress::V6((s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]))
        }
    }
}

/// A route group's name as the `route-group` enum of `0.4.0` and `0.3.0`: a name those versions
/// did not have (a service added since) is passed as `gateway`, their value of an undeclared
/// route group.
fn earlier_group(name: &str) -> EarlierGroup {
    match name {
        "auth" => EarlierGroup::Auth,
        "db" => EarlierGroup::Db,
        "storage" => EarlierGroup::Storage,
        "functions" => EarlierGroup::Functions,
        "realtime" => EarlierGroup::Realtime,
        "notifications" => EarlierGroup::Notifications,
        "ai" => EarlierGroup::Ai,
        "provisioner" => EarlierGroup::Provisioner,
        "control" => EarlierGroup::Control,
        "management" => EarlierGroup::Management,
        _ => EarlierGroup::Gateway,
    }
}

/// `input` lowered into `quota-request` with only `inputs` passed (the others empty), handed
/// to `call`.
fn lowered<R>(
    configured: &QuotaConfigured,
    input: QuotaInput<'_>,
    inputs: Inputs,
    call: impl FnOnce(QuotaRequestRef<'_, &str>) -> R,
) -> R {
    let actor = input.actor;
    fn pick(inputs: Inputs, bit: usize, value: &Option<String>) -> Option<&str> {
        value.as_deref().filter(|_| inputs.has(bit))
    }
    /// The value when declared, else `some("")` for a present value when its presence is
    /// declared (`has-key`, `has-user`).
    fn pick_or_presence(
        inputs: Inputs,
        bit: usize,
        presence: usize,
        value: &Option<String>,
    ) -> Option<&str> {
        if inputs.has(bit) {
            value.as_deref()
        } else {
            value.as_ref().filter(|_| inputs.has(presence)).map(|_| "")
        }
    }
    let claims: Vec<(u8, String)> = if inputs.has(10) {
        selected_claims(configured, actor)
    } else {
        Vec::new()
    };
    let claims: Vec<NamedRef<'_>> = claims
        .iter()
        .map(|(name, value)| NamedRef { name: *name, value })
        .collect();
    let headers: Vec<NamedRef<'_>> = if inputs.has(11) {
        selected_headers(configured, input.headers)
            .into_iter()
            .map(|(name, value)| NamedRef { name, value })
            .collect()
    } else {
        Vec::new()
    };
    let request = QuotaRequestRef {
        method: if inputs.has(0) {
            wit_method!(Method, input.method)
        } else {
            Method::Other
        },
        path: if inputs.has(1) { input.path } else { "" },
        route_group: if inputs.has(2) {
            input.route_group.as_str()
        } else {
            "gateway"
        },
        actor: ActorRef {
            role: if inputs.has(3) {
                match actor.role {
                    Role::Anon => ActorRole::Anon,
                    Role::Authenticated => ActorRole::Authenticated,
                    Role::ServiceRole => ActorRole::ServiceRole,
                    Role::Console => ActorRole::Console,
                }
            } else {
                ActorRole::Anon
            },
            project: pick(inputs, 4, &actor.project),
            key_id: pick_or_presence(inputs, 5, 12, &actor.key_id),
            user_id: pick_or_presence(inputs, 6, 13, &actor.user_id),
            org_role: pick(inputs, 7, &actor.org_role),
            plan: pick(inputs, 8, &actor.plan),
        },
        client_ip: actor.client_ip.filter(|_| inputs.has(9)).map(wit_ip),
        claims: &claims,
        headers: &headers,
    };
    call(request)
}

#[cfg(test)]
impl super::ExportedSchema for Quota {
    const EXPORTED: &'static str = aura_plugin_quota::SCHEMA;
    const FILE: &'static str = concat!(env!("CARGO_MANIFEST_DIR"), "/../plugins/quota/schema.json");
}

impl PolicyStage for Quota {
    type Earlier = QuotaEarlier;
    type Legacy = QuotaLegacy;
    type Configured = QuotaConfigured;
    type Input<'a> = QuotaInput<'a>;
    type Query = QuotaQuery;
    const BUILTIN: &'static [u8] = include_bytes!(concat!(env!("OUT_DIR"), "/quota.wasm"));
    type DefaultConfig = aura_plugin_quota::policy::Config;
    #[cfg(feature = "native-policies")]
    type Native = native::Quota;
    const INPUTS: &'static [&'static str] = &[
        "method",
        "path",
        "route-group",
        "role",
        "project",
        "key-id",
        "user-id",
        "org-role",
        "plan",
        "client-ip",
        "claims",
        "headers",
        "has-key",
        "has-user",
    ];

    fn configured(setup: &QuotaSetup) -> Result<(QuotaConfigured, Option<Declaration>), String> {
        check_names("claim", &setup.claims, false)?;
        check_names("header", &setup.headers, true)?;
        let headers = setup
            .headers
            .iter()
            .filter_map(|n| http::HeaderName::from_bytes(n.as_bytes()).ok())
            .collect();
        let declaration = setup
            .cache
            .as_ref()
            .map(|c| Declaration::of(c.inputs.as_array(), c.max_age_ms));
        Ok((
            QuotaConfigured {
                claims: setup.claims.clone(),
                headers,
            },
            declaration,
        ))
    }

    fn configured_legacy(_: &()) -> QuotaConfigured {
        QuotaConfigured::default()
    }

    fn query(input: QuotaInput<'_>) -> QuotaQuery {
        QuotaQuery {
            method: input.method.to_owned(),
            path: input.path.to_owned(),
            route_group: input.route_group,
            actor: input.actor.clone(),
            headers: input.headers.cloned(),
        }
    }

    fn input(query: &QuotaQuery) -> QuotaInput<'_> {
        QuotaInput {
            method: &query.method,
            path: &query.path,
            route_group: query.route_group,
            actor: &query.actor,
            headers: query.headers.as_ref(),
        }
    }

    fn subject(input: &QuotaInput<'_>) -> String {
        actor_subject(input.actor)
    }

    fn partition(input: &QuotaInput<'_>, key: &mut KeyWriter) {
        match &input.actor.project {
            Some(project) => key.partition(project),
            None => key.partition_address(input.actor.client_ip),
        };
    }

    fn key(
        input: &QuotaInput<'_>,
        configured: &QuotaConfigured,
        inputs: Inputs,
        key: &mut KeyWriter,
    ) {
        let actor = input.actor;
        if inputs.has(0) {
            key.tag(method_index(input.method));
        }
        if inputs.has(1) {
            key.str(input.path);
        }
        if inputs.has(2) {
            key.tag(input.route_group.index() as u8);
        }
        if inputs.has(3) {
            key.tag(actor.role as u8);
        }
        for (bit, value) in [
            (4, &actor.project),
            (5, &actor.key_id),
            (6, &actor.user_id),
            (7, &actor.org_role),
            (8, &actor.plan),
        ] {
            if inputs.has(bit) {
                key.opt(value.as_deref());
            }
        }
        if inputs.has(9) {
            match actor.client_ip {
                None => key.tag(0),
                Some(IpAddr::V4(v4)) => key.tag(4).bytes(&v4.octets()),
                Some(IpAddr::V6(v6)) => key.tag(6).bytes(&v6.octets()),
            };
        }
        if inputs.has(10) {
            for (name, value) in selected_claims(configured, actor) {
                key.tag(name).str(&value);
            }
            key.tag(u8::MAX);
        }
        if inputs.has(11) {
            for (name, value) in selected_headers(configured, input.headers) {
                key.tag(name).str(value);
            }
            key.tag(u8::MAX);
        }
        // Presence alone, when the value itself is not declared.
        if inputs.has(12) && !inputs.has(5) {
            key.tag(u8::from(actor.key_id.is_some()));
        }
        if inputs.has(13) && !inputs.has(6) {
            key.tag(u8::from(actor.user_id.is_some()));
        }
    }

    fn decision_bytes(decision: &QuotaDecision) -> usize {
        match decision {
            QuotaDecision::Limit(QuotaRule {
                scope: BucketScope::Named(name),
                ..
            }) => name.len(),
            _ => 0,
        }
    }

    fn request_line<'a>(input: &Self::Input<'a>) -> (&'a str, &'a str) {
        (input.method, input.path)
    }

    fn describe(decision: &QuotaDecision) -> String {
        match decision {
            QuotaDecision::Exempt => "exempt".to_owned(),
            QuotaDecision::Limit(r) => format!(
                "limit {} rate={} burst={} cost={}",
                describe_scope(&r.scope),
                r.rate_per_second,
                r.burst,
                r.cost
            ),
            QuotaDecision::Deny(d) => format!(
                "deny {} {}",
                deny_status(d.status).as_u16(),
                deny_code(d.reason)
            ),
        }
    }

    fn run(
        module: &StageModule<Self>,
        configured: &QuotaConfigured,
        request_id: Option<&str>,
        input: QuotaInput<'_>,
        inputs: Inputs,
    ) -> Result<QuotaDecision, PluginError> {
        lowered(configured, input, inputs, |request| {
            module.call(request_id, request)
        })
    }

    fn run_earlier(
        module: &StageModule<QuotaEarlier>,
        configured: &QuotaConfigured,
        request_id: Option<&str>,
        input: QuotaInput<'_>,
        inputs: Inputs,
    ) -> Result<QuotaDecision, PluginError> {
        lowered(configured, input, inputs, |request| {
            module.call(request_id, request.with_group(earlier_group))
        })
    }

    fn run_legacy(
        module: &StageModule<QuotaLegacy>,
        _: &QuotaConfigured,
        request_id: Option<&str>,
        input: QuotaInput<'_>,
    ) -> Result<QuotaDecision, PluginError> {
        use legacy::aura::gateway::types::ActorRole as Role2;
        use legacy::exports::aura::gateway::quota::QuotaDecision as Legacy;
        let actor = input.actor;
        let request = LegacyRequestRef {
            plane: QuotaLegacy::plane(actor.plane),
            method: input.method,
            path: input.path,
            route_group: input.route_group.as_str(),
            actor: LegacyActorRef {
                role: match actor.role {
                    Role::Anon => Role2::Anon,
                    Role::Authenticated => Role2::Authenticated,
                    Role::ServiceRole => Role2::ServiceRole,
                    Role::Console => Role2::Console,
                },
                project: actor.project.as_deref(),
                key_id: actor.key_id.as_deref(),
                user_id: actor.user_id.as_deref(),
                org_role: actor.org_role.as_deref(),
                plan: actor.plan.as_deref(),
            },
        };
        Ok(match module.call(request_id, request)? {
            Legacy::Exempt => QuotaDecision::Exempt,
            // A legacy module names its bucket: the host keeps the name in its namespace.
            Legacy::Limit(r) => QuotaDecision::Limit(QuotaRule {
                scope: BucketScope::Named(r.bucket),
                rate_per_second: r.rate_per_second,
                burst: r.burst,
                cost: r.cost,
            }),
        })
    }

    fn conformance(module: &Module<Self>) -> Result<StageReport, ConformanceError> {
        let plane = module.plane();
        let mut run = Run::new(plane, Stage::Quota);
        // Every claim and header the module reads, with two values, so that the declaration
        // is proven on each.
        let configured = module.configured();
        let claims = |value: serde_json::Value| {
            let map: serde_json::Map<String, serde_json::Value> = configured
                .claims
                .iter()
                .map(|name| (name.clone(), value.clone()))
                .collect();
            Some(std::sync::Arc::new(serde_json::Value::Object(map)))
        };
        let mut headers = http::HeaderMap::new();
        for name in &configured.headers {
            headers.append(name.clone(), http::HeaderValue::from_static("vector-a"));
        }
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
            a.client_ip = Some(IpAddr::from([203, 0, 113, 7]));
            actors.push(a);
        }
        let mut pro = actors[1].clone();
        pro.plan = Some("pro".into());
        pro.client_ip = Some("2001:db8::7".parse().expect("address"));
        pro.claims = claims(serde_json::json!("vector-a"));
        actors.push(pro);
        let mut other = actors[2].clone();
        other.key_id = Some("00000000-0000-4000-8000-000000000003".into());
        other.client_ip = Some(IpAddr::from([10, 1, 2, 3]));
        other.claims = claims(serde_json::json!(2));
        actors.push(other);
        actors.push(Actor::unauthenticated(plane));
        let groups = [
            RouteGroup::Service(crate::routes::Service::Db),
            RouteGroup::Service(crate::routes::Service::Functions),
            RouteGroup::Service(crate::routes::Service::Storage),
            RouteGroup::Gateway,
        ];
        for round in 0..4 {
            for actor in &actors {
                for group in groups {
                    let name = format!("{:?} on {}", actor.role, group.as_str());
                    let input = QuotaInput {
                        method: if round % 2 == 0 { "GET" } else { "POST" },
                        path: if round < 2 { "/v1/x" } else { "/v1/y" },
                        route_group: group,
                        actor,
                        headers: (round % 2 == 1).then_some(&headers),
                    };
                    let decision = run.call(&name, || module.vector(input))?;
                    if let QuotaDecision::Limit(r) = decision
                        && (matches!(&r.scope, BucketScope::Named(n) if n.is_empty())
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
        actor.client_ip = input
            .client_ip
            .as_deref()
            .map(|ip| {
                ip.parse()
                    .map_err(|_| format!("input.client_ip: {ip:?} is not an IP address"))
            })
            .transpose()?;
        actor.claims = input
            .claims
            .map(|c| std::sync::Arc::new(serde_json::Value::Object(c)));
        let mut headers = http::HeaderMap::new();
        for (name, value) in &input.headers {
            let name = http::HeaderName::from_bytes(name.to_ascii_lowercase().as_bytes())
                .map_err(|_| format!("input.headers: {name:?} is not a header name"))?;
            let value = http::HeaderValue::from_str(value)
                .map_err(|_| format!("input.headers: {value:?} is not a header value"))?;
            headers.append(name, value);
        }
        let route_group = RouteGroup::all()
            .find(|g| g.as_str() == input.route_group)
            .ok_or_else(|| {
                format!(
                    "input.route_group: unknown route group {:?}",
                    input.route_group
                )
            })?;
        let decision = module
            .vector(QuotaInput {
                method: &input.method,
                path: &input.path,
                route_group,
                actor: &actor,
                headers: Some(&headers),
            })
            .map_err(|e| format!("the plugin failed: {e}"))?;
        match decision {
            QuotaDecision::Exempt => decision_is(&expect.decision, "exempt"),
            QuotaDecision::Limit(rule) => {
                decision_is(&expect.decision, "limit")?;
                let scope = describe_scope(&rule.scope);
                field("scope", &expect.scope.as_deref(), &scope.as_str())?;
                field(
                    "rate_per_second",
                    &expect.rate_per_second,
                    &rule.rate_per_second,
                )?;
                field("burst", &expect.burst, &rule.burst)?;
                field("cost", &expect.cost, &rule.cost)
            }
            QuotaDecision::Deny(d) => {
                decision_is(&expect.decision, "deny")?;
                field("status", &expect.status, &deny_status(d.status).as_u16())?;
                field("code", &expect.code.as_deref(), &deny_code(d.reason))
            }
        }
    }

    #[cfg(feature = "native-policies")]
    fn native(
        native: &Self::Native,
        configured: &QuotaConfigured,
        input: QuotaInput<'_>,
    ) -> QuotaDecision {
        let claims = selected_claims(configured, input.actor);
        native.decide(input.route_group.as_str(), input.actor, &claims)
    }
}

/// A bucket scope as text: `key`, `user`, `console_user`, `project`, `client_ip` or
/// `named:<name>`.
pub fn describe_scope(scope: &BucketScope) -> String {
    match scope {
        BucketScope::Key => "key".to_owned(),
        BucketScope::User => "user".to_owned(),
        BucketScope::ConsoleUser => "console_user".to_owned(),
        BucketScope::Project => "project".to_owned(),
        BucketScope::ClientIp => "client_ip".to_owned(),
        BucketScope::Named(name) => format!("named:{name}"),
    }
}

/// The HTTP status of a denial.
pub fn deny_status(status: DenyStatus) -> http::StatusCode {
    match status {
        DenyStatus::Forbidden => http::StatusCode::FORBIDDEN,
        DenyStatus::TooManyRequests => http::StatusCode::TOO_MANY_REQUESTS,
    }
}

/// The JSON error `code` of a denial.
pub fn deny_code(reason: DenyReason) -> &'static str {
    match reason {
        DenyReason::AddressDenied => "address_denied",
        DenyReason::AddressNotAllowed => "address_not_allowed",
        DenyReason::ClaimDenied => "claim_denied",
        DenyReason::QuotaExceeded => "quota_exceeded",
        DenyReason::PolicyDenied => "policy_denied",
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
    client_ip: Option<String>,
    claims: Option<serde_json::Map<String, serde_json::Value>>,
    #[serde(default)]
    headers: Vec<(String, String)>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct QuotaExpect {
    decision: String,
    scope: Option<String>,
    rate_per_second: Option<u32>,
    burst: Option<u32>,
    cost: Option<u32>,
    status: Option<u16>,
    code: Option<String>,
}

/// The default policy compiled into the host (`--features native-policies`, benchmarks only).
#[cfg(feature = "native-policies")]
pub mod native {
    use aura_plugin_quota::policy as quota;

    use super::{BucketScope, DenyReason, DenyStatus, QuotaDecision, QuotaDenial, QuotaRule};
    use crate::actor::{Actor, Role};
    use crate::policy::stages::native::native_policy;

    native_policy!(Quota(quota::Policy), |_, config| quota::Policy::configure(
        config
    ));

    impl Quota {
        pub(crate) fn decide(
            &self,
            route_group: &str,
            actor: &Actor,
            claims: &[(u8, String)],
        ) -> QuotaDecision {
            let a = quota::Actor {
                role: match actor.role {
                    Role::Anon => quota::Role::Anon,
                    Role::Authenticated => quota::Role::Authenticated,
                    Role::ServiceRole => quota::Role::ServiceRole,
                    Role::Console => quota::Role::Console,
                },
                has_key: actor.key_id.is_some(),
                has_user: actor.user_id.is_some(),
                plan: actor.plan.as_deref(),
            };
            let claims: Vec<(u8, &str)> = claims.iter().map(|(n, v)| (*n, v.as_str())).collect();
            match self.0.decide(route_group, a, actor.client_ip, &claims) {
                quota::Outcome::Exempt => QuotaDecision::Exempt,
                quota::Outcome::Limit(r) => QuotaDecision::Limit(QuotaRule {
                    scope: match r.scope {
                        quota::Scope::Key => BucketScope::Key,
                        quota::Scope::User => BucketScope::User,
                        quota::Scope::ConsoleUser => BucketScope::ConsoleUser,
                    },
                    rate_per_second: r.rate_per_second,
                    burst: r.burst,
                    cost: r.cost,
                }),
                quota::Outcome::Deny(reason) => QuotaDecision::Deny(QuotaDenial {
                    status: DenyStatus::Forbidden,
                    reason: match reason {
                        quota::Denied::Address => DenyReason::AddressDenied,
                        quota::Denied::NotAllowed => DenyReason::AddressNotAllowed,
                        quota::Denied::Claim => DenyReason::ClaimDenied,
                    },
                    retry_after_seconds: 0,
                }),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plane::Plane;

    fn configured(claims: &[&str], headers: &[&'static str]) -> QuotaConfigured {
        QuotaConfigured {
            claims: claims.iter().map(|c| (*c).to_owned()).collect(),
            headers: headers
                .iter()
                .map(|h| http::HeaderName::from_static(h))
                .collect(),
        }
    }

    #[test]
    fn only_named_headers_within_bounds_are_passed() {
        let c = configured(&[], &["x-tier", "x-team"]);
        let mut h = http::HeaderMap::new();
        h.append("x-team", http::HeaderValue::from_static("blue"));
        h.append("x-other", http::HeaderValue::from_static("never"));
        h.append("x-tier", http::HeaderValue::from_static("gold"));
        let long = "v".repeat(MAX_VALUE_BYTES + 1);
        h.append("x-tier", http::HeaderValue::from_str(&long).expect("value"));
        h.append(
            "x-tier",
            http::HeaderValue::from_bytes(b"caf\xe9").expect("value"),
        );
        // By the position of the name, the named ones only; too long or not text: left out.
        assert_eq!(
            selected_headers(&c, Some(&h)),
            vec![(0, "gold"), (1, "blue")]
        );
        for n in 0..100 {
            h.append(
                "x-team",
                http::HeaderValue::from_str(&n.to_string()).expect("value"),
            );
        }
        assert_eq!(selected_headers(&c, Some(&h)).len(), MAX_HEADER_VALUES);
        assert!(selected_headers(&c, None).is_empty());
    }

    #[test]
    fn only_named_claims_within_bounds_are_passed_as_json() {
        let c = configured(&["tier", "org", "big"], &[]);
        let mut actor = Actor::unauthenticated(Plane::Data);
        assert!(selected_claims(&c, &actor).is_empty(), "no token");
        actor.claims = Some(std::sync::Arc::new(serde_json::json!({
            "tier": "gold", "org": 7, "secret": "never", "big": "b".repeat(MAX_VALUE_BYTES),
        })));
        assert_eq!(
            selected_claims(&c, &actor),
            vec![(0, "\"gold\"".to_owned()), (1, "7".to_owned())]
        );
    }

    #[test]
    fn presence_alone_keeps_one_decision_for_every_key_and_user_of_a_project() {
        let c = configured(&[], &[]);
        let key_of = |inputs: Inputs, key_id: Option<&str>, user_id: Option<&str>| {
            let mut actor = Actor::unauthenticated(Plane::Data);
            actor.project = Some("p".to_owned());
            actor.key_id = key_id.map(str::to_owned);
            actor.user_id = user_id.map(str::to_owned);
            let input = QuotaInput {
                method: "GET",
                path: "/v1/db/rest/v1/t",
                route_group: RouteGroup::Gateway,
                actor: &actor,
                headers: None,
            };
            let mut key = KeyWriter::default();
            Quota::partition(&input, &mut key);
            Quota::key(&input, &c, inputs, &mut key);
            key
        };
        let presence = Inputs::from_bits(0).with(12).with(13);
        // One entry whichever key or user: only whether there is one.
        assert_eq!(
            key_of(presence, Some("k1"), Some("u1")),
            key_of(presence, Some("k2"), Some("u2"))
        );
        assert_ne!(
            key_of(presence, Some("k1"), None),
            key_of(presence, None, None)
        );
        assert_ne!(
            key_of(presence, Some("k1"), Some("u1")),
            key_of(presence, Some("k1"), None)
        );
        // The value declared too: one entry per value.
        let values = presence.with(5).with(6);
        assert_ne!(
            key_of(values, Some("k1"), Some("u1")),
            key_of(values, Some("k2"), Some("u1"))
        );
        assert_ne!(
            key_of(values, Some("k1"), Some("u1")),
            key_of(values, Some("k1"), Some("u2"))
        );
    }

    #[test]
    fn a_module_naming_too_many_or_bad_claims_and_headers_is_refused() {
        let names = |n: usize| (0..n).map(|i| format!("n{i}")).collect::<Vec<_>>();
        assert!(check_names("claim", &names(MAX_NAMED), false).is_ok());
        assert!(check_names("claim", &names(MAX_NAMED + 1), false).is_err());
        assert!(check_names("claim", &["".to_owned()], false).is_err());
        assert!(check_names("claim", &["c".repeat(MAX_NAME_BYTES + 1)], false).is_err());
        assert!(check_names("header", &["X-Upper".to_owned()], true).is_err());
        assert!(check_names("header", &["bad header".to_owned()], true).is_err());
        assert!(check_names("header", &["x-ok".to_owned()], true).is_ok());
        for credential in [
            "authorization",
            "cookie",
            "apikey",
            "x-api-key",
            "x-aura-role",
        ] {
            let refused = check_names("header", &[credential.to_owned()], true);
            assert!(
                refused.is_err_and(|e| e.contains("credentials")),
                "{credential}"
            );
        }
    }
}
