//! Every `bindgen!` of the host, one module per stage world of `wit/gateway.wit`.
//!
//! Kept private to the policy module: the rest of the host sees the typed wrappers in
//! [`super::stages`]. Guest-visible errors are WIT results; traps stay host-side.

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
