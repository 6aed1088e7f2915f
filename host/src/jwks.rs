//! A JSON Web Key Set read into verification keys, and why a set could not be had. Pure: the
//! control store checks an issuer's inline keys with it, the key sources ([`crate::auth`])
//! fetch and hold what it reads.

use std::collections::HashMap;

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey};
use tokio::time::Instant;

/// Why a fetch failed: its `outcome` label, and a message that names no secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{outcome}: {message}")]
pub struct FetchFailure {
    /// `status`, `timeout`, `connect`, `too_large`, `too_many_keys`, `invalid`, `not_allowed`,
    /// `discovery_mismatch` or `busy`.
    pub outcome: &'static str,
    pub message: String,
}

impl FetchFailure {
    pub fn new(outcome: &'static str, message: impl Into<String>) -> Self {
        Self {
            outcome,
            message: message.into(),
        }
    }
}

/// One verification key and the algorithm it is for.
#[derive(Clone)]
struct Key {
    alg: Algorithm,
    key: DecodingKey,
}

/// Keys of a JWKS by `kid`.
#[derive(Default)]
pub struct KeySet {
    keys: HashMap<String, Vec<Key>>,
    unnamed: Vec<Key>,
    /// When the set was fetched (set by the source that holds it).
    pub(crate) fetched_at: Option<Instant>,
}

impl std::fmt::Debug for KeySet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeySet")
            .field("kids", &self.kids())
            .field("unnamed", &self.unnamed.len())
            .finish_non_exhaustive()
    }
}

impl KeySet {
    /// How many keys the set holds.
    pub fn len(&self) -> usize {
        self.unnamed.len() + self.keys.values().map(Vec::len).sum::<usize>()
    }

    /// Whether the set holds no key.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The key ids, sorted.
    pub fn kids(&self) -> Vec<String> {
        let mut kids: Vec<String> = self.keys.keys().cloned().collect();
        kids.sort();
        kids
    }

    /// The key for `kid` (or the unnamed keys) and `alg`.
    pub(crate) fn find(&self, kid: Option<&str>, alg: Algorithm) -> Option<DecodingKey> {
        let candidates = match kid {
            Some(kid) => self.keys.get(kid)?,
            None => &self.unnamed,
        };
        candidates
            .iter()
            .find(|k| k.alg == alg)
            .map(|k| k.key.clone())
    }
}

/// Least RSA modulus accepted, in bytes (2048 bits).
const MIN_RSA_MODULUS_BYTES: usize = 256;

/// Parses a JWKS document into its usable public signing keys. More than `max_keys` keys is
/// `too_many_keys` (the whole set refused); symmetric keys, private keys, keys for encryption,
/// RSA keys under 2048 bits and EC keys on another curve than P-256 are skipped; a key whose
/// `alg` names another algorithm than its type allows is skipped; a set with no usable key is
/// `invalid`.
pub fn parse_set(bytes: &[u8], max_keys: usize) -> Result<KeySet, FetchFailure> {
    let document: serde_json::Value = serde_json::from_slice(bytes)
        .map_err(|_| FetchFailure::new("invalid", "the JWKS is not JSON"))?;
    let list = document
        .get("keys")
        .and_then(|k| k.as_array())
        .ok_or_else(|| FetchFailure::new("invalid", "the JWKS has no keys array"))?;
    if list.len() > max_keys {
        return Err(FetchFailure::new(
            "too_many_keys",
            format!("the JWKS has {} keys, over {max_keys}", list.len()),
        ));
    }
    let mut set = KeySet::default();
    for value in list {
        let Some(object) = value.as_object() else {
            continue;
        };
        // Private parameters: a set that publishes them is broken; such a key is never used.
        if ["d", "p", "q", "dp", "dq", "qi", "k"]
            .iter()
            .any(|field| object.contains_key(*field))
        {
            continue;
        }
        let Ok(jwk) = serde_json::from_value::<Jwk>(value.clone()) else {
            continue;
        };
        if matches!(
            jwk.common.public_key_use,
            Some(PublicKeyUse::Encryption | PublicKeyUse::Other(_))
        ) {
            continue;
        }
        let alg = match &jwk.algorithm {
            AlgorithmParameters::RSA(rsa) => {
                let modulus = base64_len(&rsa.n);
                if modulus < MIN_RSA_MODULUS_BYTES {
                    continue;
                }
                Algorithm::RS256
            }
            AlgorithmParameters::EllipticCurve(p) if p.curve == EllipticCurve::P256 => {
                Algorithm::ES256
            }
            // Symmetric keys never come from a JWKS; other curves and types are not accepted.
            _ => continue,
        };
        if let Some(declared) = &jwk.common.key_algorithm {
            let declared = format!("{declared:?}");
            if declared != format!("{alg:?}") {
                continue;
            }
        }
        let Ok(key) = DecodingKey::from_jwk(&jwk) else {
            continue;
        };
        let key = Key { alg, key };
        match &jwk.common.key_id {
            Some(kid) => set.keys.entry(kid.clone()).or_default().push(key),
            None => set.unnamed.push(key),
        }
    }
    if set.is_empty() {
        return Err(FetchFailure::new(
            "invalid",
            "the JWKS has no usable public RS256 or ES256 signing key",
        ));
    }
    Ok(set)
}

/// Decoded length of a base64url value without padding, leading zero bytes not counted.
fn base64_len(value: &str) -> usize {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(value.trim_end_matches('='))
        .map(|bytes| bytes.iter().skip_while(|b| **b == 0).count())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> String {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures")
            .join(name);
        std::fs::read_to_string(path).expect("fixture")
    }

    #[test]
    fn a_set_is_bounded_and_only_public_signing_keys_are_kept() {
        let good = fixture("jwks.json");
        let set = parse_set(good.as_bytes(), 32).expect("the fixture parses");
        assert_eq!(set.kids(), vec!["ec-1".to_owned(), "rsa-1".to_owned()]);
        // Too many keys: the whole set is refused, not cut.
        let document: serde_json::Value = serde_json::from_str(&good).expect("json");
        let one = document["keys"][0].clone();
        let many = serde_json::json!({ "keys": vec![one.clone(); 33] });
        let e = parse_set(many.to_string().as_bytes(), 32).expect_err("refused");
        assert_eq!(e.outcome, "too_many_keys");
        // A private key, a symmetric key, an encryption key, a weak RSA key, a key whose alg
        // contradicts its type: none is usable.
        let mut private = one.clone();
        private["d"] = serde_json::json!("AAAA");
        let symmetric = serde_json::json!({ "kty": "oct", "k": "c2VjcmV0", "kid": "s" });
        let mut encryption = one.clone();
        encryption["use"] = serde_json::json!("enc");
        let weak =
            serde_json::json!({ "kty": "RSA", "kid": "w", "n": "AQAB".repeat(40), "e": "AQAB" });
        let mut lying = one.clone();
        lying["alg"] = serde_json::json!("HS256");
        for bad in [private, symmetric, encryption, weak, lying] {
            let doc = serde_json::json!({ "keys": [bad] });
            let e = parse_set(doc.to_string().as_bytes(), 32).expect_err("refused");
            assert_eq!(e.outcome, "invalid", "{doc}");
        }
        for junk in ["", "[]", "{\"keys\": 3}", "not json"] {
            assert_eq!(
                parse_set(junk.as_bytes(), 32).err().map(|e| e.outcome),
                Some("invalid")
            );
        }
    }
}
