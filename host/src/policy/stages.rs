//! One typed wrapper per stage: converts the host's request data to the stage's WIT records,
//! runs the call under the runtime's limits, and returns the plugin's typed decision.

use std::sync::Arc;

use wasmtime::Store;
use wasmtime::component::{Component, ComponentType, Lower, TypedFunc};

use super::bindings;
use super::engine::{Decide, Owner, PluginState, PolicyEngine, StageModule, StageWorld};
use super::{PluginError, Stage};
use crate::actor::{Actor, Role};
use crate::plane::Plane;

pub use bindings::api_key::exports::aura::gateway::api_key::{
    Credential, KeyDecision, KeyRequest, KeyRole, KeySource,
};
pub use bindings::cors::exports::aura::gateway::cors::{CorsAllow, CorsDecision};
pub use bindings::db_routing::exports::aura::gateway::db_routing::{
    DbEngine, DbRoute, ProjectDb, Topology,
};
pub use bindings::quota::exports::aura::gateway::quota::{QuotaDecision, QuotaRule};

use bindings::quota::aura::gateway::types::{ActorRole, Plane as QuotaPlane};

/// `key-request`, borrowed: method, path and header values point into the request head.
#[derive(Debug, Clone, Copy, ComponentType, Lower)]
#[component(record)]
pub(crate) struct KeyRequestRef<'a> {
    #[component(name = "method")]
    method: &'a str,
    #[component(name = "path")]
    path: &'a str,
    #[component(name = "query-keys")]
    query_keys: &'a [String],
    #[component(name = "headers")]
    headers: &'a [(&'a str, &'a str)],
}

/// `actor` of the `quota` stage, borrowed from the request's [`Actor`].
#[derive(Debug, Clone, Copy, ComponentType, Lower)]
#[component(record)]
pub(crate) struct ActorRef<'a> {
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
pub(crate) struct QuotaRequestRef<'a> {
    #[component(name = "plane")]
    plane: QuotaPlane,
    #[component(name = "method")]
    method: &'a str,
    #[component(name = "path")]
    path: &'a str,
    #[component(name = "route-group")]
    route_group: &'a str,
    #[component(name = "actor")]
    actor: ActorRef<'a>,
}

/// `cors-request`, borrowed.
#[derive(Debug, Clone, Copy, ComponentType, Lower)]
#[component(record)]
pub(crate) struct CorsRequestRef<'a> {
    #[component(name = "plane")]
    plane: bindings::cors::aura::gateway::types::Plane,
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

/// `db-request`, borrowed.
#[derive(Debug, Clone, ComponentType, Lower)]
#[component(record)]
pub(crate) struct DbRequestRef<'a> {
    #[component(name = "plane")]
    plane: bindings::db_routing::aura::gateway::types::Plane,
    #[component(name = "method")]
    method: &'a str,
    #[component(name = "path")]
    path: &'a str,
    #[component(name = "project")]
    project: Option<ProjectDb>,
}

/// Declares the [`StageWorld`] of one stage: its generated types, the request borrowed where it
/// can be.
macro_rules! stage_world {
    ($world:ident, $module:ident, $stage:expr, $interface:literal, $decide:literal, $setup:ty, $lt:lifetime, $request:ty, $decision:ty $(, check = $check:path)?) => {
        /// The runtime's view of the stage.
        #[derive(Debug)]
        pub(crate) struct $world;

        impl StageWorld for $world {
            const STAGE: Stage = $stage;
            const INTERFACE: &'static str = $interface;
            const DECIDE: &'static str = $decide;
            type Plane = bindings::$module::aura::gateway::types::Plane;
            type Setup = $setup;
            type Request<$lt> = $request;
            type Decision = $decision;

            fn plane(plane: Plane) -> Self::Plane {
                match plane {
                    Plane::Data => Self::Plane::Data,
                    Plane::Management => Self::Plane::Management,
                }
            }

            fn call<'a>(
                decide: &Decide<Self>,
                store: &mut Store<PluginState>,
                request: Self::Request<'a>,
            ) -> wasmtime::Result<(Self::Decision,)> {
                // Covariance: the function checked for `'static` inputs takes `'a` ones.
                let decide: &TypedFunc<(Self::Request<'a>,), (Self::Decision,)> = decide;
                decide.call(store, (request,))
            }

            $(
                fn check_setup(setup: &Self::Setup) -> Result<(), String> {
                    $check(setup)
                }
            )?
        }
    };
}

