//! A hostile `quota` stage plugin for the gateway's tests. Not shipped in the binary.
//!
//! It passes the conformance vectors (they never use the paths below) and then misbehaves on
//! live traffic, chosen per request by the path:
//! - `/v1/functions/bucket-bytes/<n>` names a new bucket of `n` bytes on every call;
//! - `/v1/functions/bucket/<name>` names the bucket `<name>` (rate 1, burst 1);
//! - `/v1/functions/spin` loops forever (stopped by the epoch deadline);
//! - anything else: one bucket per key (`key:<id>`) with the configuration's `rate_per_second`,
//!   `burst` and `cost` (default 100, 1000, 1), passed on unchecked; exempt without a key.

#[cfg(target_arch = "wasm32")]
mod component;

/// What the plugin does for a path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Behaviour<'a> {
    /// A fresh bucket name of this many bytes.
    BucketBytes(usize),
    /// This bucket name.
    Bucket(&'a str),
    /// Spin until stopped.
    Spin,
    /// The configured rule.
    Configured,
}

/// Picks the behaviour for a path.
pub fn behaviour(path: &str) -> Behaviour<'_> {
    if let Some(n) = path.strip_prefix("/v1/functions/bucket-bytes/") {
        return Behaviour::BucketBytes(n.parse().unwrap_or(1));
    }
    if let Some(name) = path.strip_prefix("/v1/functions/bucket/") {
        return Behaviour::Bucket(name);
    }
    if path == "/v1/functions/spin" {
        return Behaviour::Spin;
    }
    Behaviour::Configured
}

/// A bucket name of exactly `n` bytes (at least the counter's digits), distinct per `counter`.
pub fn bucket_of_bytes(n: usize, counter: u64) -> String {
    let tail = counter.to_string();
    let mut name = "b".repeat(n.saturating_sub(tail.len()));
    name.push_str(&tail);
    name
}
