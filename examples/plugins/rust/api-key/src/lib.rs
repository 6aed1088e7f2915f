//! The API key in a header of the tenant's choosing: reads the configured header (default
//! `x-aura-key`) and `apikey` (values trimmed, empty ones skipped); two different keys are
//! refused. Query keys are ignored. The decision depends on those headers alone, so that is
//! all it declares: the gateway keeps its decisions and passes it nothing else.
//! Build: `cargo build --release --target wasm32-wasip2`. Configuration:
//!
//! ```toml
//! header = "x-aura-key"
//! ```

use std::sync::OnceLock;

use serde::Deserialize;

wit_bindgen::generate!({ path: "../../../../wit", world: "api-key-stage" });

use aura::gateway::log::{Level, log};
use aura::gateway::types::Plane;
use exports::aura::gateway::api_key::{
    Credential, Guest, KeyCache, KeyDecision, KeyInputs, KeyRequest, KeyRole, KeySetup, KeySource,
};

/// The JSON Schema of the configuration: the gateway checks the configuration against it
/// before `configure` runs, and a console can render a form from it.
const SCHEMA: &str = r#"{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "title": "api-key: a custom header",
  "type": "object",
  "properties": {
    "header": {
      "description": "The lower-case header the key is read from, besides apikey.",
      "type": "string",
      "pattern": "^[a-z0-9_-]{1,64}$",
      "not": { "const": "authorization" },
      "default": "x-aura-key"
    }
  },
  "additionalProperties": false
}"#;

/// How long a decision holds: it is a function of the headers alone, so as long as the gateway
/// keeps it (it lowers this to its own ceiling).
const MAX_AGE_MS: u32 = 300_000;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    #[serde(default = "default_header")]
    header: String,
}

fn default_header() -> String {
    "x-aura-key".to_owned()
}

static HEADER: OnceLock<String> = OnceLock::new();

struct Plugin;

impl Guest for Plugin {
    fn config_schema() -> Option<String> {
        Some(SCHEMA.to_owned())
    }

    fn configure(_plane: Plane, config: String) -> Result<KeySetup, String> {
        let config: Config = serde_json::from_str(&config).map_err(|e| format!("config: {e}"))?;
        let name = config.header;
        if name.is_empty()
            || !name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
        {
            return Err(format!("header: {name:?} is not a lower-case header name"));
        }
        if name == "authorization" {
            return Err("header: \"authorization\" carries user JWTs, not API keys".into());
        }
        let headers = if name == "apikey" {
            vec![name.clone()]
        } else {
            vec![name.clone(), "apikey".to_owned()]
        };
        HEADER
            .set(name)
            .map_err(|_| "configured twice".to_string())?;
        Ok(KeySetup {
            headers,
            cache: Some(KeyCache {
                inputs: KeyInputs::HEADERS,
                max_age_ms: MAX_AGE_MS,
            }),
        })
    }

    fn extract(request: KeyRequest) -> KeyDecision {
        // The gateway passes only the headers `configure` named (each value with the position of
        // its name in that list), so every value here is a candidate key.
        let mut keys: Vec<&str> = Vec::new();
        for header in &request.headers {
            let value = header.value.trim();
            if !value.is_empty() && !keys.contains(&value) {
                keys.push(value);
            }
        }
        match keys.as_slice() {
            [] => {
                let header = HEADER.get().map(String::as_str).unwrap_or("x-aura-key");
                log(Level::Debug, &format!("no API key in {header} or apikey"));
                KeyDecision::Absent
            }
            [key] => KeyDecision::Present(Credential {
                key: (*key).to_owned(),
                source: KeySource::Header,
                allowed_roles: vec![KeyRole::Anon, KeyRole::ServiceRole],
            }),
            _ => KeyDecision::Refuse("two different API keys".into()),
        }
    }
}

export!(Plugin);
