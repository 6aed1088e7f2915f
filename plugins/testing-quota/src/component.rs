//! Component glue for the hostile quota test plugin.

#![expect(
    unsafe_code,
    reason = "wit-bindgen generates the canonical ABI glue with unsafe code"
)]

use std::hint::black_box;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::{Behaviour, behaviour, bucket_of_bytes};

wit_bindgen::generate!({ path: "../../wit/0.1.0", world: "quota-stage" });

use aura::gateway::types::Plane;
use exports::aura::gateway::quota::{Guest, QuotaDecision, QuotaRequest, QuotaRule};

static RATE: AtomicU32 = AtomicU32::new(100);
static BURST: AtomicU32 = AtomicU32::new(1000);
static COST: AtomicU32 = AtomicU32::new(1);
static CALLS: AtomicU64 = AtomicU64::new(0);

struct Component;

impl Guest for Component {
    fn configure(_plane: Plane, config: String) -> Result<(), String> {
        let value: serde_json::Value =
            serde_json::from_str(&config).map_err(|e| format!("invalid config: {e}"))?;
        let read = |key: &str, into: &AtomicU32| {
            if let Some(n) = value.get(key).and_then(serde_json::Value::as_u64) {
                into.store(u32::try_from(n).unwrap_or(u32::MAX), Ordering::Relaxed);
            }
        };
        read("rate_per_second", &RATE);
        read("burst", &BURST);
        read("cost", &COST);
        Ok(())
    }

    fn decide(request: QuotaRequest) -> QuotaDecision {
        let call = CALLS.fetch_add(1, Ordering::Relaxed);
        let rule = |bucket: String, rate: u32, burst: u32, cost: u32| {
            QuotaDecision::Limit(QuotaRule {
                bucket,
                rate_per_second: rate,
                burst,
                cost,
            })
        };
        match behaviour(&request.path) {
            Behaviour::BucketBytes(n) => rule(bucket_of_bytes(n, call), 100, 1000, 1),
            Behaviour::Bucket(name) => rule(name.to_owned(), 1, 1, 1),
            Behaviour::Spin => {
                let mut n: u64 = 0;
                loop {
                    n = black_box(n.wrapping_add(1));
                }
            }
            Behaviour::Configured => match request.actor.key_id {
                None => QuotaDecision::Exempt,
                Some(key) => rule(
                    format!("key:{key}"),
                    RATE.load(Ordering::Relaxed),
                    BURST.load(Ordering::Relaxed),
                    COST.load(Ordering::Relaxed),
                ),
            },
        }
    }
}

export!(Component);
