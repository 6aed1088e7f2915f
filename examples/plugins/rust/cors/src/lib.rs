//! A CORS allow-list for a tenant: exact origins, plus any subdomain of listed domains (over
//! https only); denied origins are logged. Build: `cargo build --release --target wasm32-wasip2`.
//! Configuration:
//!
//! ```toml
//! origins = ["https://app.example.com"]
//! subdomains_of = ["example.org"]      # https://<anything>.example.org
//! max_age_secs = 600
//! ```

use std::sync::OnceLock;

use serde::Deserialize;

wit_bindgen::generate!({ path: "../../../../wit", world: "cors-stage" });

use aura::gateway::log::{Level, log};
use aura::gateway::types::Plane;
use exports::aura::gateway::cors::{CorsAllow, CorsDecision, CorsRequest, Guest};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    #[serde(default)]
    origins: Vec<String>,
    #[serde(default)]
    subdomains_of: Vec<String>,
    #[serde(default = "default_max_age")]
    max_age_secs: u32,
}

fn default_max_age() -> u32 {
    600
}

static CONFIG: OnceLock<Config> = OnceLock::new();

fn allowed(config: &Config, origin: &str) -> bool {
    let origin = origin.to_ascii_lowercase();
    if config
        .origins
        .iter()
        .any(|o| o.eq_ignore_ascii_case(&origin))
    {
        return true;
    }
    let Some(host) = origin.strip_prefix("https://") else {
        return false;
    };
    let host = host.split(':').next().unwrap_or_default();
    config
        .subdomains_of
        .iter()
        .any(|d| host.ends_with(&format!(".{}", d.to_ascii_lowercase())))
}

struct Plugin;

impl Guest for Plugin {
    fn configure(_plane: Plane, config: String) -> Result<(), String> {
        let config: Config = serde_json::from_str(&config).map_err(|e| format!("config: {e}"))?;
        if config
            .origins
            .iter()
            .chain(&config.subdomains_of)
            .any(|o| o.contains('*'))
        {
            return Err("wildcards are not allowed; list origins or use subdomains_of".into());
        }
        log(
            Level::Info,
            &format!(
                "configured: {} origins, {} domains",
                config.origins.len(),
                config.subdomains_of.len()
            ),
        );
        CONFIG
            .set(config)
            .map_err(|_| "configured twice".to_string())
    }

    fn decide(request: CorsRequest) -> CorsDecision {
        let Some(config) = CONFIG.get() else {
            return CorsDecision::Deny;
        };
        if !allowed(config, &request.origin) {
            log(Level::Info, &format!("origin {} denied", request.origin));
            return CorsDecision::Deny;
        }
        let preflight = request.request_method.is_some();
        CorsDecision::Allow(CorsAllow {
            allow_origin: request.origin,
            allow_methods: if preflight {
                ["GET", "POST", "PATCH", "DELETE", "OPTIONS"]
                    .map(String::from)
                    .to_vec()
            } else {
                Vec::new()
            },
            allow_headers: if preflight {
                ["authorization", "apikey", "content-type"]
                    .map(String::from)
                    .to_vec()
            } else {
                Vec::new()
            },
            expose_headers: vec!["x-request-id".into()],
            max_age: preflight.then_some(config.max_age_secs),
        })
    }
}

export!(Plugin);