stage_world!(
    ApiKeyWorld,
    api_key,
    Stage::ApiKey,
    "api-key",
    "extract",
    Vec<String>,
    'a,
    KeyRequestRef<'a>,
    KeyDecision,
    check = check_key_headers
);

/// At most this many header names for the `api-key` stage to read: every request is searched
/// for each, and each is removed from every request.
pub const MAX_KEY_HEADERS: usize = 16;
/// The longest header name the `api-key` stage may ask to read, in bytes.
pub const MAX_KEY_HEADER_NAME_BYTES: usize = 64;

/// Bounds the header names an `api-key` module asks to read (its `configure` answer).
fn check_key_headers(names: &[String]) -> Result<(), String> {
    if names.len() > MAX_KEY_HEADERS {
        return Err(format!(
            "{} header names to read, more than {MAX_KEY_HEADERS}",
            names.len()
        ));
    }
    let bad = |name: &String| {
        name.is_empty()
            || name.len() > MAX_KEY_HEADER_NAME_BYTES
            || http::HeaderName::from_bytes(name.as_bytes())
                .map_or(true, |n| n.as_str() != name.as_str())
    };
    match names.iter().find(|n| bad(n)) {
        Some(name) => Err(format!(
            "{:?} as a header name to read: not a lower-case header name of 1 to \
             {MAX_KEY_HEADER_NAME_BYTES} bytes",
            name.chars()
                .take(MAX_KEY_HEADER_NAME_BYTES)
                .collect::<String>()
        )),
        None => Ok(()),
    }
}
stage_world!(
    CorsWorld,
    cors,
    Stage::Cors,
    "cors",
    "decide",
    (),
    'a,
    CorsRequestRef<'a>,
    CorsDecision
);
stage_world!(
    QuotaWorld,
    quota,
    Stage::Quota,
    "quota",
    "decide",
    (),
    'a,
    QuotaRequestRef<'a>,
    QuotaDecision
);
stage_world!(
    DbRoutingWorld,
    db_routing,
    Stage::DbRouting,
    "db-routing",
    "decide",
    (),
    'a,
    DbRequestRef<'a>,
    DbRoute
);

/// What [`super::Policies::load`] hands each wrapper: name, digest, compiled component, config.
pub(crate) type Loaded = (String, String, Component, String);

/// Implements the common parts of a stage wrapper.
macro_rules! wrapper {
    ($name:ident, $native:ident) => {
        impl $name {
            pub(crate) fn load(
                runtime: &Arc<PolicyEngine>,
                plane: Plane,
                (name, digest, component, config): Loaded,
                owner: Owner,
            ) -> Result<Self, PluginError> {
                #[cfg(feature = "native-policies")]
                let native = super::native::$native::load(&name, plane, &config);
                Ok(Self {
                    module: StageModule::load(
                        runtime.clone(),
                        plane,
                        name,
                        digest,
                        &component,
                        config,
                        owner,
                    )?,
                    #[cfg(feature = "native-policies")]
                    native,
                })
            }

            /// The module's name (`builtin` or its path).
            pub fn module_name(&self) -> &str {
                self.module.name()
            }

            /// SHA-256 of the module, hex.
            pub fn digest(&self) -> &str {
                self.module.digest()
            }

            /// Calls, failures and call times since the module was loaded.
            pub fn report(&self) -> super::stats::ModuleReport {
                self.module.report()
            }

            /// The `aura:gateway` version the module was written against.
            pub fn wit_version(&self) -> &'static str {
                self.module.wit_version()
            }

            /// Starts a new failure window for the automatic rollback.
            pub fn reset_health(&self) {
                self.module.reset_health()
            }

            /// Whether the module fails too often in the current window (the automatic
            /// rollback's thresholds, `plugins.rollback_*`).
            pub fn failing_too_often(&self) -> bool {
                self.module.failing()
            }

            /// The largest linear memory an instance of the module has had, in bytes.
            pub fn peak_memory(&self) -> usize {
                self.module.peak_memory()
            }
        }
    };
}

