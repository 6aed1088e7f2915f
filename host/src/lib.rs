//! Aura gateway: a dual-plane API gateway whose policy stages are WebAssembly components.
//!
//! A request walks in one direction: listener ([`server`]) → chain ([`planes::chain`]) →
//! handler ([`proxy`]) → transport → backend, calling [`policy`] stages at fixed points.

pub mod actor;
pub mod auth;
pub mod breaker;
pub mod config;
pub mod control;
pub mod dev;
pub mod error;
#[doc(hidden)]
pub mod fuzzing;
pub mod metrics;
pub mod middleware;
pub mod path;
pub mod plane;
pub mod planes;
pub mod policy;
pub mod proxy;
pub mod ratelimit;
pub mod reload;
pub mod route_group;
pub mod server;
pub mod state;
pub mod telemetry;
