//! API keys: generation, hashing, and resolution through a cache with positive and negative
//! entries.

use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use moka::future::Cache;
use sha2::{Digest, Sha256};

use crate::control::{ApiKeyRecord, ControlStore, KeyRole, StoreError};
use crate::hot::{self, HotTable};

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

/// The records last found in the control store, answered only while it is unavailable
/// (`auth.stale_if_error_secs`): an outage of the store does not take down traffic with keys
/// it already knew. Filled only when a record is fetched, never on a cache hit.
///
/// After the store was found unavailable, lookups skip it for [`STORE_RETRY`] and answer at
/// once (from the last known records, or `503`) instead of each waiting out the store's
/// connection timeout.
#[derive(Debug, Clone)]
pub struct LastKnown<V: Clone + Send + Sync + 'static> {
    records: Option<moka::sync::Cache<String, V>>,
    health: StoreHealth,
}

/// How long lookups skip a store found unavailable before one tries it again.
pub const STORE_RETRY: Duration = Duration::from_secs(1);

/// Whether the control store was found unavailable in the last [`STORE_RETRY`]; shared by the
/// key and project lookups.
#[derive(Debug, Clone)]
pub struct StoreHealth {
    origin: std::time::Instant,
    down_until_ms: Arc<std::sync::atomic::AtomicU64>,
}

impl Default for StoreHealth {
    fn default() -> Self {
        Self {
            origin: std::time::Instant::now(),
            down_until_ms: Arc::new(std::sync::atomic::AtomicU64::new(0)),
        }
    }
}

impl StoreHealth {
    fn now_ms(&self) -> u64 {
        self.origin.elapsed().as_millis() as u64
    }

    /// Whether lookups should skip the store now.
    pub fn is_down(&self) -> bool {
        self.now_ms()
            < self
                .down_until_ms
                .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Notes the outcome of a store call.
    pub fn note<T>(&self, result: &Result<T, StoreError>) {
        if let Err(StoreError::Unavailable(_)) = result {
            self.down_until_ms.store(
                self.now_ms() + STORE_RETRY.as_millis() as u64,
                std::sync::atomic::Ordering::Relaxed,
            );
        }
    }
}

impl<V: Clone + Send + Sync + 'static> LastKnown<V> {
    /// Keeps records for `ttl` (zero: keeps none), at most `capacity` of them.
    pub fn new(ttl: Duration, capacity: u64, health: StoreHealth) -> Self {
        Self {
            records: (!ttl.is_zero()).then(|| {
                moka::sync::Cache::builder()
                    .time_to_live(ttl)
                    .max_capacity(capacity)
                    .build()
            }),
            health,
        }
    }

    /// Runs a store lookup unless the store was just found unavailable.
    pub async fn fetch<T>(
        &self,
        lookup: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        if self.health.is_down() {
            return Err(StoreError::Unavailable(
                "found unavailable moments ago; retrying shortly".to_owned(),
            ));
        }
        let result = lookup.await;
        self.health.note(&result);
        result
    }

    /// Remembers a record fetched from the store.
    pub fn remember(&self, key: &str, value: &V) {
        if let Some(records) = &self.records {
            records.insert(key.to_owned(), value.clone());
        }
    }

    /// Forgets a record the store no longer has.
    pub fn forget(&self, key: &str) {
        if let Some(records) = &self.records {
            records.invalidate(key);
        }
    }

    /// The answer to a failed lookup: the last known record when the store is unavailable,
    /// the error otherwise.
    pub fn on_error(&self, key: &str, error: StoreError) -> Result<V, StoreError> {
        match (&error, &self.records) {
            (StoreError::Unavailable(_), Some(records)) => match records.get(key) {
                Some(value) => {
                    tracing::debug!(
                        "control store unavailable: answering from the last known record"
                    );
                    Ok(value)
                }
                None => Err(error),
            },
            _ => Err(error),
        }
    }
}

/// Store lookups through a cache: a [`HotTable`] of the records in use in front of a moka
/// cache that fetches, shares concurrent fetches of one key, and caches "not found" too, so a
/// key hits the store at most once per time to live. Store failures are not cached; while the
/// store is unavailable a record found before is answered from memory ([`LastKnown`]).
pub struct Lookups<K, V: Send + Sync + 'static> {
    /// What was fetched, with when (the hot table's entries expire when the cache's would).
    cache: Cache<K, (Instant, Option<Arc<V>>)>,
    hot: HotTable<K, Arc<V>>,
    ttl: Duration,
    last_known: LastKnown<Arc<V>>,
}

