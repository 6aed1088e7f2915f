#![no_main]
//! Fuzz target `db_routing`: see `aura_gateway::fuzzing::db_routing` for what it checks.

libfuzzer_sys::fuzz_target!(|data: &[u8]| aura_gateway::fuzzing::db_routing(data));
