//! The API key in a header of the tenant's choosing: reads the configured header (default
//! `x-aura-key`) and `apikey` (values trimmed, empty ones skipped); two different keys are
//! refused. Query keys are ignored.
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
    Credential, Guest, KeyDecision, KeyRequest, KeyRole, KeySource,
};

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
    fn configure(_plane: Plane, config: String) -> Result<Vec<String>, String> {
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
        let names = if name == "apikey" {
            vec![name.clone()]
        } else {
            vec![name.clone(), "apikey".to_owned()]
        };
        HEADER
            .set(name)
            .map_err(|_| "configured twice".to_string())?;
        Ok(names)
    }

    fn extract(request: KeyRequest) -> KeyDecision {
        let header = HEADER.get().map(String::as_str).unwrap_or("x-aura-key");
        let mut keys: Vec<&str> = Vec::new();
        for (name, value) in &request.headers {
            let value = value.trim();
            if (name == header || name == "apikey") && !value.is_empty() && !keys.contains(&value)
            {
                keys.push(value);
            }
        }
        match keys.as_slice() {
            [] => {
                log(Level::Debug, &format!("no API key on {}", request.path));
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
