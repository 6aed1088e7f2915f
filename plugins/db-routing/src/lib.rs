//! Default policy plugin for the `db-routing` stage (`aura:gateway/db-routing`).
//!
//! The six rules of the platform contract, first match wins: management routes, `PUT`, MongoDB
//! and shared Postgres go over NATS; dedicated Postgres goes straight to its PostgREST when the
//! URL is resolved, and is `unresolved` (503, never a fallback) when it is not.
//!
//! The policy is plain Rust in [`policy`]; the `wasm32` component glue is in `component`.

pub mod policy;

#[cfg(target_arch = "wasm32")]
mod component;

/// The JSON Schema of [`policy::Config`], answered by the component's `config-schema` (the
/// host's tests keep it equal to the one derived from the type).
pub const SCHEMA: &str = include_str!("../schema.json");
