//! Aura gateway: a dual-plane API gateway whose policy stages are WebAssembly components.
//!
//! A request walks in one direction: listener ([`server`]) → the plane's phases
//! ([`planes::chain`], [`phases`]) → handler ([`proxy`]) → transport → backend, calling
//! [`policy`] stages at fixed points.

pub mod actor;
pub mod allocator;
pub mod auth;
pub mod breaker;
pub mod changes;
pub mod config;
pub mod control;
pub mod deadline;
pub mod dev;
pub mod dns;
pub mod error;
pub mod files;
pub mod fleet;
#[doc(hidden)]
pub mod fuzzing;
pub mod headers;
pub mod hot;
pub mod http1;
pub mod json_text;
pub mod jwks;
#[cfg(test)]
mod layering;
pub mod metrics;
pub mod path;
pub mod phases;
pub mod plane;
pub mod planes;
pub mod policy;
pub mod proxy;
pub mod ratelimit;
pub mod readiness;
pub mod routes;
pub mod schema;
pub mod server;
pub mod stage;
pub mod startup;
pub mod state;
pub mod telemetry;
pub mod tls;
