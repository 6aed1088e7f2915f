//! The mechanism every policy module runs under, whoever owns it: the wasmtime engines
//! ([`engine`]: operators' instances in a pooling allocator's reserve, projects' made on demand
//! within one memory budget, [`instances`]) with their epoch ticker ([`epoch`]), per-call
//! limits ([`limits`]) and the
//! locked-down WASI ([`sandbox`]); compilation of uploaded modules in a confined worker
//! ([`compile`], [`confine`], [`compile_cache`]); decision caches under one ceiling
//! ([`decision_cache`], [`cache_budget`]); the tenant threads ([`isolation`]); a module's log
//! lines ([`plugin_log`]), call statistics ([`stats`]) and configuration schema
//! ([`config_schema`]). Nothing here knows a stage or an owner's policy.

pub mod cache_budget;
pub mod compile;
pub mod compile_cache;
pub mod config_schema;
pub mod confine;
pub mod decision_cache;
pub mod engine;
pub mod epoch;
pub mod instances;
pub mod isolation;
mod limits;
pub mod plugin_log;
pub mod sandbox;
pub mod stats;
