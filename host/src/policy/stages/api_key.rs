//! The `api-key` stage: which credential a data-plane request carries. Its `configure` names the
//! headers it reads; the host passes it only those, and removes them from every request.

use std::borrow::Cow;
use std::net::IpAddr;
use std::sync::Arc;

use serde::Deserialize;
use wasmtime::component::{ComponentType, Lower};

use super::conformance::{ConformanceError, Run, StageReport};
use super::vectors::{decision_is, field, get, parse, sample_path};
use super::{Declaration, Inputs, Module, NamedRef, PolicyStage, stage_world, wit_method};
use crate::policy::PluginError;
use crate::policy::runtime::decision_cache::KeyWriter;
use crate::policy::runtime::engine::StageModule;
use crate::stage::Stage;

/// The generated types of the `api-key` world (`api-key-stage` in `wit/gateway.wit`).
pub(crate) mod world {
    wasmtime::component::bindgen!({ path: "../wit", world: "api-key-stage", additional_derives: [PartialEq, Eq] });
}

/// The generated types of the `api-key` world before `0.3.0` (`wit/0.2.0/gateway.wit`).
pub(crate) mod legacy {
    wasmtime::component::bindgen!({ path: "../wit/0.2.0", world: "api-key-stage", additional_derives: [PartialEq, Eq] });
}

/// The generated types of the `api-key` world of `0.3.0` (`wit/0.3.0/gateway.wit`): the same
/// stage but for `configure`'s flags, which have no `path-with-query-keys`.
pub(crate) mod v0_3 {
    wasmtime::component::bindgen!({ path: "../wit/0.3.0", world: "api-key-stage" });
}

use world::aura::gateway::types::Method;
use world::exports::aura::gateway::api_key::KeySetup;
pub use world::exports::aura::gateway::api_key::{Credential, KeyDecision, KeyRole, KeySource};

/// The `api-key` stage.
#[derive(Debug)]
pub struct ApiKey;

/// The `api-key` stage's modules written against `0.2.0` or `0.1.0`.
#[derive(Debug)]
pub struct ApiKeyLegacy;

/// A request for the `api-key` stage given by value (conformance vectors, tests).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KeyRequest {
    pub method: String,
    pub path: String,
    pub query_keys: Vec<String>,
    /// Header pairs: lower-case name and value.
    pub headers: Vec<(String, String)>,
}

/// `key-request`, borrowed: path and header values point into the request head.
#[derive(Debug, Clone, Copy, ComponentType, Lower)]
#[component(record)]
pub struct KeyRequestRef<'a> {
    #[component(name = "method")]
    method: Method,
    #[component(name = "path")]
    path: &'a str,
    #[component(name = "query-keys")]
    query_keys: Option<&'a [String]>,
    #[component(name = "headers")]
    headers: &'a [NamedRef<'a>],
}

stage_world!(
    ApiKey,
    api_key::world,
    Stage::ApiKey,
    "extract",
    KeySetup,
    'a,
    KeyRequestRef<'a>,
    KeyDecision,
    earlier = "0.3.0" => v0_3::exports::aura::gateway::api_key::KeySetup, setup_of_0_3
);

/// A `0.3.0` module's `configure` answer: the same, its flags the first four of `0.4.0`'s.
fn setup_of_0_3(setup: v0_3::exports::aura::gateway::api_key::KeySetup) -> KeySetup {
    use v0_3::exports::aura::gateway::api_key::KeyInputs as Old;
    use world::exports::aura::gateway::api_key::{KeyCache, KeyInputs};
    KeySetup {
        headers: setup.headers,
        cache: setup.cache.map(|cache| {
            let mut inputs = KeyInputs::empty();
            for (old, new) in [
                (Old::METHOD, KeyInputs::METHOD),
                (Old::PATH, KeyInputs::PATH),
                (Old::QUERY_KEYS, KeyInputs::QUERY_KEYS),
                (Old::HEADERS, KeyInputs::HEADERS),
            ] {
                if cache.inputs.contains(old) {
                    inputs |= new;
                }
            }
            KeyCache {
                inputs,
                max_age_ms: cache.max_age_ms,
            }
        }),
    }
}

