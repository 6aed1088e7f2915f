#![no_main]
//! Fuzz target `api_key`: see `aura_gateway::fuzzing::api_key` for what it checks.

libfuzzer_sys::fuzz_target!(|data: &[u8]| aura_gateway::fuzzing::api_key(data));
