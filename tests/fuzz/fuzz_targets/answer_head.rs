#![no_main]
//! Fuzz target `answer_head`: see `aura_gateway::fuzzing::answer_head` for what it checks.

libfuzzer_sys::fuzz_target!(|data: &[u8]| aura_gateway::fuzzing::answer_head(data));
