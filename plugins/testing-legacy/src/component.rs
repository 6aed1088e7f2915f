//! Component glue of the `0.2.0` test plugin.

#![expect(
    unsafe_code,
    reason = "wit-bindgen generates the canonical ABI glue with unsafe code"
)]

wit_bindgen::generate!({ path: "../../wit/0.2.0", world: "cors-stage" });

use aura::gateway::log::{Level, log};
use aura::gateway::types::Plane;
use exports::aura::gateway::cors::{CorsAllow, CorsDecision, CorsRequest, Guest};

struct Component;

impl Guest for Component {
    fn configure(_plane: Plane, _config: String) -> Result<(), String> {
        Ok(())
    }

    fn decide(request: CorsRequest) -> CorsDecision {
        log(Level::Debug, "testing-legacy decides");
        CorsDecision::Allow(CorsAllow {
            allow_origin: request.origin,
            allow_methods: vec!["GET".to_owned()],
            allow_headers: Vec::new(),
            expose_headers: vec!["x-testing-legacy".to_owned()],
            max_age: None,
        })
    }
}

export!(Component);
