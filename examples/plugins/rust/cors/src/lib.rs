//! A CORS allow-list for a tenant: exact origins, plus any subdomain of listed domains (over
//! https only); denied origins are logged. The decision depends on the origin and on whether the
//! request is a preflight, so it declares `origin` and `request-method`.
//! Build: `cargo build --release --target wasm32-wasip2`. Configuration:
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
use exports::aura::gateway::cors::{
    CorsAllow, CorsCache, CorsDecision, CorsInputs, CorsRequest, Guest,
};

/// The JSON Schema of the configuration, checked by the gateway before `configure` runs.
const SCHEMA: &str = r#"{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "title": "cors: an allow-list",
  "type": "object",
  "properties": {
    "origins": {
      "description": "Origins allowed, compared case-insensitively (no wildcards).",
      "type": "array",
      "items": { "type": "string" }
    },
    "subdomains_of": {
      "description": "Domains whose https subdomains are allowed (no wildcards).",
      "type": "array",
      "items": { "type": "string" }
    },
    "max_age_secs": {
      "description": "Access-Control-Max-Age of a preflight, in seconds.",
      "type": "integer",
      "minimum": 0,
      "maximum": 4294967295,
      "default": 600
    }
  },
  "additionalProperties": false
}"#;

/// How long a decision holds: a function of its declared inputs and the configuration, so as
/// long as the gateway keeps it (it lowers this to its own ceiling).
const MAX_AGE_MS: u32 = 300_000;

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
    fn config_schema() -> Option<String> {
        Some(SCHEMA.to_owned())
    }

    fn configure(_plane: Plane, config: String) -> Result<Option<CorsCache>, String> {
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
            .map_err(|_| "configured twice".to_string())?;
        Ok(Some(CorsCache {
            inputs: CorsInputs::ORIGIN | CorsInputs::REQUEST_METHOD,
            max_age_ms: MAX_AGE_MS,
        }))
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
