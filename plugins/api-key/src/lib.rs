//! Default policy plugin for the `api-key` stage (`aura:gateway/api-key`).
//!
//! Reads the key from the `apikey` header, then `x-api-key`; accepts `?apikey=` only on the
//! realtime WebSocket and SSE routes and then only for `anon` keys; refuses conflicting keys.
//!
//! The policy is plain Rust in [`policy`]; the `wasm32` component glue is in `component`.

pub mod policy;

#[cfg(target_arch = "wasm32")]
mod component;

/// The JSON Schema of [`policy::Config`], answered by the component's `config-schema` (the
/// host's tests keep it equal to the one derived from the type).
pub const SCHEMA: &str = include_str!("../schema.json");
