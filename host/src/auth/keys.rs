//! API keys: generation, hashing, and resolution through a cache with positive and negative
//! entries.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use moka::future::Cache;
use sha2::{Digest, Sha256};

use crate::control::{ApiKeyRecord, ControlStore, KeyRole, StoreError};

/// Longest key string looked up; anything longer is refused without touching the store.
pub const MAX_KEY_LEN: usize = 512;

/// SHA-256 of the whole key string, lower-case hex: how keys are stored and looked up.
pub fn hash_key(key: &str) -> String {
    hex::encode(Sha256::digest(key.as_bytes()))
}

/// Whether a string can be a key at all (visible ASCII, bounded length). Others are refused
/// without a store lookup.
pub fn plausible_key(key: &str) -> bool {
    !key.is_empty() && key.len() <= MAX_KEY_LEN && key.bytes().all(|b| (0x21..=0x7e).contains(&b))
}

/// A new random key for `role`: `aura_pk_…` or `aura_sk_…` with 43 url-safe characters
/// (256 bits from the operating system's generator).
pub fn generate_key(role: KeyRole) -> String {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).expect("the operating system's random generator is available");
    let prefix = match role {
        KeyRole::Anon => "aura_pk_",
        KeyRole::ServiceRole => "aura_sk_",
    };
    format!("{prefix}{}", URL_SAFE_NO_PAD.encode(bytes))
}

/// A short, non-secret label of a key for logs: its prefix and the first characters of its
/// hash (never the key itself).
pub fn key_label(key: &str) -> String {
    let prefix = if key.starts_with("aura_sk_") {
        "aura_sk"
    } else if key.starts_with("aura_pk_") {
        "aura_pk"
    } else {
        "key"
    };
    format!("{prefix}#{}", &hash_key(key)[..8])
}

/// Resolves keys by hash through a cache. Concurrent lookups of one key share one store query;
/// unknown keys are cached too, so a key hits the store at most once per cache lifetime.
#[derive(Debug, Clone)]
pub struct KeyResolver {
    store: Arc<dyn ControlStore>,
    cache: Cache<String, Option<Arc<ApiKeyRecord>>>,
}

impl KeyResolver {
    /// A resolver caching for `ttl`, at most `capacity` entries.
    pub fn new(store: Arc<dyn ControlStore>, ttl: Duration, capacity: u64) -> Self {
        Self {
            store,
            cache: Cache::builder()
                .time_to_live(ttl)
                .max_capacity(capacity)
                .build(),
        }
    }

    /// The record of `key`, or `None` when no key has that hash. Store failures are not cached.
    pub async fn resolve(&self, key: &str) -> Result<Option<Arc<ApiKeyRecord>>, StoreError> {
        let hash = hash_key(key);
        let store = self.store.clone();
        let lookup = hash.clone();
        self.cache
            .try_get_with(hash, async move {
                store
                    .api_key_by_hash(&lookup)
                    .await
                    .map(|found| found.map(Arc::new))
            })
            .await
            .map_err(|e| (*e).clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_hashed_whole_in_lower_hex() {
        assert_eq!(
            hash_key("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn generated_keys_have_the_role_prefix_and_enough_entropy() {
        let a = generate_key(KeyRole::Anon);
        let b = generate_key(KeyRole::ServiceRole);
        assert!(a.starts_with("aura_pk_") && a.len() == 8 + 43, "{a}");
        assert!(b.starts_with("aura_sk_"), "{b}");
        assert_ne!(a, generate_key(KeyRole::Anon));
        assert!(plausible_key(&a));
    }

    #[test]
    fn implausible_keys_are_refused_early_and_labels_hide_the_key() {
        assert!(!plausible_key(""));
        assert!(!plausible_key("has space"));
        assert!(!plausible_key(&"x".repeat(MAX_KEY_LEN + 1)));
        let key = generate_key(KeyRole::ServiceRole);
        let label = key_label(&key);
        assert!(label.starts_with("aura_sk#"));
        assert!(!label.contains(&key[8..]));
    }
}
