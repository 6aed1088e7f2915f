//! Component glue of the hostile quota test plugin, written against `0.4.0` (the route group as
//! the enum of that version): the host still calls it as it is.

#![expect(
    unsafe_code,
    reason = "wit-bindgen generates the canonical ABI glue with unsafe code"
)]

use std::sync::OnceLock;

use crate::{MAX_HEADER_VALUES, MAX_VALUE_BYTES, SCHEMA_CHOICE, schema};

wit_bindgen::generate!({ path: "../../wit/0.4.0", world: "quota-stage" });

use aura::gateway::types::Plane;
use exports::aura::gateway::quota::{
    BucketScope, DenyReason, DenyStatus, Guest, QuotaDecision, QuotaDenial, QuotaRequest,
    QuotaRule, QuotaSetup,
};

/// How many header and claim names `configure` answered.
static NAMED: OnceLock<(usize, usize)> = OnceLock::new();

struct Component;

fn names(value: &serde_json::Value, key: &str) -> Vec<String> {
    value
        .get(key)
        .and_then(serde_json::Value::as_array)
        .map(|names| {
            names
                .iter()
                .filter_map(|n| n.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

fn rule(scope: BucketScope) -> QuotaDecision {
    QuotaDecision::Limit(QuotaRule {
        scope,
        rate_per_second: 1_000_000,
        burst: 1_000_000,
        cost: 1,
    })
}

fn deny(status: DenyStatus, reason: DenyReason, retry_after_seconds: u32) -> QuotaDecision {
    QuotaDecision::Deny(QuotaDenial {
        status,
        reason,
        retry_after_seconds,
    })
}

impl Guest for Component {
    fn config_schema() -> Option<String> {
        schema(std::hint::black_box(&SCHEMA_CHOICE))
    }

    fn configure(_plane: Plane, config: String) -> Result<QuotaSetup, String> {
        let value: serde_json::Value = if config.trim().is_empty() {
            serde_json::Value::Null
        } else {
            serde_json::from_str(&config).map_err(|e| format!("invalid config: {e}"))?
        };
        let (headers, claims) = (names(&value, "headers"), names(&value, "claims"));
        let _ = NAMED.set((headers.len(), claims.len()));
        Ok(QuotaSetup {
            claims,
            headers,
            cache: None,
        })
    }

    fn decide(request: QuotaRequest) -> QuotaDecision {
        let path = request.path.as_str();
        if let Some((_, n)) = path.rsplit_once("/retry/") {
            let seconds = n.parse().unwrap_or(u32::MAX);
            return deny(
                DenyStatus::TooManyRequests,
                DenyReason::QuotaExceeded,
                seconds,
            );
        }
        match path.rsplit_once('/').map_or("", |(_, last)| last) {
            "forbid" => return deny(DenyStatus::Forbidden, DenyReason::PolicyDenied, 0),
            "scope-user" => return rule(BucketScope::User),
            "scope-client-ip" => return rule(BucketScope::ClientIp),
            // The enum's case as a number the test can read back: its index plus one.
            "route-group" => {
                return deny(
                    DenyStatus::TooManyRequests,
                    DenyReason::QuotaExceeded,
                    request.route_group as u32 + 1,
                );
            }
            _ => {}
        }
        let (headers, claims) = NAMED.get().copied().unwrap_or_default();
        assert!(
            request.headers.len() <= MAX_HEADER_VALUES,
            "the host passed {} header values",
            request.headers.len()
        );
        for (kind, values, named) in [
            ("header", &request.headers, headers),
            ("claim", &request.claims, claims),
        ] {
            for v in values {
                assert!(
                    v.value.len() <= MAX_VALUE_BYTES,
                    "the host passed a {kind} value of {} bytes",
                    v.value.len()
                );
                assert!(
                    usize::from(v.name) < named,
                    "the host passed an unnamed {kind}"
                );
                if v.value == "deny-me" || v.value == "\"deny-me\"" {
                    return deny(DenyStatus::Forbidden, DenyReason::PolicyDenied, 0);
                }
            }
        }
        if request.actor.key_id.is_none() {
            return QuotaDecision::Exempt;
        }
        rule(BucketScope::Key)
    }
}

export!(Component);
