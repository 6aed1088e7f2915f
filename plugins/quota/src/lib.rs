//! Default policy plugin for the `quota` stage (`aura:gateway/quota`).
//!
//! One bucket per actor: the user when a user JWT (or console token) identifies one, otherwise
//! the API key. 100 requests/s with a burst of 1000 by default, overridable per plan, with a
//! cost per route group. Callers with neither key nor user are exempt: the per-IP limit covers
//! them.
//!
//! The policy is plain Rust in [`policy`]; the `wasm32` component glue is in `component`.

pub mod policy;

#[cfg(target_arch = "wasm32")]
mod component;

/// The JSON Schema of [`policy::Config`], answered by the component's `config-schema` (the
/// host's tests keep it equal to the one derived from the type).
pub const SCHEMA: &str = include_str!("../schema.json");