/// The legacy `key-request`, borrowed.
#[derive(Debug, Clone, Copy, ComponentType, Lower)]
#[component(record)]
pub struct LegacyRequestRef<'a> {
    #[component(name = "method")]
    method: &'a str,
    #[component(name = "path")]
    path: &'a str,
    #[component(name = "query-keys")]
    query_keys: &'a [String],
    #[component(name = "headers")]
    headers: &'a [(&'a str, &'a str)],
}

stage_world!(
    ApiKeyLegacy,
    api_key::legacy,
    Stage::ApiKey,
    "extract",
    Vec<String>,
    'a,
    LegacyRequestRef<'a>,
    legacy::exports::aura::gateway::api_key::KeyDecision,
    check = check_key_headers
);

/// What the host keeps of an `api-key` module's `configure` answer: the headers it reads.
///
/// `names` first (`repr(C)`): what a decision-cache lookup reads, on the line of the module's
/// other fields it reads ([`super::Module`]).
#[derive(Debug, Clone, Default)]
#[repr(C)]
pub struct KeyConfigured {
    /// The same names parsed, for lookups in a request head; `None` when one of them is not a
    /// lower-case header name as written, and the head is then walked header by header.
    pub(super) names: Option<Vec<http::HeaderName>>,
    pub headers: Vec<String>,
}

impl KeyConfigured {
    fn new(headers: Vec<String>) -> Self {
        let names = headers
            .iter()
            .map(|name| {
                http::HeaderName::from_bytes(name.as_bytes())
                    .ok()
                    .filter(|parsed| parsed.as_str() == name)
            })
            .collect();
        Self { headers, names }
    }
}

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

/// The headers the api-key stage is shown.
#[derive(Debug, Clone, Copy)]
pub enum KeyHeaders<'a> {
    /// A request head: the module sees only the headers its `configure` asked for, and a value
    /// that is not UTF-8 with its invalid bytes replaced.
    Head(&'a http::HeaderMap),
    /// Pairs given by value (conformance vectors, tests); the module sees those it asked for.
    Listed(&'a [(String, String)]),
}

/// What the host knows of a request for the api-key stage.
#[derive(Debug, Clone, Copy)]
pub struct KeyInput<'a> {
    pub method: &'a str,
    pub path: &'a str,
    /// The values of the `apikey` query parameters.
    pub query_keys: &'a [String],
    pub headers: KeyHeaders<'a>,
    /// The client's address: a canary's subject (no actor is known yet).
    pub client: Option<IpAddr>,
}

/// [`KeyInput`] with owned values, for a call run on another thread.
#[derive(Debug, Clone)]
pub struct KeyQuery {
    method: String,
    path: String,
    query_keys: Vec<String>,
    headers: OwnedHeaders,
    client: Option<IpAddr>,
}

#[derive(Debug, Clone)]
enum OwnedHeaders {
    Head(http::HeaderMap),
    Listed(Vec<(String, String)>),
}

/// The stage's input for a request given by value.
fn module_input(request: &KeyRequest) -> KeyInput<'_> {
    KeyInput {
        method: &request.method,
        path: &request.path,
        query_keys: &request.query_keys,
        headers: KeyHeaders::Listed(&request.headers),
        client: None,
    }
}

impl Module<ApiKey> {
    /// The lower-case header names the plugin asked to see.
    pub fn headers(&self) -> &[String] {
        &self.configured().headers
    }

    /// Extracts the credential of a request head (`request_id` goes with the plugin's log
    /// lines): only the headers the plugin asked for, and the `apikey` query values.
    pub fn extract_head(
        &self,
        request_id: Option<&str>,
        method: &str,
        uri: &http::Uri,
        headers: &http::HeaderMap,
        client: Option<IpAddr>,
    ) -> Result<KeyDecision, PluginError> {
        let query_keys = crate::headers::apikey_query_values(uri.query());
        self.decide(
            request_id,
            KeyInput {
                method,
                path: uri.path(),
                query_keys: &query_keys,
                headers: KeyHeaders::Head(headers),
                client,
            },
        )
        .map(Arc::unwrap_or_clone)
    }

