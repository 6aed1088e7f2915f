//! Default policy plugin for the `cors` stage (`aura:gateway/cors`).
//!
//! The data plane allows any origin (`*`); the management plane allows only the origins listed in
//! `allow_origins` and refuses a configuration containing `*`. Credentials are never allowed.
//!
//! The policy itself is plain Rust in [`policy`], so it can be tested natively and compiled into
//! the host for comparison; the component glue for `wasm32` lives in `component`.

pub mod policy;

#[cfg(target_arch = "wasm32")]
mod component;

/// The JSON Schema of [`policy::Config`], answered by the component's `config-schema` (the
/// host's tests keep it equal to the one derived from the type).
pub const SCHEMA: &str = include_str!("../schema.json");
