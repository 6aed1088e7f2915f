//! Component glue of the `0.3.0` api-key test plugin.

#![expect(
    unsafe_code,
    reason = "wit-bindgen generates the canonical ABI glue with unsafe code"
)]

wit_bindgen::generate!({ path: "../../wit/0.3.0", world: "api-key-stage" });

use aura::gateway::log::{Level, log};
use aura::gateway::types::Plane;
use exports::aura::gateway::api_key::{
    Credential, Guest, KeyCache, KeyDecision, KeyInputs, KeyRequest, KeyRole, KeySetup, KeySource,
};

struct Component;

impl Guest for Component {
    fn config_schema() -> Option<String> {
        None
    }

    fn configure(_plane: Plane, _config: String) -> Result<KeySetup, String> {
        Ok(KeySetup {
            headers: vec!["apikey".to_owned()],
            cache: Some(KeyCache {
                inputs: KeyInputs::PATH | KeyInputs::QUERY_KEYS | KeyInputs::HEADERS,
                max_age_ms: 60_000,
            }),
        })
    }

    fn extract(request: KeyRequest) -> KeyDecision {
        log(Level::Debug, "testing-api-key extracts");
        let header = request.headers.first().map(|h| h.value.trim().to_owned());
        let query = request.query_keys.and_then(|keys| keys.first().cloned());
        match (header, query) {
            (Some(key), _) if !key.is_empty() => KeyDecision::Present(Credential {
                key,
                source: KeySource::Header,
                allowed_roles: vec![KeyRole::Anon, KeyRole::ServiceRole],
            }),
            (_, Some(key)) if request.path == "/v1/realtime/websocket" => {
                KeyDecision::Present(Credential {
                    key,
                    source: KeySource::Query,
                    allowed_roles: vec![KeyRole::Anon],
                })
            }
            (_, Some(_)) => KeyDecision::Refuse("no query key on this path".to_owned()),
            _ => KeyDecision::Absent,
        }
    }
}

export!(Component);