    /// Extracts the credential of one request given by value.
    pub fn extract(
        &self,
        request_id: Option<&str>,
        request: KeyRequest,
    ) -> Result<KeyDecision, PluginError> {
        self.decide(
            request_id,
            KeyInput {
                method: &request.method,
                path: &request.path,
                query_keys: &request.query_keys,
                headers: KeyHeaders::Listed(&request.headers),
                client: None,
            },
        )
        .map(Arc::unwrap_or_clone)
    }
}

/// Runs `f` on the header pairs of `headers` the module reads (`wanted`, from its `configure`):
/// borrowed from the request head, or, when a value is not UTF-8, every pair passed lossily.
fn with_pairs<R>(
    headers: KeyHeaders<'_>,
    wanted: &[String],
    f: impl FnOnce(&[(&str, &str)]) -> R,
) -> R {
    let map = match headers {
        KeyHeaders::Listed(pairs) => {
            let pairs: Vec<(&str, &str)> = pairs
                .iter()
                .filter(|(n, _)| wanted.iter().any(|w| w == n))
                .map(|(n, v)| (n.as_str(), v.as_str()))
                .collect();
            return f(&pairs);
        }
        KeyHeaders::Head(map) => map,
    };
    let read = |name: &http::HeaderName| wanted.iter().any(|w| w == name.as_str());
    let mut pairs: Vec<(&str, &str)> = Vec::new();
    for (name, value) in map.iter().filter(|(name, _)| read(name)) {
        match std::str::from_utf8(value.as_bytes()) {
            Ok(value) => pairs.push((name.as_str(), value)),
            Err(_) => {
                let lossy: Vec<(&str, Cow<'_, str>)> = map
                    .iter()
                    .filter(|(name, _)| read(name))
                    .map(|(n, v)| (n.as_str(), String::from_utf8_lossy(v.as_bytes())))
                    .collect();
                let pairs: Vec<(&str, &str)> =
                    lossy.iter().map(|(n, v)| (*n, v.as_ref())).collect();
                return f(&pairs);
            }
        }
    }
    f(&pairs)
}

/// A current module's decision from a legacy one's (the same cases).
fn lift(decision: legacy::exports::aura::gateway::api_key::KeyDecision) -> KeyDecision {
    use legacy::exports::aura::gateway::api_key as v2;
    match decision {
        v2::KeyDecision::Absent => KeyDecision::Absent,
        v2::KeyDecision::Refuse(why) => KeyDecision::Refuse(why),
        v2::KeyDecision::Present(c) => KeyDecision::Present(Credential {
            key: c.key,
            source: match c.source {
                v2::KeySource::Header => KeySource::Header,
                v2::KeySource::Query => KeySource::Query,
            },
            allowed_roles: c
                .allowed_roles
                .into_iter()
                .map(|r| match r {
                    v2::KeyRole::Anon => KeyRole::Anon,
                    v2::KeyRole::ServiceRole => KeyRole::ServiceRole,
                })
                .collect(),
        }),
    }
}

/// The path a module that declares `path-with-query-keys` (and not `path`) is passed: the
/// request's, when the request carries an `apikey` query value.
fn path_with_query_keys<'a>(input: &KeyInput<'a>) -> Option<&'a str> {
    (!input.query_keys.is_empty()).then_some(input.path)
}

/// The index of a header name among those a module reads.
fn name_index(wanted: &[String], name: &str) -> u8 {
    wanted.iter().position(|w| w == name).unwrap_or(0) as u8
}