macro_rules! tried {
    ($name:ident) => {
        impl super::rollout::Tried for $name {
            fn digest(&self) -> &str {
                self.module.digest()
            }
            fn failing_too_often(&self) -> bool {
                self.module.failing()
            }
            fn report(&self) -> super::stats::ModuleReport {
                self.module.report()
            }
        }
    };
}

/// The loaded `api-key` stage of the data plane.
#[derive(Debug)]
pub struct ApiKeyStage {
    module: StageModule<ApiKeyWorld>,
    #[cfg(feature = "native-policies")]
    native: Option<super::native::ApiKey>,
}
wrapper!(ApiKeyStage, ApiKey);
tried!(ApiKeyStage);

impl ApiKeyStage {
    /// The lower-case header names the plugin asked to see.
    pub fn headers(&self) -> &[String] {
        self.module.setup()
    }

    /// Extracts the credential of a request head (`request_id` goes with the plugin's log
    /// lines): only the headers the plugin asked for, and the `apikey` query values. The input
    /// is borrowed from the head; a header value that is not UTF-8 takes [`Self::extract`]'s
    /// way, with the invalid bytes replaced.
    pub fn extract_head(
        &self,
        request_id: Option<&str>,
        method: &str,
        uri: &http::Uri,
        headers: &http::HeaderMap,
    ) -> Result<KeyDecision, PluginError> {
        let wanted = self.headers();
        let query_keys = crate::proxy::envelope::apikey_query_values(uri.query());
        let mut pairs: Vec<(&str, &str)> = Vec::new();
        for (name, value) in headers {
            let name = name.as_str();
            if !wanted.iter().any(|w| w == name) {
                continue;
            }
            match std::str::from_utf8(value.as_bytes()) {
                Ok(value) => pairs.push((name, value)),
                Err(_) => {
                    return self.extract(request_id, self.lossy_request(method, uri, headers));
                }
            }
        }
        self.extract_borrowed(
            request_id,
            KeyRequestRef {
                method,
                path: uri.path(),
                query_keys: &query_keys,
                headers: &pairs,
            },
        )
    }

    /// The stage's input as owned strings, values that are not UTF-8 passed lossily.
    fn lossy_request(
        &self,
        method: &str,
        uri: &http::Uri,
        headers: &http::HeaderMap,
    ) -> KeyRequest {
        let wanted = self.headers();
        KeyRequest {
            method: method.to_owned(),
            path: uri.path().to_owned(),
            query_keys: crate::proxy::envelope::apikey_query_values(uri.query()),
            headers: headers
                .iter()
                .filter(|(name, _)| wanted.iter().any(|w| w == name.as_str()))
                .map(|(name, value)| {
                    (
                        name.as_str().to_owned(),
                        String::from_utf8_lossy(value.as_bytes()).into_owned(),
                    )
                })
                .collect(),
        }
    }

    /// Extracts the credential of one request given as the WIT record (`request_id` goes with
    /// the plugin's log lines).
    pub fn extract(
        &self,
        request_id: Option<&str>,
        request: KeyRequest,
    ) -> Result<KeyDecision, PluginError> {
        let pairs: Vec<(&str, &str)> = request
            .headers
            .iter()
            .map(|(name, value)| (name.as_str(), value.as_str()))
            .collect();
        self.extract_borrowed(
            request_id,
            KeyRequestRef {
                method: &request.method,
                path: &request.path,
                query_keys: &request.query_keys,
                headers: &pairs,
            },
        )
    }

    fn extract_borrowed(
        &self,
        request_id: Option<&str>,
        request: KeyRequestRef<'_>,
    ) -> Result<KeyDecision, PluginError> {
        #[cfg(feature = "native-policies")]
        if let Some(native) = &self.native {
            return Ok(native.extract(request.path, request.query_keys, request.headers));
        }
        self.module.call(request_id, request)
    }
}

