#![no_main]
//! Fuzz target `chunked`: see `aura_gateway::fuzzing::chunked` for what it checks.

libfuzzer_sys::fuzz_target!(|data: &[u8]| aura_gateway::fuzzing::chunked(data));