/// Writes into a cache key the values of the headers the module reads, in request order, each
/// after its name's index. A request carries one of those names at most, as a rule: its values
/// are then looked up by name (in request order, `get_all`), without walking the other headers;
/// the key's bytes are the same as [`walk_head_values`]' (a unit test compares them).
fn head_values(map: &http::HeaderMap, configured: &KeyConfigured, key: &mut KeyWriter) {
    let Some(names) = &configured.names else {
        return walk_head_values(map, &configured.headers, key);
    };
    let mut found = None;
    for (index, name) in names.iter().enumerate() {
        let values = map.get_all(name);
        if values.iter().next().is_some() {
            if found.is_some() {
                // Two of the names (or one named twice): their relative order counts.
                return walk_head_values(map, &configured.headers, key);
            }
            found = Some((index as u8, values));
        }
    }
    if let Some((index, values)) = found {
        for value in values {
            key.tag(index).bytes(value.as_bytes());
        }
    }
}

/// [`head_values`] by walking every header of the head.
fn walk_head_values(map: &http::HeaderMap, wanted: &[String], key: &mut KeyWriter) {
    for (name, value) in map.iter() {
        if wanted.iter().any(|w| w == name.as_str()) {
            key.tag(name_index(wanted, name.as_str()))
                .bytes(value.as_bytes());
        }
    }
}

#[cfg(test)]
impl super::ExportedSchema for ApiKey {
    const EXPORTED: &'static str = aura_plugin_api_key::SCHEMA;
    const FILE: &'static str = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../plugins/api-key/schema.json"
    );
}

