//! The `cors` stage: the CORS answer to a request with an `Origin`, on both planes. Projects may
//! install their own module (data plane), and a candidate may be tried.

use std::net::IpAddr;

use serde::Deserialize;
use wasmtime::component::{ComponentType, Lower};

use super::conformance::{ConformanceError, Run, StageReport};
use super::vectors::{decision_is, field, get, parse, sample_path};
use super::{Declaration, Inputs, Module, PolicyStage, stage_world, wit_method};
use crate::plane::Plane;
use crate::policy::PluginError;
use crate::policy::runtime::decision_cache::KeyWriter;
use crate::policy::runtime::engine::StageModule;
use crate::stage::Stage;

/// The generated types of the `cors` world (`cors-stage` in `wit/gateway.wit`).
pub(crate) mod world {
    wasmtime::component::bindgen!({ path: "../wit", world: "cors-stage", additional_derives: [PartialEq, Eq] });
}

/// The generated types of the `cors` world before `0.3.0` (`wit/0.2.0/gateway.wit`).
pub(crate) mod legacy {
    wasmtime::component::bindgen!({ path: "../wit/0.2.0", world: "cors-stage", additional_derives: [PartialEq, Eq] });
}

use world::aura::gateway::types::Method;
use world::exports::aura::gateway::cors::CorsCache;
pub use world::exports::aura::gateway::cors::{CorsAllow, CorsDecision};

/// The `cors` stage.
#[derive(Debug)]
pub struct Cors;

/// The `cors` stage's modules written against `0.2.0` or `0.1.0`.
#[derive(Debug)]
pub struct CorsLegacy;

/// `cors-request`, borrowed.
#[derive(Debug, Clone, Copy, ComponentType, Lower)]
#[component(record)]
pub struct CorsRequestRef<'a> {
    #[component(name = "method")]
    method: Method,
    #[component(name = "path")]
    path: &'a str,
    #[component(name = "origin")]
    origin: &'a str,
    #[component(name = "request-method")]
    request_method: Option<&'a str>,
    #[component(name = "request-headers")]
    request_headers: Option<&'a str>,
}

stage_world!(
    Cors,
    cors::world,
    Stage::Cors,
    "decide",
    Option<CorsCache>,
    'a,
    CorsRequestRef<'a>,
    CorsDecision
);

/// The legacy `cors-request`, borrowed.
#[derive(Debug, Clone, Copy, ComponentType, Lower)]
#[component(record)]
pub struct LegacyRequestRef<'a> {
    #[component(name = "plane")]
    plane: legacy::aura::gateway::types::Plane,
    #[component(name = "method")]
    method: &'a str,
    #[component(name = "path")]
    path: &'a str,
    #[component(name = "origin")]
    origin: &'a str,
    #[component(name = "request-method")]
    request_method: Option<&'a str>,
    #[component(name = "request-headers")]
    request_headers: Option<&'a str>,
}

stage_world!(
    CorsLegacy,
    cors::legacy,
    Stage::Cors,
    "decide",
    (),
    'a,
    LegacyRequestRef<'a>,
    legacy::exports::aura::gateway::cors::CorsDecision
);

/// What the host knows of a request for the CORS stage.
#[derive(Debug, Clone, Copy)]
pub struct CorsInput<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub origin: &'a str,
    pub request_method: Option<&'a str>,
    pub request_headers: Option<&'a str>,
    /// The client's address: a canary's subject (the actor is not known yet on a preflight, and
    /// a browser's preflight and its request come from the same address).
    pub client: Option<IpAddr>,
}

/// [`CorsInput`] with owned strings, for a call run on another thread.
#[derive(Debug, Clone)]
pub struct CorsQuery {
    pub method: String,
    pub path: String,
    pub origin: String,
    pub request_method: Option<String>,
    pub request_headers: Option<String>,
    pub client: Option<IpAddr>,
}

impl From<CorsInput<'_>> for CorsQuery {
    fn from(input: CorsInput<'_>) -> Self {
        Self {
            method: input.method.to_owned(),
            path: input.path.to_owned(),
            origin: input.origin.to_owned(),
            request_method: input.request_method.map(str::to_owned),
            request_headers: input.request_headers.map(str::to_owned),
            client: input.client,
        }
    }
}

