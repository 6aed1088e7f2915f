#![no_main]
//! Fuzz target `jwt`: see `aura_gateway::fuzzing::jwt` for what it checks.

libfuzzer_sys::fuzz_target!(|data: &[u8]| aura_gateway::fuzzing::jwt(data));