impl PolicyStage for ApiKey {
    type Earlier = Self;
    type Legacy = ApiKeyLegacy;
    type Configured = KeyConfigured;
    type Input<'a> = KeyInput<'a>;
    type Query = KeyQuery;
    const BUILTIN: &'static [u8] = include_bytes!(concat!(env!("OUT_DIR"), "/api_key.wasm"));
    type DefaultConfig = aura_plugin_api_key::policy::Config;
    #[cfg(feature = "native-policies")]
    type Native = native::ApiKey;
    const INPUTS: &'static [&'static str] = &[
        "method",
        "path",
        "query-keys",
        "headers",
        "path-with-query-keys",
    ];

    fn configured(setup: &KeySetup) -> Result<(KeyConfigured, Option<Declaration>), String> {
        check_key_headers(&setup.headers)?;
        let declaration = setup
            .cache
            .as_ref()
            .map(|c| Declaration::of(c.inputs.as_array(), c.max_age_ms));
        Ok((KeyConfigured::new(setup.headers.clone()), declaration))
    }

    fn configured_legacy(headers: &Vec<String>) -> KeyConfigured {
        KeyConfigured::new(headers.clone())
    }

    fn partition(input: &KeyInput<'_>, key: &mut KeyWriter) {
        key.partition_address(input.client);
    }

    fn key(input: &KeyInput<'_>, configured: &KeyConfigured, inputs: Inputs, key: &mut KeyWriter) {
        if inputs.has(0) {
            key.tag(super::method_index(input.method));
        }
        if inputs.has(1) {
            key.str(input.path);
        } else if inputs.has(4) {
            // The path only when the module is passed it: a request with a query key.
            match path_with_query_keys(input) {
                Some(path) => key.tag(1).str(path),
                None => key.tag(0),
            };
        }
        if inputs.has(2) {
            key.tag(input.query_keys.len().min(255) as u8);
            for value in input.query_keys {
                key.str(value);
            }
        }
        if inputs.has(3) {
            // The raw values, in request order: no pair is collected or decoded for a lookup.
            let wanted = &configured.headers;
            match input.headers {
                KeyHeaders::Head(map) => head_values(map, configured, key),
                KeyHeaders::Listed(pairs) => {
                    for (name, value) in pairs.iter().filter(|(n, _)| wanted.contains(n)) {
                        key.tag(name_index(wanted, name)).str(value);
                    }
                }
            }
            key.tag(u8::MAX);
        }
    }

    fn decision_bytes(decision: &KeyDecision) -> usize {
        match decision {
            KeyDecision::Absent => 0,
            KeyDecision::Refuse(why) => why.len(),
            KeyDecision::Present(c) => c.key.len() + c.allowed_roles.len(),
        }
    }

    fn query(input: KeyInput<'_>) -> KeyQuery {
        KeyQuery {
            method: input.method.to_owned(),
            path: input.path.to_owned(),
            query_keys: input.query_keys.to_vec(),
            headers: match input.headers {
                KeyHeaders::Head(map) => OwnedHeaders::Head(map.clone()),
                KeyHeaders::Listed(pairs) => OwnedHeaders::Listed(pairs.to_vec()),
            },
            client: input.client,
        }
    }

    fn input(query: &KeyQuery) -> KeyInput<'_> {
        KeyInput {
            method: &query.method,
            path: &query.path,
            query_keys: &query.query_keys,
            headers: match &query.headers {
                OwnedHeaders::Head(map) => KeyHeaders::Head(map),
                OwnedHeaders::Listed(pairs) => KeyHeaders::Listed(pairs),
            },
            client: query.client,
        }
    }

    fn subject(input: &KeyInput<'_>) -> String {
        super::cors::client_subject(input.client)
    }

    fn request_line<'a>(input: &Self::Input<'a>) -> (&'a str, &'a str) {
        (input.method, input.path)
    }

    fn describe(decision: &KeyDecision) -> String {
        match decision {
            KeyDecision::Absent => "absent".to_owned(),
            KeyDecision::Refuse(reason) => format!("refuse {reason}"),
            // Never the key itself: a sample is shown to operators.
            KeyDecision::Present(c) => format!(
                "present source={:?} roles={:?} key_bytes={}",
                c.source,
                c.allowed_roles,
                c.key.len()
            ),
        }
    }

    fn run(
        module: &StageModule<Self>,
        configured: &KeyConfigured,
        request_id: Option<&str>,
        input: KeyInput<'_>,
        inputs: Inputs,
    ) -> Result<KeyDecision, PluginError> {
        with_pairs(input.headers, &configured.headers, |pairs| {
            let headers: Vec<NamedRef<'_>> = if inputs.has(3) {
                pairs
                    .iter()
                    .map(|(n, v)| NamedRef {
                        name: name_index(&configured.headers, n),
                        value: v,
                    })
                    .collect()
            } else {
                Vec::new()
            };
            module.call(
                request_id,
                KeyRequestRef {
                    method: if inputs.has(0) {
                        wit_method!(Method, input.method)
                    } else {
                        Method::Other
                    },
                    path: if inputs.has(1) {
                        input.path
                    } else if inputs.has(4) {
                        path_with_query_keys(&input).unwrap_or("")
                    } else {
                        ""
                    },
                    query_keys: (inputs.has(2) && !input.query_keys.is_empty())
                        .then_some(input.query_keys),
                    headers: &headers,
                },
            )
        })
    }

    fn run_legacy(
        module: &StageModule<ApiKeyLegacy>,
        configured: &KeyConfigured,
        request_id: Option<&str>,
        input: KeyInput<'_>,
    ) -> Result<KeyDecision, PluginError> {
        with_pairs(input.headers, &configured.headers, |pairs| {
            module.call(
                request_id,
                LegacyRequestRef {
                    method: input.method,
                    path: input.path,
                    query_keys: input.query_keys,
                    headers: pairs,
                },
            )
        })
        .map(lift)
    }

    fn conformance(module: &Module<Self>) -> Result<StageReport, ConformanceError> {
        let mut run = Run::new(module.plane(), Stage::ApiKey);
        let long = "k".repeat(4096);
        let request = |path: &str, query: &[&str], headers: &[(&str, &str)]| KeyRequest {
            method: "GET".into(),
            path: path.into(),
            query_keys: query.iter().map(|s| (*s).to_owned()).collect(),
            headers: headers
                .iter()
                .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
                .collect(),
        };
        let vectors: Vec<(&str, KeyRequest)> = vec![
            ("no credential", request("/v1/db/todos", &[], &[])),
            (
                "apikey header",
                request("/v1/db/todos", &[], &[("apikey", "aura_pk_vector")]),
            ),
            (
                "x-api-key header",
                request("/v1/db/todos", &[], &[("x-api-key", "aura_sk_vector")]),
            ),
            (
                "query on websocket",
                request("/v1/realtime/websocket", &["aura_pk_vector"], &[]),
            ),
            (
                "query on a REST route",
                request("/v1/db/todos", &["aura_pk_vector"], &[]),
            ),
            (
                "two different keys",
                request("/x", &[], &[("apikey", "a"), ("x-api-key", "b")]),
            ),
            ("long key", request("/x", &[], &[("apikey", long.as_str())])),
            (
                "non-ASCII value",
                request("/x", &[], &[("apikey", "clé\u{FFFD}")]),
            ),
        ];
        for _round in 0..8 {
            for (name, request) in &vectors {
                let decision = run.call(name, || module.vector(module_input(request)))?;
                if let KeyDecision::Present(c) = &decision {
                    if c.key.is_empty() || c.allowed_roles.is_empty() {
                        return Err(
                            run.fail(name, "a present credential needs a key and allowed roles")
                        );
                    }
                    if c.source == KeySource::Query
                        && c.allowed_roles.contains(&KeyRole::ServiceRole)
                    {
                        return Err(
                            run.fail(name, "a key in the URL may never be a service_role key")
                        );
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
        let input: KeyCase = parse(input, "input")?;
        let expect: KeyExpect = parse(expect, "expect")?;
        // As in the gateway, the module sees only the headers it asked for.
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
            .vector(module_input(&request))
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

    #[cfg(feature = "native-policies")]
    fn native(
        native: &Self::Native,
        configured: &KeyConfigured,
        input: KeyInput<'_>,
    ) -> KeyDecision {
        with_pairs(input.headers, &configured.headers, |pairs| {
            native.extract(input.path, input.query_keys, pairs)
        })
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyCase {
    #[serde(default = "get")]
    method: String,
    #[serde(default = "sample_path")]
    path: String,
    #[serde(default)]
    query_keys: Vec<String>,
    #[serde(default)]
    headers: Vec<(String, String)>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyExpect {
    decision: String,
    key: Option<String>,
    source: Option<String>,
    allowed_roles: Option<Vec<String>>,
    message_contains: Option<String>,
}

/// The default policy compiled into the host (`--features native-policies`, benchmarks only).
#[cfg(feature = "native-policies")]
pub mod native {
    use aura_plugin_api_key::policy as api_key;

    use super::{Credential, KeyDecision, KeyRole, KeySource};
    use crate::policy::stages::native::native_policy;

    native_policy!(ApiKey(api_key::Policy), |_, config| {
        api_key::Policy::configure(config)
    });

    impl ApiKey {
        pub(crate) fn extract(
            &self,
            path: &str,
            query_keys: &[String],
            headers: &[(&str, &str)],
        ) -> KeyDecision {
            match self.0.extract(path, query_keys, headers) {
                api_key::Decision::Absent => KeyDecision::Absent,
                api_key::Decision::Refuse(why) => KeyDecision::Refuse(why),
                api_key::Decision::Present {
                    key,
                    source,
                    allowed_roles,
                } => KeyDecision::Present(Credential {
                    key,
                    source: match source {
                        api_key::Source::Header => KeySource::Header,
                        api_key::Source::Query => KeySource::Query,
                    },
                    allowed_roles: allowed_roles
                        .into_iter()
                        .map(|r| match r {
                            api_key::Role::Anon => KeyRole::Anon,
                            api_key::Role::ServiceRole => KeyRole::ServiceRole,
                        })
                        .collect(),
                }),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(pairs: &[(&str, &[u8])]) -> http::HeaderMap {
        let mut map = http::HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                http::HeaderName::from_bytes(name.as_bytes()).expect("name"),
                http::HeaderValue::from_bytes(value).expect("value"),
            );
        }
        map
    }

    fn keys(map: &http::HeaderMap, wanted: &[&str]) -> (KeyWriter, KeyWriter) {
        let configured = KeyConfigured::new(wanted.iter().map(|w| (*w).to_owned()).collect());
        let (mut looked_up, mut walked) = (KeyWriter::new("p"), KeyWriter::new("p"));
        head_values(map, &configured, &mut looked_up);
        walk_head_values(map, &configured.headers, &mut walked);
        (looked_up, walked)
    }

    #[test]
    fn a_cache_key_from_header_lookups_has_the_bytes_of_one_from_the_walk() {
        let heads: Vec<http::HeaderMap> = vec![
            head(&[("accept", b"*/*")]),
            head(&[("accept", b"*/*"), ("apikey", b"k1"), ("dnt", b"1")]),
            head(&[("apikey", b"k1"), ("accept", b"*/*"), ("apikey", b"k2")]),
            head(&[("x-key", b"a"), ("apikey", b"k1"), ("x-key", b"b")]),
            head(&[("apikey", b"k1"), ("x-key", b"a"), ("apikey", b"k2")]),
            head(&[("authorization", b"Bearer t"), ("apikey", b"\xffk")]),
            head(&[("apikey", b""), ("user-agent", b"sdk")]),
        ];
        let wanted: [&[&str]; 5] = [
            &["apikey"],
            &["apikey", "x-key"],
            &["x-key", "apikey", "authorization"],
            &["apikey", "apikey"],
            &["X-Key", "apikey"],
        ];
        let mut lookups = 0;
        for map in &heads {
            for names in wanted {
                let (looked_up, walked) = keys(map, names);
                assert_eq!(looked_up, walked, "{map:?} read as {names:?}");
                lookups += usize::from(looked_up != KeyWriter::new("p"));
            }
        }
        // Not every key is empty: the comparison saw values.
        assert!(lookups >= 15, "{lookups} keys with values");
        // Two heads that differ only in the order of two read names keep apart.
        let (one, _) = keys(&heads[3], &["apikey", "x-key"]);
        let (other, _) = keys(
            &head(&[("apikey", b"k1"), ("x-key", b"a"), ("x-key", b"b")]),
            &["apikey", "x-key"],
        );
        assert_ne!(one, other);
    }

    /// The cache key of `input` for `inputs`, of a module that reads the `apikey` header.
    fn key_of(input: &KeyInput<'_>, inputs: Inputs) -> KeyWriter {
        let configured = KeyConfigured::new(vec!["apikey".to_owned()]);
        let mut key = KeyWriter::new("p");
        ApiKey::key(input, &configured, inputs, &mut key);
        key
    }

    fn input<'a>(
        path: &'a str,
        query: &'a [String],
        headers: &'a [(String, String)],
    ) -> KeyInput<'a> {
        KeyInput {
            method: "GET",
            path,
            query_keys: query,
            headers: KeyHeaders::Listed(headers),
            client: None,
        }
    }

    #[test]
    fn path_with_query_keys_keys_the_path_only_for_a_request_with_a_query_key() {
        let headers = [("apikey".to_owned(), "k1".to_owned())];
        let query = ["k1".to_owned()];
        // Bits: path 1, query-keys 2, headers 3, path-with-query-keys 4.
        let declared = Inputs::from_bits(0b11100);
        let (a, b) = (
            input("/v1/db/a", &[], &headers),
            input("/v1/db/b", &[], &headers),
        );
        assert_eq!(key_of(&a, declared), key_of(&b, declared), "no query key");
        let (qa, qb) = (
            input("/v1/db/a", &query, &headers),
            input("/v1/db/b", &query, &headers),
        );
        assert_ne!(key_of(&qa, declared), key_of(&qb, declared), "a query key");
        assert_ne!(key_of(&a, declared), key_of(&qa, declared));
        // `path` keys every path; neither flag none.
        let path = Inputs::from_bits(0b01110);
        assert_ne!(key_of(&a, path), key_of(&b, path));
        let neither = Inputs::from_bits(0b01100);
        assert_eq!(key_of(&qa, neither), key_of(&qb, neither));
        // What the module is passed follows the key.
        assert_eq!(path_with_query_keys(&a), None);
        assert_eq!(path_with_query_keys(&qa), Some("/v1/db/a"));
    }

    #[test]
    fn names_that_are_not_lower_case_header_names_are_walked_for() {
        assert!(KeyConfigured::new(vec!["apikey".into()]).names.is_some());
        assert!(KeyConfigured::new(vec!["X-Key".into()]).names.is_none());
        assert!(KeyConfigured::new(vec!["bad name".into()]).names.is_none());
    }
}
