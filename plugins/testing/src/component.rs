//! Component glue for the hostile test plugin.

#![expect(
    unsafe_code,
    reason = "wit-bindgen generates the canonical ABI glue with unsafe code"
)]

use std::hint::black_box;

use crate::{Behaviour, behaviour};

wit_bindgen::generate!({ path: "../../wit", world: "cors-stage" });

use aura::gateway::types::Plane;
use exports::aura::gateway::cors::{CorsAllow, CorsDecision, CorsRequest, Guest};

struct Component;

static TRAP_ALWAYS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn recurse(depth: u64, pad: [u64; 32]) -> u64 {
    let mut next = black_box(pad);
    next[(depth % 32) as usize] = depth;
    recurse(depth + 1, next) + next[0]
}

impl Guest for Component {
    fn configure(_plane: Plane, config: String) -> Result<(), String> {
        let value: serde_json::Value =
            serde_json::from_str(&config).map_err(|e| format!("invalid config: {e}"))?;
        if value.get("refuse") == Some(&serde_json::Value::Bool(true)) {
            return Err("refused as asked by the configuration".to_owned());
        }
        let trap = value.get("trap_always") == Some(&serde_json::Value::Bool(true));
        TRAP_ALWAYS.store(trap, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    fn decide(request: CorsRequest) -> CorsDecision {
        if TRAP_ALWAYS.load(std::sync::atomic::Ordering::Relaxed) {
            std::process::abort();
        }
        match behaviour(&request.origin) {
            Behaviour::Trap => std::process::abort(),
            Behaviour::Loop => {
                let mut n: u64 = 0;
                loop {
                    n = black_box(n.wrapping_add(1));
                }
            }
            Behaviour::Grow => {
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                loop {
                    hoard.push(vec![1u8; 1 << 20]);
                    black_box(&hoard);
                }
            }
            Behaviour::Recurse => {
                let depth = recurse(0, [0; 32]);
                black_box(depth);
                CorsDecision::Deny
            }
            Behaviour::Echo => CorsDecision::Allow(CorsAllow {
                allow_origin: request.origin,
                allow_methods: vec!["GET".to_owned()],
                allow_headers: vec!["x-testing".to_owned()],
                expose_headers: vec!["x-testing-plugin".to_owned()],
                max_age: Some(1),
            }),
        }
    }
}

export!(Component);
