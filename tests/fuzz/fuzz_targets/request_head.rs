#![no_main]
//! Fuzz target `request_head`: see `aura_gateway::fuzzing::request_head` for what it checks.

libfuzzer_sys::fuzz_target!(|data: &[u8]| aura_gateway::fuzzing::request_head(data));