impl<K, V: Send + Sync + 'static> std::fmt::Debug for Lookups<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lookups")
            .field("entries", &self.cache.entry_count())
            .field("hot", &self.hot)
            .finish_non_exhaustive()
    }
}

impl<K, V> Lookups<K, V>
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
    V: Send + Sync + 'static,
{
    /// Caches for `ttl`, at most `capacity` entries; `last_known` answers while the store is
    /// unavailable.
    pub fn new(ttl: Duration, capacity: u64, last_known: LastKnown<Arc<V>>) -> Self {
        Self {
            cache: Cache::builder()
                .time_to_live(ttl)
                .max_capacity(capacity)
                .build(),
            hot: HotTable::new(hot::DEFAULT_SLOTS),
            ttl,
            last_known,
        }
    }

    /// The record of `key`: from the hot table, else from the cache, else fetched by `fetch`
    /// (`label` names the record to [`LastKnown`]).
    pub async fn get<Q, F>(
        &self,
        key: &Q,
        label: impl FnOnce() -> String,
        fetch: impl FnOnce() -> F,
    ) -> Result<Option<Arc<V>>, StoreError>
    where
        K: std::borrow::Borrow<Q>,
        Q: std::hash::Hash + Eq + ToOwned<Owned = K> + ?Sized,
        F: Future<Output = Result<Option<V>, StoreError>> + Send + 'static,
    {
        let hash = self.hot.hash(key);
        if let Some(found) = self.hot.get(hash, key, Instant::now()) {
            return Ok(Some(found));
        }
        // Taken before the cache is read: a forget after this keeps the answer out of the table.
        let ticket = self.hot.ticket(hash);
        let (fetched_at, found) = match self.cache.get(key).await {
            Some(cached) => cached,
            None => {
                let name = label();
                let lookup = fetch();
                let last_known = self.last_known.clone();
                let remembered = name.clone();
                let fetched = self
                    .cache
                    .try_get_with(key.to_owned(), async move {
                        let found = last_known.fetch(lookup).await?.map(Arc::new);
                        match &found {
                            Some(record) => last_known.remember(&remembered, record),
                            None => last_known.forget(&remembered),
                        }
                        Ok::<_, StoreError>((Instant::now(), found))
                    })
                    .await;
                match fetched {
                    Ok(fetched) => fetched,
                    // Not put in the table: a record answered while the store is down is asked
                    // for again on the next request.
                    Err(e) => return self.last_known.on_error(&name, (*e).clone()).map(Some),
                }
            }
        };
        if let Some(record) = &found {
            self.hot.put(
                hash,
                key.to_owned(),
                record.clone(),
                ticket,
                fetched_at + self.ttl,
            );
        }
        Ok(found)
    }

    /// Forgets what is cached of `key` (`label` as given to `get`).
    pub async fn forget<Q>(&self, key: &Q, label: &str)
    where
        K: std::borrow::Borrow<Q>,
        Q: std::hash::Hash + Eq + ?Sized,
    {
        self.cache.invalidate(key).await;
        // After the cache: a lookup that starts after this finds the cache already without it.
        // Only this key's slot: one change never empties the table for every other key.
        self.hot.forget(self.hot.hash(key), key);
        self.last_known.forget(label);
    }

    /// Forgets every cached record (the last known ones stay for outages).
    pub fn forget_all(&self) {
        self.cache.invalidate_all();
        self.hot.forget_all();
    }
}

/// A key's record as resolved: the control store's record, and its id written out once for
/// the actor's `key_id` — a request copies the text, it does not format the id again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedKey {
    pub record: ApiKeyRecord,
    /// `record.id`, hyphenated, in lower case.
    pub key_id: Box<str>,
}

impl ResolvedKey {
    /// `record`, with its id written out.
    pub fn new(record: ApiKeyRecord) -> Self {
        let key_id = record
            .id
            .hyphenated()
            .encode_lower(&mut uuid::Uuid::encode_buffer())
            .into();
        Self { record, key_id }
    }
}

