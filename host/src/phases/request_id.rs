//! Phase 7, request ids: every request gets a fresh id, sent to backends as `x-request-id` (and
//! as the envelope `id`) and returned on the response. A client-sent `x-request-id` is replaced:
//! ids are minted by the gateway so that logs and backends can trust them.

use http::{HeaderMap, HeaderValue};

use crate::headers::X_REQUEST_ID;

/// A request id: 32 lower-case hex digits (128 random bits), held inline, and the header value
/// made of it once.
#[derive(Clone)]
pub struct RequestId {
    hex: [u8; 32],
    value: HeaderValue,
}

impl std::fmt::Debug for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl RequestId {
    /// A new random id.
    pub fn mint() -> Self {
        let mut hex = [0u8; 32];
        uuid::Uuid::new_v4().simple().encode_lower(&mut hex);
        // Cloned for the request and for its answer: made shared at once.
        let value = crate::headers::shared_value::<32>(&hex).expect("hex is a valid header value");
        Self { hex, value }
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        // Hex digits are ASCII.
        std::str::from_utf8(&self.hex).unwrap_or_default()
    }

    /// The id's 32 hex digits.
    pub fn hex(&self) -> [u8; 32] {
        self.hex
    }

    /// The `x-request-id` header value.
    pub fn header_value(&self) -> &HeaderValue {
        &self.value
    }
}

/// Gives a response answered before this phase (a preflight, an early 400 or 413) an id of its
/// own, so that every response carries one.
pub fn stamp_if_missing(headers: &mut HeaderMap) {
    if !headers.contains_key(&X_REQUEST_ID) {
        headers.insert(X_REQUEST_ID.clone(), RequestId::mint().value);
    }
}

/// Sets the id on the request (for backends) and records it in the request span (made when
/// spans are exported).
pub fn assign(id: &RequestId, headers: &mut HeaderMap) {
    if crate::telemetry::exporting() {
        tracing::Span::current().record("request_id", id.as_str());
    }
    headers.insert(X_REQUEST_ID.clone(), id.value.clone());
}

/// Sets the id on the response.
pub fn stamp(id: &RequestId, headers: &mut HeaderMap) {
    headers.insert(X_REQUEST_ID.clone(), id.value.clone());
}

#[cfg(test)]
mod tests {
    use super::RequestId;

    #[test]
    fn ids_are_32_hex_digits_and_differ() {
        let (a, b) = (RequestId::mint(), RequestId::mint());
        assert_eq!(a.as_str().len(), 32);
        assert!(a.as_str().bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a.as_str(), b.as_str());
        assert_eq!(a.header_value().as_bytes(), a.as_str().as_bytes());
    }
}