/// The loaded `cors` stage of a plane.
#[derive(Debug)]
pub struct CorsStage {
    module: StageModule<CorsWorld>,
    #[cfg(feature = "native-policies")]
    native: Option<super::native::Cors>,
}
wrapper!(CorsStage, Cors);
tried!(CorsStage);

impl CorsStage {
    /// Decides the CORS answer for one request with an `Origin` (`request_id` goes with the
    /// plugin's log lines).
    pub fn decide(
        &self,
        request_id: Option<&str>,
        plane: Plane,
        request: CorsInput<'_>,
    ) -> Result<CorsDecision, PluginError> {
        use bindings::cors::aura::gateway::types::Plane as WitPlane;
        #[cfg(feature = "native-policies")]
        if let Some(native) = &self.native {
            return Ok(native.decide(request.origin, request.request_method.is_some()));
        }
        let request = CorsRequestRef {
            plane: match plane {
                Plane::Data => WitPlane::Data,
                Plane::Management => WitPlane::Management,
            },
            method: request.method,
            path: request.path,
            origin: request.origin,
            request_method: request.request_method,
            request_headers: request.request_headers,
        };
        self.module.call(request_id, request)
    }
}

/// What the host knows of a request for the CORS stage.
#[derive(Debug, Clone, Copy)]
pub struct CorsInput<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub origin: &'a str,
    pub request_method: Option<&'a str>,
    pub request_headers: Option<&'a str>,
}

/// [`CorsInput`] with owned strings, for a call run on another thread.
#[derive(Debug, Clone)]
pub struct CorsQuery {
    pub method: String,
    pub path: String,
    pub origin: String,
    pub request_method: Option<String>,
    pub request_headers: Option<String>,
}

impl From<CorsInput<'_>> for CorsQuery {
    fn from(input: CorsInput<'_>) -> Self {
        Self {
            method: input.method.to_owned(),
            path: input.path.to_owned(),
            origin: input.origin.to_owned(),
            request_method: input.request_method.map(str::to_owned),
            request_headers: input.request_headers.map(str::to_owned),
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
        }
    }
}

/// The loaded `quota` stage of a plane.
#[derive(Debug)]
pub struct QuotaStage {
    module: StageModule<QuotaWorld>,
    #[cfg(feature = "native-policies")]
    native: Option<super::native::Quota>,
}
wrapper!(QuotaStage, Quota);
tried!(QuotaStage);

impl QuotaStage {
    /// The quota rule of one request (`request_id` goes with the plugin's log lines).
    pub fn decide(
        &self,
        request_id: Option<&str>,
        method: &str,
        path: &str,
        route_group: &str,
        actor: &Actor,
    ) -> Result<QuotaDecision, PluginError> {
        #[cfg(feature = "native-policies")]
        if let Some(native) = &self.native {
            return Ok(native.decide(route_group, actor));
        }
        let request = QuotaRequestRef {
            plane: match actor.plane {
                Plane::Data => QuotaPlane::Data,
                Plane::Management => QuotaPlane::Management,
            },
            method,
            path,
            route_group,
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
        self.module.call(request_id, request)
    }
}

/// The loaded `db-routing` stage of a plane.
#[derive(Debug)]
pub struct DbRoutingStage {
    module: StageModule<DbRoutingWorld>,
    #[cfg(feature = "native-policies")]
    native: Option<super::native::DbRouting>,
}
wrapper!(DbRoutingStage, DbRouting);
tried!(DbRoutingStage);

impl DbRoutingStage {
    /// Where one `/v1/db/*` request goes (`request_id` goes with the plugin's log lines).
    pub fn decide(
        &self,
        request_id: Option<&str>,
        plane: Plane,
        method: &str,
        path: &str,
        project: Option<ProjectDb>,
    ) -> Result<DbRoute, PluginError> {
        use bindings::db_routing::aura::gateway::types::Plane as WitPlane;
        #[cfg(feature = "native-policies")]
        if let Some(native) = &self.native {
            return Ok(native.decide(method, path, project.as_ref()));
        }
        let request = DbRequestRef {
            plane: match plane {
                Plane::Data => WitPlane::Data,
                Plane::Management => WitPlane::Management,
            },
            method,
            path,
            project,
        };
        self.module.call(request_id, request)
    }
}