impl std::ops::Deref for ResolvedKey {
    type Target = ApiKeyRecord;

    fn deref(&self) -> &ApiKeyRecord {
        &self.record
    }
}

/// Resolves keys by hash through [`Lookups`]: by the key's SHA-256, held as its 32 bytes (no
/// text per lookup, and never the key itself).
#[derive(Debug, Clone)]
pub struct KeyResolver {
    store: Arc<dyn ControlStore>,
    lookups: Arc<Lookups<[u8; 32], ResolvedKey>>,
}

impl KeyResolver {
    /// A resolver caching for `ttl`, at most `capacity` entries, answering keys it found in
    /// the last `stale` while the store is unavailable.
    pub fn new(
        store: Arc<dyn ControlStore>,
        ttl: Duration,
        capacity: u64,
        stale: Duration,
        health: StoreHealth,
    ) -> Self {
        Self {
            store,
            lookups: Arc::new(Lookups::new(
                ttl,
                capacity,
                LastKnown::new(stale, capacity, health),
            )),
        }
    }

    /// Forgets what is cached of the key whose SHA-256 is `sha256_hex` (a change event): the
    /// next request with it asks the store. Returns whether `sha256_hex` was a SHA-256.
    pub async fn forget(&self, sha256_hex: &str) -> bool {
        let mut digest = [0u8; 32];
        if hex::decode_to_slice(sha256_hex, &mut digest).is_err() {
            return false;
        }
        self.lookups
            .forget(&digest, &sha256_hex.to_ascii_lowercase())
            .await;
        true
    }

    /// Forgets every cached key (the store changed in ways not told key by key).
    pub fn forget_all(&self) {
        self.lookups.forget_all();
    }

