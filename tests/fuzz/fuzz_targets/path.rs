#![no_main]
//! Fuzz target `path`: see `aura_gateway::fuzzing::path` for what it checks.

libfuzzer_sys::fuzz_target!(|data: &[u8]| aura_gateway::fuzzing::path(data));