impl CorsQuery {
    /// The borrowed form.
    pub fn input(&self) -> CorsInput<'_> {
        CorsInput {
            method: &self.method,
            path: &self.path,
            origin: &self.origin,
            request_method: self.request_method.as_deref(),
            request_headers: self.request_headers.as_deref(),
            client: self.client,
        }
    }
}

/// The canary subject of a client address (`-` when unknown).
pub(crate) fn client_subject(client: Option<IpAddr>) -> String {
    client.map_or_else(|| "-".to_owned(), |ip| ip.to_string())
}

#[cfg(test)]
impl super::ExportedSchema for Cors {
    const EXPORTED: &'static str = aura_plugin_cors::SCHEMA;
    const FILE: &'static str = concat!(env!("CARGO_MANIFEST_DIR"), "/../plugins/cors/schema.json");
}

impl PolicyStage for Cors {
    type Earlier = Self;
    type Legacy = CorsLegacy;
    type Configured = ();
    type Input<'a> = CorsInput<'a>;
    type Query = CorsQuery;
    const BUILTIN: &'static [u8] = include_bytes!(concat!(env!("OUT_DIR"), "/cors.wasm"));
    type DefaultConfig = aura_plugin_cors::policy::Config;
    #[cfg(feature = "native-policies")]
    type Native = native::Cors;
    const INPUTS: &'static [&'static str] = &[
        "method",
        "path",
        "origin",
        "request-method",
        "request-headers",
    ];

    fn configured(setup: &Option<CorsCache>) -> Result<((), Option<Declaration>), String> {
        Ok((
            (),
            setup
                .as_ref()
                .map(|c| Declaration::of(c.inputs.as_array(), c.max_age_ms)),
        ))
    }

    fn configured_legacy(_: &()) {}

    fn partition(input: &CorsInput<'_>, key: &mut KeyWriter) {
        key.partition_address(input.client);
    }

    fn key(input: &CorsInput<'_>, _: &(), inputs: Inputs, key: &mut KeyWriter) {
        if inputs.has(0) {
            key.tag(super::method_index(input.method));
        }
        if inputs.has(1) {
            key.str(input.path);
        }
        if inputs.has(2) {
            key.str(input.origin);
        }
        if inputs.has(3) {
            key.opt(input.request_method);
        }
        if inputs.has(4) {
            key.opt(input.request_headers);
        }
    }

    fn decision_bytes(decision: &CorsDecision) -> usize {
        match decision {
            CorsDecision::Deny => 0,
            CorsDecision::Allow(a) => {
                let list = |l: &[String]| l.iter().map(|s| s.len() + 24).sum::<usize>();
                a.allow_origin.len()
                    + list(&a.allow_methods)
                    + list(&a.allow_headers)
                    + list(&a.expose_headers)
            }
        }
    }

    fn query(input: CorsInput<'_>) -> CorsQuery {
        CorsQuery::from(input)
    }

    fn input(query: &CorsQuery) -> CorsInput<'_> {
        query.input()
    }

    fn subject(input: &CorsInput<'_>) -> String {
        client_subject(input.client)
    }

    fn request_line<'a>(input: &Self::Input<'a>) -> (&'a str, &'a str) {
        (input.method, input.path)
    }

    fn describe(decision: &CorsDecision) -> String {
        match decision {
            CorsDecision::Deny => "deny".to_owned(),
            CorsDecision::Allow(a) => format!(
                "allow origin={} methods={} headers={} expose={} max_age={}",
                a.allow_origin,
                a.allow_methods.join(","),
                a.allow_headers.join(","),
                a.expose_headers.join(","),
                a.max_age.map_or_else(|| "-".to_owned(), |s| s.to_string()),
            ),
        }
    }

    fn run(
        module: &StageModule<Self>,
        _: &(),
        request_id: Option<&str>,
        input: CorsInput<'_>,
        inputs: Inputs,
    ) -> Result<CorsDecision, PluginError> {
        let request = CorsRequestRef {
            method: if inputs.has(0) {
                wit_method!(Method, input.method)
            } else {
                Method::Other
            },
            path: if inputs.has(1) { input.path } else { "" },
            origin: if inputs.has(2) { input.origin } else { "" },
            request_method: input.request_method.filter(|_| inputs.has(3)),
            request_headers: input.request_headers.filter(|_| inputs.has(4)),
        };
        module.call(request_id, request)
    }

    fn run_legacy(
        module: &StageModule<CorsLegacy>,
        _: &(),
        request_id: Option<&str>,
        input: CorsInput<'_>,
    ) -> Result<CorsDecision, PluginError> {
        use legacy::exports::aura::gateway::cors::CorsDecision as Legacy;
        let request = LegacyRequestRef {
            plane: <CorsLegacy as crate::policy::runtime::engine::StageWorld>::plane(
                module.plane(),
            ),
            method: input.method,
            path: input.path,
            origin: input.origin,
            request_method: input.request_method,
            request_headers: input.request_headers,
        };
        Ok(match module.call(request_id, request)? {
            Legacy::Deny => CorsDecision::Deny,
            Legacy::Allow(a) => CorsDecision::Allow(CorsAllow {
                allow_origin: a.allow_origin,
                allow_methods: a.allow_methods,
                allow_headers: a.allow_headers,
                expose_headers: a.expose_headers,
                max_age: a.max_age,
            }),
        })
    }

    fn conformance(module: &Module<Self>) -> Result<StageReport, ConformanceError> {
        let plane = module.plane();
        let mut run = Run::new(plane, Stage::Cors);
        let origins = [
            "https://app.example.com",
            "http://localhost:3000",
            "null",
            "https://a-very-long-subdomain.of.an.example.org:8443",
        ];
        for round in 0..4 {
            for origin in origins {
                for preflight in [true, false] {
                    let name = format!("{origin} preflight={preflight}");
                    let decision = run.call(&name, || {
                        module.vector(CorsInput {
                            method: match (preflight, round % 2) {
                                (true, _) => "OPTIONS",
                                (false, 0) => "GET",
                                (false, _) => "POST",
                            },
                            path: if round < 2 {
                                "/v1/db/todos"
                            } else {
                                "/v1/storage/x"
                            },
                            origin,
                            request_method: preflight.then_some("POST"),
                            request_headers: preflight.then_some("content-type, apikey"),
                            client: None,
                        })
                    })?;
                    if let CorsDecision::Allow(a) = decision {
                        if a.allow_origin != "*" && a.allow_origin != origin {
                            return Err(run.fail(
                                &name,
                                "allow-origin must be \"*\" or the request's origin",
                            ));
                        }
                        if plane == Plane::Management && a.allow_origin == "*" {
                            return Err(
                                run.fail(&name, "the management plane may never allow \"*\"")
                            );
                        }
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
        let input: CorsCase = parse(input, "input")?;
        let expect: CorsExpect = parse(expect, "expect")?;
        let decision = module
            .vector(CorsInput {
                method: &input.method,
                path: &input.path,
                origin: &input.origin,
                request_method: input.request_method.as_deref(),
                request_headers: input.request_headers.as_deref(),
                client: None,
            })
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

    #[cfg(feature = "native-policies")]
    fn native(native: &Self::Native, _: &(), input: CorsInput<'_>) -> CorsDecision {
        native.decide(input.origin, input.request_method.is_some())
    }
}

/// An author's case input.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CorsCase {
    #[serde(default = "get")]
    method: String,
    #[serde(default = "sample_path")]
    path: String,
    origin: String,
    request_method: Option<String>,
    request_headers: Option<String>,
}

/// An author's case expectation.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CorsExpect {
    decision: String,
    allow_origin: Option<String>,
    allow_methods: Option<Vec<String>>,
    allow_headers: Option<Vec<String>>,
    expose_headers: Option<Vec<String>>,
    max_age: Option<u32>,
}

/// The default policy compiled into the host (`--features native-policies`, benchmarks only).
#[cfg(feature = "native-policies")]
pub mod native {
    use aura_plugin_cors::policy as cors;

    use super::{CorsAllow, CorsDecision};
    use crate::plane::Plane;
    use crate::policy::stages::native::native_policy;

    native_policy!(Cors(cors::Policy), |plane, config| {
        let plane = match plane {
            Plane::Data => cors::Plane::Data,
            Plane::Management => cors::Plane::Management,
        };
        cors::Policy::configure(plane, config)
    });

    impl Cors {
        pub(crate) fn decide(&self, origin: &str, preflight: bool) -> CorsDecision {
            match self.0.decide(origin, preflight) {
                None => CorsDecision::Deny,
                Some(a) => CorsDecision::Allow(CorsAllow {
                    allow_origin: a.allow_origin,
                    allow_methods: a.allow_methods,
                    allow_headers: a.allow_headers,
                    expose_headers: a.expose_headers,
                    max_age: a.max_age,
                }),
            }
        }
    }
}