    /// The record of `key`, or `None` when no key has that hash. Store failures are not cached;
    /// while the store is unavailable a key found before is answered from memory.
    pub async fn resolve(&self, key: &str) -> Result<Option<Arc<ResolvedKey>>, StoreError> {
        let digest: [u8; 32] = Sha256::digest(key.as_bytes()).into();
        self.lookups
            .get(
                &digest,
                || hex::encode(digest),
                || {
                    let store = self.store.clone();
                    async move {
                        let found = store.api_key_by_hash(&hex::encode(digest)).await?;
                        Ok(found.map(ResolvedKey::new))
                    }
                },
            )
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resolved_key_holds_its_id_as_the_envelope_writes_it() {
        let id = uuid::Uuid::from_u128(0x0F1E_2D3C_4B5A_4978_8695_A4B3_C2D1_E0FF);
        let key = ResolvedKey::new(ApiKeyRecord {
            id,
            project_ref: "p".into(),
            role: KeyRole::Anon,
            key_sha256: hash_key("k"),
            revoked_at: None,
        });
        assert_eq!(&*key.key_id, "0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0ff");
        assert_eq!(&*key.key_id, id.to_string());
        assert_eq!(key.project_ref, "p", "the record's fields through it");
    }

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

    /// Lookups of `u32` records by name, with a fetch that counts its calls and finds names
    /// that start with `known`.
    struct Counted {
        lookups: Lookups<String, u32>,
        fetches: Arc<std::sync::atomic::AtomicUsize>,
    }

    impl Counted {
        fn new() -> Self {
            Self {
                lookups: Lookups::new(
                    Duration::from_secs(30),
                    1_000,
                    LastKnown::new(Duration::ZERO, 10, StoreHealth::default()),
                ),
                fetches: Arc::default(),
            }
        }

        async fn get(&self, name: &str) -> Option<Arc<u32>> {
            let fetches = self.fetches.clone();
            let found = name.starts_with("known").then_some(7);
            self.lookups
                .get(
                    name,
                    || name.to_owned(),
                    || async move {
                        fetches.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        Ok(found)
                    },
                )
                .await
                .expect("the fetch does not fail")
        }

        fn fetches(&self) -> usize {
            self.fetches.load(std::sync::atomic::Ordering::SeqCst)
        }

        fn in_table(&self, name: &str, at: Instant) -> bool {
            let hot = &self.lookups.hot;
            hot.get(hot.hash(name), name, at).is_some()
        }
    }

    #[tokio::test]
    async fn a_record_found_is_answered_from_the_table_until_the_cache_would_expire_it() {
        let c = Counted::new();
        assert_eq!(c.get("known-a").await.as_deref(), Some(&7));
        assert_eq!(c.fetches(), 1);
        let (fetched_at, _) = c
            .lookups
            .cache
            .get("known-a")
            .await
            .expect("cached behind the table");
        // Dropped from the cache behind it: still answered, from the table, without a fetch.
        c.lookups.cache.invalidate("known-a").await;
        assert_eq!(c.get("known-a").await.as_deref(), Some(&7));
        assert_eq!(c.fetches(), 1, "answered by the table");
        // The table's deadline is the cache's: the fetch time plus the time to live.
        let expires = fetched_at + Duration::from_secs(30);
        assert!(c.in_table("known-a", expires - Duration::from_millis(1)));
        assert!(!c.in_table("known-a", expires));
    }

    #[tokio::test]
    async fn a_record_taken_from_the_cache_keeps_its_fetch_time_in_the_table() {
        let c = Counted::new();
        c.get("known-a").await;
        let (fetched_at, _) = c.lookups.cache.get("known-a").await.expect("cached");
        // Later, out of the table but still in the cache: put back from the cache's entry.
        tokio::time::sleep(Duration::from_millis(50)).await;
        c.lookups.hot.forget_all();
        assert_eq!(c.get("known-a").await.as_deref(), Some(&7));
        assert_eq!(c.fetches(), 1, "taken from the cache, not fetched");
        let expires = fetched_at + Duration::from_secs(30);
        assert!(c.in_table("known-a", expires - Duration::from_millis(1)));
        assert!(
            !c.in_table("known-a", expires),
            "never past the cache's own deadline"
        );
    }

    #[tokio::test]
    async fn forgetting_a_record_reaches_the_table() {
        let c = Counted::new();
        c.get("known-a").await;
        c.get("known-b").await;
        assert_eq!(c.fetches(), 2);
        c.lookups.forget("known-a", "known-a").await;
        c.get("known-a").await;
        assert_eq!(c.fetches(), 3, "a forgotten record is fetched again");
        c.lookups.forget_all();
        assert!(!c.in_table("known-b", Instant::now()));
        c.get("known-b").await;
        assert_eq!(c.fetches(), 4, "forget_all reaches every entry");
    }

    #[tokio::test]
    async fn a_flood_of_unknown_names_does_not_push_a_known_one_out_of_the_table() {
        let c = Counted::new();
        c.get("known-a").await;
        for n in 0..20_000 {
            assert!(c.get(&format!("unknown-{n}")).await.is_none());
        }
        assert!(
            c.in_table("known-a", Instant::now()),
            "only records found are put in the table"
        );
        assert!(!c.in_table("unknown-0", Instant::now()));
    }

    #[tokio::test]
    async fn last_known_records_answer_only_while_the_store_is_unavailable() {
        let health = StoreHealth::default();
        let known = LastKnown::new(Duration::from_secs(60), 10, health.clone());
        known.remember("k", &1u32);
        let down = || StoreError::Unavailable("down".into());
        assert_eq!(known.on_error("k", down()).ok(), Some(1));
        assert!(
            known.on_error("other", down()).is_err(),
            "never a record not seen"
        );
        assert!(
            known
                .on_error("k", StoreError::Invalid("bad".into()))
                .is_err(),
            "only an unavailable store is answered from memory"
        );
        known.forget("k");
        assert!(
            known.on_error("k", down()).is_err(),
            "a key the store dropped is gone"
        );

        // After a failure the store is skipped for a moment instead of being waited on.
        assert!(!health.is_down());
        let failed: Result<u32, _> = known.fetch(async { Err(down()) }).await;
        assert!(failed.is_err());
        assert!(health.is_down());
        let mut called = false;
        let skipped: Result<u32, _> = known
            .fetch(async {
                called = true;
                Ok(7)
            })
            .await;
        assert!(
            skipped.is_err() && !called,
            "the store was called while marked down"
        );
        let disabled = LastKnown::new(Duration::ZERO, 10, StoreHealth::default());
        disabled.remember("k", &1u32);
        assert!(
            disabled.on_error("k", down()).is_err(),
            "stale_if_error_secs = 0"
        );
    }
}
