#![no_main]
//! Fuzz target `envelope`: see `aura_gateway::fuzzing::envelope` for what it checks.

libfuzzer_sys::fuzz_target!(|data: &[u8]| aura_gateway::fuzzing::envelope(data));
