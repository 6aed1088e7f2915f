#![no_main]
//! Fuzz target `forwarded_for`: see `aura_gateway::fuzzing::forwarded_for` for what it checks.

libfuzzer_sys::fuzz_target!(|data: &[u8]| aura_gateway::fuzzing::forwarded_for(data));
