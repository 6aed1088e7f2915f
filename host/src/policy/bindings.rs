//! Every `bindgen!` of the host, one module per stage world of `wit/gateway.wit`
//! (`aura:gateway@0.2.0`).
//!
//! Kept private to the policy module: the rest of the host sees the typed wrappers in
//! [`super::stages`]. Only the generated types are used: the runtime finds a plugin's exports
//! itself ([`super::engine::StageWorld`]), so that a plugin written against `0.1.0` (the same
//! stage records under another package version) is called through the same types.
//! Guest-visible errors are WIT results; traps stay host-side.

pub(crate) mod api_key {
    wasmtime::component::bindgen!({ path: "../wit", world: "api-key-stage", additional_derives: [PartialEq, Eq] });
}

pub(crate) mod cors {
    wasmtime::component::bindgen!({ path: "../wit", world: "cors-stage", additional_derives: [PartialEq, Eq] });
}

pub(crate) mod quota {
    wasmtime::component::bindgen!({ path: "../wit", world: "quota-stage", additional_derives: [PartialEq, Eq] });
}

pub(crate) mod db_routing {
    wasmtime::component::bindgen!({ path: "../wit", world: "db-routing-stage", additional_derives: [PartialEq, Eq] });
}

/// The level of a `log` line.
pub(crate) use cors::aura::gateway::log::Level as LogLevel;
